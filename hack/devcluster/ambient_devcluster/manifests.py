"""Apply folders of YAML manifests (CRDs first) with server-side apply.

Server-side apply is used because the Gateway API CRDs exceed the size limit
of the ``last-applied-configuration`` annotation that client-side apply needs.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient

FIELD_MANAGER = "ambient-devcluster"
_MAX_MESSAGE = 1500


class ManifestError(RuntimeError):
    """The API server rejected one of the manifests."""


def _rejected(obj: dict[str, Any], exc: ApiException) -> ManifestError:
    # The server's Status message is the useful part; the raw exception text
    # repeats it several times along with every response header.
    message = str(exc.reason)
    with contextlib.suppress(ValueError, TypeError):
        message = json.loads(exc.body or "").get("message", message)
    if len(message) > _MAX_MESSAGE:
        message = message[:_MAX_MESSAGE] + " [...]"
    name = obj.get("metadata", {}).get("name")
    return ManifestError(f"{obj.get('kind')}/{name} rejected ({exc.status}): {message}")


CRD_API_VERSION = "apiextensions.k8s.io/v1"


def load_manifests(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """Every Kubernetes object in the given YAML files (``List`` kinds expanded)."""
    objects: list[dict[str, Any]] = []
    for path in paths:
        for doc in yaml.safe_load_all(path.read_text()):
            if not isinstance(doc, dict) or not doc.get("kind"):
                continue
            if doc["kind"].endswith("List") and "items" in doc:
                objects.extend(i for i in doc["items"] if isinstance(i, dict))
            else:
                objects.append(doc)
    return objects


def manifest_files(directory: Path) -> list[Path]:
    """The ``*.yaml``/``*.yml`` files directly in ``directory``, sorted, without
    kustomize's ``kustomization.yaml``."""
    files = [*directory.glob("*.yaml"), *directory.glob("*.yml")]
    return sorted(f for f in files if f.name not in ("kustomization.yaml", "kustomization.yml"))


def _is_crd(obj: dict[str, Any]) -> bool:
    return bool(obj.get("kind") == "CustomResourceDefinition")


def apply_objects(
    api_client: Any,
    objects: Sequence[dict[str, Any]],
    *,
    field_manager: str = FIELD_MANAGER,
    timeout: float = 60.0,
) -> list[str]:
    """Server-side apply ``objects``; CRDs go first and must become Established
    before anything else is applied. Returns ``kind/name`` of each object."""
    crds = [o for o in objects if _is_crd(o)]
    others = [o for o in objects if not _is_crd(o)]
    ext = client.ApiextensionsV1Api(api_client)
    for crd in crds:
        try:
            ext.patch_custom_resource_definition(
                crd["metadata"]["name"],
                crd,
                field_manager=field_manager,
                force=True,
                _content_type="application/apply-patch+yaml",
            )
        except ApiException as exc:
            raise _rejected(crd, exc) from None
    wait_crds_established(api_client, [c["metadata"]["name"] for c in crds], timeout=timeout)
    if others:
        # A private discovery cache: the default one in /tmp is shared by every
        # process and keyed by host:port, which our clusters reuse over time.
        with tempfile.TemporaryDirectory(prefix="devcluster-discovery-") as cache_dir:
            dyn = DynamicClient(api_client, cache_file=str(Path(cache_dir) / "discovery.json"))
            for obj in others:
                resource = dyn.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
                try:
                    dyn.server_side_apply(
                        resource,
                        body=obj,
                        namespace=obj.get("metadata", {}).get("namespace"),
                        field_manager=field_manager,
                        force_conflicts=True,
                    )
                except ApiException as exc:
                    raise _rejected(obj, exc) from None
    return [f"{o['kind']}/{o['metadata']['name']}" for o in [*crds, *others]]


def apply_dirs(
    api_client: Any, directories: Iterable[Path | str], *, timeout: float = 60.0
) -> list[str]:
    """Apply every manifest in the given folders (see :func:`apply_objects`)."""
    files: list[Path] = []
    for d in directories:
        files.extend(manifest_files(Path(d)))
    return apply_objects(api_client, load_manifests(files), timeout=timeout)


def wait_crds_established(api_client: Any, names: Iterable[str], timeout: float = 60.0) -> None:
    """Wait until each named CRD has condition Established=True."""
    ext = client.ApiextensionsV1Api(api_client)
    pending = set(names)
    deadline = time.monotonic() + timeout
    while pending:
        for name in sorted(pending):
            crd = ext.read_custom_resource_definition(name)
            conditions = (crd.status.conditions if crd.status else None) or []
            if any(c.type == "Established" and c.status == "True" for c in conditions):
                pending.discard(name)
        if not pending:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"CRDs not Established after {timeout}s: {sorted(pending)}")
        time.sleep(0.2)
