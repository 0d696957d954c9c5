"""Certificates and kubeconfigs for the local control plane.

Everything is ECDSA P-256: Go's TLS stack and the API server's service-account
token signer both accept it, and generating it is far cheaper than RSA, which
keeps a cold start short. The certificates themselves are built by the
operator's :mod:`ambient_operator.webhook.certs`, the project's one place for
X.509; this module only picks their names, usages and lifetimes and writes
them to disk.
"""

from __future__ import annotations

import base64
import datetime
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec

from ambient_operator.webhook import certs
from ambient_operator.webhook.certs import key_pem, new_key, public_key_pem

# Key generation and encoding come from `certs`; they stay importable from
# here for the launcher.
__all__ = [
    "CertPair",
    "CertificateAuthority",
    "key_pem",
    "new_key",
    "public_key_pem",
    "write_kubeconfig",
    "write_private_key",
]

# Long enough for any test session or a developer's day-long `cluster-up`.
_VALIDITY = datetime.timedelta(days=30)
# Certificates start a little in the past so that small clock differences
# between the Python process and the Go programs never make them "not yet valid".
_BACKDATE = datetime.timedelta(minutes=5)


def _write_private(path: Path, data: bytes) -> None:
    """Write key material readable by the owner only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)


@dataclass(frozen=True)
class CertPair:
    """A certificate and its key, both as PEM files on disk."""

    cert_file: Path
    key_file: Path

    def cert_pem(self) -> bytes:
        """The certificate's PEM bytes."""
        return self.cert_file.read_bytes()

    def key_pem(self) -> bytes:
        """The private key's PEM bytes."""
        return self.key_file.read_bytes()


def _store(pair: CertPair, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> CertPair:
    """Write a certificate and its key (owner-readable only) to the pair's files."""
    pair.cert_file.parent.mkdir(parents=True, exist_ok=True)
    pair.cert_file.write_bytes(certs.cert_pem(cert))
    _write_private(pair.key_file, key_pem(key))
    return pair


class CertificateAuthority:
    """A self-signed CA that issues server and client certificates."""

    def __init__(self, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate, pair: CertPair):
        self._key = key
        self._cert = cert
        self.pair = pair

    @property
    def cert_file(self) -> Path:
        """Path of the CA certificate (PEM)."""
        return self.pair.cert_file

    @classmethod
    def create(
        cls, directory: Path, common_name: str = "ambient-devcluster-ca"
    ) -> CertificateAuthority:
        """Create a new CA and store it as ``ca.crt``/``ca.key`` in ``directory``."""
        key = new_key()
        now = datetime.datetime.now(datetime.UTC)
        cert = certs.ca_certificate(
            key,
            common_name,
            not_before=now - _BACKDATE,
            not_after=now + _VALIDITY,
            path_length=None,
        )
        pair = _store(CertPair(directory / "ca.crt", directory / "ca.key"), cert, key)
        return cls(key, cert, pair)

    @classmethod
    def load(cls, directory: Path) -> CertificateAuthority:
        """Load a CA written earlier by :meth:`create`."""
        pair = CertPair(directory / "ca.crt", directory / "ca.key")
        cert = x509.load_pem_x509_certificate(pair.cert_file.read_bytes())
        try:
            key = certs.load_key(pair.key_file.read_bytes())
        except TypeError:
            raise TypeError(f"{pair.key_file} is not an EC private key") from None
        return cls(key, cert, pair)

    def issue(
        self,
        directory: Path,
        basename: str,
        common_name: str,
        organizations: Sequence[str] = (),
        *,
        server: bool = False,
        client: bool = False,
        dns_names: Sequence[str] = (),
        ip_addresses: Sequence[str] = (),
    ) -> CertPair:
        """Issue a leaf certificate and write ``<basename>.crt``/``.key``.

        Kubernetes reads the user name from the CN and the groups from the O
        attributes of a client certificate.
        """
        key = new_key()
        now = datetime.datetime.now(datetime.UTC)
        cert = certs.leaf_certificate(
            self._cert,
            self._key,
            key.public_key(),
            common_name=common_name,
            not_before=now - _BACKDATE,
            not_after=now + _VALIDITY,
            organizations=organizations,
            dns_names=dns_names,
            ip_addresses=ip_addresses,
            server_auth=server,
            client_auth=client,
        )
        pair = CertPair(directory / f"{basename}.crt", directory / f"{basename}.key")
        return _store(pair, cert, key)


def write_private_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    """Write a private key as PEM, owner-readable only."""
    _write_private(path, key_pem(key))


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def write_kubeconfig(
    path: Path,
    *,
    server: str,
    ca_file: Path,
    user: str,
    client: CertPair | None = None,
    token: str | None = None,
    cluster_name: str = "ambient-dev",
) -> Path:
    """Write a single-context kubeconfig with credentials embedded.

    Embedding the data (instead of file paths) keeps the file usable when it is
    copied elsewhere, e.g. into a test's environment.
    """
    if (client is None) == (token is None):
        raise ValueError("pass exactly one of client or token")
    credentials: dict[str, Any] = {}
    if client is not None:
        credentials["client-certificate-data"] = _b64(client.cert_pem())
        credentials["client-key-data"] = _b64(client.key_pem())
    else:
        credentials["token"] = token
    context = f"{user}@{cluster_name}"
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": cluster_name,
                "cluster": {
                    "server": server,
                    "certificate-authority-data": _b64(ca_file.read_bytes()),
                },
            }
        ],
        "users": [{"name": user, "user": credentials}],
        "contexts": [{"name": context, "context": {"cluster": cluster_name, "user": user}}],
        "current-context": context,
        "preferences": {},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_private(path, yaml.safe_dump(config, sort_keys=False).encode())
    return path
