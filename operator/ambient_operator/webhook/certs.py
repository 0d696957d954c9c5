"""The webhook's serving certificate and its CA, made and checked with `cryptography`.

Pure functions of their inputs and an explicit `now`: the caller decides
where the material lives (a Secret, or files a cert-manager Certificate
mounts). The CA outlives many serving certificates, so renewing the leaf
leaves the webhook configuration's caBundle alone; when the CA itself is
renewed the bundle keeps the old CA until it expires, so replicas still
serving the old leaf stay trusted during the hand-over.

The general building blocks (`new_key`, `ca_certificate`, `leaf_certificate`,
the PEM helpers) are public: the local dev cluster's PKI is made with them too.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_DAYS = 3650
LEAF_DAYS = 365
# Renew this long before expiry: a month covers a long operator outage.
LEAF_RENEW_BEFORE = timedelta(days=30)
CA_RENEW_BEFORE = timedelta(days=365)
# Accept clocks a little behind ours (API server, other replicas).
BACKDATE = timedelta(hours=1)
CA_NAME = "ambient-operator-webhook-ca"

KEY_TLS_CRT = "tls.crt"
KEY_TLS_KEY = "tls.key"
KEY_CA_CRT = "ca.crt"
KEY_CA_KEY = "ca.key"


@dataclass(frozen=True)
class TLSMaterial:
    """PEM bytes: the CA bundle (newest CA first), the CA key if we own it, the leaf and its key."""

    ca_bundle: bytes
    ca_key: bytes | None
    cert: bytes
    key: bytes

    def as_data(self) -> dict[str, bytes]:
        """Secret data keys (type kubernetes.io/tls plus the CA)."""
        data = {KEY_TLS_CRT: self.cert, KEY_TLS_KEY: self.key, KEY_CA_CRT: self.ca_bundle}
        if self.ca_key is not None:
            data[KEY_CA_KEY] = self.ca_key
        return data

    @classmethod
    def from_data(cls, data: Mapping[str, bytes]) -> TLSMaterial:
        """Material from Secret data or files; raises ValueError when a part is missing."""
        missing = [k for k in (KEY_TLS_CRT, KEY_TLS_KEY, KEY_CA_CRT) if not data.get(k)]
        if missing:
            raise ValueError(f"missing {', '.join(missing)}")
        return cls(
            ca_bundle=data[KEY_CA_CRT],
            ca_key=data.get(KEY_CA_KEY) or None,
            cert=data[KEY_TLS_CRT],
            key=data[KEY_TLS_KEY],
        )

    def ca_bundle_first(self) -> bytes:
        """The newest CA certificate (the one that signs new leaves)."""
        return first_pem(self.ca_bundle)

    def serving_pem(self) -> bytes:
        """Leaf, then key, in one file: loaded in one read, it can never be half-renewed."""
        return self.cert.rstrip(b"\n") + b"\n" + self.key


# -- building blocks ---------------------------------------------------------------
# Every certificate of the project is made here: the webhook's CA and serving
# certificate below, and the local dev cluster's CAs, serving and client
# certificates (hack/devcluster/ambient_devcluster/pki.py). ECDSA P-256 with
# SHA-256 throughout: Go's TLS stack (API server, istiod) accepts it and it is
# far cheaper to generate than RSA.

IPAddressLike = str | ipaddress.IPv4Address | ipaddress.IPv6Address


def new_key() -> ec.EllipticCurvePrivateKey:
    """A fresh ECDSA P-256 private key."""
    return ec.generate_private_key(ec.SECP256R1())


def key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    """A private key as unencrypted PKCS#8 PEM (``BEGIN PRIVATE KEY``)."""
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def public_key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    """The public half of a private key as SubjectPublicKeyInfo PEM (``BEGIN PUBLIC KEY``)."""
    return key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def cert_pem(cert: x509.Certificate) -> bytes:
    """A certificate as PEM (``BEGIN CERTIFICATE``)."""
    return cert.public_bytes(serialization.Encoding.PEM)


