"""Admission decisions: JSONPatch contents, denials a user can act on, the mixed-fleet rule."""

from __future__ import annotations

from typing import Any

import pytest

from shared.domain.admission import REQUEST_GPU_NUM, Decision, _esc, decide, judge_update, whole_card_model
from shared.domain.annotations import ALLOCATED, BIND_PHASE, GPU_INDEX, PREDICATE_NODE, VGPU_NODE
from shared.domain.request import PIN_ANNOTATION, Mode, pod_request
from tests.unit._k8s import CORE, GPU, MEM, VGPU, apply_patch, cfg, ctr, pod, slice_ctr

C96 = cfg((96,))
C160 = cfg((160,))
MIXED = cfg((96, 160))

SCHED = {"op": "add", "path": "/spec/schedulerName", "value": "hami-scheduler"}
LIM = "/spec/containers/0/resources/limits/"
MEM_PATH = LIM + "mthreads.com~1sgpu-memory"
CORE_PATH = LIM + "mthreads.com~1sgpu-core"


def allowed(p: dict[str, Any], c: Any = C96, reported: tuple[int, ...] = ()) -> Decision:
    d = decide(p, c, reported)
    assert d.allowed, d.message
    assert d.code == 200
    return d


def denied(p: dict[str, Any], c: Any = C96, reported: tuple[int, ...] = ()) -> str:
    d = decide(p, c, reported)
    assert not d.allowed
    assert d.code == 403  # admission.Denied (the API server shows "denied the request: <message>")
    assert d.patch == ()
    return d.message


def ops(d: Decision) -> dict[str, object]:
    """path -> value of every op (each path appears once in our patches)."""
    paths = [op["path"] for op in d.patch]
    assert len(paths) == len(set(paths)), paths
    return {op["path"]: op["value"] for op in d.patch}


def limits_after(p: dict[str, Any], d: Decision, i: int = 0) -> dict[str, str]:
    res: dict[str, str] = apply_patch(p, d.patch)["spec"]["containers"][i]["resources"]["limits"]
    return res


# --- what passes untouched ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "p",
    [
        pod(ctr("a", limits={GPU: 1})),  # whole card: default scheduler, vendor plugin (seed)
        pod(ctr("a", limits={GPU: 8}, requests={GPU: 8})),
        pod(ctr("a", limits={"cpu": "1"})),
        pod(ctr("a", limits={"nvidia.com/gpu": 1}), schedulerName="volcano"),
    ],
)
def test_pods_not_asking_for_slices_pass_without_patch(p: dict[str, Any]) -> None:
    d = allowed(p)
    assert d.patch == () and d.message == ""


def test_pod_without_containers_denied() -> None:
    assert denied({"metadata": {}, "spec": {"containers": []}}) == "pod has no containers"


# --- slices ---------------------------------------------------------------------------------------


def test_seed_example_only_switches_the_scheduler() -> None:
    # "The webhook rewrites the pod to use hami-scheduler, so schedulerName need not be set."
    d = allowed(pod(slice_ctr("gpushare-pod-1", 32, 8)))
    assert d.patch == (SCHED,)


@pytest.mark.parametrize(("name", "op"), [("default-scheduler", "replace"), ("hami-scheduler", None)])
def test_scheduler_name_patch(name: str, op: str | None) -> None:
    d = allowed(pod(slice_ctr(), schedulerName=name))
    if op is None:
        assert d.patch == ()
    else:
        assert d.patch == ({"op": op, "path": "/spec/schedulerName", "value": "hami-scheduler"},)


@pytest.mark.parametrize("default", [1, 4])
def test_missing_cores_get_the_default(default: int) -> None:
    p = pod(slice_ctr("a", 16, None))
    d = allowed(p, cfg((96,), default_cores=default))
    assert ops(d) == {"/spec/schedulerName": "hami-scheduler", CORE_PATH: str(default)}
    req = pod_request(apply_patch(p, d.patch), C96)
    assert req is not None and req.cores == default


