"""Redis with AUTH and TLS, on real redis-servers started here (issue 11 item 2).

The roles' own path is exercised: load_config (file, environment) -> RedisOptions.from_config ->
connect / connect_subscriber -> the Ledger's scripts and a Mirror on the feed, as controller.roles
does it. Certificates are made by the test (deploy/local/pki.py); redis-server serves TLS only.
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest
from redis import exceptions as rexc

from deploy.local.pki import CertKey, make_ca, make_client_cert, make_serving_cert
from deploy.local.redis import ClusterSetup, RedisServer, SentinelSetup, ServerTLS, new_password
from shared.config import Config, ConfigError, load_config, without_password
from shared.serving.supervise import Supervisor
from shared.store.ledger import Ledger, RedisOptions, connect, connect_subscriber, explain
from shared.store.mirror import Mirror
from shared.store.session import open_ledger
from tests.redis.helpers import S4000, inventory

pytestmark = pytest.mark.redis

ROOT = Path(__file__).resolve().parents[2]


def _config(url: str, env: Mapping[str, str] | None = None, **flags: object) -> Config:
    return load_config(env=dict(env or {}), flags={"redisUrl": url, **flags})


async def _round_trip(cfg: Config) -> None:
    """What a role does with Redis: scripts, a booking, and a mirror that hears of it on the feed."""
    options = RedisOptions.from_config(cfg)
    prefix = f"t{uuid.uuid4().hex[:8]}"
    client, sub = connect(cfg.redis_url, options), connect_subscriber(cfg.redis_url, options)
    mirror = Mirror(Ledger(client, prefix), subscriber=sub)
    try:
        ledger = mirror.ledger
        await ledger.load_scripts()
        await mirror.start()
        await asyncio.wait_for(mirror.ready.wait(), 10)
        await ledger.upsert_node(inventory("n4", S4000))
        assert (await ledger.reserve("n4", "u1", [0], 8, 2, 1, pod="ns/p"))[0].ok
        for _ in range(200):  # bounded: the feed delivers within milliseconds
            snap = mirror.get("n4")
            if snap is not None and "u1" in snap.reservations:
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the mirror never heard of the booking")
    finally:
        await mirror.stop()
        await client.aclose()
        await sub.aclose()


async def _refusal(cfg: Config) -> BaseException:
    client = connect(cfg.redis_url, RedisOptions.from_config(cfg))
    try:
        # AuthenticationError and TLS failures alike (RedisCluster's own exception is no RedisError)
        with pytest.raises((rexc.RedisError, rexc.RedisClusterException)) as err:
            await Ledger(client).load_scripts()
        return err.value
    finally:
        await client.aclose()


# ------------------------------------------------------------------------------------------ AUTH
@pytest.fixture(scope="module")
def auth_server() -> Iterator[RedisServer]:
    server = RedisServer(password=new_password()).start()
    yield server
    server.cleanup()


def _plain(server: RedisServer) -> str:
    return f"redis://127.0.0.1:{server.port}/0"


def _password_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "password"
    path.write_text(text)
    path.chmod(0o600)
    return path


async def test_password_from_a_file(auth_server: RedisServer, tmp_path: Path) -> None:
    # a Secret created with `echo pw > f` ends with a newline that is no part of the password
    path = _password_file(tmp_path, f"{auth_server.password}\n")
    await _round_trip(_config(_plain(auth_server), redisPasswordFile=str(path)))


async def test_password_from_the_environment(auth_server: RedisServer) -> None:
    assert auth_server.password
    await _round_trip(_config(_plain(auth_server), env={"MTSCHED_REDIS_PASSWORD": auth_server.password}))


async def test_password_reaches_a_unix_socket(tmp_path: Path) -> None:
    sock = tmp_path / "redis.sock"
    server = RedisServer(password=new_password(), args=["--unixsocket", str(sock), "--unixsocketperm", "700"])
    server.start()
    try:
        assert server.password
        await _round_trip(_config(f"unix://{sock}?db=0", env={"MTSCHED_REDIS_PASSWORD": server.password}))
    finally:
        server.cleanup()


@pytest.mark.redis_ha
@pytest.mark.parametrize("kind", ["sentinel", "cluster"])
async def test_password_reaches_sentinel_and_cluster(kind: str) -> None:
    """redis+sentinel:// (the sentinels require it too) and redis+cluster:// (the ledger's client and
    the feed's subscriber), with the password from the environment and none in the URL."""
    password = new_password()
    setup: SentinelSetup | ClusterSetup = (SentinelSetup(password=password, replicas=0, sentinels=1)
                                           if kind == "sentinel" else ClusterSetup(masters=1, password=password))
    await asyncio.to_thread(setup.start)
    try:
        url = without_password(setup.url)
        assert password not in url
        await _round_trip(_config(url, env={"MTSCHED_REDIS_PASSWORD": password}))
        error = await _refusal(_config(url))
        assert ("the sentinels refused the credentials" if kind == "sentinel"
                else "requires a password and none was given") in explain(error)
    finally:
        await asyncio.to_thread(setup.cleanup)


