"""Where the API server is and who we are to it: kubeconfig or the pod's service account.

The operator reads these itself instead of through the `kubernetes` package:
that package imports every generated model (about 35 MiB resident) and kopf
imports it too whenever it can, for nothing this operator uses. One loader
serves the REST client, kopf's login and the command-line tools.

What a kubeconfig may say and how it is read follows kubectl: several files
in `$KUBECONFIG` merge with the first file's entry winning, paths are
relative to the file that names them, and a user's credentials are a token,
a token file, a client certificate or an exec plugin
(`client.authentication.k8s.io`). The removed `auth-provider` plugins and
basic auth are refused by name.
"""

from __future__ import annotations

import base64
import datetime
import json
import os
import ssl
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
# Bound service-account tokens are rotated by the kubelet (hourly by default,
# refreshed at 80% of their life); re-reading the file this often is what
# client-go does, and costs nothing.
TOKEN_FILE_RELOAD_SECONDS = 60.0
# An exec plugin's credential is run again this long before it expires, so a
# request in flight never carries one that just lapsed.
EXEC_EXPIRY_MARGIN_SECONDS = 30.0


class CredentialsError(Exception):
    """No usable credentials: the message says which file or entry, and what is wrong."""


@dataclass(frozen=True)
class ExecPlugin:
    """A `users[].user.exec` entry: a command that prints an ExecCredential."""

    command: str
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    api_version: str = "client.authentication.k8s.io/v1"
    workdir: str | None = None


