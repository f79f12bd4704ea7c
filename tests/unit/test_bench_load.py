"""The load benchmark's pure parts: memory parsing and arithmetic, kube-scheduler's configuration for
percentageOfNodesToScore and an external extender, pods in their admitted form, the summary rows."""

from __future__ import annotations

import argparse
from dataclasses import replace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from bench import prom
from bench.load import memory
from bench.load.cli import external_warmup, plan, warmup
from bench.load.external import External, add_options, admit, apply_patch, from_args, tune_scheduler_config
from bench.load.metrics import api_requests, latency
from bench.load.phase import LARGE_ANNOTATION, Phase, make_pods
from bench.load.report import summarize, table
from bench.workload import CORE, MEM, VGPU, shapes
from shared.config import Config
from shared.domain.models import CardModel

STATUS = """Name:\tpython
VmPeak:\t  900000 kB
VmHWM:\t  204800 kB
VmRSS:\t  102400 kB
Threads:\t4
"""


def test_parse_status_reads_rss_and_peak() -> None:
    assert memory.parse_status(STATUS) == {"rss_kib": 102400, "hwm_kib": 204800}
    assert memory.parse_status("Name:\tzombie\n") == {}


@pytest.mark.parametrize(("before", "after", "count", "want"), [
    (100 * 1024, 150 * 1024, 500, 100.0),  # 50 MiB for 500 -> 100 MiB per 1000
    (100 * 1024, 100 * 1024, 40, 0.0),
    (100 * 1024, 90 * 1024, 1000, -10.0),  # shrinking is reported as it is
])
def test_growth_per_1000(before: int, after: int, count: int, want: float) -> None:
    b = {"extender-0": {"rss_kib": before}}
    a = {"extender-0": {"rss_kib": after}, "webhook-0": {"rss_kib": 1}}  # only in one sample: left out
    assert memory.growth_per_1000(b, a, count) == {"extender-0": want}


def test_growth_of_nothing_is_empty() -> None:
    assert memory.growth_per_1000({"x": {"rss_kib": 1}}, {"x": {"rss_kib": 2}}, 0) == {}


def test_by_role_sums_replicas_and_keeps_named_processes() -> None:
    values = {"extender-0": 1.5, "extender-1": 2.0, "watcher-0": 3.0, "kube-apiserver": 9.0, "hami": 4.0}
    assert memory.by_role(values) == {"extender": 3.5, "watcher": 3.0}
    assert memory.by_role(values, ("hami",)) == {"extender": 3.5, "watcher": 3.0, "hami": 4.0}


def _cfg() -> dict[str, Any]:
    return {"percentageOfNodesToScore": 100,
            "profiles": [{"schedulerName": "default-scheduler"}, {"schedulerName": "hami-scheduler"}],
            "extenders": [{"urlPrefix": "https://x", "tlsConfig": {"insecure": False}}]}


def test_percentage_set_globally_and_per_profile() -> None:
    out = tune_scheduler_config(_cfg(), 30)
    assert out["percentageOfNodesToScore"] == 30
    assert [p["percentageOfNodesToScore"] for p in out["profiles"]] == [30, 30]


def test_percentage_zero_is_kube_schedulers_default() -> None:
    cfg = _cfg()
    out = tune_scheduler_config(cfg, 0)
    assert "percentageOfNodesToScore" not in out
    assert all("percentageOfNodesToScore" not in p for p in out["profiles"])
    assert cfg["percentageOfNodesToScore"] == 100  # the input is left alone


def test_server_name_only_on_tls_extenders() -> None:
    cfg = _cfg()
    cfg["extenders"].append({"urlPrefix": "http://y"})
    out = tune_scheduler_config(cfg, 0, "ext.example")
    assert out["extenders"][0]["tlsConfig"]["serverName"] == "ext.example"
    assert "tlsConfig" not in out["extenders"][1]


@pytest.mark.parametrize("pct", [-1, 101])
def test_percentage_out_of_range(pct: int) -> None:
    with pytest.raises(ValueError, match="percentageOfNodesToScore"):
        tune_scheduler_config(_cfg(), pct)