def test_container_index_skips_init_containers() -> None:
    p = pod(ctr("app-cpu"), slice_ctr("app", 8, None), init=[ctr("init-cpu"), ctr("init-cpu2")])
    d = allowed(p)
    assert "/spec/containers/1/resources/limits/mthreads.com~1sgpu-core" in ops(d)


@pytest.mark.parametrize(
    ("c", "memory", "allowed_list"),
    [
        (C96, 3, "2, 4, 8, 16, 32, 64, 96 (memoryPerCard [96])"),  # HAMi "memory no exist legalMemoryslices"
        (C96, 128, "2, 4, 8, 16, 32, 64, 96 (memoryPerCard [96])"),  # guide: 128 rejected while unset
        (C96, 160, "2, 4, 8, 16, 32, 64, 96 (memoryPerCard [96])"),
        (C160, 96, "2, 4, 8, 16, 32, 64, 128, 160 (memoryPerCard [160])"),
        (C160, 48, "2, 4, 8, 16, 32, 64, 128, 160 (memoryPerCard [160])"),
        (MIXED, 1, "2, 4, 8, 16, 32, 64, 96, 128, 160 (memoryPerCard [96, 160])"),
        (MIXED, 256, "2, 4, 8, 16, 32, 64, 96, 128, 160 (memoryPerCard [96, 160])"),
    ],
)
def test_invalid_slice_size_denied_with_the_active_list(c: Any, memory: int, allowed_list: str) -> None:
    msg = denied(pod(slice_ctr("worker", memory, 4)), c)
    assert (
        msg
        == f'container "worker": mthreads.com/sgpu-memory={memory} is not a valid slice size; allowed: '
        + allowed_list
    )


@pytest.mark.parametrize(
    ("c", "memory"),
    [(C96, v) for v in (2, 4, 8, 16, 32, 64, 96)]
    + [(C160, v) for v in (2, 4, 8, 16, 32, 64, 128, 160)]
    + [(MIXED, v) for v in (2, 4, 8, 16, 32, 64, 96, 128, 160)],
)
def test_every_seed_value_is_admitted(c: Any, memory: int) -> None:
    assert allowed(pod(slice_ctr("a", memory, 4)), c).patch == (SCHED,)


@pytest.mark.parametrize(
    ("limits", "needle"),
    [
        ({VGPU: "1.5"}, "mthreads.com/vgpu='1.5' is not a whole number"),
        ({VGPU: 1, MEM: "16Gi"}, "mthreads.com/sgpu-memory='16Gi' is 17179869184, written with"),
        ({VGPU: 1, MEM: 32, CORE: "-1"}, "mthreads.com/sgpu-core='-1' is negative"),
        ({VGPU: 0, MEM: 2, CORE: 1}, "mthreads.com/vgpu='0' must be at least 1"),  # HAMi: count 0 rejected
        ({VGPU: -1, MEM: 2, CORE: 1}, "mthreads.com/vgpu='-1' is negative"),  # HAMi: count -1 rejected
        ({VGPU: 1, MEM: 32, CORE: 0}, "mthreads.com/sgpu-core='0' must be at least 1"),
        ({VGPU: 1, MEM: 32, CORE: 17}, "mthreads.com/sgpu-core=17 is outside 1..16"),
        ({VGPU: "100000000000000000000"}, "too large"),
        # the API server writes 4000 as "4k": a whole number, then judged as a size
        ({VGPU: 1, MEM: "4k", CORE: 1}, "mthreads.com/sgpu-memory=4000 is not a valid slice size"),
    ],
)
def test_bad_quantities_denied_naming_container_resource_value(
    limits: dict[str, object], needle: str
) -> None:
    msg = denied(pod(ctr("trainer", limits=limits)))
    assert msg.startswith('container "trainer": ')
    assert needle in msg


def test_request_only_count_zero_denied() -> None:
    # HAMi "request-only count set to zero is rejected".
    assert "mthreads.com/vgpu='0' must be at least 1" in denied(
        pod(ctr("a", requests={VGPU: 0, MEM: 2, CORE: 1}))
    )


