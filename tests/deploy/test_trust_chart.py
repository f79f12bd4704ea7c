"""The chart's Redis AUTH and TLS, and who may reach the roles' ports (issue 11 item 2).

The bundled Redis requires a password from a Secret (generated, or redis.auth.existingSecret) that
appears in no pod spec and no ConfigMap; every role reads it from the Secret. The rendered Redis
and webhook are also run for real: redis-server with the rendered arguments, expanded from the
rendered Secret as the kubelet does, and `mtsched webhook` with the pod's environment.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from deploy.local.redis import RedisServer
from tests.deploy._chart import CASES, MANIFEST, ROOT, Case, Json, container, embedded, find, objects, one, template
from tests.deploy.test_rendered_roles import review, webhook_process

Rendered = Callable[[str], list[Json]]
ROLES = (("hami-scheduler", "extender"), ("hami-webhook", "webhook"), ("hami-watcher", "watcher"))


def kubelet_env(c: Json, objs: list[Json]) -> dict[str, str]:
    """A container's environment as the kubelet builds it: values, and secretKeyRefs read from the
    rendered Secrets."""
    out = {}
    for e in c.get("env", []):
        if "value" in e:
            out[e["name"]] = e["value"]
        elif "secretKeyRef" in e["valueFrom"]:  # (not the downward API's fieldRef)
            ref = e["valueFrom"]["secretKeyRef"]
            out[e["name"]] = base64.b64decode(one(objs, "Secret", ref["name"])["data"][ref["key"]]).decode()
    return out


def expand(arg: str, env: dict[str, str]) -> str:
    """$(VAR) in a container's args, as the kubelet expands them."""
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1), m.group(0)), arg)


def secret_refs(c: Json) -> dict[str, dict[str, str]]:
    return {e["name"]: e["valueFrom"]["secretKeyRef"] for e in c.get("env", [])
            if "secretKeyRef" in e.get("valueFrom", {})}


# ---------------------------------------------------------------------------------- bundled Redis
def test_bundled_redis_requires_a_password_from_a_secret(rendered: Rendered) -> None:
    objs = rendered("defaults")
    secret = one(objs, "Secret", "hami-redis-auth")
    password = base64.b64decode(secret["data"]["password"]).decode()
    assert re.fullmatch(r"[A-Za-z0-9]{32}", password)
    c = container(one(objs, "Deployment", "hami-redis"), "redis")
    assert c["args"][-2:] == ["--requirepass", "$(REDISCLI_AUTH)"]
    assert "--protected-mode" not in c["args"]  # with a password protected mode lets pods in by itself
    ref = {"name": "hami-redis-auth", "key": "password"}
    # redis-cli reads REDISCLI_AUTH: the probes authenticate (redis-cli exits 0 even on NOAUTH)
    assert secret_refs(c) == {"REDISCLI_AUTH": ref}
    assert all(p["exec"]["command"] == ["redis-cli", "ping"] for p in
               (c["startupProbe"], c["livenessProbe"], c["readinessProbe"]))
    for deploy, name in ROLES:
        assert secret_refs(container(one(objs, "Deployment", deploy), name)) == {"MTSCHED_REDIS_PASSWORD": ref}
    # the password is in its Secret and nowhere else (pod specs, the ConfigMap, ...)
    others = [o for o in objs if (o["kind"], o["metadata"]["name"]) != ("Secret", "hami-redis-auth")]
    assert password not in json.dumps(others)
    assert "redisPassword" not in embedded(objs, "hami-config", "config.yaml")


def test_existing_secret_and_auth_off(helm: Path, rendered: Rendered) -> None:
    own = Case({"redis": {"auth": {"existingSecret": "my-redis", "passwordKey": "pw"}}})
    objs = objects(template(helm, own).stdout)
    assert not find(objs, "Secret", "hami-redis-auth")
    ref = {"name": "my-redis", "key": "pw"}
    assert secret_refs(container(one(objs, "Deployment", "hami-redis"), "redis")) == {"REDISCLI_AUTH": ref}
    for deploy, name in ROLES:
        assert secret_refs(container(one(objs, "Deployment", deploy), name)) == {"MTSCHED_REDIS_PASSWORD": ref}
    objs = rendered("redis-no-auth")
    assert not find(objs, "Secret", "hami-redis-auth")
    c = container(one(objs, "Deployment", "hami-redis"), "redis")
    assert "--requirepass" not in c["args"] and c["args"][-2:] == ["--protected-mode", "no"]
    for deploy, name in ROLES:
        assert not secret_refs(container(one(objs, "Deployment", deploy), name))


def test_static_manifest_names_a_secret_you_create() -> None:
    """deploy/manifests/hami.yaml is public: it holds no password, the user creates hami-redis-auth."""
    objs = objects(MANIFEST.read_text())
    assert not find(objs, "Secret")
    c = container(one(objs, "Deployment", "hami-redis"), "redis")
    assert secret_refs(c)["REDISCLI_AUTH"] == {"name": "hami-redis-auth", "key": "password"}
    steps = (ROOT / "docs" / "install.md").read_text()
    assert "kubectl -n kube-system create secret generic hami-redis-auth" in steps


