"""Files OpenSSL serves and trusts that cryptography does not read (review of rt-ready, 2026-12-07).

The readiness checks of the serving certificate and the client CAs (shared/domain/serving_cert.py) read the files'
validity with cryptography, while the handshake uses what OpenSSL loaded. OpenSSL also reads a certificate labelled
"TRUSTED CERTIFICATE" (`openssl x509 -trustout`, the form OpenSSL's own trust stores use), as the served certificate
and as a CA; cryptography reads only "CERTIFICATE". Two defects followed:
- a serving certificate in that form, which the role served before, now stopped it at its start (cryptography's
  ValueError out of CertReloader), and a renewal to it never loaded;
- a client CA bundle rotating from an expired CA to a valid one in that form said "every CA ... has expired" while
  the handshake took the valid one's callers: every replica unready at once for a bundle that works.
Each test runs a real handshake on 127.0.0.1 to show what OpenSSL does with the same files."""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import os
import ssl
import time
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from deploy.local.pki import CertKey, make_ca, make_client_cert, make_serving_cert
from shared.config import load_config
from shared.serving.listen import webhook_policy
from shared.serving.tls import CertReloader

# OpenSSL's X509_CERT_AUX trusting the certificate for clientAuth (`openssl x509 -trustout -addtrust clientAuth`)
CLIENT_AUTH_TRUST = bytes.fromhex("300c300a06082b06010505070302")


def trusted_form(pem: bytes, aux: bytes = b"") -> bytes:
    """The same certificate as `openssl x509 -trustout` writes it: its DER, then OpenSSL's trust settings if any."""
    der = x509.load_pem_x509_certificate(pem).public_bytes(serialization.Encoding.DER) + aux
    body = base64.encodebytes(der)
    return b"-----BEGIN TRUSTED CERTIFICATE-----\n" + body + b"-----END TRUSTED CERTIFICATE-----\n"


def expired_ca() -> CertKey:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(x509.NameOID.COMMON_NAME, "retired client CA")])
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(dt.datetime(2020, 1, 1, tzinfo=dt.UTC))
            .not_valid_after(dt.datetime(2021, 1, 1, tzinfo=dt.UTC))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .sign(key, hashes.SHA256()))
    return CertKey(cert.public_bytes(serialization.Encoding.PEM), key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))


def leaf_until(ca: CertKey, not_after: dt.datetime) -> CertKey:
    """A serving certificate of `ca` valid from a minute ago until `not_after`."""
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem)
    ca_key = serialization.load_pem_private_key(ca.key_pem, password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(x509.NameOID.COMMON_NAME, "w")]))
            .issuer_name(ca_cert.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(dt.datetime.now(dt.UTC) - dt.timedelta(minutes=1)).not_valid_after(not_after)
            .sign(ca_key, hashes.SHA256()))
    return CertKey(cert.public_bytes(serialization.Encoding.PEM), key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))


async def handshake(server: ssl.SSLContext, client: ssl.SSLContext) -> str:
    """A real TLS handshake on 127.0.0.1: the subject CN the client saw."""
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"ok")
        await writer.drain()
        writer.close()

    srv = await asyncio.start_server(answer, "127.0.0.1", 0, ssl=server)
    try:
        port = srv.sockets[0].getsockname()[1]
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection("127.0.0.1", port, ssl=client, server_hostname="127.0.0.1"), 5)
        peer = writer.get_extra_info("peercert")
        assert await asyncio.wait_for(reader.read(2), 5) == b"ok"
        writer.close()
        return str(dict(kv for rdn in peer["subject"] for kv in rdn)["commonName"])
    finally:
        srv.close()
        await srv.wait_closed()


async def test_a_serving_certificate_openssl_serves_in_its_trusted_form_still_starts_and_renews(
        tmp_path: Path) -> None:
    ca = make_ca()
    first, second = make_serving_cert(ca, "first"), make_serving_cert(ca, "second")
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert.write_bytes(trusted_form(first.cert_pem) + ca.cert_pem)
    key.write_bytes(first.key_pem)
    now = [time.time()]
    # (rt-ready: ValueError, "no BEGIN CERTIFICATE/END CERTIFICATE delimiters")
    reloader = CertReloader(str(cert), str(key), clock=lambda: now[0])
    client = ssl.create_default_context(cadata=ca.cert_pem.decode())
    assert await handshake(reloader.context, client) == "first"
    assert reloader.problem() == ""
    # judged on the certificate served (the first block), not on the first block labelled CERTIFICATE (the CA's)
    served = x509.load_pem_x509_certificate(first.cert_pem)
    assert reloader.not_after == served.not_valid_after_utc.timestamp()
    now[0] = reloader.not_after + 1
    assert "expired at" in reloader.problem()
    now[0] = time.time()
    # a renewal to the same form loads too (it was refused, its error named once the first one expired)
    cert.write_bytes(trusted_form(second.cert_pem))
    key.write_bytes(second.key_pem)
    deadline = time.monotonic() + 5
    while not reloader.maybe_reload():  # (the files' mtime may not have moved yet on a coarse clock)
        assert time.monotonic() < deadline, "the renewed pair never loaded"
        (tmp_path / "tls.crt").touch()
        await asyncio.sleep(0.05)
    assert await handshake(reloader.context, client) == "second"
    assert reloader.problem() == "" and reloader.reload_error == ""