def test_apply_patch_add_replace_and_escapes() -> None:
    doc = {"spec": {"containers": [{"name": "a"}]}, "metadata": {}}
    out = apply_patch(doc, [{"op": "add", "path": "/metadata/annotations", "value": {}},
                            {"op": "add", "path": "/metadata/annotations/a.io~1b", "value": "1"},
                            {"op": "replace", "path": "/spec/containers/0", "value": {"name": "b"}}])
    assert out == {"spec": {"containers": [{"name": "b"}]}, "metadata": {"annotations": {"a.io/b": "1"}}}
    assert doc["metadata"] == {}
    with pytest.raises(ValueError, match="remove"):
        apply_patch(doc, [{"op": "remove", "path": "/metadata"}])


def _parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--kubeconfig")
    add_options(p)
    return p.parse_args(list(argv))


def test_external_options() -> None:
    assert from_args(_parse()) is None
    ext = from_args(_parse("--external-extender", "https://h:1", "--external-node-cache-capable", "false",
                           "--external-prioritize-verb", "", "--external-weight", "3", "--external-pid", "42"))
    assert ext == External("https://h:1", node_cache_capable=False, prioritize_verb="", weight=3, pid="42")
    assert ext.process_id() == 42
    spec = ext.spec()
    assert (spec.prioritize_verb, spec.filter_verb, spec.weight, spec.node_cache_capable) == (None, "filter", 3, False)


@pytest.mark.parametrize("argv", [
    ("--external-extender", "h:1"),
    ("--external-extender", "https://h:1", "--external-client-cert", "c.pem"),
    ("--external-extender", "https://h:1", "--kubeconfig", "k"),
])
def test_external_options_refused(argv: tuple[str, ...]) -> None:
    with pytest.raises(SystemExit):
        from_args(_parse(*argv))


def test_external_pods_are_what_the_webhook_admits() -> None:
    mix = shapes(200, 7)
    pods = make_pods(Phase("external", 10, "x", 0), mix, "r")
    for s, p in zip(mix, pods, strict=True):
        limits = p["spec"]["containers"][0]["resources"]["limits"]
        assert p["spec"]["schedulerName"] == "hami-scheduler"
        assert (int(limits[MEM]), int(limits[CORE])) == s.admitted(160)
        assert limits[VGPU] == str(s.vgpu)
        assert ((p["metadata"].get("annotations") or {}).get("mthreads.com/request-gpu-num")
                == (str(s.vgpu) if s.vgpu > 1 else None))


def test_admit_refuses_what_the_webhook_denies() -> None:
    cfg = replace(Config(), memory_per_card=(CardModel(96),))
    pod = {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "resources": {"limits": {
        VGPU: "1", MEM: "7"}}}]}}
    with pytest.raises(ValueError, match="would deny"):
        admit(pod, cfg, (96,))


def test_large_pods_carry_the_annotation() -> None:
    pods = make_pods(Phase("large", 10, 1, 0, large_kb=50), shapes(3), "r")
    assert all(len(p["metadata"]["annotations"][LARGE_ANNOTATION]) == 50_000 for p in pods)


def _args(**kw: Any) -> argparse.Namespace:
    base = {"repeat": 2, "no_plain": False, "also_plain2": False, "rate": 0.0, "paced_rate": 50.0, "paced_pods": 10,
            "large_pods": 5, "large_annotation_kb": 50}
    return argparse.Namespace(**{**base, **kw})


def test_plan_order_and_sizes() -> None:
    got = [(ph.mode, ph.rep, pods, ph.percentage) for ph, pods in plan(100, 1, 100, _args(), 40)]
    assert got == [("ours", 0, 40, 100), ("plain", 0, 40, 100), ("plain", 1, 40, 100), ("ours", 1, 40, 100),
                   ("paced", 0, 10, 100), ("large", 0, 5, 100)]
    assert [ph.mode for ph, _ in plan(100, 1, 0, _args(no_plain=True, paced_rate=0, large_pods=0), 40)] == [
        "ours", "ours"]
    assert plan(100, 1, 0, _args(large_pods=1000), 40)[-1][1] == 40  # at most the mix
    # --also-plain2: the baseline before 2026-12-04 beside each plain phase, never without plain; the order
    # mirrored (ABC, CBA), so that no mode runs systematically earlier than another (the machine drifts)
    both = _args(also_plain2=True, paced_rate=0, large_pods=0)
    order = [(ph.mode, ph.rep) for ph, _ in plan(100, 1, 0, both, 40)]
    assert order == [("ours", 0), ("plain", 0), ("plain2", 0), ("plain2", 1), ("plain", 1), ("ours", 1)]
    for m in ("ours", "plain", "plain2"):
        assert sum(i % 3 for i, (mode, _) in enumerate(order) if mode == m) == 2  # same mean position
    assert [ph.mode for ph, _ in plan(100, 1, 0, _args(also_plain2=True, no_plain=True, paced_rate=0,
                                                       large_pods=0), 40)] == ["ours", "ours"]