async def test_refused_without_a_password(auth_server: RedisServer) -> None:
    error = await _refusal(_config(_plain(auth_server)))
    assert isinstance(error, rexc.AuthenticationError)
    assert "requires a password and none was given" in explain(error)
    assert "redisPasswordFile" in explain(error)



async def test_a_large_command_without_a_password_is_explained(auth_server: RedisServer) -> None:
    """Redis refuses a large command (over 16 KB, as every script is) of a client that has not authenticated
    with a protocol error instead of NOAUTH, and redis-py 7 sends it first (8 authenticated on connect):
    the message still names the missing password."""
    client = connect(_plain(auth_server))
    try:
        with pytest.raises(rexc.RedisError) as err:
            await client.execute_command("SCRIPT", "LOAD", "return '" + "x" * 20_000 + "'")
        assert "requires a password and none was given" in explain(err.value), err.value
    finally:
        await client.aclose()

async def test_refused_with_a_wrong_password(auth_server: RedisServer, tmp_path: Path) -> None:
    path = _password_file(tmp_path, "not-the-password")
    error = await _refusal(_config(_plain(auth_server), redisPasswordFile=str(path)))
    assert isinstance(error, rexc.AuthenticationError)
    assert "refused the password" in explain(error)
    assert "not-the-password" not in explain(error)


def test_password_mistakes_stop_the_start(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="carries a password and redisPassword or redisPasswordFile"):
        _config("redis://:inurl@127.0.0.1:1/0", env={"MTSCHED_REDIS_PASSWORD": "pw"})
    with pytest.raises(ConfigError, match="both set"):
        _config("redis://127.0.0.1:1/0", env={"MTSCHED_REDIS_PASSWORD": "pw"}, redisPasswordFile="/x")
    with pytest.raises(ConfigError) as err:  # the error message redacts the URL
        _config("http://:topsecret@127.0.0.1:1/0")
    assert "topsecret" not in str(err.value) and "***" in str(err.value)
    for text, why in (("", "is empty"), (None, "cannot read")):
        path = tmp_path / "missing"
        if text is not None:
            path = _password_file(tmp_path, text)
        cfg = _config("redis://127.0.0.1:1/0", redisPasswordFile=str(path))
        with pytest.raises(ConfigError, match=why):
            RedisOptions.from_config(cfg)