def test_slices_of_one_pod_must_fit_one_card_of_some_model() -> None:
    msg = denied(pod(slice_ctr("a", 64, 4), slice_ctr("b", 64, 4)), C96)
    assert msg == (
        "the pod's slice containers share one card and ask 128 mthreads.com/sgpu-memory in all "
        "(a=64, b=64); no configured card model holds that: memoryPerCard [96]"
    )
    allowed(pod(slice_ctr("a", 64, 4), slice_ctr("b", 64, 4)), MIXED)  # fits an S5000 card
    # 96 is only an S4000 size and 96 + 64 > 96: no model takes both.
    assert "no configured card model holds that" in denied(
        pod(slice_ctr("a", 96, 4), slice_ctr("b", 64, 4)), MIXED
    )


def test_pinned_slice_must_be_valid_on_the_pin() -> None:
    p = pod(slice_ctr("a", 128, 4), annotations={PIN_ANNOTATION: "96"})
    assert denied(p, MIXED) == (
        'container "a": mthreads.com/sgpu-memory=128 is not valid on MTT S4000 pinned by '
        "mtsched.io/card-memory; allowed: 2, 4, 8, 16, 32, 64, 96"
    )
    assert "names no configured card model" in denied(
        pod(slice_ctr(), annotations={PIN_ANNOTATION: "S7000"}), MIXED
    )


# --- exclusive ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("c", "reported", "units", "text"),
    [
        (C96, (), "96", "the whole MTT S4000 card (96 units = 48 GiB, 16 core groups)"),
        (C160, (), "160", "the whole MTT S5000 card (160 units = 80 GiB, 16 core groups)"),
        (C160, (160,), "160", "80 GiB"),
    ],
)
def test_exclusive_gets_the_whole_card(c: Any, reported: tuple[int, ...], units: str, text: str) -> None:
    # "request only mthreads.com/vgpu. The webhook ... sets sgpu-core to 16 and sgpu-memory to the card's
    # full per-card capacity (160 units = 80 GiB on S5000)".
    p = pod(ctr("a", limits={VGPU: 1}))
    d = allowed(p, c, reported)
    assert ops(d) == {"/spec/schedulerName": "hami-scheduler", MEM_PATH: units, CORE_PATH: "16"}
    assert limits_after(p, d) == {VGPU: "1", MEM: units, CORE: "16"}
    assert any(text in w for w in d.warnings)
    req = pod_request(apply_patch(p, d.patch), c)
    assert req is not None and req.booking_for(int(units)) == (int(units), 16, 1)


def test_exclusive_with_16_cores_is_still_exclusive() -> None:
    p = pod(ctr("a", limits={VGPU: 1, CORE: 16}))
    assert limits_after(p, allowed(p, C160)) == {VGPU: "1", MEM: "160", CORE: "16"}


@pytest.mark.parametrize(
    ("c", "annotations", "reported", "units"),
    [
        (MIXED, {}, (), 160),  # no node reports sliced cards yet: the largest configured model
        (MIXED, {}, (96,), 96),  # only S4000 nodes so far: an S5000-size pod could never run
        (MIXED, {}, (160,), 160),
        (MIXED, {}, (96, 160), 160),  # the largest model some node reports
        (MIXED, {}, (128,), 160),  # capacities no model is configured for are ignored
        (C96, {}, (160,), 96),  # a node with unconfigured cards does not change the configured answer
        (MIXED, {PIN_ANNOTATION: "96"}, (96, 160), 96),  # the pin beats everything
        (MIXED, {PIN_ANNOTATION: "S4000"}, (160,), 96),
        (MIXED, {PIN_ANNOTATION: "S5000"}, (96,), 160),
    ],
)
def test_mixed_fleet_rule_for_whole_cards(
    c: Any, annotations: dict[str, str], reported: tuple[int, ...], units: int
) -> None:
    # Pinned annotation > largest configured model reported by nodes > largest configured model.
    p = pod(ctr("a", limits={VGPU: 1}), annotations=annotations)
    assert whole_card_model(p, c, reported).memory == units
    assert limits_after(p, allowed(p, c, reported))[MEM] == str(units)
    p2 = pod(ctr("a", limits={VGPU: 2}), annotations=annotations)
    assert limits_after(p2, allowed(p2, c, reported))[MEM] == str(2 * units)


