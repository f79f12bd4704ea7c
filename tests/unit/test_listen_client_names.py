"""Who may call the webhook, and narrowing either role's client CA to named certificates.

`webhookClientCAFile` makes the webhook's handshake require a certificate of that CA (the API
server's, from its AdmissionConfiguration); `<role>ClientNames` then admits only the certificates
naming one of the names (subject CN or DNS SAN) and answers anyone else 403. The TLS tests run the
real serve() over HTTPS on 127.0.0.1 with certificates made here.
"""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from deploy.local.pki import CertKey, make_ca, make_serving_cert
from shared.config import Config, ConfigError, load_config
from shared.serving.http import serve
from shared.serving.listen import cert_names, name_allowed, start_problems, webhook_policy
from shared.serving.metrics import CLIENTS_REFUSED
from tests.unit._servers import extender, extender_app, pod, webhook_app
from tests.unit.test_listen import client_cert, write
from webhook.server import CertReloader

TLS = {"tlsCertFile": "/c", "tlsKeyFile": "/k"}


@pytest.mark.parametrize(("raw", "names"), [
    (["kube-apiserver"], ("kube-apiserver",)),
    ("kube-apiserver,apiserver.example", ("kube-apiserver", "apiserver.example")),
    (" a , b ,", ("a", "b")),  # a flag's spaces and a trailing comma are no names
    ([], ()),
    ("", ()),
    (" ", ()),  # a flag or variable set empty: unset
    (["a", ""], ("a",)),  # a blank beside a name is dropped
    # a flag written as a YAML list: its brackets are no part of the first and last names
    ("[kube-apiserver,apiserver.example]", ("kube-apiserver", "apiserver.example")),
    (" [ a , b ] ", ("a", "b")),
    ("[]", ()),
    # the same list as YAML or JSON quotes it: the quotes are no part of the names either
    ('["kube-apiserver", "apiserver.example"]', ("kube-apiserver", "apiserver.example")),
    ("['a','b']", ("a", "b")),
])
def test_client_names_accepted(raw: object, names: tuple[str, ...]) -> None:
    flags = {**TLS, "webhookClientCAFile": "/ca", "webhookClientNames": raw}
    assert load_config(env={}, flags=flags).webhook_client_names == names


@pytest.mark.parametrize(("raw", "problem"), [
    (["has space"], "'has space' is not allowed"),
    (["a,b"], "'a,b' is not allowed"),
    ("a,[b]", "'[b]' is not allowed"),  # a bracket is a list written wrongly, never part of a name
    (["[a"], "'[a' is not allowed"),
    ("{a,b}", "'{a' is not allowed"),  # helm's list syntax is not ours: refused, never read as names
    ("[,]", "names no certificate"),
    ('"kube-apiserver"', "'\"kube-apiserver\"' is not allowed"),  # a quote is never part of a name either
    (["a'b"], "is not allowed"),
    ('["a]', "is not allowed"),
    # a list of only blank names names no certificate: read as unset, it would admit any of the CA's
    ([""], "[''] names no certificate"),
    ([" ", ""], "names no certificate"),
    (",", "',' names no certificate"),
    (["x" * 254], "is not allowed"),
    ([f"n{i}" for i in range(33)], "at most 32 names"),
    (7, "7 is not a list of names"),
    ([1, 2], "is not a list of names"),
    ({"a": 1}, "is not a list of names"),
])
def test_client_names_refused(raw: object, problem: str) -> None:
    flags = {**TLS, "webhookClientCAFile": "/ca", "webhookClientNames": raw}
    with pytest.raises(ConfigError, match="webhookClientNames: ") as e:
        load_config(env={}, flags=flags)
    assert problem in str(e.value)