async def test_a_client_ca_bundle_whose_valid_ca_is_in_the_trusted_form_is_no_spurious_unready(
        tmp_path: Path) -> None:
    ca, old = make_ca("new client CA"), expired_ca()
    bundle = tmp_path / "client-ca.crt"
    # a rotation: the valid CA (trusted for clientAuth) and the retired one
    bundle.write_bytes(trusted_form(ca.cert_pem, CLIENT_AUTH_TRUST) + old.cert_pem)
    policy = webhook_policy(load_config(env={}, flags={"webhookClientCAFile": str(bundle),
                                                        "tlsCertFile": "/t.crt", "tlsKeyFile": "/t.key"}))
    serving = make_serving_cert(ca, "webhook")
    (tmp_path / "tls.crt").write_bytes(serving.cert_pem)
    (tmp_path / "tls.key").write_bytes(serving.key_pem)
    server = CertReloader(str(tmp_path / "tls.crt"), str(tmp_path / "tls.key")).context
    _, server_ctx = policy.apply("127.0.0.1:0", server)
    assert server_ctx is not None
    caller = make_client_cert(ca, "kube-apiserver")
    (tmp_path / "caller.crt").write_bytes(caller.cert_pem)
    (tmp_path / "caller.key").write_bytes(caller.key_pem)
    client = ssl.create_default_context(cadata=ca.cert_pem.decode())
    client.load_cert_chain(str(tmp_path / "caller.crt"), str(tmp_path / "caller.key"))
    assert await handshake(server_ctx, client) == "webhook"  # OpenSSL takes the valid CA's caller
    check = policy.client_ca_check()
    assert check is None or check() == "", check()  # said "every CA ... has expired" with rt-ready
    # and a bundle whose every CA expired, whatever its form, is still named
    bundle.write_bytes(trusted_form(old.cert_pem) + old.cert_pem)
    expired = policy.client_ca_check()
    assert expired is not None and "has expired" in expired()


def test_a_secret_volumes_atomic_swap_is_reloaded_and_the_role_ready_again(tmp_path: Path) -> None:
    """The kubelet's atomic writer (a Secret volume): tls.crt -> ..data/tls.crt, ..data -> ..<timestamp>, a renewal
    written to a new timestamped directory and ..data swapped by a rename. os.stat follows the links to the new
    files (new mtimes): the renewal is loaded and the expiry's unready ends (no finding: evidence)."""
    ca = make_ca()
    now = [time.time()]
    old = leaf_until(ca, dt.datetime.fromtimestamp(now[0] + 3600, dt.UTC))
    new = leaf_until(ca, dt.datetime.fromtimestamp(now[0] + 30 * 86400, dt.UTC))

    def publish(name: str, pair: CertKey, mtime: float) -> None:
        d = tmp_path / name
        d.mkdir()
        for file, data in (("tls.crt", pair.cert_pem), ("tls.key", pair.key_pem)):
            (d / file).write_bytes(data)
            os.utime(d / file, (mtime, mtime))
        (tmp_path / "..data_tmp").symlink_to(name)
        os.replace(tmp_path / "..data_tmp", tmp_path / "..data")

    publish("..2026_12_07_15_00_00.1", old, 1_800_000_000)
    for file in ("tls.crt", "tls.key"):
        (tmp_path / file).symlink_to(f"..data/{file}")
    reloader = CertReloader(str(tmp_path / "tls.crt"), str(tmp_path / "tls.key"), clock=lambda: now[0])
    now[0] = reloader.not_after + 1
    assert "expired at" in reloader.problem()
    publish("..2026_12_07_16_00_00.2", new, 1_800_000_060)
    assert reloader.maybe_reload()
    assert reloader.problem() == "", reloader.problem()
    assert reloader.not_after > now[0]


def test_a_renewal_that_keeps_the_old_files_mtime_is_reloaded(tmp_path: Path) -> None:
    """A renewal copied over the files with their times kept (`cp -p`, `rsync -a`, `docker cp`, an archive's
    normalized times) left the mtime the reloader compared unchanged: the renewal never loaded, and once the old
    certificate expired the role stayed unready, saying "renew it", for a certificate renewed long before. The
    files' change time (ctime), which no copy keeps, tells it."""
    ca = make_ca()
    now = [time.time()]
    old = leaf_until(ca, dt.datetime.fromtimestamp(now[0] + 3600, dt.UTC))
    new = leaf_until(ca, dt.datetime.fromtimestamp(now[0] + 30 * 86400, dt.UTC))
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    for path, data in ((cert, old.cert_pem), (key, old.key_pem)):
        path.write_bytes(data)
        os.utime(path, (1_800_000_000, 1_800_000_000))
    reloader = CertReloader(str(cert), str(key), clock=lambda: now[0])
    loaded = os.stat(cert).st_ctime_ns
    deadline = time.monotonic() + 5
    while os.stat(cert).st_ctime_ns == loaded:  # (a later tick of the file system's clock, as a renewal is)
        assert time.monotonic() < deadline
        for path, data in ((key, new.key_pem), (cert, new.cert_pem)):  # copied over, times kept
            path.write_bytes(data)
            os.utime(path, (1_800_000_000, 1_800_000_000))
    assert reloader.maybe_reload(), "the renewed pair was not loaded"
    now[0] += 2 * 3600
    assert reloader.problem() == "", reloader.problem()
    assert not reloader.maybe_reload()  # nothing changed since: no reload