def test_summary_sets_the_old_baseline_beside_plain() -> None:
    rows = summarize([_phase("ours", 1, 60.0), _phase("plain", 1, 100.0), _phase("plain2", 1, 120.0),
                      _phase("ours", 1, 40.0), _phase("plain", 1, 80.0), _phase("plain2", 1, 80.0)], fine=True)
    r = rows[0]
    assert (r["plain_pods_s"], r["plain2_pods_s"], r["ratio"], r["ratio_plain2"]) == (90.0, 100.0, 0.556, 0.5)
    assert r["plain2_pods_s_all"] == [120.0, 80.0]
    rounds = [_phase("ours", 1, 60.0), _phase("plain", 1, 100.0), _phase("plain", 1, 80.0), _phase("ours", 1, 40.0)]
    rounds[2].rep = rounds[3].rep = 1
    assert summarize(rounds, fine=True)[0]["ratio_pairs"] == [0.6, 0.5]
    assert "ratio to plain2" in table(rows, [])
    assert "plain2_pods_s" not in summarize([_phase("ours", 1, 60.0), _phase("plain", 1, 100.0)], fine=True)[0]


def test_warmup_runs_both_profiles_unmeasured_before_a_setting() -> None:
    got = [(ph.mode, ph.rep, ph.percentage) for ph in warmup(100, 1, 100, _args(warmup_pods=100))]
    assert got == [("ours", -1, 100), ("plain", -1, 100)]
    assert [ph.mode for ph in warmup(100, 1, 0, _args(warmup_pods=100, no_plain=True))] == ["ours"]
    assert warmup(100, 1, 0, _args(warmup_pods=0)) == []


def test_an_external_extender_gets_its_own_unmeasured_warmup() -> None:
    got = [(ph.mode, ph.replicas, ph.rep, ph.percentage) for ph in external_warmup(500, "hami", 100,
                                                                                    _args(warmup_pods=100))]
    assert got == [("external", "hami", -1, 100)]
    assert external_warmup(500, "hami", 0, _args(warmup_pods=0)) == []
    # the summary, made from the measured phases only, never sees them (cli.py keeps them in doc["warmups"])
    assert all(ph.rep >= 0 for ph, _ in plan(100, 1, 0, _args(warmup_pods=100), 40))


def _phase(mode: str, replicas: int | str, pods_s: float, pct: int = 0, **res: Any) -> Phase:
    ph = Phase(mode, 20, replicas, 0, percentage=pct, large_kb=50 if mode == "large" else 0)
    ph.result = {"throughput_pods_s": pods_s, "bound": 40, "pods": 40, "scheduling_cycle": {"mean_ms": 2.0},
                 "cpu_ms_per_pod": {"kube-scheduler": 1.0}, **res}
    return ph


def test_summary_puts_external_beside_ours_and_plain() -> None:
    phases = [
        _phase("ours", 1, 50.0, rss_mib_per_1000_pods={"extender-0": 10.0, "webhook-0": 1.0},
               hwm_mib_bound={"extender-0": 80.0}),
        _phase("ours", 1, 40.0, rss_mib_per_1000_pods={"extender-0": 4.0}, hwm_mib_bound={"extender-0": 90.0}),
        _phase("plain", 1, 100.0),
        _phase("large", 1, 30.0, rss_mib_per_1000_pods={"extender-0": 60.0}),
        _phase("external", "hami", 20.0, correctness={"unannotated_bound": 40},
               rss_mib_per_1000_pods={"hami": 7.0}),
        _phase("ours", 1, 45.0, pct=100),
    ]
    node_memory = [{"nodes": 20, "replicas": 1, "percentage": 0, "rss_mib_per_1000_nodes": {"extender-0": 25.0}}]
    rows = summarize(phases, fine=True, node_memory=node_memory)
    assert [(r["percentage_of_nodes_to_score"], r["ours_pods_s"]) for r in rows] == [(0, 45.0), (100, 45.0)]
    r = rows[0]
    assert (r["external"], r["external_pods_s"], r["external_ratio"]) == ("hami", 20.0, 0.2)
    assert r["external_unannotated_bound"] == 40 and r["unannotated_bound"] == 0  # not counted as ours
    assert r["external_rss_mib_per_1000_pods"] == {"hami": 7.0}
    assert r["rss_mib_per_1000_pods"] == {"extender": 10.0, "webhook": 1.0}  # the largest of the runs
    assert r["rss_mib_per_1000_large_pods"] == {"extender": 60.0} and r["large_annotation_kb"] == 50
    assert r["rss_mib_per_1000_nodes"] == {"extender": 25.0} and r["rss_mib_peak"] == {"extender": 90.0}
    assert "external" not in rows[1] and rows[1]["rss_mib_per_1000_nodes"] is None
    text = table(rows, [])
    assert "hami | 20.0" in text and "per 1000 large pods" in text
    assert "20 | 1 | default | extender | 25.00 | 10.00 | 60.00 | 50 | 90.0" in text


