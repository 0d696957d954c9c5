"""Kubeconfigs and the service account, read without the `kubernetes` package.

The unit tests read literal kubeconfig files; the cluster tests send what was
read to the real API server, which is the judge of whether it authenticates.
"""

from __future__ import annotations

import base64
import json
import os
import stat
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from ambient_devcluster import LocalCluster
from ambient_operator.kube.client import Kube, KubeError
from ambient_operator.kube.credentials import (
    Credentials,
    CredentialsError,
    from_kubeconfig,
    load_credentials,
)
from ambient_operator.kube.resources import KINDS
from conftest import REPO_ROOT, wait_for
from operator_harness import AuditLog

NAMESPACE = KINDS[("v1", "Namespace")]
CA_PEM = b"-----BEGIN CERTIFICATE-----\nnot really\n-----END CERTIFICATE-----\n"


def _config(user: dict[str, Any], cluster: dict[str, Any] | None = None, name: str = "a") -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": f"ctx-{name}",
            "contexts": [{"name": f"ctx-{name}", "context": {"cluster": name, "user": name}}],
            "clusters": [{"name": name, "cluster": cluster or {"server": f"https://{name}:6443"}}],
            "users": [{"name": name, "user": user}],
        }
    )


def test_token_and_inline_ca_are_read_and_paths_are_relative_to_their_file(
    tmp_path: Path,
) -> None:
    (tmp_path / "sub").mkdir()
    path = tmp_path / "sub" / "config"
    path.write_text(
        _config(
            {"token": "t0ken", "client-certificate": "certs/me.crt", "client-key": "/abs/me.key"},
            {
                "server": "https://api.example:6443/",
                "certificate-authority-data": base64.b64encode(CA_PEM).decode(),
                "certificate-authority": "ignored-when-data-is-there.crt",
            },
        )
    )
    got = from_kubeconfig([path])
    assert got.server == "https://api.example:6443"
    assert got.ca_data == CA_PEM
    assert got.ca_file is None
    assert got.bearer() == "t0ken"
    assert got.cert_file == str(tmp_path / "sub" / "certs" / "me.crt")
    assert got.key_file == "/abs/me.key"
    assert not got.insecure


def test_several_files_merge_with_the_first_one_winning(tmp_path: Path) -> None:
    first, second = tmp_path / "one", tmp_path / "two"
    first.write_text(_config({"token": "first"}, name="a"))
    # The second file names its own current context and redefines user "a":
    # kubectl keeps the first file's current-context and its user "a".
    doc = yaml.safe_load(_config({"token": "second"}, name="a"))
    doc["current-context"] = "ctx-b"
    second.write_text(yaml.safe_dump(doc))
    got = load_credentials(environ={"KUBECONFIG": f"{first}{os.pathsep}{second}"})
    assert got.bearer() == "first"
    assert load_credentials(f"{tmp_path / 'missing'}{os.pathsep}{first}").bearer() == "first"


@pytest.mark.parametrize(
    ("user", "cluster", "message"),
    [
        ({"auth-provider": {"name": "gcp"}}, None, "'auth-provider', which Kubernetes no longer"),
        ({"username": "u", "password": "p"}, None, "'username', which Kubernetes no longer"),
        ({"token": "x"}, {"server": ""}, "has no server"),
        ({"client-key-data": "%%%"}, None, "the key data is not base64"),
        ({"exec": {"args": ["x"]}}, None, "an exec entry without a command"),
    ],
)
def test_what_cannot_be_used_is_refused_by_name(
    tmp_path: Path, user: dict[str, Any], cluster: dict[str, Any] | None, message: str
) -> None:
    path = tmp_path / "config"
    path.write_text(_config(user, cluster))
    with pytest.raises(CredentialsError, match=message):
        from_kubeconfig([path])


def test_no_credentials_anywhere_names_where_it_looked(tmp_path: Path) -> None:
    with pytest.raises(CredentialsError) as raised:
        load_credentials(environ={"HOME": str(tmp_path)}, service_account_dir=tmp_path)
    assert str(tmp_path / ".kube" / "config") in str(raised.value)
    path = tmp_path / "nocontext"
    path.write_text("apiVersion: v1\nkind: Config\nclusters: []\n")
    with pytest.raises(CredentialsError, match="no current-context"):
        load_credentials(str(path))


