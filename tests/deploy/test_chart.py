"""The `hami` chart: lint, render over values combinations, and check what each object promises.

Schema validation of every object against the real API server is in tests/e2e/test_helm_dryrun.py.
"""

from __future__ import annotations

import base64
import ipaddress
import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa

from controller.leadership import LeaderYield
from deploy.local import identities
from deploy.local.stack import CHART_WEBHOOK_NAME
from shared.config import _KEYS as CONFIG_KEYS
from shared.config import SPELLED, load_config
from shared.domain.annotations import MTHREADS_OWNED_KEYS, SCHEDULER_OWNED_KEYS
from shared.domain.nudge import any_node_wakes, unschedulable_retry_args
from tests.deploy._chart import (
    CASES,
    CHART,
    Case,
    Json,
    case_args,
    check_config,
    container,
    embedded,
    find,
    objects,
    one,
    run_helm,
    template,
    values_file,
)

Rendered = Callable[[str], list[Json]]
WORKLOADS = ("scheduler", "webhook", "watcher")


def fullname(case: Case) -> str:
    return case.release if "hami" in case.release else f"{case.release}-hami"


# ---------------------------------------------------------------------------------- lint, render
@pytest.mark.parametrize("name", sorted(CASES))
def test_lint(helm: Path, name: str) -> None:
    case = CASES[name]
    with values_file(case.values) as vf:
        proc = run_helm(helm, ["lint", str(CHART), "--strict", *case_args(case, vf)], check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in proc.stdout


@pytest.mark.parametrize("name", sorted(CASES))
def test_renders_valid_objects(rendered: Rendered, name: str) -> None:
    objs = rendered(name)
    case = CASES[name]
    seen: set[tuple[str, str]] = set()
    for o in objs:
        assert o.get("apiVersion") and o.get("kind"), o
        meta = o["metadata"]
        key = (o["kind"], meta["name"])
        assert key not in seen, f"duplicate {key}"
        seen.add(key)
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", meta["name"]) and len(meta["name"]) <= 63
        labels = meta.get("labels") or {}
        assert labels.get("app.kubernetes.io/instance") == case.release, key
        if o["kind"] not in ("ClusterRole", "ClusterRoleBinding", "MutatingWebhookConfiguration",
                             "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"):
            expected = "kube-system" if key == ("RoleBinding", f"{fullname(case)}-scheduler-auth-reader") \
                else "default" if key[1] == f"{fullname(case)}-watcher-events" else case.namespace
            assert meta.get("namespace") == expected, key


@pytest.mark.parametrize("name", ["defaults", "s5000", "mixed", "legacy-scalar", "set-list", "custom",
                                  "external-redis", "external-sentinel", "external-cluster", "seed-oneliner",
                                  "external-redis-tls", "redis-no-auth", "network-policy"])
def test_rendered_config_is_accepted_by_mtsched(rendered: Rendered, name: str) -> None:
    case = CASES[name]
    objs = rendered(name)
    cm = one(objs, "ConfigMap", f"{fullname(case)}-config")
    # The pods' environment is part of the configuration (MTSCHED_* overrides the file); a variable
    # from a Secret gets what the kubelet would put there.
    env = {e["name"]: e.get("value", "from-a-secret") for e in container(
        one(objs, "Deployment", f"{fullname(case)}-watcher"), "watcher").get("env", [])}
    env = {k: v for k, v in env.items() if k.startswith("MTSCHED_")}
    out = check_config(cm["data"]["config.yaml"], env)
    assert out["memoryPerCard"] == list(case.memory)
    assert out["schedulerName"] == case.values.get("schedulerName", "hami-scheduler")
    assert out["tlsCertFile"] == "/etc/mtsched/tls/tls.crt"
    assert out["redisPassword"] == ("***" if "MTSCHED_REDIS_PASSWORD" in env else "")


def test_config_keys_are_known_settings(rendered: Rendered) -> None:
    cfg = embedded(rendered("defaults"), "hami-config", "config.yaml")
    assert set(cfg) <= set(CONFIG_KEYS), set(cfg) - set(CONFIG_KEYS)


def test_invalid_values_are_refused(helm: Path) -> None:
    for sets, message in (
        (("devices.mthreads.memoryPerCard=abc",), "memoryPerCard"),
        (("devices.mthreads.memoryPerCard=1",), "memoryPerCard"),
        (("scheduler.admissionWebhook.failurePolicy=Sometimes",), "failurePolicy"),
        (("tls.mode=selfsigned",), "tls.mode: \"selfsigned\" is not allowed"),
        (("scheduler.defaultSchedulerPolicy.gpuSchedulerPolicy=random",), "gpuSchedulerPolicy"),
        (("webhook.replicas=0",), "replicas"),
        (("redis.external.url=http://x",), "url"),
        (("scheduler.admissionWebhook.objectSelector.matchLabels.team=ml",), "objectSelector must be empty"),
        (("scheduler.admissionPolicy.enabled=maybe",), "admissionPolicy"),
        (("mtsched.successEvents=maybe",), "successEvents"),
        (("scheduler.filterTopK=abc",), "filterTopK"),
        (("scheduler.filterTopK=-1",), "filterTopK"),
        (("scheduler.filterTopK=1.5",), "filterTopK"),
        (("scheduler.percentageOfNodesToScore=101",), "percentageOfNodesToScore"),
        (("scheduler.percentageOfNodesToScore=-1",), "percentageOfNodesToScore"),
        (("scheduler.percentageOfNodesToScore=half",), "percentageOfNodesToScore"),
        # a password in the URL would be written into the ConfigMap every role reads
        (("redis.external.url=redis://:s3cret@redis.example:6379/0",), "carries a password"),
        (("redis.external.url=redis://u:s3cret@redis.example:6379/0",), "carries a password"),
        (("redis.external.url=redis://redis.example:6379/0?password=s3cret",), "carries a password"),
        # values that render into a deployment that cannot work (templates/validate.yaml)
        (("mtsched.metricsBindAddress=127.0.0.1",), "is a loopback address"),
        (("scheduler.extender.port=9395",), "is taken in the scheduler pod"),
        (("webhook.port=9395",), "is mtsched.metricsPort too"),
        (("monitoring.prometheusRule.enabled=true", "monitoring.prometheusRule.ledgerStaleSeconds=5"),
         "between two passes"),
        (("redis.external.url=redis+sentinel://h:26379/m?sentinel_password=s3cret",), "carries a password"),
        (("mtsched.metricsBindAddress=0:0:0:0:0:0:0:1",), "is a loopback address"),
        (("webhook.podDisruptionBudget.maxUnavailable=null", "webhook.podDisruptionBudget.minAvailable=100%"),
         "would block every node drain"),
        (("scheduler.admissionWebhook.timeoutSeconds=3",), "shorter than the webhook's quota check"),
        (("webhook.podDisruptionBudget.maxUnavailable=0",), "would block every node drain"),
        (("watcher.podDisruptionBudget.maxUnavailable=null", "watcher.podDisruptionBudget.minAvailable=2"),
         "would block every node drain"),
        # a bundled Redis that may drop any key when full: every booking would be refused (shared/store/eviction.py)
        (("redis.args={--maxmemory,200mb,--maxmemory-policy,allkeys-lru}",), "redis.args[3] allkeys-lru"),
        (("redis.args={--maxmemory-policy=allkeys-random}",), "allkeys-random: with an allkeys-*"),
    ):
        proc = template(helm, Case(sets=sets), check=False)
        assert proc.returncode != 0, sets
        assert message in proc.stderr, proc.stderr
    proc = template(helm, Case({"devices": {"mthreads": {"memoryPerCard": []}}}), check=False)
    assert proc.returncode != 0 and "memoryPerCard" in proc.stderr
    # ... and only where the chart renders what a check protects (or the value is what it means)
    for sets in (("webhook.replicas=1", "webhook.podDisruptionBudget.maxUnavailable=0"),
                 ("scheduler.admissionWebhook.enabled=false", "scheduler.admissionWebhook.timeoutSeconds=3"),
                 ("monitoring.prometheusRule.ledgerStaleSeconds=5",),
                 ("mtsched.metricsBindAddress=::",),
                 ("redis.args={--maxmemory-policy,volatile-lru}",),
                 ("redis.external.url=redis://r:6379/0", "redis.args={--maxmemory-policy,allkeys-lru}"),  # not rendered
                 ("redis.external.url=redis+sentinel://h:26379/m?sentinel_password=",)):  # empty: documented
        template(helm, Case(sets=sets))


def test_every_mtsched_setting_has_a_schema() -> None:
    """A value of `mtsched:` without a type would render as is and stop the roles at start, not at install."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())["mtsched"]
    schema = json.loads((CHART / "values.schema.json").read_text())["properties"]["mtsched"]["properties"]
    assert set(values) - set(schema) == set()


# ----------------------------------------------------------------------------------- topology
def test_default_topology(rendered: Rendered) -> None:
    objs = rendered("defaults")
    deploys = {d["metadata"]["name"]: d for d in find(objs, "Deployment")}
    assert set(deploys) == {"hami-scheduler", "hami-webhook", "hami-watcher", "hami-redis"}
    assert {n: d["spec"]["replicas"] for n, d in deploys.items()} == {
        "hami-scheduler": 2, "hami-webhook": 2, "hami-watcher": 2, "hami-redis": 1}
    sched = deploys["hami-scheduler"]["spec"]["template"]["spec"]
    assert [c["name"] for c in sched["containers"]] == ["kube-scheduler", "extender"]  # "2/2"
    ks = container(deploys["hami-scheduler"], "kube-scheduler")
    assert ks["image"].startswith("registry.k8s.io/kube-scheduler:v1.")
    assert "--config=/etc/kubernetes/hami/scheduler-config.yaml" in ks["command"]
    ext = container(deploys["hami-scheduler"], "extender")
    assert ext["args"][:2] == ["extender", "--config=/etc/mtsched/config.yaml"]
    assert "--set=listen=127.0.0.1:8443" in ext["args"]
    assert container(deploys["hami-webhook"], "webhook")["args"][:2] == ["webhook", "--config=/etc/mtsched/config.yaml"]
    assert container(deploys["hami-watcher"], "watcher")["args"][:2] == ["watcher", "--config=/etc/mtsched/config.yaml"]
    for name in ("hami-scheduler", "hami-webhook", "hami-watcher"):
        spec = deploys[name]["spec"]["template"]["spec"]
        mounts = {m["mountPath"]: m for c in spec["containers"] for m in c.get("volumeMounts", [])}
        assert mounts["/etc/mtsched/config.yaml"]["subPath"] == "config.yaml" or name == "hami-scheduler"
        vols = {v["name"]: v for v in spec["volumes"]}
        assert vols["config"]["configMap"]["name"] == "hami-config"
    services = {s["metadata"]["name"]: s for s in find(objs, "Service")}
    assert set(services) == {"hami-scheduler", "hami-webhook", "hami-watcher", "hami-redis"}
    assert {p["port"]: p["targetPort"] for p in services["hami-webhook"]["spec"]["ports"]} == {
        443: "https", 9395: "metrics"}
    assert services["hami-redis"]["spec"]["ports"][0]["port"] == 6379
    cfg = embedded(objs, "hami-config", "config.yaml")
    assert cfg["redisUrl"] == "redis://hami-redis.kube-system.svc:6379/0"
    assert cfg["memoryPerCard"] == [96]


def test_kube_scheduler_configuration(rendered: Rendered) -> None:
    ksc = embedded(rendered("defaults"), "hami-scheduler", "scheduler-config.yaml")
    assert ksc["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert ksc["kind"] == "KubeSchedulerConfiguration"
    assert ksc["leaderElection"] == {"leaderElect": True, "resourceLock": "leases",
                                     "resourceName": "hami-scheduler", "resourceNamespace": "kube-system"}
    assert ksc["profiles"] == [{"schedulerName": "hami-scheduler"}]
    assert ksc["percentageOfNodesToScore"] == 100
    assert "clientConnection" not in ksc  # in-cluster credentials of the hami-scheduler ServiceAccount
    assert ksc["extenders"] == [{
        "urlPrefix": "http://127.0.0.1:8443",
        "filterVerb": "filter", "prioritizeVerb": "prioritize", "bindVerb": "bind", "preemptVerb": "preempt",
        "weight": 1, "enableHTTPS": False,
        "nodeCacheCapable": True, "ignorable": False, "httpTimeout": "30s",
        "managedResources": [{"name": "mthreads.com/vgpu", "ignoredByScheduler": True},
                             {"name": "mthreads.com/sgpu-memory", "ignoredByScheduler": False},
                             {"name": "mthreads.com/sgpu-core", "ignoredByScheduler": False}],
    }]


def _scheduler_pod(objs: list[Json]) -> Json:
    return dict(one(objs, "Deployment", "hami-scheduler")["spec"]["template"])


def test_extender_scheme_http_by_default_https_on_request(rendered: Rendered) -> None:
    """http (the default): plain HTTP on the pod's loopback, the extender started without a certificate and
    nothing of the TLS Secret mounted in the scheduler's pod; https: kube-scheduler checks the chart's
    certificate, which both containers mount."""
    pod = _scheduler_pod(rendered("defaults"))
    ext = next(c for c in pod["spec"]["containers"] if c["name"] == "extender")
    assert "--set=listen=127.0.0.1:8443" in ext["args"]  # loopback: the extender refuses HTTP elsewhere
    assert {"--set=tlsCertFile=", "--set=tlsKeyFile="} <= set(ext["args"])
    assert not [m for c in pod["spec"]["containers"] for m in c.get("volumeMounts", []) if m["name"] == "tls"]
    assert "tls" not in {v["name"] for v in pod["spec"]["volumes"]}
    assert "checksum/tls" not in pod["metadata"]["annotations"]

    objs = rendered("extender-https")
    (entry,) = embedded(objs, "hami-scheduler", "scheduler-config.yaml")["extenders"]
    assert entry["urlPrefix"] == "https://127.0.0.1:8443" and entry["enableHTTPS"] is True
    assert entry["tlsConfig"] == {"insecure": False, "caFile": "/etc/mtsched/tls/ca.crt"}
    pod = _scheduler_pod(objs)
    for c in pod["spec"]["containers"]:
        assert {"name": "tls", "mountPath": "/etc/mtsched/tls", "readOnly": True} in c["volumeMounts"], c["name"]
        assert not [a for a in c.get("args", []) if a.startswith("--set=tls")]  # config.yaml's certificate
    assert "checksum/tls" in pod["metadata"]["annotations"]


def test_extender_scheme_missing_from_values_is_http(helm: Path, tmp_path: Path) -> None:
    """`helm upgrade --reuse-values` from a chart without scheduler.extender.scheme renders with the old chart's
    values, which lack the key (Helm's Upgrade.reuseValues: chart.Values = the old coalesced values); so does a
    values file saying `scheme: null`. Both get the default, http, not a urlPrefix "%!s(<nil>)://127.0.0.1:8443"
    that kube-scheduler cannot call."""
    old = tmp_path / "hami"
    shutil.copytree(CHART, old)
    values = (old / "values.yaml").read_text()
    assert "\n    scheme: http\n" in values
    (old / "values.yaml").write_text(values.replace("\n    scheme: http\n", "\n"))
    renders = {
        "key missing": run_helm(helm, ["template", "hami", str(old), "--namespace", "kube-system"]).stdout,
        "null": template(helm, Case(sets=("scheduler.extender.scheme=null",))).stdout,
    }
    for why, text in renders.items():
        objs = objects(text)
        (entry,) = embedded(objs, "hami-scheduler", "scheduler-config.yaml")["extenders"]
        assert (entry["urlPrefix"], entry["enableHTTPS"], "tlsConfig" in entry) == \
            ("http://127.0.0.1:8443", False, False), why
        ext = container(one(objs, "Deployment", "hami-scheduler"), "extender")
        assert {"--set=tlsCertFile=", "--set=tlsKeyFile="} <= set(ext["args"]), why


def test_local_harness_calls_the_same_verbs_as_the_chart(rendered: Rendered) -> None:
    """deploy/local runs kube-scheduler with the extender entry the chart renders (preempt included)."""
    from deploy.local.scheduler_config import ExtenderSpec

    (chart,) = embedded(rendered("defaults"), "hami-scheduler", "scheduler-config.yaml")["extenders"]
    local = ExtenderSpec("https://127.0.0.1:8443").to_config(b"ca")
    verbs = ("filterVerb", "prioritizeVerb", "bindVerb", "preemptVerb")
    assert {k: local.get(k) for k in verbs} == {k: chart.get(k) for k in verbs}
    assert local["preemptVerb"] == "preempt" and local["nodeCacheCapable"] is chart["nodeCacheCapable"] is True
    # and is asked about the same pods (card units without vgpu included: tests/e2e/test_redteam_chain_webhooks.py)
    assert local["managedResources"] == chart["managedResources"]


def test_disabled_leaves_a_plain_scheduler(rendered: Rendered) -> None:
    objs = rendered("disabled")
    assert [d["metadata"]["name"] for d in find(objs, "Deployment")] == ["hami-scheduler"]
    spec = one(objs, "Deployment", "hami-scheduler")["spec"]["template"]["spec"]
    assert [c["name"] for c in spec["containers"]] == ["kube-scheduler"]
    assert {v["name"] for v in spec["volumes"]} == {"scheduler-config", "tmp"}
    ksc = embedded(objs, "hami-scheduler", "scheduler-config.yaml")
    assert "extenders" not in ksc  # no managedResources for mthreads
    assert ksc["profiles"] == [{"schedulerName": "hami-scheduler"}]
    kinds = {o["kind"] for o in objs}
    assert not kinds & {"MutatingWebhookConfiguration", "Secret", "NetworkPolicy"}
    assert not find(objs, "ClusterRole")
    assert not find(objs, "ConfigMap", "hami-config")


def test_replicas_and_disruption_budgets(rendered: Rendered) -> None:
    for name, n in (("defaults", 2), ("replicas-3", 3)):
        objs = rendered(name)
        for role in WORKLOADS:
            assert one(objs, "Deployment", f"hami-{role}")["spec"]["replicas"] == n
            pdb = one(objs, "PodDisruptionBudget", f"hami-{role}")
            assert pdb["spec"]["maxUnavailable"] == 1
            assert pdb["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == role
    objs = rendered("replicas-1")
    assert not find(objs, "PodDisruptionBudget")  # a budget for one pod would only block drains
    assert all(d["spec"]["replicas"] == 1 for d in find(objs, "Deployment"))


def test_pods_are_hardened(rendered: Rendered) -> None:
    for name in ("defaults", "custom"):
        objs = rendered(name)
        [hook] = find(objs, "MutatingWebhookConfiguration")[0]["webhooks"]
        skipped = next(e["values"] for e in hook["namespaceSelector"]["matchExpressions"]
                       if e["key"] == "kubernetes.io/metadata.name")
        for d in find(objs, "Deployment"):
            spec = d["spec"]["template"]["spec"]
            labels = d["spec"]["template"]["metadata"]["labels"]
            where = d["metadata"]["name"]
            # never judged by our own webhook: by their namespace, a pod label would be anyone's to set
            assert d["metadata"]["namespace"] in skipped and "hami.io/webhook" not in labels, where
            assert spec["securityContext"]["runAsNonRoot"] is True, where
            assert spec["securityContext"]["runAsUser"] > 0, where
            assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, where
            assert spec["enableServiceLinks"] is False, where  # no *_SERVICE_* env (MTSCHED_* is config)
            for c in spec["containers"]:
                sc = c["securityContext"]
                assert sc["readOnlyRootFilesystem"] is True, (where, c["name"])
                assert sc["allowPrivilegeEscalation"] is False, (where, c["name"])
                assert sc["capabilities"] == {"drop": ["ALL"]}, (where, c["name"])
                assert c["resources"]["requests"]["cpu"] and c["resources"]["requests"]["memory"]
                assert c["resources"]["limits"]["memory"]
                for probe in ("livenessProbe", "readinessProbe"):
                    assert probe in c, (where, c["name"], probe)
                if c["name"] in ("extender", "webhook", "watcher"):
                    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
                    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
                    assert c["readinessProbe"]["httpGet"]["port"] == "metrics"
                    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
                    assert ports["metrics"] == (9400 if name == "custom" else 9395)
            if where.endswith(("-scheduler", "-webhook", "-watcher")):
                term = spec["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]
                assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"


def test_only_known_mtsched_environment(rendered: Rendered) -> None:
    """Every MTSCHED_* variable is read as a setting and an unknown one stops the role."""
    for name in CASES:
        for d in find(rendered(name), "Deployment"):
            for c in d["spec"]["template"]["spec"]["containers"]:
                for e in c.get("env", []):
                    if e["name"].startswith("MTSCHED_") and e["name"] != "MTSCHED_CONFIG":
                        key = re.sub(r"_([a-z])", lambda m: m.group(1).upper(), e["name"][8:].lower())
                        assert SPELLED.get(key, key) in CONFIG_KEYS, (name, e["name"])


# --------------------------------------------------------------------------------------- values
def test_memory_per_card_forms(rendered: Rendered) -> None:
    for name in ("defaults", "s5000", "mixed", "legacy-scalar", "set-list"):
        cfg = embedded(rendered(name), "hami-config", "config.yaml")
        assert cfg["memoryPerCard"] == list(CASES[name].memory), name


def test_kube_scheduler_image_tag(rendered: Rendered) -> None:
    def image(name: str) -> str:
        objs = rendered(name)
        return str(container(one(objs, "Deployment", f"{fullname(CASES[name])}-scheduler"),
                             "kube-scheduler")["image"])

    assert image("seed-oneliner") == "registry.k8s.io/kube-scheduler:v1.30.4"
    assert image("hami-legacy") == "registry.k8s.io/kube-scheduler:v1.30.4"  # scheduler.kubeScheduler.imageTag
    assert image("custom").startswith("mirror.example:5000/kube-scheduler:v1.")


def test_custom_values_reach_every_object(rendered: Rendered) -> None:
    objs = rendered("custom")
    cfg = embedded(objs, "gpu-hami-config", "config.yaml")
    assert cfg["schedulerName"] == "gpu-scheduler"
    assert (cfg["nodeSchedulerPolicy"], cfg["gpuSchedulerPolicy"]) == ("spread", "binpack")
    assert cfg["resourceCountName"] == "example.com/vgpu"
    assert cfg["redisUrl"] == "redis://gpu-hami-redis.hami-system.svc:6379/0"
    assert cfg["metricsListen"] == "0.0.0.0:9400"
    assert cfg["logLevel"] == "debug"
    ksc = embedded(objs, "gpu-hami-scheduler", "scheduler-config.yaml")
    assert ksc["profiles"] == [{"schedulerName": "gpu-scheduler"}]
    assert ksc["percentageOfNodesToScore"] == 0  # kube-scheduler's adaptive default, as the value asked
    assert ksc["leaderElection"]["resourceName"] == "gpu-scheduler"
    assert ksc["leaderElection"]["resourceNamespace"] == "hami-system"
    assert [m["name"] for m in ksc["extenders"][0]["managedResources"]] == [
        "example.com/vgpu", "mthreads.com/vgpu", "mthreads.com/sgpu-memory", "mthreads.com/sgpu-core"]
    lease = one(objs, "Role", "gpu-hami-scheduler-lease")
    assert lease["rules"][1]["resourceNames"] == ["gpu-scheduler"]
    for d in find(objs, "Deployment"):
        spec = d["spec"]["template"]["spec"]
        assert spec["imagePullSecrets"] == [{"name": "regcred"}]
        assert all(c["image"].startswith("mirror.example:5000/") for c in spec["containers"])
        assert d["metadata"]["labels"]["cost-center"] == "gpu"
        assert d["metadata"]["annotations"]["owner"] == "platform"
    ext = container(one(objs, "Deployment", "gpu-hami-scheduler"), "extender")
    assert "--log-format=text" in ext["args"]
    hook = one(objs, "MutatingWebhookConfiguration", "gpu-hami-webhook")["webhooks"][0]
    assert hook["clientConfig"]["service"] == {"name": "gpu-hami-webhook", "namespace": "hami-system",
                                               "path": "/mutate", "port": 443}
    assert hook["namespaceSelector"]["matchLabels"] == {"gpu": "yes"}
    assert {"key": "team", "operator": "In", "values": ["ml"]} in hook["namespaceSelector"]["matchExpressions"]
    assert {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["hami-system", "kube-system"]} \
        in hook["namespaceSelector"]["matchExpressions"]  # the release namespace (our pods) and the whitelist
    assert "'example.com/vgpu'" in hook["matchConditions"][0]["expression"]


def test_external_redis(rendered: Rendered) -> None:
    objs = rendered("external-redis")
    assert not [o for o in objs if o["metadata"]["name"] == "hami-redis"]
    # the ACL user in the URL, the password from the Secret (shared.store.ledger.connect adds it)
    assert embedded(objs, "hami-config", "config.yaml")["redisUrl"] == "rediss://mtsched@redis.example:6380/1"
    for role, cname in (("scheduler", "extender"), ("webhook", "webhook"), ("watcher", "watcher")):
        env = {e["name"]: e for e in container(one(objs, "Deployment", f"hami-{role}"), cname)["env"]}
        assert env["MTSCHED_REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": "mt-redis", "key": "pw"}
        assert "MTSCHED_REDIS_URL" not in env


def test_external_sentinel_and_cluster_redis(rendered: Rendered) -> None:
    objs = rendered("external-sentinel")
    assert not [o for o in objs if o["metadata"]["name"] == "hami-redis"]
    url = CASES["external-sentinel"].values["redis"]["external"]["url"]
    assert embedded(objs, "hami-config", "config.yaml")["redisUrl"] == url
    env = {e["name"]: e for e in container(one(objs, "Deployment", "hami-watcher"), "watcher")["env"]}
    # shared.store.ledger.connect uses it for the sentinels and the data nodes
    assert env["MTSCHED_REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": "mt-redis", "key": "password"}
    objs = rendered("external-cluster")
    assert not [o for o in objs if o["metadata"]["name"] == "hami-redis"]
    assert embedded(objs, "hami-config", "config.yaml")["redisUrl"] == "redis+cluster://redis-cluster-0.redis:6379"


def test_bundled_redis(rendered: Rendered) -> None:
    objs = rendered("defaults")
    redis = one(objs, "Deployment", "hami-redis")
    c = container(redis, "redis")
    assert c["command"] == ["redis-server"]
    assert c["args"][:2] == ["--save", ""]
    assert c["args"][-2:] == ["--requirepass", "$(REDISCLI_AUTH)"]  # AUTH: tests/deploy/test_trust_chart.py
    assert redis["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
    policy = one(objs, "NetworkPolicy", "hami-redis")
    allowed = policy["spec"]["ingress"][0]["from"][0]["podSelector"]["matchExpressions"]
    assert {"key": "app.kubernetes.io/component", "operator": "In",
            "values": ["scheduler", "webhook", "watcher"]} in allowed


# ------------------------------------------------------------------------------------------ RBAC
def _bindings_of(objs: list[Json], sa: str) -> list[Json]:
    return [b for b in find(objs, "ClusterRoleBinding") + find(objs, "RoleBinding")
            if any(s.get("kind") == "ServiceAccount" and s["name"] == sa for s in b["subjects"])]


def test_least_privilege_rbac(rendered: Rendered) -> None:
    objs = rendered("defaults")
    roles = {b["roleRef"]["name"] for b in _bindings_of(objs, "hami-scheduler")}
    assert roles == {"system:kube-scheduler", "system:volume-scheduler", "hami-scheduler-lease",
                     "extension-apiserver-authentication-reader", "hami-extender"}
    assert one(objs, "ClusterRole", "hami-extender")["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["pods/binding"], "verbs": ["create"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
        # a pinned model or a node selector is checked against the node's labels at bind
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]},
    ]
    assert one(objs, "Role", "hami-scheduler-lease")["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": ["hami-scheduler"],
         "verbs": ["get", "update"]},
    ]
    assert [b["roleRef"]["name"] for b in _bindings_of(objs, "hami-watcher")] == ["hami-watcher",
                                                                                 "hami-watcher-events"]
    assert one(objs, "ClusterRole", "hami-watcher")["rules"] == [
        {"apiGroups": [""], "resources": ["nodes", "pods"], "verbs": ["list", "watch"]},
        # the reconciler confirms with the API server before it frees a reservation
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]},
        # the nudge: the node annotation mtsched.io/capacity-freed after a release (and nothing else of a
        # Node: the policy hami-watcher-writes)
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["patch"]}]
    # Warning events on Nodes, in `default` only: a card knob changed under held slices
    # (controller/knob_watch.py), capacity, label or model disagree (controller/mismatch.py)
    events = one(objs, "Role", "hami-watcher-events")
    assert events["metadata"]["namespace"] == "default"
    assert events["rules"] == [{"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}]
    # The webhook only lists the namespace's ResourceQuotas and pods (the quota forms only it enforces,
    # shared/domain/quota.py); Redis needs nothing from the API: no binding, no token.
    assert [b["roleRef"]["name"] for b in _bindings_of(objs, "hami-webhook")] == ["hami-webhook"]
    assert one(objs, "ClusterRole", "hami-webhook")["rules"] == [
        {"apiGroups": [""], "resources": ["resourcequotas", "pods"], "verbs": ["list"]}]
    assert _bindings_of(objs, "hami-redis") == []
    assert one(objs, "ServiceAccount", "hami-redis")["automountServiceAccountToken"] is False
    for d in find(objs, "Deployment"):
        assert d["spec"]["template"]["spec"]["serviceAccountName"] == d["metadata"]["name"]
    # No verb that writes anything but bindings, events and the watcher's node nudge.
    for role in find(objs, "ClusterRole") + find(objs, "Role"):
        for rule in role["rules"]:
            forbidden = {"*", "delete", "patch", "deletecollection", "escalate", "bind"}
            if role["metadata"]["name"] == "hami-watcher" and rule["resources"] == ["nodes"]:
                forbidden.discard("patch")
            assert not set(rule["verbs"]) & forbidden, (role["metadata"]["name"], rule)


@pytest.mark.parametrize("name,on", [("defaults", True), ("no-quota-check", False)])
def test_quota_check_decides_the_webhooks_rbac_and_token(rendered: Rendered, name: str, on: bool) -> None:
    objs = rendered(name)
    config = yaml.safe_load(one(objs, "ConfigMap", "hami-config")["data"]["config.yaml"])
    assert config["quotaCheck"] is on
    assert bool(find(objs, "ClusterRole", "hami-webhook")) is on
    assert [b["roleRef"]["name"] for b in _bindings_of(objs, "hami-webhook")] == (["hami-webhook"] if on else [])
    account = one(objs, "ServiceAccount", "hami-webhook")
    pod = one(objs, "Deployment", "hami-webhook")["spec"]["template"]["spec"]
    assert account.get("automountServiceAccountToken", True) is on
    assert pod.get("automountServiceAccountToken", True) is on
    # the local harness reads the same identities either way: the webhook runs as its ServiceAccount,
    # with a token only when its pod mounts one (deploy/local/identities.py, stack.role_argv)
    assert identities.role_service_accounts(objs)["webhook"] == ("kube-system", "hami-webhook")
    assert identities.token_mounted(objs) == {"kube-scheduler": True, "extender": True, "webhook": on,
                                              "watcher": True}


# ----------------------------------------------------------------------------------- the webhook
def test_webhook_registration(rendered: Rendered) -> None:
    objs = rendered("defaults")
    cfg = one(objs, "MutatingWebhookConfiguration", "hami-webhook")
    [hook] = cfg["webhooks"]
    assert hook["name"] == "vgpu.hami.io" == CHART_WEBHOOK_NAME  # the local stack's too: refusals read the same
    assert hook["failurePolicy"] == "Fail"  # fail closed (HAMi: Ignore)
    assert hook["sideEffects"] == "None" and hook["admissionReviewVersions"] == ["v1"]
    assert hook["rules"] == [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                              "resources": ["pods"], "scope": "*"}]
    ignore = {"key": "hami.io/webhook", "operator": "NotIn", "values": ["ignore"]}
    # no objectSelector: a pod label is set by whoever creates the pod, who must not skip admission
    assert "objectSelector" not in hook
    assert ignore in hook["namespaceSelector"]["matchExpressions"]  # namespaces: labelled by admins only
    assert {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system"]} in \
        hook["namespaceSelector"]["matchExpressions"]
    expr = hook["matchConditions"][0]["expression"]
    for name in ("mthreads.com/vgpu", "mthreads.com/sgpu-memory", "mthreads.com/sgpu-core"):
        assert f"'{name}'" in expr
    legacy = one(rendered("hami-legacy"), "MutatingWebhookConfiguration", "hami-webhook")["webhooks"][0]
    assert legacy["failurePolicy"] == "Ignore"
    # without a whitelist the release namespace is still skipped (our own pods, when matchConditions are off)
    assert legacy["namespaceSelector"]["matchExpressions"][1:] == [
        {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system"]}]


def test_match_condition_lists_every_scheduler_owned_annotation(rendered: Rendered) -> None:
    expr = one(rendered("defaults"), "MutatingWebhookConfiguration", "hami-webhook")["webhooks"][0][
        "matchConditions"][0]["expression"]
    listed = re.search(r"annotations\.exists\(k, k in \[([^\]]*)\]", expr)
    assert listed is not None
    assert set(re.findall(r"'([^']+)'", listed.group(1))) == set(SCHEDULER_OWNED_KEYS)


def test_match_conditions_need_kubernetes_1_28(helm: Path) -> None:
    old = objects(template(helm, Case(sets=("scheduler.admissionPolicy.enabled=false",)), "--kube-version",
                           "v1.27.9").stdout)
    assert "matchConditions" not in one(old, "MutatingWebhookConfiguration", "hami-webhook")["webhooks"][0]


# ------------------------------------------------------------------------------ the admission policy
def _policy(objs: list[Json], fullname: str) -> tuple[Json, Json]:
    policy = one(objs, "ValidatingAdmissionPolicy", f"{fullname}-allocation-records")
    binding = one(objs, "ValidatingAdmissionPolicyBinding", f"{fullname}-allocation-records")
    return policy["spec"], binding["spec"]


def _cel_list(expression: str) -> list[set[str]]:
    return [set(re.findall(r"'([^']+)'", m)) for m in re.findall(r"\[('[^\]]*')\]", expression)]


def test_admission_policy_only_our_bind_writes_records(rendered: Rendered) -> None:
    spec, binding = _policy(rendered("defaults"), "hami")
    assert binding == {"policyName": "hami-allocation-records", "validationActions": ["Deny"]}
    assert spec["failurePolicy"] == "Fail"  # fail closed
    rules = {(tuple(r["operations"]), tuple(r["resources"])) for r in spec["matchConstraints"]["resourceRules"]}
    # pods/status too (a status update may change annotations); Bindings copy theirs onto the pod
    assert rules == {(("CREATE", "UPDATE"), ("pods", "pods/status")), (("CREATE",), ("pods/binding", "bindings"))}
    who, could = spec["matchConditions"]
    # exempt: the scheduler's ServiceAccount (the extender shares it) and the watchers'; nobody else,
    # cluster admins included
    assert who["expression"] == ("!(request.userInfo.username in ['system:serviceaccount:kube-system:hami-scheduler', "
                                 "'system:serviceaccount:kube-system:hami-watcher'])")
    # judged whenever a validation could refuse: every scheduler-owned key (the widest list the validations
    # use), looked for in the object and in the old object, a create that names a node, and a create of a pod
    # asking for slices that names another scheduler (in containers and init containers)
    assert could["name"] == "could-be-refused"
    keys, *resources = _cel_list(could["expression"])
    assert keys == set(SCHEDULER_OWNED_KEYS)
    assert resources == [{"mthreads.com/vgpu", "mthreads.com/sgpu-memory", "mthreads.com/sgpu-core"}] * 4
    for part in ("k in object.metadata.annotations", "k in oldObject.metadata.annotations",
                 "request.operation == 'CREATE'", "object.spec.nodeName != ''",
                 "object.spec.schedulerName != 'hami-scheduler'", "object.spec.initContainers.exists"):
        assert part in could["expression"]
    variables = {v["name"]: v["expression"] for v in spec["variables"]}
    everywhere, on_slices = _cel_list(variables["owned"])[1], _cel_list(variables["owned"])[0]
    assert on_slices == set(SCHEDULER_OWNED_KEYS) and everywhere == set(MTHREADS_OWNED_KEYS)
    assert _cel_list(variables["bindingRecord"])[0] == set(SCHEDULER_OWNED_KEYS)
    for name in ("mthreads.com/vgpu", "mthreads.com/sgpu-memory", "mthreads.com/sgpu-core"):
        assert f"'{name}'" in variables["asksForSlices"]
    assert "initContainers" in variables["asksForSlices"]
    messages = " ".join(v["messageExpression"] for v in spec["validations"])
    assert all(v["reason"] == "Forbidden" for v in spec["validations"])
    for what in ("remove them from the pod you create", "may not set, change or remove them",
                 "may only be made by hami-scheduler", "use a nodeSelector instead",
                 'must name schedulerName "hami-scheduler"'):
        assert what in messages


def test_admission_policy_follows_release_and_resource_names(rendered: Rendered) -> None:
    spec, _ = _policy(rendered("custom"), "gpu-hami")
    assert "'system:serviceaccount:hami-system:gpu-hami-scheduler'" in spec["matchConditions"][0]["expression"]
    assert "'system:serviceaccount:hami-system:gpu-hami-watcher'" in spec["matchConditions"][0]["expression"]
    variables = {v["name"]: v["expression"] for v in spec["variables"]}
    assert "'example.com/vgpu'" in variables["asksForSlices"]
    assert "example.com/vgpu are placed on a card by gpu-scheduler" in spec["validations"][-2]["messageExpression"]
    last = spec["validations"][-1]
    assert 'example.com/vgpu must name schedulerName "gpu-scheduler"' in last["messageExpression"]
    assert "object.spec.schedulerName == 'gpu-scheduler'" in last["expression"]
    assert "object.spec.schedulerName != 'gpu-scheduler'" in spec["matchConditions"][1]["expression"]
    # the scheduler and watcher ServiceAccounts it exempts are the ones the Deployments run as
    accounts = {d["spec"]["template"]["spec"]["serviceAccountName"] for d in find(rendered("custom"), "Deployment")}
    assert {"gpu-hami-scheduler", "gpu-hami-watcher"} <= accounts


def test_identity_policies(rendered: Rendered) -> None:
    """What RBAC cannot narrow (tests/e2e/test_trust.py runs them on the real API server): the scheduler's
    ServiceAccount writes only its own Lease, the watchers' only one annotation of a Node."""
    objs = rendered("defaults")
    leases = one(objs, "ValidatingAdmissionPolicy", "hami-scheduler-leases")["spec"]
    assert leases["failurePolicy"] == "Fail"
    who = "request.userInfo.username == 'system:serviceaccount:kube-system:hami-scheduler'"
    assert leases["matchConditions"] == [{"name": "our-scheduler", "expression": who}]
    assert "request.name == 'hami-scheduler'" in leases["validations"][0]["expression"]
    nodes = one(objs, "ValidatingAdmissionPolicy", "hami-watcher-writes")["spec"]
    assert nodes["matchConstraints"]["resourceRules"] == [
        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"], "resources": ["nodes"]}]
    assert "'mtsched.io/capacity-freed'" in str(nodes["variables"])
    for name in ("hami-scheduler-leases", "hami-watcher-writes"):
        assert one(objs, "ValidatingAdmissionPolicyBinding", name)["spec"] == {
            "policyName": name, "validationActions": ["Deny"]}


def test_admission_policy_toggle_and_kubernetes_version(helm: Path, rendered: Rendered) -> None:
    # devices.mthreads.enabled=false: no record and no watcher; the scheduler's Lease stays its own
    assert [p["metadata"]["name"] for p in find(rendered("disabled"), "ValidatingAdmissionPolicy")] == [
        "hami-scheduler-leases"]
    off = objects(template(helm, Case(sets=("scheduler.admissionPolicy.enabled=false",))).stdout)
    assert not find(off, "ValidatingAdmissionPolicy") and not find(off, "ValidatingAdmissionPolicyBinding")
    proc = template(helm, Case(), "--kube-version", "v1.29.9", check=False)  # no admissionregistration v1 VAP
    assert proc.returncode != 0 and "needs Kubernetes 1.30+" in proc.stderr
    assert "scheduler.admissionPolicy.enabled=false" in proc.stderr  # says how to install anyway


# ------------------------------------------------------------------------------------------- TLS
def _cert(pem: bytes) -> x509.Certificate:
    return x509.load_pem_x509_certificate(pem)


def _verify_signed_by(cert: x509.Certificate, ca: x509.Certificate) -> None:
    key = ca.public_key()
    assert cert.signature_hash_algorithm is not None
    if isinstance(key, rsa.RSAPublicKey):
        key.verify(cert.signature, cert.tbs_certificate_bytes, padding.PKCS1v15(), cert.signature_hash_algorithm)
    else:
        assert isinstance(key, ec.EllipticCurvePublicKey)
        key.verify(cert.signature, cert.tbs_certificate_bytes, ec.ECDSA(cert.signature_hash_algorithm))


def test_generated_certificate(rendered: Rendered) -> None:
    objs = rendered("defaults")
    secret = one(objs, "Secret", "hami-scheduler-tls")
    assert secret["type"] == "kubernetes.io/tls"
    data = {k: base64.b64decode(v) for k, v in secret["data"].items()}
    hook = one(objs, "MutatingWebhookConfiguration", "hami-webhook")["webhooks"][0]
    assert base64.b64decode(hook["clientConfig"]["caBundle"]) == data["ca.crt"]  # one CA, one render
    ca, cert = _cert(data["ca.crt"]), _cert(data["tls.crt"])
    _verify_signed_by(cert, ca)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert ipaddress.ip_address("127.0.0.1") in san.get_values_for_type(x509.IPAddress)  # the extender URL
    assert "hami-webhook.kube-system.svc" in san.get_values_for_type(x509.DNSName)  # the webhook Service
    # Every pod that mounts the Secret rolls when the CA changes.
    digests = {d["spec"]["template"]["metadata"]["annotations"].get("checksum/tls")
               for d in find(rendered("extender-https"), "Deployment")
               if d["metadata"]["name"] in ("hami-scheduler", "hami-webhook")}
    assert len(digests) == 1 and None not in digests
    assert "checksum/tls" in one(objs, "Deployment", "hami-webhook")["spec"]["template"]["metadata"]["annotations"]


def test_cert_manager(rendered: Rendered) -> None:
    for name in ("cert-manager", "hami-legacy"):
        objs = rendered(name)
        assert not find(objs, "Secret", "hami-scheduler-tls")
        cert = one(objs, "Certificate", "hami-scheduler-serving-cert")
        assert cert["spec"]["secretName"] == "hami-scheduler-tls"
        assert cert["spec"]["ipAddresses"] == ["127.0.0.1"]
        assert "hami-webhook.kube-system.svc" in cert["spec"]["dnsNames"]
        assert cert["spec"]["issuerRef"] == {"name": "hami-ca-issuer", "kind": "Issuer", "group": "cert-manager.io"}
        assert one(objs, "Certificate", "hami-ca")["spec"]["isCA"] is True
        cfg = one(objs, "MutatingWebhookConfiguration", "hami-webhook")
        assert cfg["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == \
            "kube-system/hami-scheduler-serving-cert"
        assert "caBundle" not in cfg["webhooks"][0]["clientConfig"]
    objs = rendered("cert-manager-issuer")
    assert [c["metadata"]["name"] for c in find(objs, "Certificate")] == ["hami-scheduler-serving-cert"]
    assert not find(objs, "Issuer")
    assert one(objs, "Certificate", "hami-scheduler-serving-cert")["spec"]["issuerRef"]["kind"] == "ClusterIssuer"


def test_external_tls(rendered: Rendered) -> None:
    objs = rendered("external-tls")
    assert not find(objs, "Secret", "hami-scheduler-tls") and not find(objs, "Certificate")
    hook = one(objs, "MutatingWebhookConfiguration", "hami-webhook")["webhooks"][0]
    assert hook["clientConfig"]["caBundle"] == CASES["external-tls"].values["tls"]["external"]["caBundle"]
    for d in find(objs, "Deployment"):
        for v in d["spec"]["template"]["spec"]["volumes"]:
            if v["name"] == "tls":
                assert v["secret"]["secretName"] == "my-tls"


# ------------------------------------------------------------------------------- helm upgrade
def test_checksums_roll_pods_only_when_configuration_changes(helm: Path) -> None:
    def annotations(case: Case) -> dict[str, dict[str, str]]:
        objs = objects(template(helm, case).stdout)
        return {d["metadata"]["name"]: d["spec"]["template"]["metadata"].get("annotations", {})
                for d in find(objs, "Deployment")}

    # tls.mode=external keeps renders deterministic (generate makes a new CA without a cluster).
    base = Case(sets=("tls.mode=external",))
    a, b = annotations(base), annotations(base)
    assert a == b
    changed = annotations(Case(sets=("tls.mode=external", "devices.mthreads.memoryPerCard={96,160}")))
    for name in ("hami-scheduler", "hami-webhook", "hami-watcher"):
        assert changed[name]["checksum/config"] != a[name]["checksum/config"], name
    assert changed["hami-scheduler"]["checksum/scheduler-config"] == a["hami-scheduler"]["checksum/scheduler-config"]
    timeout = annotations(Case(sets=("tls.mode=external", "scheduler.extenderHTTPTimeout=45")))
    assert timeout["hami-scheduler"]["checksum/scheduler-config"] != a["hami-scheduler"]["checksum/scheduler-config"]


# ------------------------------------------------------------------------ static manifest, image
def test_static_manifest_is_the_fresh_render(helm: Path) -> None:
    import os
    import subprocess

    from tests.deploy._chart import MANIFEST, RENDER_SH

    fresh = subprocess.run([str(RENDER_SH), "--stdout"], capture_output=True, text=True, check=True,
                           env={**os.environ, "HELM": str(helm)}, timeout=300).stdout
    assert MANIFEST.read_text() == fresh, "deploy/manifests/hami.yaml is stale: run deploy/manifests/render.sh"
    objs = objects(fresh)
    assert not find(objs, "Secret")  # the certificate is the user's (tls.mode=external)
    assert {d["metadata"]["name"]: d["spec"]["replicas"] for d in find(objs, "Deployment")} == {
        "hami-scheduler": 2, "hami-webhook": 2, "hami-watcher": 2, "hami-redis": 1}
    # (the watchers' events Role lives where Node events do)
    assert all(o["metadata"].get("namespace") in (None, "kube-system") or o["metadata"]["name"] == "hami-watcher-events"
               for o in objs)


def test_dockerfile() -> None:
    from tests.deploy._chart import ROOT

    text = (ROOT / "deploy" / "Dockerfile").read_text()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    froms = [ln for ln in lines if ln.upper().startswith("FROM ")]
    assert froms and all(f.split()[1].startswith("python:3.11-slim") for f in froms)
    assert any("pip install" in ln and "." in ln.split("pip install", 1)[1] for ln in lines)
    user = [ln.split()[1] for ln in lines if ln.upper().startswith("USER ")][-1]
    assert user.split(":")[0] == "10001"  # the chart's runAsUser
    assert lines[-1] == 'ENTRYPOINT ["mtsched"]' or 'ENTRYPOINT ["mtsched"]' in lines
    # Everything the package needs is copied into the build context.
    for path in re.findall(r"^COPY\s+(\S+)", text, re.M):
        if not path.startswith("--"):
            assert (ROOT / path).exists(), path
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["image"]["repository"].endswith("mtsched")


# ----------------------------------------------------------------------------------- the node agent
def test_the_node_agent_is_off_by_default_and_complete_when_on(rendered: Rendered) -> None:
    assert not find(rendered("defaults"), "DaemonSet")
    assert not [o for o in rendered("defaults") if "node-agent" in o["metadata"]["name"]]
    objs = rendered("node-agent")
    ds = one(objs, "DaemonSet", "hami-node-agent")
    spec = ds["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] == "hami-node-agent"
    assert spec["nodeSelector"] == {"mthreads.com/gpu-node": "true"}
    c = container(ds, "node-agent")
    assert c["args"][:2] == ["node-agent", "--config=/etc/mtsched/config.yaml"]
    env = {e["name"]: e for e in c["env"]}
    assert env["MTSCHED_NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["MTSCHED_CARD_KNOBS_PATH"]["value"] == "/host/proc/sgpu_km"
    assert env["MTSCHED_CARD_KNOBS_SECONDS"]["value"] == "10"
    assert "MTSCHED_REDIS_PASSWORD" not in env  # no Redis, no Secret
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert mounts["sgpu-km"] == {"name": "sgpu-km", "mountPath": "/host/proc/sgpu_km", "readOnly": True}
    vols = {v["name"]: v for v in spec["volumes"]}
    assert vols["sgpu-km"]["hostPath"] == {"path": "/proc/sgpu_km", "type": "Directory"}
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert spec["securityContext"]["runAsNonRoot"] is True
    # the settings the environment gives are settings mtsched knows (and accepts)
    cm = one(objs, "ConfigMap", "hami-config")
    out = check_config(cm["data"]["config.yaml"], {k: e.get("value", "gpu-node-1") for k, e in env.items()
                                                   if k != "MTSCHED_CONFIG"})
    assert (out["cardKnobsPath"], out["cardKnobsSeconds"], out["nodeName"]) == ("/host/proc/sgpu_km", 10,
                                                                               "gpu-node-1")
    # RBAC: get and patch nodes only; the admission policy keeps it to its own node and its annotation
    assert one(objs, "ClusterRole", "hami-node-agent")["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}]
    assert [b["roleRef"]["name"] for b in _bindings_of(objs, "hami-node-agent")] == ["hami-node-agent"]
    policy = one(objs, "ValidatingAdmissionPolicy", "hami-node-agent-writes")["spec"]
    assert policy["failurePolicy"] == "Fail"
    assert "'system:serviceaccount:kube-system:hami-node-agent'" in policy["matchConditions"][0]["expression"]
    assert "authentication.kubernetes.io/node-name" in policy["validations"][0]["expression"]
    assert one(objs, "ValidatingAdmissionPolicyBinding", "hami-node-agent-writes")["spec"] == {
        "policyName": "hami-node-agent-writes", "validationActions": ["Deny"]}


def test_filter_top_k_reaches_the_config(rendered: Rendered) -> None:
    """scheduler.filterTopK: the measured default 1 (docs/rules.md), a custom value as given; both load."""
    from shared.config import load_config

    for case, config, k in (("defaults", "hami-config", 1), ("custom", "gpu-hami-config", 5)):
        cfg = embedded(rendered(case), config, "config.yaml")
        assert cfg["filterTopK"] == k
        assert load_config(env={}, flags={"filterTopK": str(cfg["filterTopK"])}).filter_top_k == k


@pytest.mark.parametrize("case", ["defaults", "custom", "replicas-1"])
def test_the_extender_is_told_the_lease_and_its_replicas_to_hand_the_leadership_over(
        rendered: Rendered, case: str) -> None:
    """The extender of the leader pod writes kube-scheduler's Lease over while it is unready and another replica
    is Ready (controller/leadership.py): the chart tells it the Lease kube-scheduler elects on, a selector of
    exactly the Deployment's pods and its own pod's name, and the whole is a configuration the role accepts.
    One replica (or no leader election): nobody to hand over to, left off."""
    objs = rendered(case)
    deploy = next(o for o in find(objs, "Deployment") if o["metadata"]["name"].endswith("-scheduler"))
    ext = container(deploy, "extender")
    flags = dict(a[len("--set="):].split("=", 1) for a in ext["args"] if a.startswith("--set="))
    env = {e["name"]: e for e in ext["env"]}
    assert env["MTSCHED_POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    if case == "replicas-1":
        assert not [k for k in flags if k.startswith("leader")]
        return
    ksc = embedded(objs, deploy["metadata"]["name"], "scheduler-config.yaml")["leaderElection"]
    assert flags["leaderLease"] == f"{ksc['resourceNamespace']}/{ksc['resourceName']}"
    assert ksc["leaderElect"] is True and deploy["metadata"]["namespace"] == ksc["resourceNamespace"]
    selector = dict(p.split("=", 1) for p in flags["leaderPeers"].split(","))
    assert selector == deploy["spec"]["selector"]["matchLabels"]
    assert flags["leaderYieldSeconds"] == "60"
    cfg = load_config(env={"MTSCHED_POD_NAME": "hami-scheduler-5d8f-x2x7q"}, flags=flags)
    assert LeaderYield.wanted(cfg) and cfg.leader_yield_seconds == 60


@pytest.mark.parametrize("tag", ["v1.36.3", "v1.35.0", "v1.34.0", "1.34.2", "v1.34.1-gke.1200", "v1.33.5", "1.30.4",
                                 "v1.31.0-eks-1", "latest", "v2.0.0", "sha-0123abc"])
def test_nudge_any_node_follows_the_charts_kube_scheduler_as_the_python_rule_does(helm: Path, tag: str) -> None:
    """The chart's `hami.nudgeAnyNode` (from its kube-scheduler's image tag) and shared/domain/nudge.py
    any_node_wakes are twins: the watchers coalesce their Node nudges only for a kube-scheduler whose queueing
    hints are always on (docs/architecture.md)."""
    objs = objects(template(helm, Case(sets=(f"scheduler.kubeScheduler.image.tag={tag}",))).stdout)
    cfg = embedded(objs, "hami-config", "config.yaml")
    spelled = tag if tag.startswith("v") else f"v{tag}"  # as hami.kubeSchedulerTag writes it
    assert cfg["nudgeAnyNode"] is any_node_wakes(spelled), (tag, cfg["nudgeAnyNode"])
    assert cfg["nudgeAnyNode"] is (tag in ("v1.36.3", "v1.35.0", "v1.34.0", "1.34.2", "v1.34.1-gke.1200"))


@pytest.mark.parametrize("tag", ["v1.36.3", "v1.32.0", "v1.31.14", "v1.31.0-eks-1", "1.30.4", "v1.30.14", "latest",
                                 "v2.0.0"])
def test_kube_scheduler_arguments_and_readiness_follow_its_tag(helm: Path, tag: str) -> None:
    """Before 1.32 no Node event wakes a pod asking for mthreads.com/vgpu (shared/domain/nudge.py): the chart shortens
    kube-scheduler's retry of parked pods there, as unschedulable_retry_args says (the twin, which the local stack
    gives its kube-scheduler); before 1.31 kube-scheduler serves no /readyz, so it is ready at /healthz. Anything
    unreadable is a current kube-scheduler. The user's extraArgs come after ours (the last of a flag wins)."""
    objs = objects(template(helm, Case(sets=(f"scheduler.kubeScheduler.image.tag={tag}",))).stdout)
    c = container(one(objs, "Deployment", "hami-scheduler"), "kube-scheduler")
    spelled = tag if tag.startswith("v") else f"v{tag}"  # as hami.kubeSchedulerTag writes it
    ours = list(unschedulable_retry_args(spelled))
    assert c["command"] == ["kube-scheduler", "--config=/etc/kubernetes/hami/scheduler-config.yaml", *ours, "-v=2"]
    assert bool(ours) is (tag in ("v1.31.14", "v1.31.0-eks-1", "1.30.4", "v1.30.14")), tag
    old = tag in ("1.30.4", "v1.30.14")
    assert c["readinessProbe"]["httpGet"]["path"] == ("/healthz" if old else "/readyz"), tag
    assert c["livenessProbe"]["httpGet"]["path"] == c["startupProbe"]["httpGet"]["path"] == "/healthz"


def test_nudge_any_node_with_no_tag_follows_the_clusters_version(helm: Path) -> None:
    for version, any_node in (("v1.36.1", True), ("v1.33.4", False)):
        objs = objects(template(helm, Case(), "--kube-version", version).stdout)
        assert embedded(objs, "hami-config", "config.yaml")["nudgeAnyNode"] is any_node, version