def test_schedule_attempts_are_counted_by_result_across_profiles() -> None:
    from bench import prom
    from bench.load.metrics import schedule_attempts

    text = "\n".join([
        "# HELP scheduler_schedule_attempts_total Number of attempts to schedule pods",
        "# TYPE scheduler_schedule_attempts_total counter",
        'scheduler_schedule_attempts_total{profile="default-scheduler",result="scheduled"} 7',
        'scheduler_schedule_attempts_total{profile="hami-scheduler",result="scheduled"} 5',
        'scheduler_schedule_attempts_total{profile="hami-scheduler",result="error"} 2',
        'scheduler_schedule_attempts_total{profile="hami-scheduler",result="unschedulable"} 0',
        "# TYPE other_total counter",
        "other_total 9",
    ]) + "\n"
    before = prom.parse(text)  # kept by the bench's filter of what it reads
    after = {k: v * 3 for k, v in before.items()}
    d = {"kube-scheduler": prom.diff(after, before)}
    assert schedule_attempts(d) == {"scheduled": 24, "error": 4}  # the phase's attempts; zero results dropped
    assert schedule_attempts({}) == {}


def test_batch_attempts_are_counted_per_profile() -> None:
    from bench import prom
    from bench.load.metrics import batch_attempts

    text = "\n".join([
        "# TYPE scheduler_batch_attempts_total counter",
        'scheduler_batch_attempts_total{profile="default-scheduler",result="hint"} 4',
        'scheduler_batch_attempts_total{profile="default-scheduler",result="no_hint"} 6',
        'scheduler_batch_attempts_total{profile="hami-scheduler",result="no_hint"} 0',
    ]) + "\n"
    before = prom.parse(text)
    d = {"kube-scheduler": prom.diff({k: v * 2 for k, v in before.items()}, before)}
    assert batch_attempts(d) == {"default-scheduler": {"hint": 4, "no_hint": 6}}
    assert batch_attempts({}) == {}


