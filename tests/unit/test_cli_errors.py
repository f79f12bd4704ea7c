"""`mtsched cards` / `explain` say in one line what is wrong with what they were given, naming the flag or setting, its
value and what to do, with no traceback (new-user test): a `--redis-url` of another scheme passed redis-py's own
words through (which name neither the flag nor the value, nor redis+sentinel:// and redis+cluster://); a kubeconfig
that does not exist or is garbage gave kubernetes-asyncio's "Expected key current-context"; Redis refusing the
credentials was sent again for seconds before it was said (tests/redis/test_cli_credentials.py, on a real server)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from redis import exceptions as rexc
from redis.asyncio import Redis

from controller import cli
from shared.config import ConfigError, load_config
from shared.store.ledger import Ledger
from shared.store.redis_conn import credentials_refused, explain

FIX = "give --kubeconfig FILE (or set KUBECONFIG)"


def _err(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return err


@pytest.fixture(autouse=True)
def _no_kube_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "MTSCHED_CONFIG", "MTSCHED_REDIS_URL", "MTSCHED_KUBECONFIG",
                 "MTSCHED_REDIS_PASSWORD"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.kube/config


# ------------------------------------------------------------------------------------------ --redis-url's scheme
@pytest.mark.parametrize("cmd", [["cards"], ["explain", "ns/p"]])
def test_a_redis_url_of_another_scheme_names_the_flag_the_value_and_every_scheme(
        cmd: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([*cmd, "--redis-url", "http://127.0.0.1:1", "--log-format", "text"]) == 2
    err = _err(capsys)
    assert err.startswith(f"mtsched {cmd[0]}: --redis-url sets redisUrl; "), err
    # the configuration's own rule, word for word as `--set redisUrl=` and check-config say it
    with pytest.raises(ConfigError) as rule:
        load_config(env={}, flags={"redisUrl": "http://127.0.0.1:1"})
    line = str(rule.value).splitlines()[-1].strip()
    assert line == ("- redisUrl: 'http://127.0.0.1:1' must start with redis://, rediss://, unix://, "
                    "redis+sentinel:// or redis+cluster://"), line
    assert line in err, err
    assert "Redis URL must specify" not in err  # redis-py's words, which omit two of the forms


def test_the_same_rule_as_check_config(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["check-config", "--set", "redisUrl=http://x"]) == 2
    said = _err(capsys).splitlines()[-1]
    assert cli.main(["cards", "--redis-url", "http://x"]) == 2
    assert said in _err(capsys)


def test_a_redis_url_that_cannot_be_connected_names_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["cards", "--redis-url", "redis+sentinel://:secret@127.0.0.1:1", "--log-format", "text"]) == 2
    err = _err(capsys)
    assert "--redis-url redis+sentinel://:***@127.0.0.1:1: " in err and "service name" in err, err
    assert "secret" not in err


def test_a_good_redis_url_flag_wins_over_the_configured_one(capsys: pytest.CaptureFixture[str],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MTSCHED_REDIS_URL", "http://bad")  # the flag replaces it: not checked
    assert cli.main(["cards", "--redis-url", "redis+sentinel://127.0.0.1:1", "--log-format", "text"]) == 2
    assert "service name" in _err(capsys)  # got as far as connecting with the flag's URL


# ------------------------------------------------------------------------------------------ kubeconfig
def _explain(capsys: pytest.CaptureFixture[str], *extra: str) -> str:
    # a Redis URL nothing listens on: the kubeconfig is checked first, so it is never reached
    assert cli.main(["explain", "ns/p", "--redis-url", "redis://127.0.0.1:1/0", "--log-format", "text",
                     *extra]) == 2
    err = _err(capsys)
    assert len(err.strip().splitlines()) == 1, err  # one line: no warning of the loader, no resend of the ledger
    return err


def test_a_kubeconfig_that_does_not_exist(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    missing = tmp_path / "nonexistent"
    err = _explain(capsys, "--kubeconfig", str(missing))
    assert err.startswith(f"mtsched explain: --kubeconfig {missing}: no such file; {FIX}"), err
    assert "current-context" not in err


def test_a_kubeconfig_from_the_environment_or_the_default_is_named_so(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home" / ".kube" / "config"
    assert f"the default kubeconfig {home}: no such file" in _explain(capsys)
    monkeypatch.setenv("KUBECONFIG", f"{tmp_path / 'a'}{os.pathsep}{tmp_path / 'b'}")
    assert f"$KUBECONFIG's {tmp_path / 'a'}: no such file" in _explain(capsys)
    monkeypatch.setenv("MTSCHED_KUBECONFIG", str(tmp_path / "c"))
    assert f"the kubeconfig setting {tmp_path / 'c'}: no such file" in _explain(capsys)


@pytest.mark.parametrize(("content", "problem"), [
    (b"", "not a kubeconfig (empty)"),
    (b"clusters: [\n", "not a kubeconfig (not YAML: expected the node content"),
    (b"- a\n- b\n", "not a kubeconfig (not a YAML mapping)"),
    (b"just words\n", "not a kubeconfig (not a YAML mapping)"),
    (bytes(range(128, 256)), "not a kubeconfig (not text)"),
    (b"apiVersion: v1\nkind: Config\n", "cannot be loaded (ConfigException: Invalid kube-config file. Expected key "
                                        "current-context"),
    (b"current-context: x\ncontexts: 5\n", "cannot be loaded (TypeError: "),
])
def test_a_garbage_kubeconfig(content: bytes, problem: str, capsys: pytest.CaptureFixture[str],
                              tmp_path: Path) -> None:
    path = tmp_path / "kubeconfig"
    path.write_bytes(content)
    err = _explain(capsys, "--kubeconfig", str(path))
    assert err.startswith(f"mtsched explain: --kubeconfig {path}: {problem}"), err
    assert FIX in err


def test_a_kubeconfig_that_is_a_directory(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    err = _explain(capsys, "--kubeconfig", str(tmp_path))
    assert err.startswith(f"mtsched explain: --kubeconfig {tmp_path}: a directory, not a file; {FIX}"), err


def test_an_unreadable_kubeconfig(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text("apiVersion: v1\n")
    read = Path.read_text

    def denied(self: Path, *args: object, **kwargs: object) -> str:
        if self == path:  # mode 000 stops no root (the tests may run as root): its error, as a user gets it
            raise PermissionError(13, "Permission denied", str(self))
        return read(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "read_text", denied)
    err = _explain(capsys, "--kubeconfig", str(path))
    assert err.startswith(f"mtsched explain: --kubeconfig {path}: cannot be read (Permission denied); {FIX}"), err


# ------------------------------------------------------------------------------------------ credentials refused
def test_refused_credentials_are_explained_with_every_way_to_give_the_password() -> None:
    none = rexc.AuthenticationError("Authentication required.")
    assert credentials_refused(none)
    said = explain(none)
    assert "requires a password and none was given" in said
    for way in ("redisPasswordFile", "MTSCHED_REDIS_PASSWORD", "redis://:PASSWORD@host"):
        assert way in said, said
    wrong = rexc.AuthenticationError("invalid username-password pair or user is disabled.")
    assert credentials_refused(wrong) and "refused the password" in explain(wrong)
    assert not credentials_refused(rexc.ConnectionError("Error 111 connecting to 127.0.0.1:1."))
    assert not credentials_refused(rexc.TimeoutError("Timeout reading from socket"))


class _CountedPing:
    def __init__(self, error: BaseException):
        self.error = error
        self.calls = 0

    async def __call__(self) -> bool:
        self.calls += 1
        raise self.error


async def test_a_ping_that_may_give_up_is_not_sent_again_on_refused_credentials() -> None:
    client = Redis.from_url("redis://127.0.0.1:1/0")
    ledger = Ledger(client)
    ledger.retry_seconds = 0.0  # the resends that are due, without their seconds
    try:
        refused = _CountedPing(rexc.AuthenticationError("Authentication required."))
        client.ping = refused  # type: ignore[method-assign]
        with pytest.raises(rexc.AuthenticationError):
            await ledger.ping(give_up=credentials_refused)
        assert refused.calls == 1
        # the roles' rule is unchanged: without give_up every connection error is sent again, a refusal too
        with pytest.raises(rexc.AuthenticationError):
            await ledger.ping()
        assert refused.calls == 1 + 1 + ledger.connection_retries
        # and the one-shot commands still send again what may cure itself (a restart, a failover)
        lost = _CountedPing(rexc.ConnectionError("Connection reset by peer"))
        client.ping = lost  # type: ignore[method-assign]
        with pytest.raises(rexc.ConnectionError):
            await ledger.ping(give_up=credentials_refused)
        assert lost.calls == 1 + ledger.connection_retries
    finally:
        await client.aclose()


# ------------------------------------------------------------------------------------------ from the review
def test_a_password_given_to_a_redis_without_one_is_not_called_missing() -> None:
    """redis-py's words when the server has no password: they were read as "none was given"."""
    unneeded = rexc.AuthenticationError("AUTH <password> called without any password configured for the default "
                                        "user. Are you sure your configuration is correct?")
    assert credentials_refused(unneeded)
    said = explain(unneeded)
    assert "a password was given but this Redis has none" in said and "none was given" not in said, said