@dataclass
class Credentials:
    """One API server and one identity for it.

    The bearer token may change under us (a rotated token file, an exec
    plugin's credential expiring); `bearer()` always answers the current one.
    """

    server: str
    ca_file: str | None = None
    ca_data: bytes | None = None
    insecure: bool = False
    token: str | None = None
    token_file: str | None = None
    cert_file: str | None = None
    cert_data: bytes | None = None
    key_file: str | None = None
    key_data: bytes | None = None
    exec_plugin: ExecPlugin | None = None
    source: str = ""
    _expires: float | None = field(default=None, repr=False)
    _read_at: float = field(default=0.0, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def bearer(self) -> str | None:
        """The token to send now, or None when we authenticate by certificate."""
        with self._lock:
            now = time.monotonic()
            if self.token_file and (
                self.token is None or now - self._read_at >= TOKEN_FILE_RELOAD_SECONDS
            ):
                self.token = _read_text(self.token_file, "token file").strip()
                self._read_at = now
            elif self.exec_plugin and (
                self._read_at == 0.0
                or (self._expires is not None and now >= self._expires - EXEC_EXPIRY_MARGIN_SECONDS)
            ):
                self._run_exec(now)
            return self.token

    def expiration(self) -> datetime.datetime | None:
        """When the current credential lapses (exec plugins only), for kopf's re-login."""
        self.bearer()
        return self._lapse()

    def _lapse(self) -> datetime.datetime | None:
        if self._expires is None:
            return None
        left = self._expires - time.monotonic()
        return datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=left)

    def refresh(self) -> None:
        """Forget the cached token: the API server answered 401 to it."""
        with self._lock:
            if self.token_file or self.exec_plugin:
                self._read_at = 0.0  # an exec plugin runs again at the next bearer()
                if self.token_file:
                    self.token = None  # read again even if the clock says 60 s have not passed

    def _run_exec(self, now: float) -> None:
        plugin = self.exec_plugin
        assert plugin is not None
        info = {
            "apiVersion": plugin.api_version,
            "kind": "ExecCredential",
            "spec": {"interactive": False},
        }
        env = {**os.environ, **dict(plugin.env), "KUBERNETES_EXEC_INFO": json.dumps(info)}
        try:
            done = subprocess.run(
                [plugin.command, *plugin.args],
                env=env,
                cwd=plugin.workdir,
                capture_output=True,
                timeout=60,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise CredentialsError(
                f"{self.source}: exec plugin {plugin.command!r}: {exc}"
            ) from None
        if done.returncode != 0:
            err = done.stderr.decode(errors="replace").strip()[:500]
            raise CredentialsError(
                f"{self.source}: exec plugin {plugin.command!r} exited {done.returncode}: {err}"
            )
        try:
            status = json.loads(done.stdout)["status"]
        except (ValueError, KeyError, TypeError):
            raise CredentialsError(
                f"{self.source}: exec plugin {plugin.command!r} printed no ExecCredential status"
            ) from None
        token = status.get("token")
        cert, key = status.get("clientCertificateData"), status.get("clientKeyData")
        if not token and not (cert and key):
            raise CredentialsError(
                f"{self.source}: exec plugin {plugin.command!r} gave neither a token "
                "nor a client certificate and key"
            )
        self.token = token or None
        if cert and key:
            self.cert_data, self.key_data = cert.encode(), key.encode()
            self.cert_file = self.key_file = None
        self._read_at = now
        self._expires = _expiry(status.get("expirationTimestamp"), now)

    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS settings for an https server (None for plain http)."""
        if not self.server.startswith("https://"):
            return None
        self.bearer()  # an exec plugin may be what supplies the client certificate
        context = ssl.create_default_context(
            cafile=self.ca_file, cadata=self.ca_data.decode() if self.ca_data else None
        )
        if self.insecure:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if self.cert_file or self.cert_data:
            _load_client_pair(context, self)
        return context

    def connection_info(self) -> Any:
        """The same credentials as kopf's ConnectionInfo (kopf is imported here only)."""
        import kopf

        token = self.bearer()
        return kopf.ConnectionInfo(
            server=self.server,
            ca_path=self.ca_file,
            ca_data=self.ca_data,
            insecure=self.insecure or None,
            scheme="Bearer" if token else None,
            token=token,
            certificate_path=self.cert_file,
            certificate_data=self.cert_data,
            private_key_path=self.key_file,
            private_key_data=self.key_data,
            expiration=self._lapse(),  # of the token just read
        )


def load_credentials(
    kubeconfig: str | None = None,
    *,
    context: str | None = None,
    environ: Mapping[str, str] | None = None,
    service_account_dir: Path = SERVICE_ACCOUNT_DIR,
) -> Credentials:
    """Credentials from `kubeconfig`, else the service account, else $KUBECONFIG or ~/.kube.

    The order is the one the operator always had: an explicit file wins, then
    the pod's own identity, then what kubectl would use. `context` picks a
    context of the kubeconfig other than its current one (kubectl's --context).
    """
    env = os.environ if environ is None else environ
    if kubeconfig:
        listed = [Path(p) for p in kubeconfig.split(os.pathsep) if p]
        # Like kubectl, a listed file that does not exist is skipped; when none
        # does, reading the first says what is wrong with it.
        return from_kubeconfig([p for p in listed if p.exists()] or listed[:1], context)
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
    if host and port and (service_account_dir / "token").exists():
        return in_cluster(host, port, service_account_dir)
    listed = [Path(p) for p in env.get("KUBECONFIG", "").split(os.pathsep) if p]
    if not listed:
        listed = [Path(env.get("HOME", "~")).expanduser() / ".kube" / "config"]
    present = [p for p in listed if p.exists()]
    if not present:
        raise CredentialsError(
            "no credentials: not in a pod with a service account, and no kubeconfig at "
            + ", ".join(str(p) for p in listed)
        )
    return from_kubeconfig(present, context)


def in_cluster(host: str, port: str, directory: Path = SERVICE_ACCOUNT_DIR) -> Credentials:
    """The pod's service account: its token file (re-read as it rotates) and the cluster CA."""
    server_host = f"[{host}]" if ":" in host else host
    ca = directory / "ca.crt"
    return Credentials(
        server=f"https://{server_host}:{port}",
        ca_file=str(ca) if ca.exists() else None,
        token_file=str(directory / "token"),
        source=f"service account ({directory})",
    )


def from_kubeconfig(files: list[Path], context_name: str | None = None) -> Credentials:
    """The current context's (or `context_name`'s) cluster and user, merged over `files` as
    kubectl merges them."""
    contexts: dict[str, tuple[dict[str, Any], Path]] = {}
    clusters: dict[str, tuple[dict[str, Any], Path]] = {}
    users: dict[str, tuple[dict[str, Any], Path]] = {}
    current = ""
    for path in files:
        doc = _read_yaml(path)
        current = current or str(doc.get("current-context") or "")
        for key, table, inner in (
            ("contexts", contexts, "context"),
            ("clusters", clusters, "cluster"),
            ("users", users, "user"),
        ):
            for entry in doc.get(key) or []:
                if isinstance(entry, dict) and entry.get("name") not in table:
                    table[str(entry.get("name"))] = (entry.get(inner) or {}, path)
    where = ", ".join(str(p) for p in files)
    if context_name:
        if context_name not in contexts:
            raise CredentialsError(f"{where}: no context {context_name!r}")
        current = context_name
    if not current:
        raise CredentialsError(f"{where}: no current-context")
    if current not in contexts:
        raise CredentialsError(f"{where}: current-context {current!r} is not among its contexts")
    context = contexts[current][0]
    cluster_name, user_name = str(context.get("cluster") or ""), str(context.get("user") or "")
    if cluster_name not in clusters:
        raise CredentialsError(f"{where}: context {current!r} names a missing cluster")
    cluster, cluster_file = clusters[cluster_name]
    server = str(cluster.get("server") or "").rstrip("/")
    if not server:
        raise CredentialsError(f"{cluster_file}: cluster {cluster_name!r} has no server")
    user, user_file = users.get(user_name, ({}, cluster_file))
    credentials = Credentials(
        server=server,
        ca_file=_relative(cluster.get("certificate-authority"), cluster_file),
        ca_data=_decoded(cluster.get("certificate-authority-data"), cluster_file, "CA"),
        insecure=bool(cluster.get("insecure-skip-tls-verify")),
        token=user.get("token") or None,
        token_file=_relative(user.get("tokenFile"), user_file),
        cert_file=_relative(user.get("client-certificate"), user_file),
        cert_data=_decoded(user.get("client-certificate-data"), user_file, "certificate"),
        key_file=_relative(user.get("client-key"), user_file),
        key_data=_decoded(user.get("client-key-data"), user_file, "key"),
        exec_plugin=_exec_plugin(user.get("exec"), user_file),
        source=f"{user_file} (context {current!r})",
    )
    if credentials.ca_file and credentials.ca_data:
        credentials.ca_file = None  # kubectl prefers the inline data too
    for refused in ("auth-provider", "username", "password"):
        if user.get(refused):
            raise CredentialsError(
                f"{user_file}: user {user_name!r} uses {refused!r}, which Kubernetes no longer "
                "supports; use a token, a client certificate or an exec plugin"
            )
    return credentials


def _exec_plugin(entry: Any, origin: Path) -> ExecPlugin | None:
    if not entry:
        return None
    if not isinstance(entry, dict) or not entry.get("command"):
        raise CredentialsError(f"{origin}: an exec entry without a command")
    command = str(entry["command"])
    # A relative path with a slash is relative to the kubeconfig; a bare name is on $PATH.
    if os.sep in command and not os.path.isabs(command):
        command = str((origin.parent / command).resolve())
    return ExecPlugin(
        command=command,
        args=tuple(str(a) for a in entry.get("args") or []),
        env=tuple((str(e["name"]), str(e["value"])) for e in entry.get("env") or []),
        api_version=str(entry.get("apiVersion") or "client.authentication.k8s.io/v1"),
        workdir=str(origin.parent),
    )


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        doc = yaml.safe_load(_read_text(str(path), "kubeconfig")) or {}
    except yaml.YAMLError as exc:
        raise CredentialsError(f"{path}: not YAML: {exc}") from None
    if not isinstance(doc, dict):
        raise CredentialsError(f"{path}: not a kubeconfig (a mapping at the top)")
    return doc


def _read_text(path: str, what: str) -> str:
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise CredentialsError(f"cannot read {what} {path}: {exc.strerror}") from None


def _relative(value: Any, origin: Path) -> str | None:
    if not value:
        return None
    path = Path(str(value)).expanduser()
    return str(path if path.is_absolute() else origin.parent / path)


def _decoded(value: Any, origin: Path, what: str) -> bytes | None:
    if not value:
        return None
    try:
        return base64.b64decode(str(value), validate=True)
    except ValueError:
        raise CredentialsError(f"{origin}: the {what} data is not base64") from None


def _expiry(stamp: Any, now: float) -> float | None:
    if not stamp:
        return None
    try:
        when = datetime.datetime.fromisoformat(str(stamp).replace("Z", "+00:00"))
    except ValueError:
        return None
    return now + (when - datetime.datetime.now(datetime.UTC)).total_seconds()


def _load_client_pair(context: ssl.SSLContext, credentials: Credentials) -> None:
    """Load the client certificate; inline PEM goes through a file removed at once.

    `ssl` loads a certificate chain only from files. The file is private to
    us (mkstemp's 0600) and gone before this returns.
    """
    written: list[str] = []
    try:
        paths = []
        for path, data in (
            (credentials.cert_file, credentials.cert_data),
            (credentials.key_file, credentials.key_data),
        ):
            if path:
                paths.append(path)
                continue
            handle, name = tempfile.mkstemp(prefix="ambient-operator-", suffix=".pem")
            written.append(name)
            with os.fdopen(handle, "wb") as out:
                out.write(data or b"")
            paths.append(name)
        context.load_cert_chain(paths[0], paths[1])
    except (OSError, ssl.SSLError) as exc:
        raise CredentialsError(f"{credentials.source}: client certificate: {exc}") from None
    finally:
        for name in written:
            os.unlink(name)
