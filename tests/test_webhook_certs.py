"""Certificates are made in one place: `ambient_operator.webhook.certs`.

Offline. The webhook's CA and serving certificate, and the local dev
cluster's PKI (`ambient_devcluster.pki`, built from the same blocks), are
pinned extension by extension: names, usages, criticality and lifetimes are
written out here, not read from the code.
"""

from __future__ import annotations

import base64
import ipaddress
import stat
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TypeVar

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, ExtensionOID, NameOID

from ambient_devcluster import pki
from ambient_operator.webhook import certs

NOW = datetime(2026, 11, 30, tzinfo=UTC)
HOUR = timedelta(hours=1)
SERVER = ExtendedKeyUsageOID.SERVER_AUTH
CLIENT = ExtendedKeyUsageOID.CLIENT_AUTH
BC, KU, EKU = (
    ExtensionOID.BASIC_CONSTRAINTS,
    ExtensionOID.KEY_USAGE,
    ExtensionOID.EXTENDED_KEY_USAGE,
)
SKI, AKI = ExtensionOID.SUBJECT_KEY_IDENTIFIER, ExtensionOID.AUTHORITY_KEY_IDENTIFIER
SAN = ExtensionOID.SUBJECT_ALTERNATIVE_NAME
E = TypeVar("E", bound=x509.ExtensionType)


def _extensions(cert: x509.Certificate) -> dict[x509.ObjectIdentifier, bool]:
    """Each extension's OID and whether it is critical."""
    return {ext.oid: ext.critical for ext in cert.extensions}


def _value(cert: x509.Certificate, kind: type[E]) -> E:
    return cert.extensions.get_extension_for_class(kind).value


def _usages(cert: x509.Certificate) -> tuple[bool, bool, bool]:
    """(digitalSignature, keyCertSign, cRLSign); every other usage must be off."""
    ku = _value(cert, x509.KeyUsage)
    others = (ku.content_commitment, ku.key_encipherment, ku.data_encipherment, ku.key_agreement)
    assert not any(others), ku
    return ku.digital_signature, ku.key_cert_sign, ku.crl_sign


def _sans(cert: x509.Certificate) -> set[str]:
    names = _value(cert, x509.SubjectAlternativeName)
    ips = names.get_values_for_type(x509.IPAddress)
    return set(names.get_values_for_type(x509.DNSName)) | {f"ip:{ip}" for ip in ips}


def _is_ec_p256(cert: x509.Certificate) -> bool:
    key = cert.public_key()
    return isinstance(key, ec.EllipticCurvePublicKey) and key.curve.name == "secp256r1"


# -- the building blocks -----------------------------------------------------------


def test_a_ca_certificate_has_the_given_name_lifetime_and_path_length() -> None:
    key = certs.new_key()
    for path_length in (0, 2, None):
        ca = certs.ca_certificate(
            key,
            "some-ca",
            not_before=NOW - HOUR,
            not_after=NOW + 10 * HOUR,
            path_length=path_length,
        )
        assert ca.subject.rfc4514_string() == ca.issuer.rfc4514_string() == "CN=some-ca"
        assert (ca.not_valid_before_utc, ca.not_valid_after_utc) == (NOW - HOUR, NOW + 10 * HOUR)
        assert _extensions(ca) == {BC: True, KU: True, SKI: False}
        assert _value(ca, x509.BasicConstraints) == x509.BasicConstraints(True, path_length)
        assert _usages(ca) == (True, True, True)
        ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
        assert _value(ca, x509.SubjectKeyIdentifier) == ski
        ca.verify_directly_issued_by(ca)
        assert _is_ec_p256(ca)


def test_a_leaf_names_its_organisations_addresses_and_usages() -> None:
    ca_key = certs.new_key()
    ca = certs.ca_certificate(
        ca_key, "ca", not_before=NOW - HOUR, not_after=NOW + 48 * HOUR, path_length=None
    )
    leaf = certs.leaf_certificate(
        ca,
        ca_key,
        certs.new_key().public_key(),
        common_name="jane",
        not_before=NOW - HOUR,
        not_after=NOW + 24 * HOUR,
        organizations=["system:masters", "devs"],
        dns_names=["a.example", "localhost"],
        ip_addresses=["127.0.0.1", ipaddress.ip_address("::1")],
        server_auth=True,
        client_auth=True,
    )
    leaf.verify_directly_issued_by(ca)
    assert leaf.issuer == ca.subject
    assert [(a.oid, a.value) for a in leaf.subject] == [
        (NameOID.ORGANIZATION_NAME, "system:masters"),
        (NameOID.ORGANIZATION_NAME, "devs"),
        (NameOID.COMMON_NAME, "jane"),
    ]
    assert (leaf.not_valid_before_utc, leaf.not_valid_after_utc) == (NOW - HOUR, NOW + 24 * HOUR)
    assert _extensions(leaf) == {BC: True, KU: True, EKU: False, AKI: False, SAN: False}
    assert _value(leaf, x509.BasicConstraints) == x509.BasicConstraints(False, None)
    assert _usages(leaf) == (True, False, False)
    assert list(_value(leaf, x509.ExtendedKeyUsage)) == [SERVER, CLIENT]
    aki = x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key())
    assert _value(leaf, x509.AuthorityKeyIdentifier) == aki
    assert _sans(leaf) == {"a.example", "localhost", "ip:127.0.0.1", "ip:::1"}
    assert _is_ec_p256(leaf)