@pytest.mark.parametrize(("flags", "problem"), [
    ({"webhookClientCAFile": "/ca"}, "webhookClientCAFile needs tlsCertFile and tlsKeyFile"),
    ({**TLS, "webhookClientNames": "a"}, "webhookClientNames needs webhookClientCAFile"),
    ({**TLS, "extenderClientNames": "a"}, "extenderClientNames needs extenderClientCAFile"),
])
def test_settings_that_need_another(flags: dict[str, object], problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        load_config(env={}, flags=flags)


def test_the_environment_spells_the_keys() -> None:
    cfg = load_config(env={"MTSCHED_WEBHOOK_CLIENT_CA_FILE": "/ca", "MTSCHED_WEBHOOK_CLIENT_NAMES": "a,b",
                           "MTSCHED_TLS_CERT_FILE": "/c", "MTSCHED_TLS_KEY_FILE": "/k"})
    assert cfg.webhook_client_ca_file == "/ca" and cfg.webhook_client_names == ("a", "b")
    policy = webhook_policy(cfg)
    assert policy.client_ca == "/ca" and policy.client_names == ("a", "b")
    assert start_problems(cfg, "webhook") == []


def _peer(cn: str | None = None, dns: tuple[str, ...] = (), ips: tuple[str, ...] = ()) -> dict[str, Any]:
    subject = ((("organizationName", "system:masters"),),) + (((("commonName", cn),),) if cn else ())
    return {"subject": subject,
            "subjectAltName": tuple(("DNS", d) for d in dns) + tuple(("IP Address", i) for i in ips)}


@pytest.mark.parametrize(("peer", "names", "allowed"), [
    (_peer("kube-apiserver"), ["kube-apiserver"], True),
    (_peer("kubelet", dns=("apiserver.example",)), ["apiserver.example"], True),
    (_peer("kubelet"), ["kube-apiserver"], False),
    (_peer(dns=("a.example",), ips=("10.0.0.1",)), ["10.0.0.1"], False),  # an IP SAN is no name
    (_peer("KUBE-APISERVER"), ["kube-apiserver"], False),  # names compare exactly
    (_peer(), ["system:masters"], False),  # the organisation is not the name
    ({}, ["kube-apiserver"], False),
    # several CNs name none: Kubernetes reads the last as the user, a request "CN=x, CN=system:node:n1"
    ({"subject": ((("commonName", "kube-apiserver"),), (("commonName", "system:node:n1"),))},
     ["kube-apiserver"], False),
    ({"subject": ((("commonName", "system:node:n1"),), (("commonName", "kube-apiserver"),))},
     ["kube-apiserver"], False),
    ({"subject": ((("commonName", "a"), ("commonName", "b")),), "subjectAltName": (("DNS", "b"),)}, ["b"], True),
    (None, ["kube-apiserver"], False),
])
def test_name_allowed(peer: dict[str, Any] | None, names: list[str], allowed: bool) -> None:
    assert name_allowed(peer, names) is allowed


def test_cert_names_order() -> None:
    assert cert_names(_peer("cn", dns=("d1", "d2"), ips=("10.0.0.1",))) == ["cn", "d1", "d2"]


def _ctx(ca: str, cert: tuple[str, str] | None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=ca)
    if cert:
        ctx.load_cert_chain(*cert)
    return ctx


def _review() -> dict[str, Any]:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "r1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                        "resource": {"group": "", "version": "v1", "resource": "pods"},
                        "operation": "CREATE", "namespace": "ns", "object": pod()}}


async def _post(url: str, ctx: ssl.SSLContext) -> tuple[int, Any]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s, \
            s.post(f"{url}/mutate", json=_review(), ssl=ctx) as resp:
        return resp.status, await resp.json()


@contextlib.asynccontextmanager
async def _serving(tmp_path: Path, ca: CertKey, make_app: Callable[[Config], web.Application],
                   flags: dict[str, object]) -> AsyncIterator[tuple[str, str, ssl.SSLContext]]:
    """The role's app served over HTTPS on 127.0.0.1 with a certificate of `ca`, whose file is the client CA
    for `flags` to name; yields (URL, CA file, the serving context)."""
    server = write(tmp_path, "server", make_serving_cert(ca, "role"))
    (tmp_path / "ca.crt").write_bytes(ca.cert_pem)
    ca_file = str(tmp_path / "ca.crt")
    cfg = load_config(env={}, flags={"listen": "127.0.0.1:0", "tlsCertFile": server[0], "tlsKeyFile": server[1],
                                     **{k: (ca_file if v == "CA" else v) for k, v in flags.items()}})
    reloader = CertReloader(cfg.tls_cert_file, cfg.tls_key_file)
    runner = await serve(make_app(cfg), cfg.listen, reloader.context)
    try:
        yield f"https://127.0.0.1:{runner.addresses[0][1]}", ca_file, reloader.context
    finally:
        await runner.cleanup()