def test_in_cluster_reads_the_service_account_and_rereads_a_rotated_token(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("first-token\n")
    (tmp_path / "ca.crt").write_bytes(CA_PEM)
    env = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"}
    got = load_credentials(environ=env, service_account_dir=tmp_path)
    assert got.server == "https://[fd00::1]:443"
    assert got.ca_file == str(tmp_path / "ca.crt")
    assert got.bearer() == "first-token"
    (tmp_path / "token").write_text("rotated-token\n")
    assert got.bearer() == "first-token"  # cached for a minute
    got.refresh()  # what a 401 does
    assert got.bearer() == "rotated-token"


def _exec_script(tmp_path: Path, status: dict[str, Any]) -> Path:
    """A plugin that records each run and what it was told, then prints `status`."""
    script = tmp_path / "plugin.py"
    script.write_text(
        textwrap.dedent(
            f"""\
            import json, os, sys
            with open({str(tmp_path / "runs")!r}, "a") as out:
                out.write(os.environ["KUBERNETES_EXEC_INFO"] + " " + os.environ["EXTRA"] + "\\n")
            print(json.dumps({{"apiVersion": "client.authentication.k8s.io/v1",
                              "kind": "ExecCredential", "status": {status!r}}}))
            """
        )
    )
    wrapper = tmp_path / "plugin"
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} {script} "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    return wrapper


def _runs(tmp_path: Path) -> list[str]:
    return (tmp_path / "runs").read_text().splitlines()


def test_an_exec_plugin_is_run_with_its_env_and_again_when_its_token_expires(
    tmp_path: Path,
) -> None:
    _exec_script(tmp_path, {"token": "from-plugin", "expirationTimestamp": "2000-01-01T00:00:00Z"})
    path = tmp_path / "config"
    path.write_text(
        _config(
            {
                "exec": {
                    "apiVersion": "client.authentication.k8s.io/v1",
                    "command": "./plugin",
                    "env": [{"name": "EXTRA", "value": "given"}],
                }
            }
        )
    )
    got = load_credentials(str(path))
    assert got.bearer() == "from-plugin"
    runs = _runs(tmp_path)
    info, extra = runs[0].rsplit(" ", 1)
    assert extra == "given"
    assert json.loads(info) == {
        "apiVersion": "client.authentication.k8s.io/v1",
        "kind": "ExecCredential",
        "spec": {"interactive": False},
    }
    # The credential had expired already: every use asks the plugin again...
    got.bearer()
    assert len(_runs(tmp_path)) == 2
    # ...and kopf's login is one use: its token and its expiry come from one run.
    info = got.connection_info()
    assert info.token == "from-plugin"
    assert info.expiration is not None
    assert len(_runs(tmp_path)) == 3


def test_an_exec_plugin_without_an_expiry_is_run_once_until_a_refresh(tmp_path: Path) -> None:
    plugin = _exec_script(tmp_path, {"token": "forever"})
    path = tmp_path / "config"
    path.write_text(
        _config({"exec": {"command": str(plugin), "env": [{"name": "EXTRA", "value": "x"}]}})
    )
    got = load_credentials(str(path))
    assert [got.bearer(), got.bearer(), got.connection_info().token] == ["forever"] * 3
    assert len(_runs(tmp_path)) == 1
    # After a 401 the plugin is asked again, once.
    got.refresh()
    assert [got.bearer(), got.bearer()] == ["forever", "forever"]
    assert len(_runs(tmp_path)) == 2


def test_a_failing_exec_plugin_is_an_error_with_its_words(tmp_path: Path) -> None:
    plugin = tmp_path / "plugin"
    plugin.write_text("#!/bin/sh\necho 'token expired, run login' >&2\nexit 3\n")
    plugin.chmod(0o755)
    path = tmp_path / "config"
    path.write_text(_config({"exec": {"command": str(plugin)}}))
    with pytest.raises(CredentialsError, match="exited 3: token expired, run login"):
        load_credentials(str(path)).bearer()


# -- against the API server ------------------------------------------------------------------


def _admin(cluster: LocalCluster) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    return doc


