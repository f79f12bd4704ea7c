"""A role whose serving certificate has expired cannot do its job: the API server (and kube-scheduler, with
`scheduler.extender.scheme: https`) refuses the handshake ("x509: certificate has expired"), so every review and
every extender call fails. Its /readyz said `ok` all along (the certificate is reloaded when its files change,
and a renewal that never came, or a renewed pair that does not load, only logged), so neither MtschedRoleNotReady
nor the runbook pointed at the certificate (red team, 2026-12-07). Now the role is unready from the moment the
certificate it serves is out of its validity, naming it, and ready again within the reload period (10 s) of valid
files, without a restart; /healthz stays `ok` (a restart cannot renew a certificate)."""

from __future__ import annotations

import asyncio
import datetime as dt
import ipaddress
import os
import ssl
import time
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from deploy.local.pki import CertKey, make_ca
from deploy.local.processes import free_port
from deploy.local.redis import RedisServer, new_password
from shared.config import load_config
from webhook.runner import run_webhook

pytestmark = pytest.mark.redis

RELOAD_SECONDS = 10.0  # shared/serving/tls.py watch_certs
MARGIN = 3.0


def _short_cert(ca: CertKey, seconds: float) -> CertKey:
    """A serving certificate for 127.0.0.1 signed by `ca`, valid from a minute ago for `seconds` from now."""
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem)
    ca_key = serialization.load_pem_private_key(ca.key_pem, password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(x509.NameOID.COMMON_NAME, "w")]))
            .issuer_name(ca_cert.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=1)).not_valid_after(now + dt.timedelta(seconds=seconds))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    return CertKey(cert.public_bytes(serialization.Encoding.PEM), key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))


def _write(paths: tuple[Path, Path], pair: CertKey) -> None:
    cert, key = paths
    for path, data in ((key, pair.key_pem), (cert, pair.cert_pem)):
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)
    bump = time.time() + 2  # a new mtime even within the file system's timestamp granularity
    os.utime(cert, (bump, bump))
    os.utime(key, (bump, bump))


async def _within(what: str, cond: Callable[[], object], bound: float) -> float:
    loop = asyncio.get_running_loop()
    start = loop.time()
    while True:
        got = cond()
        if asyncio.iscoroutine(got):
            got = await got
        if got:
            return loop.time() - start
        assert loop.time() - start < bound, f"not within {bound:.0f}s: {what}"
        await asyncio.sleep(0.1)


async def test_an_expired_serving_certificate_makes_the_role_unready_and_a_renewal_ready_again(
        tmp_path: Path) -> None:
    ca = make_ca()
    (tmp_path / "ca.crt").write_bytes(ca.cert_pem)
    paths = (tmp_path / "tls.crt", tmp_path / "tls.key")
    life = 6.0
    _write(paths, _short_cert(ca, life))
    expires = time.time() + life
    server = RedisServer(password=new_password()).start()
    port, metrics = free_port(), free_port()
    cfg = load_config(env={}, flags={"redisUrl": server.url, "tlsCertFile": str(paths[0]),
                                     "tlsKeyFile": str(paths[1]), "quotaCheck": False,
                                     "listen": f"127.0.0.1:{port}", "metricsListen": f"127.0.0.1:{metrics}"})
    client_ctx = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))
    stop = asyncio.Event()
    role = asyncio.create_task(run_webhook(cfg, stop))
    session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5))
    seen: dict[str, str] = {}

    async def probe(path: str) -> int:
        try:
            async with session.get(f"http://127.0.0.1:{metrics}{path}") as r:
                seen[path] = await r.text()
                return r.status
        except aiohttp.ClientError as e:
            seen[path] = repr(e)
            return 0

    async def handshake() -> str:
        """"" when a verifying client completes the TLS handshake with the role's API, else why not."""
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port, ssl=client_ctx), 5)
        except (ssl.SSLError, OSError, TimeoutError) as e:
            return str(e) or type(e).__name__
        writer.close()
        return ""

    try:
        await _within("ready", lambda: _ready(probe), 30)
        assert await handshake() == ""
        await _within("the certificate expired", lambda: time.time() > expires + 1.5, life + 5)
        refused = await handshake()
        assert "expired" in refused, refused  # the callers refuse it: the role cannot do its job
        await _within("unready after the certificate expired", lambda: _status(probe, 503), 2)
        assert "tls" in seen["/readyz"] and "expired" in seen["/readyz"], seen["/readyz"]
        assert await probe("/healthz") == 200  # alive: a restart would not renew it
        _write(paths, _short_cert(ca, 3600))
        took = await _within("ready again after the renewal", lambda: _status(probe, 200), RELOAD_SECONDS + MARGIN)
        assert await handshake() == "", "the renewed certificate is served"
        print(f"ready again {took:.1f}s after the renewal")
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(role, return_exceptions=True), 20)
        await session.close()
        server.cleanup()


async def _ready(probe: Callable[[str], object]) -> bool:
    return await _status(probe, 200)


async def _status(probe: Callable[[str], object], want: int) -> bool:
    got = await probe("/readyz")  # type: ignore[misc]
    return bool(got == want)
