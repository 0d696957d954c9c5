"""Constrained scalar types shared by the API models.

Each type carries both the pydantic validation and the OpenAPI fragment that
goes into the CRD, so the API server and the operator enforce the same rule.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, WithJsonSchema
from pydantic.alias_generators import to_camel

# A reference as `docker pull` takes it: registry host (optionally with a
# port), path components, then an optional tag and/or digest.
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_LABEL = r"[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?"
_HOST = rf"(?:{_LABEL}(?:\.{_LABEL})*(?::[0-9]+)?/)?"
REPOSITORY_PATTERN = rf"^{_HOST}{_COMPONENT}(?:/{_COMPONENT})*$"
TAG_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$"
IMAGE_PATTERN = (
    rf"^{_HOST}{_COMPONENT}(?:/{_COMPONENT})*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[a-f0-9]{64})?$"
)
# Kubernetes quantities, without the sign: a data-plane agent never asks for
# a negative amount of anything.
QUANTITY_PATTERN = r"^(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[KMGTPE]i|[numkMGTPE]|[eE][+]?[0-9]+)?$"
PERCENT_OR_INT_PATTERN = r"^[0-9]+%?$"
WINDOWS_BUILD_PATTERN = r"^10\.0\.[0-9]+$"
LABEL_VALUE_MAX = 63


class ApiModel(BaseModel):
    """Base of every API model: camelCase on the wire, unknown fields refused."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
    )


def _matches(pattern: str, what: str) -> Any:
    compiled = re.compile(pattern)

    def check(value: str) -> str:
        if not compiled.fullmatch(value):
            raise ValueError(f"{value!r} is not a valid {what}")
        return value

    return AfterValidator(check)


ImageRef = Annotated[
    str,
    Field(max_length=512),
    _matches(IMAGE_PATTERN, "image reference"),
    WithJsonSchema({"type": "string", "maxLength": 512, "pattern": IMAGE_PATTERN}),
]
Repository = Annotated[
    str,
    Field(max_length=255),
    _matches(REPOSITORY_PATTERN, "image repository (hub)"),
    WithJsonSchema({"type": "string", "maxLength": 255, "pattern": REPOSITORY_PATTERN}),
]
ImageTag = Annotated[
    str,
    _matches(TAG_PATTERN, "image tag"),
    WithJsonSchema({"type": "string", "maxLength": 128, "pattern": TAG_PATTERN}),
]


def _quantity(value: int | str) -> str:
    text = str(value)
    if not re.fullmatch(QUANTITY_PATTERN, text):
        raise ValueError(f"{text!r} is not a non-negative Kubernetes quantity")
    return text


# Users write `cpu: 1` as often as `cpu: "100m"`, so accept both forms. The
# pattern checks strings and `minimum` integers; neither costs CEL budget.
Quantity = Annotated[
    int | str,
    AfterValidator(_quantity),
    WithJsonSchema(
        {
            "x-kubernetes-int-or-string": True,
            "pattern": QUANTITY_PATTERN,
            "minimum": 0,
        }
    ),
]


def _int_or_percent(value: int | str) -> int | str:
    if isinstance(value, int):
        if value < 0:
            raise ValueError("must not be negative")
        return value
    if not re.fullmatch(PERCENT_OR_INT_PATTERN, value):
        raise ValueError(f"{value!r} is neither a count nor a percentage like '10%'")
    return value


IntOrPercent = Annotated[
    int | str,
    AfterValidator(_int_or_percent),
    WithJsonSchema(
        {"x-kubernetes-int-or-string": True, "pattern": PERCENT_OR_INT_PATTERN, "minimum": 0}
    ),
]


def is_zero(value: int | str) -> bool:
    """True when a count-or-percentage means zero (0, "0" or "0%")."""
    return str(value).rstrip("%").lstrip("0") == ""


LabelMap = Annotated[
    dict[str, Annotated[str, Field(max_length=LABEL_VALUE_MAX)]],
    Field(max_length=64),
    WithJsonSchema(
        {
            "type": "object",
            "maxProperties": 64,
            "additionalProperties": {"type": "string", "maxLength": LABEL_VALUE_MAX},
        }
    ),
]
