"""The Grafana dashboard and the alert rules: the chart carries them (optional, off by default), the
metric-name extractor reads tricky PromQL right, and every name queried is one our code exports.

That the names exist in a real scrape of the running roles, with samples, is tests/e2e/test_dashboard_metrics.py.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client import registry as prom_registry

from tests.deploy._chart import ROOT, Case, Json, find, objects, one, template
from tests.deploy._promql import (
    DASHBOARD,
    Scrape,
    concrete,
    dashboard_queries,
    metric_names,
    parse_errors,
    promql_checker,
    queried_names,
    rule_queries,
    variable_metric_names,
)

Rendered = Callable[[str], list[Json]]

# -------------------------------------------------------------------------------- the extractor
EXTRACTOR_CASES: list[tuple[str, set[str]]] = [
    ("up", {"up"}),
    ("mtsched_ready == 0", {"mtsched_ready"}),
    ('rate(mtsched_bindings_total{result=~"failed|error"}[5m])', {"mtsched_bindings_total"}),
    # label names in by/on/group_left lists and label matchers are not metrics
    ("sum by (role) (mtsched_ready * on(job, instance) group_left(role) mtsched_role_info)",
     {"mtsched_ready", "mtsched_role_info"}),
    ("sum without (instance, pod) (rate(a_total[1m])) / ignoring(le) group_right b",
     {"a_total", "b"}),
    ("sum(rate(x_total[5m])) by (node, device_index)", {"x_total"}),
    # histogram_quantile with a Grafana range variable and a trailing `by`
    ("histogram_quantile(0.99, sum by (le, verb) (rate(mtsched_extender_request_seconds_bucket[$__rate_interval])))",
     {"mtsched_extender_request_seconds_bucket"}),
    # Grafana variables in matchers and ranges, in both spellings; numbers with units and exponents
    ('max by (node) (mtsched_card_slices{node=~"$node", device_index="${card}"}) > 1e3 offset 5m',
     {"mtsched_card_slices"}),
    ("rate(c_total[${__rate_interval}]) * 0.5 + rate(d_total[[[interval]]])", {"c_total", "d_total"}),
    # strings hold anything, including names, parentheses and braces
    ('label_replace(e_metric, "dst", "$1 f_metric{x}", "src", "(.*) by (y)")', {"e_metric"}),
    ('count_values("g_metric", h_metric)', {"h_metric"}),
    # keywords, bool, subqueries, @ modifiers, set operators
    ("(time() - i_ts > bool 180) and on(job) j_info unless k_metric or vector(0)", {"i_ts", "j_info", "k_metric"}),
    ("max_over_time(l_metric[1h:5m] @ start()) - m_metric @ 1609746000", {"l_metric", "m_metric"}),
    # recording-rule names with colons, __name__ selectors, absent()
    ('job:n_metric:rate5m + on() group_left {__name__="o_metric", job="x"}', {"job:n_metric:rate5m", "o_metric"}),
    ('absent(mtsched_role_info{role="watcher"}) or absent(p_metric)', {"mtsched_role_info", "p_metric"}),
    # a metric whose name contains a function's name; topk's parameter
    ("topk(5, rate_limit_hits_total) + sum_requests", {"rate_limit_hits_total", "sum_requests"}),
    ("  ", set()),
]


@pytest.mark.parametrize(("expr", "names"), EXTRACTOR_CASES, ids=[c[0][:50] for c in EXTRACTOR_CASES])
def test_extractor_finds_the_metric_names(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


def test_variable_queries() -> None:
    assert variable_metric_names("label_values(mtsched_card_slices, node)") == {"mtsched_card_slices"}
    assert variable_metric_names('label_values(a{job=~"$job", x="1,2"}, instance)') == {"a"}
    assert variable_metric_names("label_values(node)") == set()  # a label across all series
    assert variable_metric_names("query_result(topk(3, sum by (node) (b)))") == {"b"}


def test_scrape_resolves_histogram_suffixes() -> None:
    text = "\n".join([
        "# HELP h_seconds x", "# TYPE h_seconds histogram", 'h_seconds_bucket{le="+Inf"} 0', "h_seconds_count 0",
        "h_seconds_sum 0", "# HELP c_total x", "# TYPE c_total counter",  # declared, no sample yet
        "# TYPE g gauge", 'g{node="a b"} 1'])
    s = Scrape.parse(text)
    assert s.family("h_seconds_bucket") == s.family("h_seconds_count") == "h_seconds"
    assert s.family("c_total") == "c_total" and not s.has_samples("c_total")
    assert s.family("g_bucket") is None and s.family("missing") is None
    assert s.has_samples("g") and s.has_samples("h_seconds")


# ----------------------------------------------------------------------- the dashboard and rules
def dashboard() -> Json:
    data: Json = json.loads(DASHBOARD.read_text())
    return data


def monitoring_objects(rendered: Rendered) -> list[Json]:
    return rendered("monitoring")


def _our_registry() -> str:
    """Every metric our code defines: the roles' registry plus the per-card collector over an empty mirror."""
    for module in ("controller.extender", "controller.reconciler", "controller.watchers", "webhook.server"):
        importlib.import_module(module)  # the modules that define metrics (their import registers them)
    from shared.store.card_metrics import CardExposition

    return generate_latest(prom_registry.REGISTRY).decode() + CardExposition(dict).render().decode()


