"""The Jinja2 side of rendering: load a template, fill it, parse the YAML."""

from __future__ import annotations

import dataclasses
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


class _Kept:
    """Objects by a text key, kept as JSON: json.loads of the kept text is a fresh
    copy, which a caller may change, at a fraction of the cost of making it again."""

    def __init__(self, size: int) -> None:
        self._kept: OrderedDict[str, str] = OrderedDict()
        self._size = size
        self._lock = threading.Lock()  # renders run in worker threads too

    def get(self, key: str) -> Any | None:
        with self._lock:
            kept = self._kept.get(key)
            if kept is not None:
                self._kept.move_to_end(key)
        return None if kept is None else json.loads(kept)

    def put(self, key: str, obj: Any) -> None:
        try:
            dumped = json.dumps(obj)
        except TypeError:  # a value JSON cannot carry (a YAML timestamp): not kept
            return
        if json.loads(dumped) != obj:  # integer keys would come back as strings
            return
        with self._lock:
            self._kept[key] = dumped
            while len(self._kept) > self._size:
                self._kept.popitem(last=False)


# Parsed objects by the YAML text they came from. The operator renders the
# same objects again on every pass that touches them (200 waypoints:
# thousands of renders at start-up), and parsing YAML, even with libyaml,
# took about half the operator's CPU then.
_PARSED = _Kept(2048)
# Rendered objects by their template and values. A platform rendered again
# (a node changed its placement: render/dataplane.py's RenderMemo) has few of
# its values changed, its ConfigMap's none; Jinja's render was a third of a
# node pass's CPU (bench/profile_passes.py). The values' JSON is the key: a
# template reads nothing else.
_RENDERED = _Kept(256)


def _parse(text: str) -> Any:
    obj = _PARSED.get(text)
    if obj is None:
        obj = yaml.load(text, Loader=_Loader)
        _PARSED.put(text, obj)
    return obj


def _key_part(value: Any) -> Any:
    """A frozen dataclass as JSON for a memo key; anything else JSON lacks is not keyed."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        if not type(value).__dataclass_params__.frozen:  # type: ignore[attr-defined]
            raise TypeError("a mutable dataclass may change under its key")
        fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        return {"__type__": type(value).__qualname__, **fields}
    raise TypeError(f"{type(value).__name__} is not keyed")


def _values_key(template: str, values: dict[str, Any]) -> str | None:
    try:
        return template + "\0" + json.dumps(values, sort_keys=True, default=_key_part)
    except (TypeError, ValueError):  # a set, a cycle: rendered without the memo
        return None


def render_object(template: str, **values: Any) -> dict[str, Any]:
    """Fill a template with values and return the single object it lays out."""
    key = _values_key(template, values)
    kept = None if key is None else _RENDERED.get(key)
    if isinstance(kept, dict):
        return kept
    obj = _parse(environment().get_template(template).render(**values))
    if not isinstance(obj, dict):
        raise TypeError(f"template {template} did not produce a mapping")
    if key is not None:
        _RENDERED.put(key, obj)
    return obj
