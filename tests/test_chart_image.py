"""What the operator image is made of: pinned dependencies and packaging.

The image itself is built by `make images` (hack/images) and read back by
tests/test_images.py: exactly the lock's wheels, user 65532, no pip. Here:
the lock must pin exactly the runtime closure of pyproject's dependencies,
and the package data the wheel ships (templates behind a symlink) must be
real files.
"""

from __future__ import annotations

import importlib.util
import tomllib
from pathlib import Path
from types import ModuleType

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "requirements.lock"


def _lock_tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "lock_requirements", ROOT / "hack" / "lock_requirements.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _pins() -> dict[str, str]:
    pins = {}
    for line in LOCK.read_text().splitlines():
        if line and not line.startswith("#"):
            name, sep, version = line.partition("==")
            assert sep, f"not pinned: {line}"
            pins[canonicalize_name(name)] = version
    return pins


def test_lock_pins_exactly_the_runtime_dependencies() -> None:
    tool = _lock_tool()
    needed = tool.runtime_closure(tool.direct_requirements())
    pins = _pins()
    assert set(pins) == needed, (
        f"missing {sorted(needed - set(pins))}, extra {sorted(set(pins) - needed)}; "
        "run `.venv/bin/python hack/lock_requirements.py`"
    )
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for text in project["dependencies"]:
        req = Requirement(text)
        version = pins[canonicalize_name(req.name)]
        assert req.specifier.contains(version, prereleases=True), f"{req.name}=={version}"
    for dev_only in ("pytest", "mypy", "ruff", "hypothesis", "matplotlib", "kubernetes-validate"):
        assert dev_only not in pins


def test_package_data_ships_the_templates_as_files() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    data = config["package-data"]["ambient_operator"]
    assert "templates/*.j2" in data and "samples/*.yaml" in data
    linked = ROOT / "operator" / "ambient_operator" / "templates"
    assert linked.resolve() == (ROOT / "templates").resolve()
    files = sorted(linked.glob("*.j2"))
    assert files, "no templates"
    assert not any(f.is_symlink() for f in files), "the wheel must get contents, not links"
