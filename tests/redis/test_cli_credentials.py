"""`mtsched cards` / `explain` against a real Redis that requires a password, given none or a wrong one: said at once,
naming the URL (the flag or the setting it came from) and every way to give the password, exit 2. Before, the ledger
sent the read again for ~4 s (sending again cannot cure a refusal), printing a warning line a second, and then said
only `AuthenticationError: Authentication required.` (new-user test). The roles keep trying, as before
(tests/redis/test_trust_redis.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from controller import cli
from deploy.local.redis import RedisServer, new_password
from shared.serving.metrics import REDIS_RESENDS, REDIS_ROUND_TRIPS

pytestmark = pytest.mark.redis

WAYS = ("redisPasswordFile", "MTSCHED_REDIS_PASSWORD", "redis://:PASSWORD@host")


@pytest.fixture(scope="module")
def auth_server() -> Iterator[RedisServer]:
    server = RedisServer(password=new_password()).start()  # requirepass
    yield server
    server.cleanup()


@pytest.fixture(autouse=True)
def _no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("MTSCHED_CONFIG", "MTSCHED_REDIS_URL", "MTSCHED_REDIS_PASSWORD", "MTSCHED_REDIS_PASSWORD_FILE"):
        monkeypatch.delenv(name, raising=False)


def _counted(metric: object) -> float:
    return sum(s.value for m in metric.collect() for s in m.samples  # type: ignore[attr-defined]
               if s.name.endswith("_total"))


class _Attempts:
    """What one command cost the server and the ledger: connections the server accepted, PINGs sent, resends."""

    def __init__(self, server: RedisServer):
        self.admin = redis.Redis(host="127.0.0.1", port=server.port, password=server.password)

    def read(self) -> tuple[int, float, float]:
        return (int(self.admin.info("stats")["total_connections_received"]),
                REDIS_ROUND_TRIPS.labels("ping")._value.get(), _counted(REDIS_RESENDS))

    def __enter__(self) -> _Attempts:
        self.before = self.read()
        return self

    def __exit__(self, *exc: object) -> None:
        after = self.read()
        self.admin.close()
        # one connection (the admin's own is pooled, made before), one PING, nothing sent again
        self.delta = (after[0] - self.before[0], after[1] - self.before[1], after[2] - self.before[2])


def _plain(server: RedisServer) -> str:
    return f"redis://127.0.0.1:{server.port}/0"


@pytest.mark.parametrize("how", ["--redis-url", "--set"])
def test_cards_without_the_password(how: str, auth_server: RedisServer, capsys: pytest.CaptureFixture[str]) -> None:
    url = _plain(auth_server)
    given = ["--redis-url", url] if how == "--redis-url" else ["--set", f"redisUrl={url}"]
    with _Attempts(auth_server) as attempts:
        assert cli.main(["cards", *given, "--log-format", "text"]) == 2
    assert attempts.delta == (1, 1, 0), attempts.delta
    err = capsys.readouterr().err
    assert "Traceback" not in err and "sending again" not in err, err
    assert len(err.strip().splitlines()) == 1, err
    source = "--redis-url" if how == "--redis-url" else "redisUrl"
    assert err.startswith(f"mtsched cards: {source} {url}: Redis requires a password and none was given"), err
    for way in WAYS:
        assert way in err, err


def test_cards_with_a_wrong_password(auth_server: RedisServer, capsys: pytest.CaptureFixture[str],
                                     tmp_path: Path) -> None:
    path = tmp_path / "password"
    path.write_text("not-the-password\n")
    with _Attempts(auth_server) as attempts:
        assert cli.main(["cards", "--redis-url", _plain(auth_server), "--set", f"redisPasswordFile={path}",
                         "--log-format", "text"]) == 2
    assert attempts.delta == (1, 1, 0), attempts.delta
    err = capsys.readouterr().err
    assert err.startswith(f"mtsched cards: --redis-url {_plain(auth_server)}: Redis refused the password"), err
    assert "redisPasswordFile" in err and "not-the-password" not in err


def test_a_password_in_the_url_is_never_said(auth_server: RedisServer, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"redis://:not-the-password@127.0.0.1:{auth_server.port}/0"
    assert cli.main(["cards", "--redis-url", url, "--log-format", "text"]) == 2
    err = capsys.readouterr().err
    assert f"--redis-url redis://:***@127.0.0.1:{auth_server.port}/0: Redis refused the password" in err, err
    assert "not-the-password" not in err


def test_explain_without_the_password(auth_server: RedisServer, capsys: pytest.CaptureFixture[str],
                                      tmp_path: Path) -> None:
    # a kubeconfig that loads: nothing is asked of its API server before Redis is read, which refuses
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: k, cluster: {server: 'https://127.0.0.1:1'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\n")
    with _Attempts(auth_server) as attempts:
        assert cli.main(["explain", "ns/p", "--kubeconfig", str(kubeconfig), "--redis-url", _plain(auth_server),
                         "--log-format", "text"]) == 2
    assert attempts.delta == (1, 1, 0), attempts.delta
    err = capsys.readouterr().err
    assert err.startswith(f"mtsched explain: --redis-url {_plain(auth_server)}: Redis requires a password"), err
    for way in WAYS:
        assert way in err, err


def test_cards_with_the_password_still_work(auth_server: RedisServer, capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    assert auth_server.password
    monkeypatch.setenv("MTSCHED_REDIS_PASSWORD", auth_server.password)
    assert cli.main(["cards", "--redis-url", _plain(auth_server), "--log-format", "text"]) == 0
    assert "no sliced Moore Threads cards in the ledger" in capsys.readouterr().out  # (a flushed server's)


def test_a_user_the_acl_denies_is_said_so(auth_server: RedisServer, capsys: pytest.CaptureFixture[str]) -> None:
    """An ACL user that may not run what the roles need (here PING) is a mistake in what the command was given:
    exit 2 naming the user's URL and what to grant, not exit 1 with redis-py's bare NoPermissionError."""
    admin = redis.Redis(host="127.0.0.1", port=auth_server.port, password=auth_server.password)
    admin.acl_setuser("noping", enabled=True, passwords=["+secret-pw"], keys=["*"], channels=["*"],
                      commands=["+@all", "-ping"])
    admin.close()
    url = f"redis://noping:secret-pw@127.0.0.1:{auth_server.port}/0"
    assert cli.main(["cards", "--redis-url", url, "--log-format", "text"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "secret-pw" not in err, err
    assert err.startswith(f"mtsched cards: --redis-url redis://noping:***@127.0.0.1:{auth_server.port}/0: "
                          "ping: the Redis user may not do what the roles need"), err  # the round trip refused
    assert "'ping'" in err, err
