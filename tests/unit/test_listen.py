"""Who may call the extender: its default address, mutual TLS, and refusing to start unprotected.

The mTLS test runs the real serve() with the extender's routes on 127.0.0.1 over HTTPS, with a
CA, a server certificate and client certificates made here.
"""

from __future__ import annotations

import datetime as dt
import ssl
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from controller import cli
from deploy.local.pki import CertKey, make_ca, make_serving_cert
from shared.config import ConfigError, load_config
from shared.serving.http import serve
from shared.serving.listen import EXTENDER_LISTEN, WEBHOOK_LISTEN, extender_policy, is_loopback, start_problems
from tests.unit._servers import extender, extender_app
from webhook.server import CertReloader


@pytest.mark.parametrize(("host", "loopback"), [
    ("127.0.0.1", True), ("127.8.9.10", True), ("::1", True), ("0.0.0.0", False), ("::", False),
    ("10.0.0.5", False), ("localhost", False), ("", False), ("example.com", False),
])
def test_is_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


@pytest.mark.parametrize(("flags", "problem"), [
    ({}, ""),  # default: loopback
    ({"listen": "127.0.0.1:9443"}, ""),
    ({"listen": "[::1]:8443"}, ""),
    ({"listen": "0.0.0.0:8443"}, "listen '0.0.0.0:8443' is not a loopback address"),
    ({"listen": ":8443"}, "listen ':8443' is not a loopback address"),
    ({"listen": "localhost:8443"}, "is not a loopback address"),  # resolves through files we do not control
    ({"listen": "10.1.2.3:8443", "tlsCertFile": "c", "tlsKeyFile": "k", "extenderClientCAFile": "ca"}, ""),
    ({"listen": "10.1.2.3:8443", "extenderAllowUnauthenticated": "true"}, ""),
])
def test_extender_start_problems(flags: dict[str, object], problem: str) -> None:
    cfg = load_config(env={}, flags=flags)
    out = start_problems(cfg, "extender")
    if not problem:
        assert out == []
    else:
        assert len(out) == 1 and problem in out[0] and "extenderClientCAFile" in out[0]


def test_defaults_per_role() -> None:
    cfg = load_config(env={}, flags={})
    assert cfg.listen == "" and extender_policy(cfg).address(cfg.listen) == EXTENDER_LISTEN == "127.0.0.1:8443"
    assert start_problems(cfg, "webhook") == [] and WEBHOOK_LISTEN == "0.0.0.0:8443"
    assert start_problems(load_config(env={}, flags={"listen": "0.0.0.0:1"}), "webhook") == []
    assert start_problems(load_config(env={}, flags={"listen": "0.0.0.0:1"}), "watcher") == []


def test_client_ca_needs_a_serving_certificate() -> None:
    with pytest.raises(ConfigError, match="extenderClientCAFile needs tlsCertFile and tlsKeyFile"):
        load_config(env={}, flags={"extenderClientCAFile": "/ca.crt"})


def test_cli_refuses_to_start_an_unprotected_public_extender(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["extender", "--set", "listen=0.0.0.0:8443", "--log-format", "text"]) == 2
    assert "is not a loopback address" in capsys.readouterr().err


async def test_serve_refuses_before_opening_the_port() -> None:
    cfg = load_config(env={}, flags={"listen": "0.0.0.0:0"})
    with pytest.raises(ConfigError, match="is not a loopback address"):
        await serve(extender_app(extender(cfg)), cfg.listen, None)


# --- mutual TLS, for real ---------------------------------------------------------------------------


def client_cert(ca: CertKey, name: str) -> CertKey:
    """A leaf for TLS client authentication (EKU clientAuth), signed by `ca`."""
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem)
    ca_key = serialization.load_pem_private_key(ca.key_pem, password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(ca_cert.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return CertKey(cert.public_bytes(serialization.Encoding.PEM), key_pem)


def write(tmp: Path, name: str, ck: CertKey) -> tuple[str, str]:
    (tmp / f"{name}.crt").write_bytes(ck.cert_pem)
    (tmp / f"{name}.key").write_bytes(ck.key_pem)
    return str(tmp / f"{name}.crt"), str(tmp / f"{name}.key")


async def call(url: str, ca: str, cert: tuple[str, str] | None) -> int:
    ctx = ssl.create_default_context(cafile=ca)
    if cert:
        ctx.load_cert_chain(*cert)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s, \
            s.get(f"{url}/readyz", ssl=ctx) as resp:
        return resp.status


async def test_mutual_tls_refuses_callers_without_a_certificate_from_the_client_ca(tmp_path: Path) -> None:
    ca, rogue_ca = make_ca("clients-and-server"), make_ca("someone-else")
    server = write(tmp_path, "server", make_serving_cert(ca, "extender"))
    (tmp_path / "ca.crt").write_bytes(ca.cert_pem)
    ca_file = str(tmp_path / "ca.crt")
    scheduler = write(tmp_path, "scheduler", client_cert(ca, "kube-scheduler"))
    stranger = write(tmp_path, "stranger", client_cert(rogue_ca, "kube-scheduler"))
    # on 127.0.0.1 (a test opens no public port): with a client CA set, every caller needs a certificate
    cfg = load_config(env={}, flags={"listen": "127.0.0.1:0", "tlsCertFile": server[0], "tlsKeyFile": server[1],
                                     "extenderClientCAFile": ca_file})
    reloader = CertReloader(cfg.tls_cert_file, cfg.tls_key_file)
    runner = await serve(extender_app(extender(cfg)), cfg.listen, reloader.context)
    try:
        port = runner.addresses[0][1]
        url = f"https://127.0.0.1:{port}"
        assert reloader.context.verify_mode == ssl.CERT_REQUIRED
        assert await call(url, ca_file, scheduler) == 200
        refused: list[Any] = []
        for cert in (None, stranger):
            with pytest.raises((aiohttp.ClientError, ssl.SSLError, ConnectionError)) as e:
                await call(url, ca_file, cert)
            refused.append(e.value)
        assert len(refused) == 2
        assert await call(url, ca_file, scheduler) == 200  # the server still serves after refusing
    finally:
        await runner.cleanup()


async def test_without_client_ca_the_server_asks_no_certificate(tmp_path: Path) -> None:
    ca = make_ca()
    server = write(tmp_path, "server", make_serving_cert(ca, "extender"))
    (tmp_path / "ca.crt").write_bytes(ca.cert_pem)
    cfg = load_config(env={}, flags={"listen": "127.0.0.1:0", "tlsCertFile": server[0], "tlsKeyFile": server[1]})
    reloader = CertReloader(cfg.tls_cert_file, cfg.tls_key_file)
    runner = await serve(extender_app(extender(cfg)), cfg.listen, reloader.context)
    try:
        assert reloader.context.verify_mode == ssl.CERT_NONE
        assert await call(f"https://127.0.0.1:{runner.addresses[0][1]}", str(tmp_path / "ca.crt"), None) == 200
    finally:
        await runner.cleanup()