@pytest.mark.redis
def test_rendered_redis_and_webhook_authenticate(rendered: Rendered) -> None:
    objs = rendered("defaults")
    c = container(one(objs, "Deployment", "hami-redis"), "redis")
    env = kubelet_env(c, objs)
    args = [expand(a, env) for a in c["args"]]
    server = RedisServer(password=env["REDISCLI_AUTH"], args=args).start()
    try:
        with redis.Redis(port=server.port, socket_timeout=2) as anonymous, \
                pytest.raises(redis.AuthenticationError):
            anonymous.ping()
        pod_env = kubelet_env(container(one(objs, "Deployment", "hami-webhook"), "webhook"), objs)
        assert pod_env["MTSCHED_REDIS_PASSWORD"] == env["REDISCLI_AUTH"]
        with webhook_process(objs, f"redis://127.0.0.1:{server.port}/0",
                             {"MTSCHED_REDIS_PASSWORD": pod_env["MTSCHED_REDIS_PASSWORD"]}) as (port, ca):
            assert review(port, ca, "hami-webhook.kube-system.svc", 32)["allowed"] is True
    finally:
        server.cleanup()


# --------------------------------------------------------------------------------- external Redis
def test_external_redis_tls_ca_from_a_secret(helm: Path, rendered: Rendered) -> None:
    objs = rendered("external-redis-tls")
    assert not find(objs, "Deployment", "hami-redis") and not find(objs, "Secret", "hami-redis-auth")
    assert embedded(objs, "hami-config", "config.yaml")["redisUrl"] == "rediss://mtsched@redis.example:6380/0"
    for deploy, name in ROLES:
        assert secret_refs(container(one(objs, "Deployment", deploy), name)) == {
            "MTSCHED_REDIS_PASSWORD": {"name": "mt-redis", "key": "password"},
            "MTSCHED_REDIS_CA": {"name": "mt-redis-ca", "key": "ca.crt"}}
    plain = {"redis": {"external": {**CASES["external-redis-tls"].values["redis"]["external"],
                                    "url": "redis://redis.example:6379/0"}}}
    proc = template(helm, Case(plain), check=False)
    assert proc.returncode != 0 and "caSecret needs a rediss://" in proc.stderr


# ------------------------------------------------------------------------------ network policies
def _policies(objs: list[Json]) -> dict[str, Json]:
    return {p["metadata"]["name"]: p["spec"] for p in find(objs, "NetworkPolicy")}


def test_network_policies(helm: Path, rendered: Rendered) -> None:
    assert set(_policies(rendered("defaults"))) == {"hami-redis"}  # off by default
    objs = rendered("network-policy")
    peers = CASES["network-policy"].values["networkPolicy"]["metricsFrom"]
    policies = _policies(objs)
    assert set(policies) == {"hami-redis", "hami-scheduler", "hami-webhook", "hami-watcher"}
    for deploy, _name in ROLES:
        spec = policies[deploy]
        pod = one(objs, "Deployment", deploy)["spec"]["template"]
        assert spec["podSelector"]["matchLabels"].items() <= pod["metadata"]["labels"].items(), deploy
        assert spec["policyTypes"] == ["Ingress"]
        named = {p["name"] for c in pod["spec"]["containers"] for p in c.get("ports", [])}
        rules = {r["ports"][0]["port"]: r.get("from") for r in spec["ingress"]}
        assert set(rules) <= named, deploy  # every rule names a port the pods have
        assert rules["metrics"] == peers
        # the webhook's HTTPS port is open to the API server, from wherever it calls; nothing else is
        assert rules == ({"metrics": peers, "https": None} if deploy == "hami-webhook" else {"metrics": peers})
    # without peers nobody but the node reaches the metrics port: no rule at all, never an empty "from"
    objs = objects(template(helm, Case(sets=("networkPolicy.enabled=true",))).stdout)
    policies = _policies(objs)
    assert policies["hami-scheduler"]["ingress"] == [] and policies["hami-watcher"]["ingress"] == []
    assert policies["hami-webhook"]["ingress"] == [{"ports": [{"port": "https", "protocol": "TCP"}]}]


def test_metrics_bind_address(helm: Path, rendered: Rendered) -> None:
    assert embedded(rendered("defaults"), "hami-config", "config.yaml")["metricsListen"] == "0.0.0.0:9395"
    assert embedded(rendered("network-policy"), "hami-config", "config.yaml")["metricsListen"] == "[::]:9395"
    for case, message in ((Case(sets=("mtsched.metricsBindAddress=my-host",)), "metricsBindAddress"),
                          (Case(sets=("networkPolicy.enabled=maybe",)), "networkPolicy"),
                          (Case(sets=("redis.auth.enabled=maybe",)), "auth"),
                          # an empty peer: the API server would refuse it at install
                          (Case({"networkPolicy": {"metricsFrom": [{}]}}), "metricsFrom")):
        proc = template(helm, case, check=False)
        assert proc.returncode != 0 and message in proc.stderr, (case, proc.stderr[-500:])