def test_a_leaf_without_names_or_key_usage_leaves_those_extensions_out() -> None:
    ca_key = certs.new_key()
    ca = certs.ca_certificate(ca_key, "ca", not_before=NOW, not_after=NOW + HOUR, path_length=0)
    public = certs.new_key().public_key()
    plain = certs.leaf_certificate(
        ca, ca_key, public, common_name="c", not_before=NOW, not_after=NOW + HOUR, client_auth=True
    )
    assert _extensions(plain) == {BC: True, KU: True, EKU: False, AKI: False}
    assert list(_value(plain, x509.ExtendedKeyUsage)) == [CLIENT]
    assert plain.subject.rfc4514_string() == "CN=c"
    bare = certs.leaf_certificate(
        ca,
        ca_key,
        public,
        common_name="s",
        not_before=NOW,
        not_after=NOW + HOUR,
        server_auth=True,
        key_usage=False,
    )
    assert _extensions(bare) == {BC: True, EKU: False, AKI: False}


def test_a_leaf_needs_a_usage_and_real_ip_addresses() -> None:
    ca_key = certs.new_key()
    ca = certs.ca_certificate(ca_key, "ca", not_before=NOW, not_after=NOW + HOUR, path_length=0)
    public = certs.new_key().public_key()
    with pytest.raises(ValueError, match="server and/or client usage"):
        certs.leaf_certificate(
            ca, ca_key, public, common_name="x", not_before=NOW, not_after=NOW + HOUR
        )
    with pytest.raises(ValueError, match="nope"):
        certs.leaf_certificate(
            ca,
            ca_key,
            public,
            common_name="x",
            not_before=NOW,
            not_after=NOW + HOUR,
            server_auth=True,
            ip_addresses=["nope"],
        )


def test_pem_encoding_and_loading() -> None:
    key = certs.new_key()
    assert key.curve.name == "secp256r1"
    pem = certs.key_pem(key)
    assert pem.startswith(b"-----BEGIN PRIVATE KEY-----\n")  # PKCS#8, unencrypted
    assert certs.load_key(pem).private_numbers() == key.private_numbers()
    public = certs.public_key_pem(key)
    assert public.startswith(b"-----BEGIN PUBLIC KEY-----\n")
    assert serialization.load_pem_public_key(public) == key.public_key()
    ca = certs.ca_certificate(key, "ca", not_before=NOW, not_after=NOW + HOUR, path_length=0)
    cert = certs.cert_pem(ca)
    assert cert.startswith(b"-----BEGIN CERTIFICATE-----\n")
    assert x509.load_pem_x509_certificate(cert) == ca
    assert certs.first_pem(cert + certs.new_ca(NOW)[0]) == cert
    rsa_pem = rsa.generate_private_key(65537, 2048).private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    with pytest.raises(TypeError, match="not an EC private key"):
        certs.load_key(rsa_pem)
    with pytest.raises(ValueError):
        certs.load_key(b"not a key")


def test_hosts_split_into_dns_names_and_ip_addresses() -> None:
    hosts = ["hook.ns.svc", "127.0.0.1", "::1", "other", "0:0::0:1"]
    assert certs.split_hosts(hosts) == (["hook.ns.svc", "other"], ["127.0.0.1", "::1", "::1"])
    assert certs.split_hosts([]) == ([], [])


# -- the webhook's CA and serving certificate ---------------------------------------