def test_exclusive_with_partial_cores_denied() -> None:
    # HAMi "don't set to memory limit": {vgpu 1, core 1} is made exclusive (core overwritten to 16).
    # Deliberate difference: we do not silently change what the user asked for; the message says how to fix.
    msg = denied(pod(ctr("a", limits={VGPU: 1, CORE: 1})))
    assert 'container "a": mthreads.com/sgpu-core=1 without mthreads.com/sgpu-memory' in msg
    assert "remove mthreads.com/sgpu-core to take the whole card" in msg


# --- multi-card -----------------------------------------------------------------------------------


def test_multi_card_gets_whole_cards_and_the_hami_annotation() -> None:
    p = pod(ctr("a", limits={VGPU: 2}))  # pod annotations absent (HAMi#2253: must not crash)
    d = allowed(p, C96)
    assert d.patch == (
        SCHED,
        {"op": "add", "path": MEM_PATH, "value": "192"},
        {"op": "add", "path": CORE_PATH, "value": "32"},
        {"op": "add", "path": "/metadata/annotations", "value": {}},
        {"op": "add", "path": "/metadata/annotations/mthreads.com~1request-gpu-num", "value": "2"},
    )
    after = apply_patch(p, d.patch)
    assert after["metadata"]["annotations"] == {REQUEST_GPU_NUM: "2"}
    assert any("2 whole MTT S4000 cards (2 x 96 units = 96 GiB)" in w for w in d.warnings)


def test_multi_card_overwrites_a_user_request_gpu_num() -> None:
    # HAMi "set to resources limit": annotation "test123" becomes "2".
    p = pod(ctr("a", limits={VGPU: 2}), annotations={REQUEST_GPU_NUM: "test123", "team": "x"})
    d = allowed(p, C96)
    assert "/metadata/annotations" not in ops(d)  # the map exists: keep the user's other annotations
    assert apply_patch(p, d.patch)["metadata"]["annotations"] == {REQUEST_GPU_NUM: "2", "team": "x"}


@pytest.mark.parametrize(("c", "n", "units"), [(C96, 7, 96), (C160, 7, 160), (C160, 8, 160)])
def test_hami_2987_vgpu_7_becomes_seven_whole_cards(c: Any, n: int, units: int) -> None:
    p = pod(ctr("a", limits={VGPU: n}))
    d = allowed(p, c)
    after = apply_patch(p, d.patch)
    assert after["spec"]["containers"][0]["resources"]["limits"] == {
        VGPU: str(n),
        MEM: str(n * units),
        CORE: str(n * 16),
    }
    req = pod_request(after, c)  # the scheduler's view: never "no request"
    assert req is not None and req.mode is Mode.MULTI and req.cards == n and req.model == units


def test_multi_card_explicit_memory_picks_the_model() -> None:
    p = pod(ctr("a", limits={VGPU: 2, MEM: 320}))
    d = allowed(p, MIXED, (96, 160))
    assert limits_after(p, d) == {VGPU: "2", MEM: "320", CORE: "32"}
    req = pod_request(apply_patch(p, d.patch), MIXED)
    assert req is not None and req.model == 160


def test_multi_card_memory_not_a_whole_card_denied() -> None:
    msg = denied(pod(ctr("a", limits={VGPU: 2, MEM: 200})), MIXED)
    assert msg == (
        'container "a": mthreads.com/sgpu-memory=200 with mthreads.com/vgpu=2: multi-card pods take '
        "whole cards; mthreads.com/sgpu-memory must be mthreads.com/vgpu x a card's memory "
        "(192 for MTT S4000, 320 for MTT S5000) or be left out"
    )


def test_multi_card_containers_with_different_models_denied() -> None:
    p = pod(ctr("a", limits={VGPU: 2, MEM: 320}), init=[ctr("i", limits={VGPU: 2, MEM: 192})])
    assert "ask different mthreads.com/sgpu-memory (192, 320)" in denied(p, MIXED)