def load_key(pem: bytes) -> ec.EllipticCurvePrivateKey:
    """An unencrypted PEM private key.

    Raises ValueError when the PEM cannot be read and TypeError when it holds
    a key that is not an EC key.
    """
    key = serialization.load_pem_private_key(pem, password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise TypeError(f"not an EC private key: {type(key).__name__}")
    return key


# Key usages none of these certificates has: their keys only sign.
_UNUSED_USAGES = dict.fromkeys(
    (
        "content_commitment",
        "key_encipherment",
        "data_encipherment",
        "key_agreement",
        "encipher_only",
        "decipher_only",
    ),
    False,
)


def _key_usage(*, ca: bool) -> x509.KeyUsage:
    """digitalSignature, plus keyCertSign and cRLSign for a CA."""
    return x509.KeyUsage(digital_signature=True, key_cert_sign=ca, crl_sign=ca, **_UNUSED_USAGES)


def ca_certificate(
    key: ec.EllipticCurvePrivateKey,
    common_name: str,
    *,
    not_before: datetime,
    not_after: datetime,
    path_length: int | None,
) -> x509.Certificate:
    """A self-signed CA certificate for `key`, subject and issuer ``CN=<common_name>``.

    Extensions: BasicConstraints(ca, `path_length`; None means unlimited),
    critical; KeyUsage digitalSignature, keyCertSign and cRLSign, critical;
    SubjectKeyIdentifier of the key.
    """
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=path_length), critical=True)
        .add_extension(_key_usage(ca=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )


def leaf_certificate(
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    public_key: ec.EllipticCurvePublicKey,
    *,
    common_name: str,
    not_before: datetime,
    not_after: datetime,
    organizations: Sequence[str] = (),
    dns_names: Iterable[str] = (),
    ip_addresses: Iterable[IPAddressLike] = (),
    server_auth: bool = False,
    client_auth: bool = False,
    key_usage: bool = True,
) -> x509.Certificate:
    """An end-entity certificate for `public_key`, signed by the CA.

    The subject is one O attribute per organisation (Kubernetes reads a client
    certificate's groups from them), then ``CN=<common_name>`` (the user name).
    Extensions: BasicConstraints(not a CA), critical; with `key_usage`, KeyUsage
    digitalSignature, critical; ExtendedKeyUsage serverAuth and/or clientAuth;
    AuthorityKeyIdentifier of the CA key; SubjectAlternativeName with the DNS
    names, then the IP addresses, when there are any. IP addresses that do not
    parse raise ValueError, as does asking for neither usage.
    """
    usages = []
    if server_auth:
        usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
    if client_auth:
        usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
    if not usages:
        raise ValueError("a certificate needs server and/or client usage")
    sans: list[x509.GeneralName] = [x509.DNSName(name) for name in dns_names]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ip_addresses]
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, org) for org in organizations]
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name(attrs))
        .issuer_name(ca_cert.subject)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
    )
    if key_usage:
        builder = builder.add_extension(_key_usage(ca=False), critical=True)
    builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False).add_extension(
        x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(ca_key, hashes.SHA256())


def split_hosts(hosts: Iterable[str]) -> tuple[list[str], list[str]]:
    """Hosts as (DNS names, IP addresses): a host that parses as an IP address is one."""
    dns_names: list[str] = []
    ip_addresses: list[str] = []
    for host in hosts:
        try:
            ip_addresses.append(str(ipaddress.ip_address(host)))
        except ValueError:
            dns_names.append(host)
    return dns_names, ip_addresses


# -- the webhook's CA and serving certificate ---------------------------------------


def new_ca(now: datetime) -> tuple[bytes, bytes]:
    """A self-signed CA certificate and key (PEM)."""
    key = new_key()
    cert = ca_certificate(
        key,
        CA_NAME,
        not_before=now - BACKDATE,
        not_after=now + timedelta(days=CA_DAYS),
        path_length=0,
    )
    return cert_pem(cert), key_pem(key)


def issue(
    ca_cert_pem: bytes, ca_key_pem: bytes, hosts: Sequence[str], now: datetime
) -> tuple[bytes, bytes]:
    """A serving certificate for `hosts` (DNS names or IPs), signed by the CA."""
    if not hosts:
        raise ValueError("a serving certificate needs at least one host")
    ca_cert = x509.load_pem_x509_certificate(ca_cert_pem)
    try:
        ca_key = load_key(ca_key_pem)
    except TypeError:
        raise ValueError("the CA key is not an EC key") from None
    key = new_key()
    dns_names, ip_addresses = split_hosts(hosts)
    cert = leaf_certificate(
        ca_cert,
        ca_key,
        key.public_key(),
        common_name=hosts[0],
        not_before=now - BACKDATE,
        not_after=min(now + timedelta(days=LEAF_DAYS), ca_cert.not_valid_after_utc),
        dns_names=dns_names,
        ip_addresses=ip_addresses,
        server_auth=True,
        key_usage=False,
    )
    return cert_pem(cert), key_pem(key)


def generate(hosts: Sequence[str], now: datetime) -> TLSMaterial:
    """A fresh CA and serving certificate."""
    ca_cert, ca_key = new_ca(now)
    cert, key = issue(ca_cert, ca_key, hosts, now)
    return TLSMaterial(ca_bundle=ca_cert, ca_key=ca_key, cert=cert, key=key)


def _cert_hosts(cert: x509.Certificate) -> set[str]:
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set()
    return {str(v) for v in sans.get_values_for_type(x509.DNSName)} | {
        str(v) for v in sans.get_values_for_type(x509.IPAddress)
    }


def _signed_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def renewal_reason(material: TLSMaterial, hosts: Sequence[str], now: datetime) -> str | None:
    """Why the material must be renewed now, or None when it is good."""
    try:
        cas = x509.load_pem_x509_certificates(material.ca_bundle)
        leaf = x509.load_pem_x509_certificate(material.cert)
        key = serialization.load_pem_private_key(material.key, password=None)
    except ValueError as exc:
        return f"unreadable: {exc}"
    if key.public_key().public_numbers() != leaf.public_key().public_numbers():  # type: ignore[union-attr]
        return "the key does not belong to the certificate"
    if not any(_signed_by(leaf, ca) for ca in cas):
        return "the certificate is not signed by a CA in the bundle"
    if material.ca_key is not None and now + CA_RENEW_BEFORE > cas[0].not_valid_after_utc:
        return "the CA expires soon"
    if now + LEAF_RENEW_BEFORE > leaf.not_valid_after_utc:
        return "the certificate expires soon"
    if now < leaf.not_valid_before_utc:
        return "the certificate is not valid yet"
    dns_names, ip_addresses = split_hosts(hosts)
    missing = sorted({*dns_names, *ip_addresses} - _cert_hosts(leaf))
    if missing:
        return f"the certificate does not name {', '.join(missing)}"
    return None


def renewed(material: TLSMaterial | None, hosts: Sequence[str], now: datetime) -> TLSMaterial:
    """New material: a new leaf from the same CA when it is good, else a new CA too.

    A new CA is bundled with the still-valid old ones, newest first.
    """
    if material is None or material.ca_key is None:
        return generate(hosts, now)
    try:
        cas = x509.load_pem_x509_certificates(material.ca_bundle)
        if cas and now + CA_RENEW_BEFORE <= cas[0].not_valid_after_utc:
            cert, key = issue(material.ca_bundle_first(), material.ca_key, hosts, now)
            return TLSMaterial(material.ca_bundle, material.ca_key, cert, key)
    except ValueError:
        return generate(hosts, now)
    fresh = generate(hosts, now)
    old = b"".join(cert_pem(ca) for ca in cas if ca.not_valid_after_utc > now)
    return TLSMaterial(fresh.ca_bundle + old, fresh.ca_key, fresh.cert, fresh.key)


def first_pem(bundle: bytes) -> bytes:
    """The first certificate of a PEM bundle."""
    return cert_pem(x509.load_pem_x509_certificates(bundle)[0])