async def test_the_role_logs_no_password(auth_server: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    """controller.roles retries an unreachable Redis and says why, with the URL redacted."""
    secret = "wrong-" + new_password()
    cfg = _config(f"redis://:{secret}@127.0.0.1:{auth_server.port}/0")
    caplog.set_level(logging.WARNING, logger="mtsched")
    task = asyncio.create_task(open_ledger(cfg, Supervisor()))
    try:
        for _ in range(200):
            if any("not reachable" in r.getMessage() for r in caplog.records):
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the role logged no retry")
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    lines = [r.getMessage() for r in caplog.records]
    assert not any(secret in line for line in lines), lines
    line = next(line for line in lines if "not reachable" in line)
    assert f"redis://:***@127.0.0.1:{auth_server.port}/0" in line and "refused the password" in line


async def test_the_role_connects_with_its_password_file(auth_server: RedisServer, tmp_path: Path) -> None:
    path = _password_file(tmp_path, str(auth_server.password))
    sup = Supervisor()
    ledger, mirror = await asyncio.wait_for(
        open_ledger(_config(_plain(auth_server), redisPasswordFile=str(path)), sup), 10)
    try:
        await asyncio.wait_for(mirror.ready.wait(), 10)
    finally:
        await sup.cancel()
        await ledger.redis.aclose()
        await mirror.subscriber.aclose()


def test_check_config_prints_no_password(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MTSCHED_")}
    for sets, secret in ((["--set", "redisUrl=redis://u:s3cr3t-url@h:1/0"], "s3cr3t-url"),
                         (["--set", "redisPassword=s3cr3t-key"], "s3cr3t-key")):
        proc = subprocess.run([sys.executable, "-m", "controller.cli", "check-config", *sets], cwd=ROOT,
                              env=env, capture_output=True, text=True, check=False, timeout=60)
        assert proc.returncode == 0, proc.stderr
        assert secret not in proc.stdout and "***" in proc.stdout


# ------------------------------------------------------------------------------------------- TLS
@dataclass(frozen=True)
class Pki:
    dir: Path
    ca: Path
    ca_pem: str
    other_ca: Path  # a CA that signed nothing of this server's
    client_crt: Path
    client_key: Path
    stranger_crt: Path  # a client certificate of the other CA
    stranger_key: Path
    tls: ServerTLS


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    d = tmp_path_factory.mktemp("redis-pki")
    ca, other = make_ca("redis-test-ca"), make_ca("someone-elses-ca")
    server = make_serving_cert(ca, "redis")
    client, stranger = make_client_cert(ca, "mtsched"), make_client_cert(other, "mtsched")

    def put(name: str, pair: CertKey) -> tuple[Path, Path]:
        crt, key = d / f"{name}.crt", d / f"{name}.key"
        crt.write_bytes(pair.cert_pem)
        key.write_bytes(pair.key_pem)
        key.chmod(0o600)
        return crt, key

    ca_crt, _ = put("ca", ca)
    other_crt, _ = put("other-ca", other)
    server_crt, server_key = put("server", server)
    client_crt, client_key = put("client", client)
    stranger_crt, stranger_key = put("stranger", stranger)
    return Pki(d, ca_crt, ca.cert_pem.decode(), other_crt, client_crt, client_key, stranger_crt, stranger_key,
               ServerTLS(server_crt, server_key, ca_crt, client_cert_file=client_crt, client_key_file=client_key))


def _start_tls(server: RedisServer) -> RedisServer:
    try:
        return server.start()
    except RuntimeError:
        log = (server.workdir / "redis.log").read_text(errors="replace")
        server.cleanup()
        if "tls" in log.lower() and ("bad directive" in log.lower() or "not supported" in log.lower()):
            pytest.skip("this redis-server was built without TLS (BUILD_TLS=no): " + log.strip().splitlines()[-1])
        raise


@pytest.fixture(scope="module")
def tls_server(pki: Pki) -> Iterator[RedisServer]:
    server = _start_tls(RedisServer(password=new_password(), tls=pki.tls))
    yield server
    server.cleanup()


@pytest.fixture(scope="module")
def mtls_server(pki: Pki) -> Iterator[RedisServer]:
    """--tls-auth-clients yes: only clients with a certificate of the CA get a connection."""
    tls = ServerTLS(pki.tls.cert_file, pki.tls.key_file, pki.ca, auth_clients=True,
                    client_cert_file=pki.client_crt, client_key_file=pki.client_key)
    server = _start_tls(RedisServer(password=new_password(), tls=tls))
    yield server
    server.cleanup()


def _tls_url(server: RedisServer) -> str:
    return f"rediss://127.0.0.1:{server.port}/0"


@pytest.fixture
def pw_env(tls_server: RedisServer) -> dict[str, str]:
    return {"MTSCHED_REDIS_PASSWORD": str(tls_server.password)}


async def test_tls_with_the_ca_file(tls_server: RedisServer, pki: Pki, pw_env: dict[str, str]) -> None:
    await _round_trip(_config(_tls_url(tls_server), env=pw_env, redisCAFile=str(pki.ca)))


async def test_tls_with_the_ca_from_the_environment(tls_server: RedisServer, pki: Pki,
                                                    pw_env: dict[str, str]) -> None:
    """What the chart does: the CA's PEM in MTSCHED_REDIS_CA (from a Secret)."""
    await _round_trip(_config(_tls_url(tls_server), env={**pw_env, "MTSCHED_REDIS_CA": pki.ca_pem}))


async def test_tls_refused_without_the_ca(tls_server: RedisServer, pki: Pki, pw_env: dict[str, str]) -> None:
    for flags in ({}, {"redisCAFile": str(pki.other_ca)}):
        error = await _refusal(_config(_tls_url(tls_server), env=pw_env, **flags))
        assert "certificate verify failed" in str(error), error
        assert "set redisCAFile" in explain(error)


async def test_tls_still_needs_the_password(tls_server: RedisServer, pki: Pki) -> None:
    error = await _refusal(_config(_tls_url(tls_server), redisCAFile=str(pki.ca)))
    assert isinstance(error, rexc.AuthenticationError)


async def test_tls_client_certificate(mtls_server: RedisServer, pki: Pki) -> None:
    env = {"MTSCHED_REDIS_PASSWORD": str(mtls_server.password)}
    url = _tls_url(mtls_server)
    # no certificate, or one of another CA: the server ends the handshake
    for flags in ({}, {"redisCertFile": str(pki.stranger_crt), "redisKeyFile": str(pki.stranger_key)}):
        error = await _refusal(_config(url, env=env, redisCAFile=str(pki.ca), **flags))
        assert not isinstance(error, rexc.AuthenticationError), error
    await _round_trip(_config(url, env=env, redisCAFile=str(pki.ca), redisCertFile=str(pki.client_crt),
                              redisKeyFile=str(pki.client_key)))


def test_tls_settings_need_rediss(pki: Pki) -> None:
    for flags in ({"redisCAFile": str(pki.ca)}, {"redisCA": pki.ca_pem},
                  {"redisCertFile": str(pki.client_crt), "redisKeyFile": str(pki.client_key)}):
        for url in ("redis://127.0.0.1:1/0", "redis+sentinel://127.0.0.1:1/m", "redis+cluster://127.0.0.1:1"):
            with pytest.raises(ConfigError, match="need a rediss:// redisUrl"):
                load_config(env={}, flags={"redisUrl": url, **flags})
    with pytest.raises(ConfigError, match="together"):
        _config("rediss://127.0.0.1:1/0", redisCertFile=str(pki.client_crt))
    with pytest.raises(ConfigError, match="give the CA one way"):
        _config("rediss://127.0.0.1:1/0", redisCAFile=str(pki.ca), redisCA=pki.ca_pem)
    with pytest.raises(ValueError, match="rediss://"):
        connect("redis://127.0.0.1:1/0", RedisOptions(ca_file=str(pki.ca)))