def test_init_and_app_fills_use_their_own_paths() -> None:
    p = pod(ctr("a", limits={VGPU: 1}), init=[ctr("i", limits={VGPU: 1})])
    got = ops(allowed(p, C96))
    assert got["/spec/initContainers/0/resources/limits/mthreads.com~1sgpu-memory"] == "96"
    assert got[MEM_PATH] == "96"


# --- requests -------------------------------------------------------------------------------------


def test_requests_only_count_gets_limits() -> None:
    # HAMi "count one requested without limits": R{vgpu 1}, L nil -> L gets core 16, mem 96, and the count
    # itself: the API server refuses an extended resource requested without its limit
    # (tests/e2e/test_redteam_user_requests_only.py)
    p = pod(ctr("a", requests={VGPU: 1}))
    d = allowed(p, C96)
    assert d.patch[1] == {"op": "add", "path": "/spec/containers/0/resources/limits", "value": {}}
    res = apply_patch(p, d.patch)["spec"]["containers"][0]["resources"]
    assert res == {"requests": {VGPU: "1"}, "limits": {VGPU: "1", MEM: "96", CORE: "16"}}


def test_requests_count_over_one_gets_limits() -> None:
    # HAMi "count over one requested without limits".
    p = pod(ctr("a", requests={VGPU: 2}))
    res = apply_patch(p, allowed(p, C96).patch)["spec"]["containers"][0]["resources"]
    assert res["limits"] == {VGPU: "2", MEM: "192", CORE: "32"}


def test_requests_patched_only_where_present() -> None:
    # Extended resources: the API server defaults missing requests to limits, so a request is only
    # rewritten when the user wrote that very key.
    p = pod(ctr("a", limits={VGPU: 1, CORE: 16}, requests={VGPU: 1, CORE: 16}))
    got = ops(allowed(p, C96))
    assert got["/spec/containers/0/resources/requests/mthreads.com~1sgpu-core"] == "16"
    assert "/spec/containers/0/resources/requests/mthreads.com~1sgpu-memory" not in got
    p = pod(
        slice_ctr("a", 32, None)
        | {"resources": {"limits": {VGPU: "1", MEM: "32"}, "requests": {VGPU: "1", MEM: "32"}}}
    )
    assert not any("/requests" in path for path in ops(allowed(p, C96)))


@pytest.mark.parametrize(("requests", "which"), [({VGPU: 1, MEM: 32}, MEM), ({VGPU: 1, CORE: 4}, CORE)])
def test_slice_values_under_requests_only_denied(requests: dict[str, object], which: str) -> None:
    # HAMi reads sgpu-memory from limits only: requests-only memory silently becomes an exclusive pod.
    # We deny and say where to put it.
    msg = denied(pod(ctr("a", limits={VGPU: 1}, requests=requests)))
    assert msg == f'container "a": {which} is set under requests only; set it under limits'


def test_json_pointer_escaping() -> None:
    assert _esc("mthreads.com/sgpu-memory") == "mthreads.com~1sgpu-memory"
    assert _esc("a~b/c") == "a~0b~1c"  # "~" first, else "/" -> "~1" -> "~01"


# --- other denials --------------------------------------------------------------------------------


@pytest.mark.parametrize("requests_side", [False, True])
def test_whole_gpu_mixed_with_slices_denied(requests_side: bool) -> None:
    c = (
        ctr("mix", limits={VGPU: 1, MEM: 32, CORE: 8}, requests={GPU: 1})
        if requests_side
        else ctr("mix", limits={VGPU: 1, MEM: 32, CORE: 8, GPU: 1})
    )
    msg = denied(pod(c))
    assert msg.startswith(
        'container "mix": mthreads.com/gpu cannot be mixed with '
        "mthreads.com/vgpu/mthreads.com/sgpu-memory/mthreads.com/sgpu-core in one container"
    )


