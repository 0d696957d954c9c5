"""The webhook at run time: a Reviewer that also keeps its TLS, configuration and server.

Everything kopf's managed configuration cannot say (see config.py) the
operator applies itself. The serving certificate comes from a Secret the
operator creates and renews (shared by restarts and replicas), or from a
directory a cert-manager Certificate is mounted into.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ambient_operator.api import constants as c
from ambient_operator.api import metrics
from ambient_operator.apply.plan import prepare, up_to_date
from ambient_operator.apply.writer import create_new, replace, write_by_name
from ambient_operator.cluster.state import ClusterState
from ambient_operator.kube.client import Kube, KubeError
from ambient_operator.kube.resources import KINDS
from ambient_operator.webhook.config import (
    CONFIG_NAME,
    SECRET_NAME,
    WebhookOptions,
    webhook_configuration,
)
from ambient_operator.webhook.misses import MissTracker
from ambient_operator.webhook.review import Reviewer
from ambient_operator.webhook.server import AdmissionServer

if TYPE_CHECKING:
    # Imported where a certificate is made or read: cryptography is a
    # sixth of the operator's imports, and an operator without the webhook
    # server never needs it.
    from ambient_operator.webhook import certs

log = logging.getLogger(__name__)
CONTROLLER = "webhook"
SECRET = KINDS[("v1", "Secret")]
MWC = KINDS[("admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration")]
SERVING_FILE = "serving.pem"
CA_FILE = "ca.crt"
SECRET_ATTEMPTS = 5


def _write_atomically(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _decode(data: Mapping[str, str] | None) -> dict[str, bytes]:
    return {k: base64.b64decode(v) for k, v in (data or {}).items()}


class Webhook(Reviewer):
    """State and work of the redirection-wait webhook inside one operator process.

    The reviews come from Reviewer; this adds the upkeep around them: the
    TLS material and its Secret, the MutatingWebhookConfiguration, and the
    server's start and stop.
    """

    def __init__(
        self,
        state: ClusterState,
        kube: Kube,
        options: WebhookOptions,
        *,
        clock: Callable[[], float] = time.monotonic,
        default_registry: str | None = None,
    ) -> None:
        super().__init__(state, kube, clock=clock, default_registry=default_registry)
        self.options = options
        self.server: AdmissionServer | None = None
        self.material: certs.TLSMaterial | None = None
        self.serve_dir: Path | None = None
        self.misses: MissTracker | None = None

    # -- TLS --------------------------------------------------------------------
    def secret_namespace(self) -> str:
        """Where the TLS Secret lives: the flag, else the AmbientMesh's namespace."""
        if self.options.secret_namespace:
            return self.options.secret_namespace
        spec = (self.state.mesh or {}).get("spec") or {}
        return str(spec.get("namespace") or os.environ.get("POD_NAMESPACE") or "istio-system")

    def hosts(self) -> list[str]:
        """Names the serving certificate must carry."""
        spec = (self.state.mesh or {}).get("spec") or {}
        return self.options.hosts(str(spec.get("clusterDomain") or "cluster.local"))

    def _secret_body(
        self, namespace: str, material: certs.TLSMaterial, resource_version: str | None = None
    ) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "name": SECRET_NAME,
            "namespace": namespace,
            "labels": {c.LABEL_MANAGED_BY: c.MANAGED_BY, c.LABEL_COMPONENT: "webhook"},
        }
        if resource_version:
            meta["resourceVersion"] = resource_version
        return {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": meta,
            "type": "kubernetes.io/tls",
            "data": {k: base64.b64encode(v).decode("ascii") for k, v in material.as_data().items()},
        }

    def ensure_secret(self, current: certs.TLSMaterial | None) -> certs.TLSMaterial:
        """The Secret's material, creating or renewing it; safe against other replicas.

        Create-if-absent and replace-at-resourceVersion: whoever loses a race
        reads the winner's material and uses it.
        """
        from ambient_operator.webhook import certs

        namespace, hosts = self.secret_namespace(), self.hosts()
        for _ in range(SECRET_ATTEMPTS):
            now = datetime.now(UTC)
            live = self.kube.get(SECRET, SECRET_NAME, namespace)
            if live is None:
                usable = current is not None and certs.renewal_reason(current, hosts, now) is None
                material = current if usable and current else certs.generate(hosts, now)
                try:
                    create_new(self.kube, self._secret_body(namespace, material))
                except KubeError as exc:
                    if exc.status == 409:
                        continue
                    raise
                log.info("created webhook TLS Secret %s/%s", namespace, SECRET_NAME)
                return material
            stored: certs.TLSMaterial | None
            try:
                stored = certs.TLSMaterial.from_data(_decode(live.get("data")))
                reason = certs.renewal_reason(stored, hosts, now)
            except ValueError as exc:
                stored, reason = None, f"unreadable: {exc}"
            if reason is None and stored is not None:
                return stored
            material = certs.renewed(stored, hosts, now)
            body = self._secret_body(namespace, material, live["metadata"].get("resourceVersion"))
            try:
                replace(self.kube, body)
            except KubeError as exc:
                if exc.status == 409:
                    continue
                raise
            log.info("renewed webhook TLS Secret %s/%s: %s", namespace, SECRET_NAME, reason)
            return material
        raise KubeError(409, "Conflict", f"Secret {namespace}/{SECRET_NAME} kept changing")

    def _from_cert_dir(self) -> certs.TLSMaterial:
        from ambient_operator.webhook import certs

        folder = Path(self.options.cert_dir or "")
        return certs.TLSMaterial.from_data(
            {
                name: (folder / name).read_bytes()
                for name in (certs.KEY_TLS_CRT, certs.KEY_TLS_KEY, certs.KEY_CA_CRT)
                if (folder / name).exists()
            }
        )

    def load_material(self) -> certs.TLSMaterial:
        """Current TLS material from the cert dir or the Secret.

        When the Secret cannot be used (no namespace yet, no permission), the
        process serves with material of its own and keeps trying to store it.
        """
        from ambient_operator.webhook import certs

        if self.options.cert_dir:
            return self._from_cert_dir()
        try:
            return self.ensure_secret(self.material)
        except KubeError as exc:
            log.error(
                "webhook TLS Secret unavailable (%s); serving with a private certificate", exc
            )
            now = datetime.now(UTC)
            if self.material is None or certs.renewal_reason(self.material, self.hosts(), now):
                return certs.generate(self.hosts(), now)
            return self.material

    def serving_paths(self) -> tuple[Path, Path, Path]:
        """(certfile, keyfile, cafile) for kopf's server."""
        from ambient_operator.webhook import certs

        if self.options.cert_dir:
            folder = Path(self.options.cert_dir)
            return folder / certs.KEY_TLS_CRT, folder / certs.KEY_TLS_KEY, folder / certs.KEY_CA_CRT
        if self.serve_dir is None:
            self.serve_dir = Path(tempfile.mkdtemp(prefix="ambient-operator-webhook-"))
        serving = self.serve_dir / SERVING_FILE
        return serving, serving, self.serve_dir / CA_FILE

    def sync(self) -> None:
        """Converge the served certificate and the MutatingWebhookConfiguration on the material."""
        self.install(self.load_material())
        if self.material is not None:
            self.apply_configuration(self.material.ca_bundle)

    def install(self, material: certs.TLSMaterial) -> None:
        """Serve this material (no-op when it is what is served already)."""
        if material == self.material:
            return
        certfile, keyfile, cafile = self.serving_paths()
        if not self.options.cert_dir:
            _write_atomically(cafile, material.ca_bundle)
            _write_atomically(certfile, material.serving_pem())
        if self.server is not None:
            self.server.set_certificate(certfile, keyfile)
        self.material = material

    def apply_configuration(self, ca_bundle: bytes) -> bool:
        """Server-side apply of the webhook configuration when it differs; True when written."""
        desired = prepare(
            webhook_configuration(self.options.client_config(ca_bundle)), None, CONTROLLER
        )
        live = self.kube.get(MWC, CONFIG_NAME)
        if up_to_date(desired, live):
            return False
        # Ours by field manager: a configuration of that name made by anyone
        # else is refused (NameConflictError), not taken over.
        write_by_name(self.kube, desired, live)
        metrics.OBJECTS_APPLIED.labels(kind="MutatingWebhookConfiguration").inc()
        log.info("applied MutatingWebhookConfiguration %s", CONFIG_NAME)
        return True

    async def maintain(self) -> None:
        """Re-check the material and the configuration every sync period."""
        while True:
            await asyncio.sleep(self.options.sync_seconds)
            try:
                await asyncio.to_thread(self.sync)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("webhook sync failed; retrying in %ss", self.options.sync_seconds)

    def start_server(self) -> None:
        """Bind the HTTPS server with the current material."""
        certfile, keyfile, _cafile = self.serving_paths()
        server = AdmissionServer(
            self.review, self.options.listen_address, self.options.port, limiter=self.limiter
        )
        server.set_certificate(certfile, keyfile)
        server.start()
        self.server = server
        log.info(
            "serving the redirection-wait webhook on %s:%s",
            self.options.listen_address,
            self.options.port,
        )

    def cleanup(self) -> None:
        """Stop serving; remove the private serving files (the Secret stays for the next start)."""
        if self.server is not None:
            self.server.stop()
            self.server = None
        if self.serve_dir is not None:
            shutil.rmtree(self.serve_dir, ignore_errors=True)
            self.serve_dir = None