def test_every_query_parses_with_the_prometheus_parser(pytestconfig: pytest.Config, rendered: Rendered) -> None:
    queries = [*dashboard_queries(dashboard()), *rule_queries(monitoring_objects(rendered))]
    assert len(queries) > 30
    exprs = [concrete(e) for _, e in queries]
    verdicts = parse_errors(promql_checker(pytestconfig), [*exprs, "sum(rate(x[5m])"])
    assert verdicts[-1] != "ok"  # the checker does refuse a broken expression
    bad = {where: (e, v) for (where, _), e, v in zip(queries, exprs, verdicts, strict=False) if v != "ok"}
    assert not bad, bad


def test_concrete_queries() -> None:
    assert concrete('rate(a{node=~"$node"}[$__rate_interval]) + b[${__range}]') == 'rate(a{node=~".*"}[5m]) + b[5m]'


def test_every_queried_metric_is_one_our_code_defines(rendered: Rendered) -> None:
    names = queried_names(dashboard(), monitoring_objects(rendered))
    # the extractor found what the panels are about (guards against one that finds nothing)
    assert {"mtsched_card_memory_allocated_units", "mtsched_extender_request_seconds_bucket",
            "mtsched_filter_failures_total", "mtsched_ready", "mtsched_redis_up",
            "mtsched_reconcile_last_pass_timestamp_seconds", "mtsched_bindings_total"} <= set(names)
    defined = Scrape.parse(_our_registry())
    unknown = {n: sorted(w) for n, w in names.items() if defined.family(n) is None}
    assert not unknown, unknown


def test_dashboard_is_well_formed() -> None:
    dash = dashboard()
    assert dash["uid"] and dash["title"] and dash["schemaVersion"] >= 36
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for p in dash["panels"]:
        if p["type"] == "row":
            continue
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p["targets"] and all(t["expr"].strip() for t in p["targets"]), p["title"]
        assert p.get("description"), p["title"]
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, p["title"]
    titles = {p["title"] for p in dash["panels"]}
    assert {"Pending pods by reason", "Extender latency (p50, p99)", "Ledger rebuilds", "Reconcile repairs",
            "Ready replicas by role", "Watch relists and resumes", "Reservations and conflicts"} <= titles
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"


# ----------------------------------------------------------------------------------- the chart
def test_off_by_default(rendered: Rendered) -> None:
    objs = rendered("defaults")
    assert not find(objs, "PrometheusRule")
    assert not [o for o in find(objs, "ConfigMap") if "grafana_dashboard" in (o["metadata"].get("labels") or {})]