def test_a_mistake_in_the_config_file_is_not_blamed_on_the_redis_url_flag(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("memoryPerCard: abc\n")
    assert cli.main(["cards", "--config", str(bad), "--redis-url", "redis://127.0.0.1:1/0"]) == 2
    err = _err(capsys)
    assert "'abc' is not a whole number" in err and "--redis-url" not in err, err


def test_a_kubeconfig_under_home_is_read_as_the_loader_reads_it(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """`~` is the home directory for kubernetes-asyncio's loader: `kubeconfig: ~/.kube/config` loaded before the
    check was added, and must still pass it; several files joined as in $KUBECONFIG are left to the loader."""
    home = tmp_path / "home"
    (home / "k").mkdir(parents=True)
    (home / "k" / "config").write_text("apiVersion: v1\nkind: Config\n")
    assert cli.kubeconfig_problem("~/k/config") == ""
    assert cli.kubeconfig_problem("~/k/missing") == "no such file"
    assert cli.kubeconfig_problem(os.pathsep.join(["~/k/config", "~/k/missing"])) == ""


# ------------------------------------------------------------------------------------------ red team
async def test_a_kubeconfig_given_as_a_pipe_is_left_whole_for_the_loader() -> None:
    """`--kubeconfig <(kubectl config view --raw)` (a pipe, /dev/fd/N) loaded before the check was added: the check
    read the pipe to its end, and the loader then found it empty ("cannot be loaded (TypeError: 'NoneType' ...)").
    A pipe is read once, by the loader."""
    from shared.kube import Kube

    r, w = os.pipe()
    try:
        os.write(w, b"apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: 'https://127.0.0.1:1'}\n"
                    b"users:\n- name: u\n  user: {token: t}\ncontexts:\n- name: x\n  context: {cluster: c, user: u}\n"
                    b"current-context: x\n")
        os.close(w)
        path = f"/dev/fd/{r}"
        assert cli.kubeconfig_problem(path) == ""
        kube = await Kube.create(path)  # the whole of it is still there
        await kube.close()
    finally:
        os.close(r)


def test_dev_null_as_a_kubeconfig_is_said_empty(capsys: pytest.CaptureFixture[str]) -> None:
    err = _explain(capsys, "--kubeconfig", os.devnull)
    assert err.startswith(f"mtsched explain: --kubeconfig {os.devnull}: not a kubeconfig (empty); {FIX}"), err
