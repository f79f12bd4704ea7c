"""A role that requires its callers' client certificates (`webhookClientCAFile`, `extenderClientCAFile`) cannot take
a single call once every CA of that file is out of its validity: the TLS handshake refuses every caller's certificate
("certificate verify failed: certificate has expired", the API server sees "tls: expired certificate"), yet /readyz
said `ok` (red team, 2026-12-07). The file is read at start (docs/install.md: restart the role after rotating it), so
the role now says so on /readyz, naming the file and what to do, for as long as it lasts; /healthz stays `ok` (a
restart with the same file cures nothing), and a start with a valid CA is ready again."""

from __future__ import annotations

import asyncio
import datetime as dt
import ssl
import time
from pathlib import Path

import aiohttp
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from deploy.local.pki import CertKey, make_ca, make_client_cert, make_serving_cert
from deploy.local.processes import free_port
from deploy.local.redis import RedisServer, new_password
from shared.config import Config, load_config
from webhook.runner import run_webhook

pytestmark = pytest.mark.redis


def short_ca(seconds: float) -> CertKey:
    """A self-signed CA valid from a minute ago for `seconds` from now."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    name = x509.Name([x509.NameAttribute(x509.NameOID.COMMON_NAME, "short-lived client CA")])
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=1))
            .not_valid_after(now + dt.timedelta(seconds=seconds))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                         crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    return CertKey(cert.public_bytes(serialization.Encoding.PEM), key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))


class Role:
    """The webhook role run in this process, and what its callers see."""

    def __init__(self, cfg: Config, port: int, metrics: int, client: ssl.SSLContext) -> None:
        self.cfg, self.port, self.metrics, self.client = cfg, port, metrics, client
        self.stop = asyncio.Event()
        self.task = asyncio.create_task(run_webhook(cfg, self.stop))
        # a new connection for every call: a TLS connection kept open was verified at its handshake
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5),
                                             connector=aiohttp.TCPConnector(force_close=True))

    async def probe(self, path: str) -> tuple[int, str]:
        try:
            async with self.session.get(f"http://127.0.0.1:{self.metrics}{path}") as r:
                return r.status, await r.text()
        except aiohttp.ClientError as e:
            return 0, repr(e)

    async def call(self) -> str:
        """"" when the role answers a call with the caller's certificate, else why not."""
        try:
            async with self.session.get(f"https://127.0.0.1:{self.port}/healthz", ssl=self.client) as r:
                await r.read()
                return ""
        except (aiohttp.ClientError, ssl.SSLError, OSError, TimeoutError) as e:
            return str(e) or type(e).__name__

    async def until(self, what: str, status: int, bound: float) -> str:
        end = time.monotonic() + bound
        while True:
            got, body = await self.probe("/readyz")
            if got == status:
                return body
            assert time.monotonic() < end, f"not within {bound:.0f}s: {what}: {got} {body}"
            await asyncio.sleep(0.1)

    async def close(self) -> None:
        self.stop.set()
        await asyncio.wait_for(asyncio.gather(self.task, return_exceptions=True), 20)
        await self.session.close()


async def test_a_client_ca_out_of_its_validity_makes_the_role_unready_saying_to_rotate_it(tmp_path: Path) -> None:
    serving_ca = make_ca()
    serving = make_serving_cert(serving_ca, "webhook")
    for name, data in (("tls.crt", serving.cert_pem), ("tls.key", serving.key_pem), ("ca.crt", serving_ca.cert_pem)):
        (tmp_path / name).write_bytes(data)
    life = 6.0
    client_ca = short_ca(life)
    expires = time.time() + life
    (tmp_path / "client-ca.crt").write_bytes(client_ca.cert_pem)
    caller = make_client_cert(client_ca, "kube-apiserver")
    (tmp_path / "client.crt").write_bytes(caller.cert_pem)
    (tmp_path / "client.key").write_bytes(caller.key_pem)
    client = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))
    client.load_cert_chain(str(tmp_path / "client.crt"), str(tmp_path / "client.key"))
    server = RedisServer(password=new_password()).start()
    port, metrics = free_port(), free_port()
    flags = {"redisUrl": server.url, "tlsCertFile": str(tmp_path / "tls.crt"), "tlsKeyFile": str(tmp_path / "tls.key"),
             "webhookClientCAFile": str(tmp_path / "client-ca.crt"), "quotaCheck": False,
             "listen": f"127.0.0.1:{port}", "metricsListen": f"127.0.0.1:{metrics}"}
    role = Role(load_config(env={}, flags=flags), port, metrics, client)
    try:
        await role.until("ready", 200, 30)
        assert await role.call() == "", "the caller's certificate is taken while its CA is valid"
        await asyncio.sleep(max(0.0, expires + 1.5 - time.time()))  # (a date on the wall clock: nothing to wait on)
        refused = await role.call()
        assert refused, "a caller whose CA expired is taken"  # every caller refused: the role cannot do its job
        body = await role.until("unready once the client CA expired", 503, 2)
        assert "client-ca" in body and "client-ca.crt" in body and "expired" in body and "restart" in body, body
        assert (await role.probe("/healthz"))[0] == 200  # alive: a restart with the same file cures nothing
    finally:
        await role.close()
    renewed = make_ca("renewed client CA")  # rotated, and the role restarted
    (tmp_path / "client-ca.crt").write_bytes(renewed.cert_pem)
    again = make_client_cert(renewed, "kube-apiserver")
    (tmp_path / "client.crt").write_bytes(again.cert_pem)
    (tmp_path / "client.key").write_bytes(again.key_pem)
    client.load_cert_chain(str(tmp_path / "client.crt"), str(tmp_path / "client.key"))
    role = Role(load_config(env={}, flags=flags), port, metrics, client)
    try:
        await role.until("ready after the rotation and a restart", 200, 30)
        assert await role.call() == ""
    finally:
        await role.close()
        server.cleanup()