# ---------------------------------------------------------------------- the webhook's callers
CLIENT_CA = "/etc/mtsched/webhook-client-ca"


def _webhook_pod(objs: list[Json]) -> tuple[Json, Json]:
    """The webhook Deployment's pod spec and its webhook container."""
    spec = one(objs, "Deployment", "hami-webhook")["spec"]["template"]["spec"]
    return spec, container(one(objs, "Deployment", "hami-webhook"), "webhook")


def test_webhook_asks_no_client_certificate_by_default(rendered: Rendered) -> None:
    objs = rendered("defaults")
    for d in find(objs, "Deployment"):
        spec = d["spec"]["template"]["spec"]
        assert "webhook-client-ca" not in [v["name"] for v in spec.get("volumes", [])], d["metadata"]["name"]
        for c in spec["containers"]:
            assert not [a for a in c.get("args", []) if "webhookClient" in a], (d["metadata"]["name"], c["name"])
            assert all(m["mountPath"] != CLIENT_CA for m in c.get("volumeMounts", []))


def test_webhook_client_ca_and_names(helm: Path, rendered: Rendered) -> None:
    spec, c = _webhook_pod(rendered("webhook-client-auth"))
    assert [v for v in spec["volumes"] if v["name"] == "webhook-client-ca"] == [{
        "name": "webhook-client-ca",
        "secret": {"secretName": "apiserver-client-ca", "defaultMode": 0o440,
                   "items": [{"key": "client-ca.pem", "path": "client-ca.pem"}]}}]
    assert [m for m in c["volumeMounts"] if m["name"] == "webhook-client-ca"] == [
        {"name": "webhook-client-ca", "mountPath": CLIENT_CA, "readOnly": True}]
    listen = c["args"].index("--set=listen=0.0.0.0:8443")
    assert c["args"][listen + 1:] == [f"--set=webhookClientCAFile={CLIENT_CA}/client-ca.pem",
                                      "--set=webhookClientNames=kube-apiserver,apiserver.example.com"]
    # no other role mounts the CA or is given the settings (only the webhook reads them)
    for d in find(rendered("webhook-client-auth"), "Deployment"):
        if d["metadata"]["name"] != "hami-webhook":
            assert "webhook-client-ca" not in [v["name"] for v in d["spec"]["template"]["spec"].get("volumes", [])]
    # the CA alone: any certificate that CA signed, no names (and the default key)
    spec, c = _webhook_pod(objects(template(helm, Case(sets=("webhook.clientAuth.caSecret=apiserver-ca",))).stdout))
    [volume] = [v for v in spec["volumes"] if v["name"] == "webhook-client-ca"]
    assert volume["secret"]["secretName"] == "apiserver-ca"
    assert volume["secret"]["items"] == [{"key": "ca.crt", "path": "ca.crt"}]
    assert [a for a in c["args"] if "webhookClient" in a] == [f"--set=webhookClientCAFile={CLIENT_CA}/ca.crt"]


def test_webhook_client_names_are_refused_without_their_ca(helm: Path) -> None:
    proc = template(helm, Case(sets=("webhook.clientAuth.allowedNames={kube-apiserver}",)), check=False)
    assert proc.returncode != 0
    assert "webhook.clientAuth.allowedNames needs webhook.clientAuth.caSecret" in proc.stderr, proc.stderr[-500:]
    ca = {"caSecret": "apiserver-ca"}
    for client_auth, message in (
            # the names reach the role as one comma-separated --set value
            ({**ca, "allowedNames": ["kube-apiserver,evil"]}, "allowedNames/0"),
            ({**ca, "allowedNames": ["kube apiserver"]}, "allowedNames/0"),
            ({**ca, "allowedNames": ["[kube-apiserver"]}, "allowedNames/0"),  # a list written wrongly
            ({**ca, "allowedNames": ["{kube-apiserver}"]}, "allowedNames/0"),
            ({**ca, "allowedNames": ['"kube-apiserver"']}, "allowedNames/0"),  # quoted twice
            ({**ca, "allowedNames": ["kube-apiserver", ""]}, "allowedNames/1"),
            ({**ca, "allowedNames": [f"n{i}" for i in range(33)]}, "allowedNames"),
            ({**ca, "caKey": ""}, "caKey"),
            ({**ca, "caKey": "../ca.crt"}, "caKey"),
            ({"caSecrets": "apiserver-ca"}, "caSecrets")):  # a typo is refused, not ignored
        proc = template(helm, Case({"webhook": {"clientAuth": client_auth}}), check=False)
        assert proc.returncode != 0 and message in proc.stderr, (client_auth, proc.stderr[-500:])