async def test_the_webhook_answers_only_the_named_certificate_of_its_client_ca(tmp_path: Path) -> None:
    ca, rogue_ca = make_ca("cluster"), make_ca("someone-else")
    apiserver = write(tmp_path, "apiserver", client_cert(ca, "kube-apiserver"))
    kubelet = write(tmp_path, "kubelet", client_cert(ca, "system:node:n1"))  # the same CA, another client
    stranger = write(tmp_path, "stranger", client_cert(rogue_ca, "kube-apiserver"))
    flags: dict[str, object] = {"webhookClientCAFile": "CA", "webhookClientNames": "kube-apiserver"}
    async with _serving(tmp_path, ca, webhook_app, flags) as (url, ca_file, context):
        assert context.verify_mode == ssl.CERT_REQUIRED
        status, body = await _post(url, _ctx(ca_file, apiserver))
        assert status == 200 and body["response"]["uid"] == "r1" and body["response"]["allowed"] is True
        before = CLIENTS_REFUSED.labels("webhook")._value.get()
        status, body = await _post(url, _ctx(ca_file, kubelet))
        assert status == 403 and CLIENTS_REFUSED.labels("webhook")._value.get() == before + 1
        assert body == {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "code": 403,
                        "reason": "Forbidden", "message": "webhook: the client certificate names system:node:n1; "
                                                          "webhookClientNames allows kube-apiserver"}
        for cert in (None, stranger):  # no certificate, or another CA's with the right name: no handshake
            with pytest.raises((aiohttp.ClientError, ssl.SSLError, ConnectionError)):
                await _post(url, _ctx(ca_file, cert))
        assert (await _post(url, _ctx(ca_file, apiserver)))[0] == 200  # still serving after refusing


async def test_extender_client_names_refuse_another_client_of_the_ca(tmp_path: Path) -> None:
    ca = make_ca("cluster")
    scheduler = write(tmp_path, "scheduler", client_cert(ca, "system:kube-scheduler"))
    other = write(tmp_path, "other", client_cert(ca, "system:kube-controller-manager"))
    flags: dict[str, object] = {"extenderClientCAFile": "CA", "extenderClientNames": ["system:kube-scheduler"]}
    async with _serving(tmp_path, ca, lambda cfg: extender_app(extender(cfg)), flags) as (url, ca_file, _), \
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s:
        for cert, status, says in ((scheduler, 400, "PodName: got null"),
                                   (other, 403, "names system:kube-controller-manager")):
            async with s.post(f"{url}/bind", json={}, ssl=_ctx(ca_file, cert)) as resp:
                # 400 for the empty bind: the request reached the extender; 403: it did not
                assert resp.status == status and says in await resp.text()


async def test_without_client_names_any_certificate_of_the_ca_is_answered(tmp_path: Path) -> None:
    ca = make_ca("cluster")
    anyone = write(tmp_path, "anyone", client_cert(ca, "whoever"))
    async with _serving(tmp_path, ca, webhook_app, {"webhookClientCAFile": "CA"}) as (url, ca_file, _):
        assert (await _post(url, _ctx(ca_file, anyone)))[0] == 200


@pytest.mark.parametrize("content", [None, b"", b"not a certificate"])
async def test_an_unreadable_client_ca_stops_the_role_with_the_key_named(tmp_path: Path, content: bytes | None) -> None:
    ca = make_ca()
    server = write(tmp_path, "server", make_serving_cert(ca, "webhook"))
    ca_file = tmp_path / "client-ca.crt"
    if content is not None:
        ca_file.write_bytes(content)
    cfg = load_config(env={}, flags={"listen": "127.0.0.1:0", "tlsCertFile": server[0], "tlsKeyFile": server[1],
                                     "webhookClientCAFile": str(ca_file)})
    with pytest.raises(ConfigError, match=f"webhookClientCAFile: cannot read '{ca_file}' as PEM certificates"):
        await serve(webhook_app(cfg), cfg.listen, CertReloader(cfg.tls_cert_file, cfg.tls_key_file).context)


def test_client_names_from_the_environment_as_json() -> None:
    """A list put into a variable is often JSON (a manifest's `toJson`): its names, not their quoted forms
    (which no certificate carries: the API server would be locked out)."""
    env = {"MTSCHED_WEBHOOK_CLIENT_NAMES": '["kube-apiserver","apiserver.example"]'}
    cfg = load_config(env=env, flags={**TLS, "webhookClientCAFile": "/ca"})
    assert cfg.webhook_client_names == ("kube-apiserver", "apiserver.example")