def test_whole_gpu_in_another_container_allowed() -> None:
    allowed(pod(ctr("whole", limits={GPU: 1}), slice_ctr("s", 32, 8)))


@pytest.mark.parametrize(
    "key",
    [
        ALLOCATED,
        GPU_INDEX,
        PREDICATE_NODE,
        VGPU_NODE,
        BIND_PHASE,
        "hami.io/mthreads-vgpu-devices-to-allocate",
    ],
)
def test_scheduler_owned_annotations_denied(key: str) -> None:
    # A copied pod carrying an old allocation record would be booked where it never ran.
    msg = denied(pod(slice_ctr(), annotations={key: "x"}))
    assert msg.startswith(f"annotations {key} are written by hami-scheduler")


@pytest.mark.parametrize("key", [ALLOCATED, GPU_INDEX, PREDICATE_NODE])
def test_mthreads_record_denied_even_on_pods_without_slices(key: str) -> None:
    # The vendor device plugin reads these keys: a forged one is refused on any pod.
    assert denied(pod(ctr("web"), annotations={key: "x"})).startswith(f"annotations {key} are written")


@pytest.mark.parametrize("key", [VGPU_NODE, BIND_PHASE])
def test_hami_generic_keys_left_to_pods_of_other_vendors(key: str) -> None:
    # hami.io/vgpu-node and bind-phase are shared by HAMi's other vendors: not ours to police there.
    allowed(pod(ctr("cuda", limits={"nvidia.com/gpu": 1}), annotations={key: "x"}))


def test_pin_annotation_and_request_gpu_num_are_not_scheduler_owned() -> None:
    allowed(pod(slice_ctr(), annotations={PIN_ANNOTATION: "96", REQUEST_GPU_NUM: "1"}))


def test_privileged_slice_container_denied() -> None:
    # HAMi: "container <name> is privileged" (a privileged container sees every card).
    p = pod(slice_ctr("a") | {"securityContext": {"privileged": True}})
    assert denied(p).startswith('container "a" is privileged')


def test_node_name_and_foreign_scheduler_denied() -> None:
    assert denied(pod(slice_ctr(), nodeName="n1")).startswith('spec.nodeName "n1" is set')
    # HAMi lets pods of other schedulers through unvalidated; such a pod could never get a slice
    # (nodes do not advertise mthreads.com/vgpu), so we say so at creation.
    assert denied(pod(slice_ctr(), schedulerName="volcano")).startswith('schedulerName "volcano"')
    no_force = cfg((96,), force_overwrite_default_scheduler=False)
    assert "must be scheduled by" in denied(pod(slice_ctr(), schedulerName="default-scheduler"), no_force)


def test_every_problem_reported_together() -> None:
    p = pod(slice_ctr("a") | {"securityContext": {"privileged": True}}, nodeName="n1")
    msg = denied(p)
    assert "spec.nodeName" in msg and "is privileged" in msg and "; " in msg


def test_sgpu_without_vgpu_denied() -> None:
    # HAMi "don't set to count limit": L{mem 2, core 1} is not HAMi's business (found=false) and reaches the
    # vendor plugin unaccounted. Deliberate difference: denied with the fix in the message.
    assert "need mthreads.com/vgpu" in denied(pod(ctr("a", limits={MEM: 2, CORE: 1})))


# --- HAMi Test_MutateAdmission, re-expressed ------------------------------------------------------


