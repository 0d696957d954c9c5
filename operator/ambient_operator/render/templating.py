"""The Jinja2 side of rendering: load a template, fill it, parse the YAML."""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
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
        # The templates ship with the code: no stat of each file at every
        # render (6% of a Gateway pass, bench/profile_passes.py).
        auto_reload=False,
    )
    env.filters["tojson"] = tojson
    return env


# Parsed objects by the YAML text they came from, kept as JSON text. The
# operator renders the same objects again on every pass that touches them
# (200 waypoints: thousands of renders at start-up), and parsing YAML, even
# with libyaml, took about half the operator's CPU then; json.loads of the
# kept text is a fresh copy at a fraction of the cost.
_PARSED: OrderedDict[str, str] = OrderedDict()
_PARSED_MAX = 2048
_PARSED_LOCK = threading.Lock()


def _parse(text: str) -> Any:
    with _PARSED_LOCK:
        kept = _PARSED.get(text)
        if kept is not None:
            _PARSED.move_to_end(text)
    if kept is not None:
        return json.loads(kept)
    obj = yaml.load(text, Loader=_Loader)
    try:
        dumped = json.dumps(obj)
    except TypeError:  # a value JSON cannot carry (a YAML timestamp): not kept
        return obj
    if json.loads(dumped) == obj:  # integer keys would come back as strings
        with _PARSED_LOCK:
            _PARSED[text] = dumped
            while len(_PARSED) > _PARSED_MAX:
                _PARSED.popitem(last=False)
    return obj


def render_object(template: str, **values: Any) -> dict[str, Any]:
    """Fill a template with values and return the single object it lays out."""
    text = environment().get_template(template).render(**values)
    obj = _parse(text)
    if not isinstance(obj, dict):
        raise TypeError(f"template {template} did not produce a mapping")
    return obj