def test_client_certificate_data_from_an_exec_plugin_authenticates(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    admin = _admin(cluster)
    user = admin["users"][0]["user"]
    _exec_script(
        tmp_path,
        {
            "clientCertificateData": base64.b64decode(user["client-certificate-data"]).decode(),
            "clientKeyData": base64.b64decode(user["client-key-data"]).decode(),
        },
    )
    admin["users"][0]["user"] = {
        "exec": {"command": "./plugin", "env": [{"name": "EXTRA", "value": "x"}]}
    }
    path = tmp_path / "config"
    path.write_text(yaml.safe_dump(admin))
    kube = Kube(load_credentials(str(path)))
    try:
        assert kube.get(NAMESPACE, "default") is not None
    finally:
        kube.close()


def _account_token(cluster: LocalCluster, k8s: client.ApiClient, namespace: str, name: str) -> str:
    """A token of a new ServiceAccount, which RBAC allows nothing."""
    client.CoreV1Api(k8s).create_namespaced_service_account(namespace, {"metadata": {"name": name}})
    issued = yaml.safe_load(cluster.serviceaccount_kubeconfig(namespace, name).read_text())
    token: str = issued["users"][0]["user"]["token"]
    return token


def test_a_401_rereads_a_rotated_token_and_sends_the_request_again(
    cluster: LocalCluster, k8s: client.ApiClient, namespace: str, tmp_path: Path
) -> None:
    token = _account_token(cluster, k8s, namespace, "reader")
    token_file = tmp_path / "token"
    token_file.write_text("an-old-token-the-api-server-refuses")
    credentials = Credentials(
        server=cluster.server, ca_file=str(cluster.ca_file), token_file=str(token_file)
    )
    kube = Kube(credentials)
    try:
        assert credentials.bearer() == "an-old-token-the-api-server-refuses"
        token_file.write_text(token)  # the kubelet rotates it
        # 403, not 401: the API server knew who we were and only RBAC said no.
        with pytest.raises(KubeError) as refused:
            kube.get(NAMESPACE, "default")
        assert refused.value.status == 403
        assert f"system:serviceaccount:{namespace}:reader" in refused.value.message
        token_file.write_text("garbage-again")
        credentials.refresh()
        with pytest.raises(KubeError) as unknown:
            kube.get(NAMESPACE, "default")
        assert unknown.value.status == 401
    finally:
        kube.close()


def test_requests_name_the_operator_and_its_version_in_the_audit_log(
    cluster: LocalCluster, k8s: client.ApiClient, namespace: str
) -> None:
    token = _account_token(cluster, k8s, namespace, "probe")
    audit = AuditLog(cluster.audit_log)
    since = audit.mark()
    kube = Kube(Credentials(server=cluster.server, ca_file=str(cluster.ca_file), token=token))
    try:
        with pytest.raises(KubeError):  # refused by RBAC, and audited all the same
            kube.get(NAMESPACE, "default")
    finally:
        kube.close()
    user = f"system:serviceaccount:{namespace}:probe"
    version = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["version"]
    agents = wait_for(
        lambda: [e.get("userAgent") for e in audit.events(since, user=user)] or None,
        timeout=30,
        message="the request's audit event",
    )
    assert agents == [f"ambient-operator/{version}"]


def test_the_operator_never_imports_the_kubernetes_package(tmp_path: Path) -> None:
    """It is 10-35 MiB the operator does not use; kopf would import it if it could."""
    snippet = textwrap.dedent(
        f"""\
        import sys
        from ambient_operator.cli.main import main
        rc = main(["run", "--kubeconfig", {str(tmp_path / "missing")!r}])
        import kopf
        from ambient_operator.runtime import memory
        print(rc, sys.modules.get("kubernetes") is not None, sys.modules.get("kopf") is kopf,
              memory.arenas_limited)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", snippet], capture_output=True, text=True, timeout=120, check=False
    )
    # The last: glibc's malloc arenas were capped (runtime/memory.limit_arenas).
    assert done.stdout.split() == ["1", "False", "True", "True"], done.stderr
    assert f"ambient-operator run: cannot read kubeconfig {tmp_path / 'missing'}" in done.stderr


def test_a_context_other_than_the_current_one_is_chosen_by_name(tmp_path: Path) -> None:
    path = tmp_path / "config"
    path.write_text(
        yaml.safe_dump(
            {
                "current-context": "a",
                "clusters": [
                    {"name": "ca", "cluster": {"server": "https://a.example:6443"}},
                    {"name": "cb", "cluster": {"server": "https://b.example:6443"}},
                ],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [
                    {"name": "a", "context": {"cluster": "ca", "user": "u"}},
                    {"name": "b", "context": {"cluster": "cb", "user": "u"}},
                ],
            }
        )
    )
    assert load_credentials(str(path)).server == "https://a.example:6443"
    assert load_credentials(str(path), context="b").server == "https://b.example:6443"
    with pytest.raises(CredentialsError, match=r"no context 'c'"):
        load_credentials(str(path), context="c")
