"""Certificates and kubeconfigs for the local control plane.

Everything is ECDSA P-256: Go's TLS stack and the API server's service-account
token signer both accept it, and generating it is far cheaper than RSA, which
keeps a cold start short.
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

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


def new_key() -> ec.EllipticCurvePrivateKey:
    """Generate a fresh P-256 private key."""
    return ec.generate_private_key(ec.SECP256R1())


def key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    """Serialise a private key as PKCS#8 PEM."""
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def public_key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    """Serialise the public half of a key as SubjectPublicKeyInfo PEM."""
    return key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


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
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _BACKDATE)
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False
            )
            .sign(key, hashes.SHA256())
        )
        pair = CertPair(directory / "ca.crt", directory / "ca.key")
        directory.mkdir(parents=True, exist_ok=True)
        pair.cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_private(pair.key_file, key_pem(key))
        return cls(key, cert, pair)

    @classmethod
    def load(cls, directory: Path) -> CertificateAuthority:
        """Load a CA written earlier by :meth:`create`."""
        pair = CertPair(directory / "ca.crt", directory / "ca.key")
        cert = x509.load_pem_x509_certificate(pair.cert_file.read_bytes())
        key = serialization.load_pem_private_key(pair.key_file.read_bytes(), password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise TypeError(f"{pair.key_file} is not an EC private key")
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
        attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, org) for org in organizations]
        attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
        usages = []
        if server:
            usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
        if client:
            usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
        if not usages:
            raise ValueError("a certificate needs server and/or client usage")
        now = datetime.datetime.now(datetime.UTC)
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(attrs))
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _BACKDATE)
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=False,
                    crl_sign=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()),
                critical=False,
            )
        )
        sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns_names]
        sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ip_addresses]
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        pair = CertPair(directory / f"{basename}.crt", directory / f"{basename}.key")
        directory.mkdir(parents=True, exist_ok=True)
        pair.cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_private(pair.key_file, key_pem(key))
        return pair


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
