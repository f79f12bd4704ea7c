"""Throwaway PKI for the local control plane, webhook and extender (test use only).

Pure functions return PEM bytes; :func:`write_pki` lays out the files the harness needs.
Go's TLS stack checks SANs only (no CN fallback), so every serving cert carries
IP:127.0.0.1, IP:::1 and DNS:localhost (the IPv6 loopback: tests of callers that reach the roles over IPv6).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# Long enough for any test session or a developer's quick-start cluster.
_VALIDITY = dt.timedelta(days=365)
# Tolerate small clock skew between this process and the Go binaries.
_BACKDATE = dt.timedelta(minutes=5)

# The clients' names (subject CN): the roles admit only these (extenderClientNames, webhookClientNames),
# as one CA here signs every certificate.
SCHEDULER_CLIENT = "mtsched-harness-kube-scheduler"
APISERVER_CLIENT = "mtsched-harness-kube-apiserver"


@dataclass(frozen=True)
class CertKey:
    """A certificate and its private key, both PEM."""

    cert_pem: bytes
    key_pem: bytes


@dataclass(frozen=True)
class PkiPaths:
    """Files written by :func:`write_pki`."""

    dir: Path
    ca_crt: Path
    ca_key: Path
    apiserver_crt: Path
    apiserver_key: Path
    serving_crt: Path  # shared by webhook and extender servers
    serving_key: Path
    sa_key: Path
    sa_pub: Path
    client_crt: Path  # kube-scheduler's (and the balancer's) client certificate for the extender (mTLS)
    client_key: Path
    # kube-apiserver's client certificate for the webhooks it calls (its AdmissionConfiguration's kubeconfig)
    webhook_client_crt: Path
    webhook_client_key: Path


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _builder(subject: str, issuer: x509.Name, key: ec.EllipticCurvePrivateKey, ca: bool) -> x509.CertificateBuilder:
    """What the CA and the leaf certs share: names, key, serial, validity, basic constraints and key usage
    (signing only; a CA also signs certificates and CRLs)."""
    now = dt.datetime.now(dt.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(now + _VALIDITY)
        .add_extension(x509.BasicConstraints(ca=ca, path_length=0 if ca else None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=ca,
                crl_sign=ca,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    )


def make_ca(common_name: str = "mtsched-harness-ca") -> CertKey:
    """Self-signed ECDSA P-256 CA."""
    key = _new_key()
    cert = (
        _builder(common_name, _name(common_name), key, ca=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return CertKey(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def make_client_cert(ca: CertKey, common_name: str) -> CertKey:
    """Leaf cert with EKU clientAuth (no SANs), signed by ``ca``: a TLS client's identity."""
    return make_serving_cert(ca, common_name, ips=(), dns_names=(), usage=ExtendedKeyUsageOID.CLIENT_AUTH)


def make_serving_cert(
    ca: CertKey,
    common_name: str,
    ips: Sequence[str] = ("127.0.0.1", "::1"),
    dns_names: Sequence[str] = ("localhost",),
    usage: x509.ObjectIdentifier = ExtendedKeyUsageOID.SERVER_AUTH,
) -> CertKey:
    """Leaf cert with EKU serverAuth (or `usage`) and the given SANs, signed by ``ca``."""
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem)
    ca_key = serialization.load_pem_private_key(ca.key_pem, password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise TypeError("CA key must be ECDSA (made by make_ca)")
    key = _new_key()
    sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns_names]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
    builder = (_builder(common_name, ca_cert.subject, key, ca=False)
               .add_extension(x509.ExtendedKeyUsage([usage]), critical=False))
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    cert = (
        builder.add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    return CertKey(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def make_service_account_keys() -> tuple[bytes, bytes]:
    """(private key PEM, public key PEM) for signing/verifying service-account tokens."""
    key = _new_key()
    pub = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return _key_pem(key), pub


def _write(path: Path, data: bytes, private: bool = False) -> Path:
    path.write_bytes(data)
    if private:
        path.chmod(0o600)
    return path


def write_pki(directory: Path | str) -> PkiPaths:
    """Generate a fresh CA, apiserver cert, shared serving cert and SA keys into ``directory``."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    ca = make_ca()
    api = make_serving_cert(ca, "kube-apiserver")
    serving = make_serving_cert(ca, "mtsched-harness-serving")
    sa_key, sa_pub = make_service_account_keys()
    client = make_client_cert(ca, SCHEDULER_CLIENT)
    webhook_client = make_client_cert(ca, APISERVER_CLIENT)
    return PkiPaths(
        dir=d,
        ca_crt=_write(d / "ca.crt", ca.cert_pem),
        ca_key=_write(d / "ca.key", ca.key_pem, private=True),
        apiserver_crt=_write(d / "apiserver.crt", api.cert_pem),
        apiserver_key=_write(d / "apiserver.key", api.key_pem, private=True),
        serving_crt=_write(d / "serving.crt", serving.cert_pem),
        serving_key=_write(d / "serving.key", serving.key_pem, private=True),
        sa_key=_write(d / "sa.key", sa_key, private=True),
        sa_pub=_write(d / "sa.pub", sa_pub),
        client_crt=_write(d / "client.crt", client.cert_pem),
        client_key=_write(d / "client.key", client.key_pem, private=True),
        webhook_client_crt=_write(d / "apiserver-webhook-client.crt", webhook_client.cert_pem),
        webhook_client_key=_write(d / "apiserver-webhook-client.key", webhook_client.key_pem, private=True),
    )