def test_the_webhook_ca_is_pinned() -> None:
    cert_pem, key_pem = certs.new_ca(NOW)
    ca = x509.load_pem_x509_certificate(cert_pem)
    assert ca.subject.rfc4514_string() == "CN=ambient-operator-webhook-ca"
    assert ca.issuer == ca.subject
    assert ca.not_valid_before_utc == NOW - HOUR
    assert ca.not_valid_after_utc == NOW + timedelta(days=3650)
    assert _extensions(ca) == {BC: True, KU: True, SKI: False}
    assert _value(ca, x509.BasicConstraints) == x509.BasicConstraints(True, 0)
    assert _usages(ca) == (True, True, True)
    assert _is_ec_p256(ca)
    assert certs.load_key(key_pem).public_key() == ca.public_key()


def test_the_webhook_serving_certificate_is_pinned() -> None:
    ca_pem, ca_key_pem = certs.new_ca(NOW)
    hosts = ["hook.ns.svc", "127.0.0.1", "hook.ns", "::1"]
    cert_pem, key_pem = certs.issue(ca_pem, ca_key_pem, hosts, NOW)
    ca, leaf = x509.load_pem_x509_certificate(ca_pem), x509.load_pem_x509_certificate(cert_pem)
    leaf.verify_directly_issued_by(ca)
    assert leaf.subject.rfc4514_string() == "CN=hook.ns.svc"  # the first host
    assert leaf.not_valid_before_utc == NOW - HOUR
    assert leaf.not_valid_after_utc == NOW + timedelta(days=365)
    # No KeyUsage: the serving certificate never had one.
    assert _extensions(leaf) == {SAN: False, BC: True, EKU: False, AKI: False}
    assert _value(leaf, x509.BasicConstraints) == x509.BasicConstraints(False, None)
    assert list(_value(leaf, x509.ExtendedKeyUsage)) == [SERVER]
    assert _sans(leaf) == {"hook.ns.svc", "hook.ns", "ip:127.0.0.1", "ip:::1"}
    assert certs.load_key(key_pem).public_key() == leaf.public_key()
    assert _is_ec_p256(leaf)


def test_a_serving_certificate_never_outlives_its_ca() -> None:
    ca_pem, ca_key_pem = certs.new_ca(NOW)
    late = NOW + timedelta(days=3600)
    leaf = x509.load_pem_x509_certificate(certs.issue(ca_pem, ca_key_pem, ["h.svc"], late)[0])
    assert leaf.not_valid_after_utc == NOW + timedelta(days=3650)


def test_issue_refuses_no_hosts_and_a_non_ec_ca_key() -> None:
    ca_pem, ca_key_pem = certs.new_ca(NOW)
    with pytest.raises(ValueError, match="at least one host"):
        certs.issue(ca_pem, ca_key_pem, [], NOW)
    rsa_pem = rsa.generate_private_key(65537, 2048).private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    with pytest.raises(ValueError, match="the CA key is not an EC key"):
        certs.issue(ca_pem, rsa_pem, ["h.svc"], NOW)
    # renewed() treats such a CA as broken and starts over with a fresh one.
    broken = certs.TLSMaterial(ca_pem, rsa_pem, b"", b"")
    fresh = certs.renewed(broken, ["h.svc"], NOW)
    assert fresh.ca_key != rsa_pem and certs.renewal_reason(fresh, ["h.svc"], NOW) is None


# -- the dev cluster's PKI, built from the same blocks -----------------------------


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_devcluster_ca_has_no_path_length_limit(tmp_path: Path) -> None:
    before = datetime.now(UTC).replace(microsecond=0)
    ca = pki.CertificateAuthority.create(tmp_path / "ca")
    front = pki.CertificateAuthority.create(tmp_path / "fp", "front-proxy-ca")
    after = datetime.now(UTC)
    assert ca.cert_file == tmp_path / "ca" / "ca.crt"
    assert _mode(tmp_path / "ca" / "ca.key") == 0o600
    for authority, name in ((ca, "CN=ambient-devcluster-ca"), (front, "CN=front-proxy-ca")):
        cert = x509.load_pem_x509_certificate(authority.pair.cert_pem())
        assert cert.subject.rfc4514_string() == cert.issuer.rfc4514_string() == name
        assert _extensions(cert) == {BC: True, KU: True, SKI: False}
        assert _value(cert, x509.BasicConstraints) == x509.BasicConstraints(True, None)
        assert _usages(cert) == (True, True, True)
        # Thirty days, starting five minutes back.
        start = cert.not_valid_before_utc + timedelta(minutes=5)
        assert before <= start <= after
        assert cert.not_valid_after_utc - cert.not_valid_before_utc == timedelta(days=30, minutes=5)


