"""The Jinja2 side of rendering: load a template, fill it, parse the YAML."""

from __future__ import annotations

import json
from functools import cache
from typing import Any

import jinja2
import yaml

# libyaml parses an order of magnitude faster; the result is the same.
_Loader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def tojson(value: Any) -> str:
    """JSON text of a value, which YAML reads back unchanged whatever its characters."""
    if isinstance(value, jinja2.Undefined):
        # json.dumps would fail with a TypeError; StrictUndefined names the missing value.
        str(value)
    return json.dumps(value, sort_keys=True)


@cache
def environment() -> jinja2.Environment:
    """The one template environment: strict about undefined names, no HTML escaping."""
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("ambient_operator", "templates"),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters["tojson"] = tojson
    return env


def render_object(template: str, **values: Any) -> dict[str, Any]:
    """Fill a template with values and return the single object it lays out."""
    text = environment().get_template(template).render(**values)
    obj = yaml.load(text, Loader=_Loader)
    if not isinstance(obj, dict):
        raise TypeError(f"template {template} did not produce a mapping")
    return obj
