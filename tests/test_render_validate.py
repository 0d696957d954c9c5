"""Every rendered object is valid Kubernetes, for every minor version we support.

Strict schemas refuse unknown fields, so a typo in a template fails here
rather than being pruned silently by the API server.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import kubernetes_validate
import pytest

from ambient_operator.render import RenderResult
from render_cases import CASES, Case

VERSIONS = [f"1.{minor}" for minor in range(30, 38)]


@cache
def _rendered(case: Case) -> RenderResult:
    return case.render()


def _describe(obj: dict[str, Any]) -> str:
    return f"{obj['kind']}/{obj['metadata']['name']}"


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_objects_validate_strictly(case: Case, version: str) -> None:
    result = _rendered(case)
    assert result.objects
    for obj in result.objects:
        try:
            kubernetes_validate.validate(obj, f"{version}.0", strict=True)
        except kubernetes_validate.ValidationError as err:
            path = ".".join(str(p) for p in err.path)
            pytest.fail(
                f"{case.name}: {_describe(obj)} invalid for {version}: {path}: {err.message}"
            )


def test_schemas_exist_for_every_version() -> None:
    # validate() silently falls back to an older schema set; make sure that
    # every version we claim is really checked against its own schemas.
    available = {v.rsplit(".", 1)[0] for v in kubernetes_validate.utils.all_versions()}
    assert set(VERSIONS) <= available