def test_plain_pods_ask_for_twins_our_roles_ignore() -> None:
    """The plain phase must cost kube-scheduler what ours does at node level, and our roles nothing: its pods
    ask for twins of the three resources our admitted pods ask for (same amounts), which the product does not
    read; plain2 (--also-plain2), the baseline before 2026-12-04, for twins of sgpu-memory/sgpu-core only."""
    from dataclasses import replace

    from bench.load.cluster import node_body
    from bench.load.external import admit
    from bench.workload import PLAIN_CORE, PLAIN_MEM, PLAIN_VGPU, PLAIN_VGPU_CAPACITY, admitted_pod, our_pod
    from controller.pod_watch import unaccounted
    from shared.config import Config, load_config
    from shared.domain.models import CardModel

    acfg = replace(Config(), memory_per_card=(CardModel(96), CardModel(160)))
    for name in ("bench-node-00000", "bench-node-00001"):  # both models: the nodes offer every twin
        for res in ("capacity", "allocatable"):
            have = node_body(name, False)["status"][res]
            assert (have[PLAIN_MEM], have[PLAIN_CORE]) == (have["mthreads.com/sgpu-memory"],
                                                           have["mthreads.com/sgpu-core"])
            assert int(have["pods"]) * 2 < int(have[PLAIN_VGPU]) == PLAIN_VGPU_CAPACITY  # never decides a placement

    cfg = load_config(env={}, flags={"memoryPerCard": "96,160"})
    mix = shapes(200, 7)
    assert {s.vgpu for s in mix} == {1, 2}
    assert 110 * max(s.vgpu for s in mix) < PLAIN_VGPU_CAPACITY  # never what decides a plain placement
    for s, p, old in zip(mix, make_pods(Phase("plain", 10, "x", 0), mix, "r"),
                         make_pods(Phase("plain2", 10, "x", 0), mix, "r"), strict=True):
        limits = p["spec"]["containers"][0]["resources"]["limits"]
        ours = admitted_pod("x", s, 160)["spec"]["containers"][0]["resources"]["limits"]
        real = admit(our_pod("x", s, "r"), acfg, (96, 160))["spec"]["containers"][0]["resources"]["limits"]
        assert real == ours  # what the webhook's decision really gives kube-scheduler: three, same amounts
        assert set(limits) == {PLAIN_VGPU, PLAIN_MEM, PLAIN_CORE} and len(limits) == len(ours) == 3
        assert (int(limits[PLAIN_VGPU]), int(limits[PLAIN_MEM]), int(limits[PLAIN_CORE])) == (s.vgpu, *s.admitted(160))
        assert old["spec"]["containers"][0]["resources"]["limits"] == {PLAIN_MEM: limits[PLAIN_MEM],
                                                                       PLAIN_CORE: limits[PLAIN_CORE]}
        for pod in (p, old):
            bound = {**pod, "metadata": {**pod["metadata"], "namespace": "n", "uid": "u"},
                     "spec": {**pod["spec"], "nodeName": "bench-node-00001"}}
            assert unaccounted(bound, cfg) is None  # bound without a record, and nothing for our watchers


def _bench_scrape(*verbs: str) -> prom.Scrape:
    """One role's /metrics with three samples of mtsched_bench_seconds per verb, as bench/timed_role.py labels them."""
    reg = CollectorRegistry()
    hist = Histogram("mtsched_bench_seconds", "x", ["verb"], registry=reg, buckets=(0.001, 0.01))
    for verb in verbs:
        for _ in range(3):
            hist.labels(verb).observe(0.0005)
    return prom.parse(generate_latest(reg).decode())


def test_fine_latency_reads_each_part_from_the_role_that_times_it() -> None:
    d = {"extender": _bench_scrape("filter", "filter.compute", "filter.compute_cpu", "filter.compute_gc",
                                   "bind.api_binding", "loop_lag", "gc.gen0"),
         "webhook": _bench_scrape("webhook", "webhook.compute", "loop_lag", "gc.gen2"),
         "watcher": _bench_scrape("gc.gen1")}
    out = latency(d, fine=True)
    parts = ("filter.compute", "filter.compute_cpu", "filter.compute_gc", "bind.api_binding", "webhook.compute",
             "extender.loop_lag", "webhook.loop_lag", "extender.gc.gen0", "webhook.gc.gen2", "watcher.gc.gen1")
    assert {p: out.get(p, {}).get("count") for p in parts} == dict.fromkeys(parts, 3)
    assert "watcher.gc.gen0" not in out and "extender.gc.gen2" not in out  # none timed: no entry


def test_api_requests_per_pod_from_the_api_servers_counter() -> None:
    text = "\n".join([
        "# TYPE apiserver_request_total counter",
        'apiserver_request_total{code="201",resource="pods",subresource="",verb="POST"} 990',
        'apiserver_request_total{code="500",resource="pods",subresource="",verb="POST"} 10',
        'apiserver_request_total{code="201",resource="pods",subresource="binding",verb="POST"} 1000',
        'apiserver_request_total{code="200",resource="nodes",subresource="",verb="PATCH"} 2',
        'apiserver_request_total{code="200",resource="",subresource="",verb="GET"} 40',
        "# TYPE unrelated_total counter",
        "unrelated_total 5",
    ]) + "\n"
    scrape = prom.parse(text)
    assert all(name == "apiserver_request_total" for name, _ in scrape)  # the rest is dropped unparsed
    before = {k: v / 2 for k, v in scrape.items()}
    got = api_requests({"kube-apiserver": prom.diff(scrape, before)}, pods=500)
    # half of each count is the phase's; codes add up; below 0.005 per pod (1 PATCH) is left out
    assert got == {"POST pods": 1.0, "POST pods/binding": 1.0, "GET (non-resource)": 0.04}
    assert api_requests({}, pods=500) == {} and api_requests({"kube-apiserver": scrape}, pods=0) == {}