def test_the_devcluster_issues_server_and_client_certificates(tmp_path: Path) -> None:
    ca = pki.CertificateAuthority.create(tmp_path)
    ca_cert = x509.load_pem_x509_certificate(ca.pair.cert_pem())
    server = ca.issue(
        tmp_path,
        "apiserver",
        "kube-apiserver",
        server=True,
        dns_names=["localhost", "kubernetes.default.svc"],
        ip_addresses=["127.0.0.1", "10.96.0.1"],
    )
    client = ca.issue(
        tmp_path / "users", "admin", "kubernetes-admin", ["system:masters"], client=True
    )
    assert server == pki.CertPair(tmp_path / "apiserver.crt", tmp_path / "apiserver.key")
    assert client.cert_file == tmp_path / "users" / "admin.crt"
    assert _mode(server.key_file) == _mode(client.key_file) == 0o600

    cert = x509.load_pem_x509_certificate(server.cert_pem())
    cert.verify_directly_issued_by(ca_cert)
    assert cert.subject.rfc4514_string() == "CN=kube-apiserver"
    assert _extensions(cert) == {BC: True, KU: True, EKU: False, AKI: False, SAN: False}
    assert _usages(cert) == (True, False, False)
    assert list(_value(cert, x509.ExtendedKeyUsage)) == [SERVER]
    assert _sans(cert) == {"localhost", "kubernetes.default.svc", "ip:127.0.0.1", "ip:10.96.0.1"}
    assert cert.not_valid_after_utc - cert.not_valid_before_utc == timedelta(days=30, minutes=5)

    user = x509.load_pem_x509_certificate(client.cert_pem())
    user.verify_directly_issued_by(ca_cert)
    # Kubernetes: user name from CN, groups from O.
    assert user.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "kubernetes-admin"
    orgs = [a.value for a in user.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)]
    assert orgs == ["system:masters"]
    assert _extensions(user) == {BC: True, KU: True, EKU: False, AKI: False}
    assert list(_value(user, x509.ExtendedKeyUsage)) == [CLIENT]
    assert certs.load_key(client.key_pem()).public_key() == user.public_key()

    with pytest.raises(ValueError, match="server and/or client usage"):
        ca.issue(tmp_path, "none", "none")


def test_a_loaded_devcluster_ca_keeps_issuing(tmp_path: Path) -> None:
    # istio.py reloads its CA from disk on a second start.
    created = pki.CertificateAuthority.create(tmp_path / "ca", "istiod-local-ca")
    loaded = pki.CertificateAuthority.load(tmp_path / "ca")
    pair = loaded.issue(
        tmp_path / "certs",
        "istiod",
        "istiod.ns.svc",
        server=True,
        dns_names=("istiod.ns.svc", "istiod"),
        ip_addresses=("127.0.0.1",),
    )
    cert = x509.load_pem_x509_certificate(pair.cert_pem())
    cert.verify_directly_issued_by(x509.load_pem_x509_certificate(created.pair.cert_pem()))
    assert cert.issuer.rfc4514_string() == "CN=istiod-local-ca"
    assert _sans(cert) == {"istiod.ns.svc", "istiod", "ip:127.0.0.1"}

    (tmp_path / "rsa").mkdir()
    (tmp_path / "rsa" / "ca.crt").write_bytes(created.pair.cert_pem())
    (tmp_path / "rsa" / "ca.key").write_bytes(
        rsa.generate_private_key(65537, 2048).private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    with pytest.raises(TypeError, match=r"rsa/ca\.key is not an EC private key"):
        pki.CertificateAuthority.load(tmp_path / "rsa")


def test_devcluster_keys_and_kubeconfigs(tmp_path: Path) -> None:
    key = pki.new_key()
    assert key.curve.name == "secp256r1"
    pki.write_private_key(tmp_path / "sa.key", key)
    assert _mode(tmp_path / "sa.key") == 0o600
    assert (tmp_path / "sa.key").read_bytes() == pki.key_pem(key)
    assert pki.public_key_pem(key).startswith(b"-----BEGIN PUBLIC KEY-----\n")

    ca = pki.CertificateAuthority.create(tmp_path)
    pair = ca.issue(tmp_path, "admin", "kubernetes-admin", ["system:masters"], client=True)
    path = pki.write_kubeconfig(
        tmp_path / "kubeconfig",
        server="https://127.0.0.1:1",
        ca_file=ca.cert_file,
        user="me",
        client=pair,
    )
    assert _mode(path) == 0o600
    config = yaml.safe_load(path.read_text())
    user = config["users"][0]["user"]
    assert base64.b64decode(user["client-certificate-data"]) == pair.cert_pem()
    ca_data = config["clusters"][0]["cluster"]["certificate-authority-data"]
    assert base64.b64decode(ca_data) == ca.pair.cert_pem()