@pytest.mark.parametrize(
    ("case", "container", "annotations", "ok"),
    [
        # HAMi overwrites to {core 32, mem 192}; we refuse memory that is not 2 whole cards.
        (
            "set to resources limit",
            ctr("c", limits={VGPU: 2, MEM: 2, CORE: 1}),
            {REQUEST_GPU_NUM: "test123"},
            False,
        ),
        ("count over one without pod annotations", ctr("c", limits={VGPU: 2}), None, True),
        ("count over one requested without limits", ctr("c", requests={VGPU: 2}), None, True),
        ("count one requested without limits", ctr("c", requests={VGPU: 1}), None, True),
        # HAMi: not found (passes untouched); we: denied, see test_sgpu_without_vgpu_denied.
        ("don't set to count limit", ctr("c", limits={MEM: 2, CORE: 1}), None, False),
        # HAMi: exclusive with core forced to 16; we: denied, see test_exclusive_with_partial_cores_denied.
        ("don't set to memory limit", ctr("c", limits={VGPU: 1, CORE: 1}), None, False),
        ("count less than one (misnamed)", ctr("c", limits={VGPU: 1, MEM: 2, CORE: 1}), None, True),
        ("memory no exist legalMemoryslices", ctr("c", limits={VGPU: 1, MEM: 3, CORE: 1}), None, False),
        ("count set to zero is rejected", ctr("c", limits={VGPU: 0, MEM: 2, CORE: 1}), None, False),
        ("count set to negative is rejected", ctr("c", limits={VGPU: -1, MEM: 2, CORE: 1}), None, False),
        (
            "request-only count set to zero is rejected",
            ctr("c", requests={VGPU: 0, MEM: 2, CORE: 1}),
            None,
            False,
        ),
    ],
)
def test_hami_mutate_admission_table(
    case: str, container: dict[str, Any], annotations: dict[str, str] | None, ok: bool
) -> None:
    p = pod(container, annotations=annotations)
    d = decide(p, C96, ())
    assert d.allowed is ok, (case, d.message)
    if ok:  # whatever we admit, the scheduler can read
        assert pod_request(apply_patch(p, d.patch), C96) is not None


def test_privileged_check_pairs_each_container_with_its_own_ask() -> None:
    # Matched by name before: a privileged init container without cards named like a slice container was
    # refused, and the privileged slice container next to it passed when names repeated.
    p = pod(slice_ctr("a"), init=[ctr("a", securityContext={"privileged": True})])
    allowed(p)
    p = pod(slice_ctr("a") | {"securityContext": {"privileged": True}}, init=[ctr("a")])
    assert denied(p).startswith('container "a" is privileged')


@pytest.mark.parametrize(
    ("p", "field"),
    [
        ({"metadata": [], "spec": {"containers": [ctr()]}}, "metadata"),
        (pod(ctr("a", limits={VGPU: True})), 'spec.containers[0].resources.limits["mthreads.com/vgpu"]'),
        (pod({"name": "a", "resources": {"limits": {VGPU: 2**70}}}),
         'spec.containers[0].resources.limits["mthreads.com/vgpu"]'),
        (pod(slice_ctr() | {"securityContext": {"privileged": "yes"}}),
         "spec.containers[0].securityContext.privileged"),
        (pod(slice_ctr(), schedulerName=5), "spec.schedulerName"),
        (pod(slice_ctr(), nodeName=["n1"]), "spec.nodeName"),
        (pod(ctr(5)), "spec.containers[0].name"),  # type: ignore[arg-type]
    ],
)
def test_malformed_pod_fields_are_denied_with_400(p: dict[str, Any], field: str) -> None:
    d = decide(p, C96)
    assert not d.allowed and d.code == 400 and d.patch == ()
    assert d.message.startswith(f"{field}: got ") and "; allowed: " in d.message


def test_judge_update_denies_changed_card_resources_only() -> None:
    before = pod(slice_ctr("a", 32, 8), ctr("b"))
    assert judge_update(before, before, "alice", C96).allowed
    assert judge_update(before, {**before, "metadata": {"name": "p", "labels": {"x": "y"}}}, "alice", C96).allowed
    changed = pod(slice_ctr("a", 64, 8), ctr("b"))
    assert 'container "a"' in judge_update(before, changed, "alice", C96).message
    added = pod(slice_ctr("a", 32, 8), ctr("b", limits={VGPU: 1}))
    assert 'container "b"' in judge_update(before, added, "alice", C96).message
    fewer = pod(slice_ctr("a", 32, 8))
    assert "containers changed from 2 to 1" in judge_update(before, fewer, "alice", C96).message
    assert judge_update({"spec": {"containers": 5}}, before, "alice", C96).message.startswith("oldObject: ")
