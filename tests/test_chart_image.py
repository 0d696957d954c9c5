"""The operator image the chart runs: Dockerfile, pinned dependencies, packaging.

No container runtime here, so the Dockerfile is checked as text: a pinned
base, two stages, non-root, no build tools in the final stage, the lock file
as the only source of dependencies. The lock must pin exactly the runtime
closure of pyproject's dependencies, and the package data the wheel ships
(templates behind a symlink) must be real files.
"""

from __future__ import annotations

import importlib.util
import re
import tomllib
from pathlib import Path
from types import ModuleType

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "Dockerfile"
LOCK = ROOT / "requirements.lock"


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def _stages() -> list[list[tuple[str, str]]]:
    stages: list[list[tuple[str, str]]] = []
    for instruction in _instructions():
        if instruction[0] == "FROM":
            stages.append([])
        if stages:
            stages[-1].append(instruction)
    return stages


def test_base_image_is_slim_python_311_pinned() -> None:
    args = dict(
        rest.split("=", 1) for word, rest in _instructions() if word == "ARG" and "=" in rest
    )
    base = args["PYTHON_IMAGE"]
    assert re.fullmatch(r"python:3\.11\.\d+-slim-[a-z]+(@sha256:[a-f0-9]{64})?", base), base
    stages = _stages()
    assert len(stages) == 2, "a build stage and a runtime stage"
    assert all(stage[0][1].startswith("${PYTHON_IMAGE}") for stage in stages)


def test_runtime_stage_is_non_root_and_minimal() -> None:
    build, final = _stages()
    assert "AS build" in build[0][1]
    users = [rest for word, rest in final if word == "USER"]
    assert users, "the final stage must set USER"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) > 0, "numeric, so runAsNonRoot can be checked"
    assert gid.isdigit() and int(gid) > 0
    runs = " ".join(rest for word, rest in final if word == "RUN")
    for tool in ("apt-get", "gcc", "build-essential", "git "):
        assert tool not in runs, f"{tool} in the final stage"
    assert "--no-index" in runs, "the final stage installs only the wheels built before"
    assert "requirements.lock" in runs
    assert "pip uninstall --yes pip setuptools wheel" in runs
    assert not any(word in ("ADD",) for word, _ in final)
    entry = [rest for word, rest in final if word == "ENTRYPOINT"]
    assert entry == ['["ambient-operator"]']


def test_build_stage_builds_the_wheel_with_its_templates() -> None:
    build, _ = _stages()
    copies = " ".join(rest for word, rest in build if word == "COPY")
    for needed in ("requirements.lock", "pyproject.toml", "templates/", "operator/"):
        assert needed in copies, needed
    runs = " ".join(rest for word, rest in build if word == "RUN")
    assert "pip wheel --no-deps" in runs and "ambient_operator/templates/" in runs


def test_dockerignore_keeps_the_context_small() -> None:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    assert "*" in lines, "everything is excluded unless listed"
    for kept in ("!operator/", "!templates/", "!requirements.lock", "!pyproject.toml"):
        assert kept in lines, kept


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