def test_the_pod_monitor_scrapes_every_role_s_metrics_port(helm: Path) -> None:
    """The alerts expect every role scraped (MtschedRoleAbsent): the PodMonitor selects the release's pods and
    their port named `metrics`, which each role's container has (the node agent's too)."""
    values = {"monitoring": {"podMonitor": {"enabled": True, "labels": {"release": "prom"}}},
              "nodeAgent": {"enabled": True}}
    objs = objects(template(helm, Case(values), "--api-versions", "monitoring.coreos.com/v1").stdout)
    pm = one(objs, "PodMonitor", "hami")
    assert pm["metadata"]["labels"]["release"] == "prom"
    assert pm["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
    selector = pm["spec"]["selector"]["matchLabels"]
    scraped = set()
    for w in find(objs, "Deployment") + find(objs, "DaemonSet"):
        pod = w["spec"]["template"]
        ports = {p["name"] for c in pod["spec"]["containers"] for p in c.get("ports") or []}
        if "metrics" in ports:
            assert selector.items() <= pod["metadata"]["labels"].items(), w["metadata"]["name"]
            scraped.add(w["metadata"]["name"])
    assert scraped == {"hami-scheduler", "hami-webhook", "hami-watcher", "hami-node-agent"}
    proc = template(helm, Case(values), check=False)  # no Prometheus Operator: said at install
    assert proc.returncode != 0 and "Prometheus Operator" in proc.stderr


def test_dashboard_configmap_carries_the_one_json_file(rendered: Rendered) -> None:
    cm = one(monitoring_objects(rendered), "ConfigMap", "hami-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["annotations"]["grafana_folder"] == "GPU"
    assert cm["metadata"]["namespace"] == "kube-system"
    # byte for byte the file in the chart (read with .Files.Get, not a copy)
    assert cm["data"]["mtsched.json"] == DASHBOARD.read_text().rstrip("\n")
    assert json.loads(cm["data"]["mtsched.json"]) == dashboard()


def test_dashboard_label_and_namespace_are_configurable(helm: Path) -> None:
    values = {"monitoring": {"dashboard": {"enabled": True, "labelKey": "grafana.example/dashboard", "labelValue": 1,
                                           "namespace": "monitoring"}}}
    objs = objects(template(helm, Case(values)).stdout)
    cm = one(objs, "ConfigMap", "hami-dashboard")
    labels = cm["metadata"]["labels"]
    assert labels["grafana.example/dashboard"] == "1" and "grafana_dashboard" not in labels
    assert cm["metadata"]["namespace"] == "monitoring"
    proc = template(helm, Case({"monitoring": {"dashboard": {"enabled": True, "labelKey": ""}}}), check=False)
    assert proc.returncode != 0 and "labelKey" in proc.stderr


def _rules(objs: list[Json]) -> dict[str, Json]:
    rule = one(objs, "PrometheusRule", "hami-alerts")
    return {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}


def test_prometheus_rule_alerts(rendered: Rendered) -> None:
    objs = monitoring_objects(rendered)
    rule = one(objs, "PrometheusRule", "hami-alerts")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    rules = _rules(objs)
    assert {"MtschedLedgerNotReconciled", "MtschedRoleDown", "MtschedRoleNotReady", "MtschedRoleAbsent",
            "MtschedBindFailures", "MtschedRedisUnreachable", "MtschedOvercommitObserved",
            "MtschedCardOverbooked"} <= set(rules)
    for name, r in rules.items():
        assert r["labels"]["severity"] in ("critical", "warning", "info"), name
        assert r["annotations"]["summary"] and r["annotations"]["description"], name
        # the runbook anchor is a heading of docs/runbooks.md
        assert r["annotations"]["runbook_url"].startswith("https://git.example/mtsched/blob/main/docs/runbooks.md#")
        assert metric_names(r["expr"]), name
    # Prometheus's own template syntax survives Helm's
    assert "{{ $labels.role }}" in rules["MtschedRoleDown"]["annotations"]["summary"]
    # default staleness: 4 x reconcileSeconds (30) + 60
    assert "> 180)" in rules["MtschedLedgerNotReconciled"]["expr"]
    assert "> 0.1" in rules["MtschedBindFailures"]["expr"]
    absent = rules["MtschedRoleAbsent"]["expr"]
    assert all(f'role="{role}"' in absent for role in ("extender", "watcher", "webhook"))


def test_runbook_has_a_section_per_alert(rendered: Rendered) -> None:
    headings = {line.lstrip("#").strip().lower() for line in (ROOT / "docs" / "runbooks.md").read_text().splitlines()
                if line.startswith("#")}
    for name, r in _rules(monitoring_objects(rendered)).items():
        anchor = r["annotations"]["runbook_url"].rsplit("#", 1)[1]
        assert anchor in headings, (name, anchor)


def test_prometheus_rule_values(helm: Path) -> None:
    values: dict[str, Any] = {"mtsched": {"reconcileSeconds": 120},
                              "scheduler": {"admissionWebhook": {"enabled": False}},
                              "monitoring": {"prometheusRule": {"enabled": True, "bindFailureRatio": 0.25,
                                                                "namespace": "monitoring"}}}
    objs = objects(template(helm, Case(values)).stdout)
    rules = _rules(objs)
    assert one(objs, "PrometheusRule", "hami-alerts")["metadata"]["namespace"] == "monitoring"
    assert "> 540)" in rules["MtschedLedgerNotReconciled"]["expr"]
    assert "> 0.25" in rules["MtschedBindFailures"]["expr"]
    assert 'role="webhook"' not in rules["MtschedRoleAbsent"]["expr"]  # no webhook deployed, none expected
    assert all("runbook_url" not in r["annotations"] for r in rules.values())
    values["monitoring"]["prometheusRule"]["ledgerStaleSeconds"] = 900
    assert "> 900)" in _rules(objects(template(helm, Case(values)).stdout))["MtschedLedgerNotReconciled"]["expr"]
    # no roles, no alerts about them
    off = Case({"devices": {"mthreads": {"enabled": False}}, "monitoring": {"prometheusRule": {"enabled": True}}})
    assert not find(objects(template(helm, off).stdout), "PrometheusRule")
    bad = template(helm, Case({"monitoring": {"prometheusRule": {"enabled": True, "bindFailureRatio": 2}}}),
                   check=False)
    assert bad.returncode != 0 and "bindFailureRatio" in bad.stderr

