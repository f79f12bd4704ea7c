"""Red team (what a demanding user sees): a refused pod is told what *it* wrote and which rule it breaks.

The webhook fills exclusive and multi-card containers (`vgpu: 1` alone: sgpu-memory = the card, sgpu-core = 16)
before it applied the sharing rules, so the rules judged the filled values: two `vgpu: 1` containers were refused
with "the pod's slice containers share one card and ask 32 mthreads.com/sgpu-core in all", numbers the user never
wrote, and the rule written for that pod ("an exclusive container takes the whole card; no other app container may
share it") was never reached. Worse, the documented rule "an exclusive container cannot share its card with slice
containers" (docs/rules.md) was not applied to an exclusive init container: it was admitted as a 160-unit slice.
"""

from __future__ import annotations

from typing import Any

import pytest

from shared.domain.admission import decide
from tests.unit._k8s import CORE, MEM, VGPU, cfg, ctr, pod, slice_ctr

MIXED = cfg((96, 160))


def denied(p: dict[str, Any]) -> str:
    d = decide(p, MIXED, (96, 160))
    assert not d.allowed, d.patch
    assert d.code == 403
    return d.message


def test_two_exclusive_app_containers_are_told_the_exclusive_rule() -> None:
    msg = denied(pod(ctr("a", limits={VGPU: 1}), ctr("b", limits={VGPU: 1})))
    assert "exclusive container" in msg and "(a, b)" in msg, msg
    assert "32" not in msg and "slice containers share one card" not in msg, msg


@pytest.mark.parametrize("exclusive", [
    ctr("a", limits={VGPU: 1}),
    ctr("a", limits={VGPU: 1, CORE: 16}),  # 16 core groups without memory: still the whole card
])
def test_an_exclusive_container_beside_a_slice_is_told_so(exclusive: dict[str, Any]) -> None:
    msg = denied(pod(exclusive, slice_ctr("b", memory=32, cores=None)))
    assert "cannot share it with slice containers (b)" in msg, msg
    assert "17" not in msg and "160" not in msg, msg


def test_an_exclusive_sidecar_beside_a_slice_is_told_so() -> None:
    msg = denied(pod(slice_ctr("b"), init=[ctr("s", limits={VGPU: 1}, restartPolicy="Always")]))
    assert "cannot share it with slice containers (b)" in msg, msg


def test_an_exclusive_init_container_cannot_share_its_card_with_slices() -> None:
    """docs/rules.md: "An exclusive container cannot share its card with slice containers"."""
    msg = denied(pod(slice_ctr("a", memory=32, cores=8), init=[ctr("i", limits={VGPU: 1})]))
    assert "exclusive containers (only mthreads.com/vgpu: 1: i)" in msg, msg


def test_a_multi_card_pod_with_a_one_card_container_is_told_its_own_values() -> None:
    msg = denied(pod(ctr("a", limits={VGPU: 2}), init=[ctr("i", limits={VGPU: 1})]))
    assert 'container "i": mthreads.com/vgpu=1, but container "a" asks mthreads.com/vgpu=2' in msg, msg
    # the webhook's own fills (160 and 320 units, 16 core groups) are not the user's values
    assert "160" not in msg and "320" not in msg and "sgpu-core=16" not in msg, msg


@pytest.mark.parametrize("p", [
    pod(ctr("i2", limits={VGPU: 1}), init=[ctr("i", limits={VGPU: 1})]),  # exclusive init, then exclusive app
    pod(ctr("a", limits={VGPU: 2}), init=[ctr("i", limits={VGPU: 2})]),  # multi-card init and app
    pod(slice_ctr("a"), init=[slice_ctr("i", memory=160, cores=16)]),  # an init slice of the whole card
])
def test_what_the_rules_allow_is_still_admitted(p: dict[str, Any]) -> None:
    d = decide(p, MIXED, (96, 160))
    assert d.allowed, d.message


def test_valid_values_still_reported_before_the_sharing_rules() -> None:
    msg = denied(pod(ctr("a", limits={VGPU: 2, MEM: 256})))
    assert "(192 for MTT S4000, 320 for MTT S5000)" in msg, msg


# --- placement annotations a user misspells ----------------------------------------------------------------------
# `hami.io/gpu-scheduler-policy: binpak` (or `node-scheduler-policy: Binpacking`) fell back to the default policy
# without a word: the pod was placed by the policy its creator tried to turn off. HAMi reads them the same lax way,
# so only values naming none of HAMi's policies are refused, on pods asking for our slices.

GPU_POLICY, NODE_POLICY = "hami.io/gpu-scheduler-policy", "hami.io/node-scheduler-policy"


@pytest.mark.parametrize(("key", "value", "allowed"), [
    (GPU_POLICY, "binpak", "allowed: binpack, spread, mutex"),
    (GPU_POLICY, "binpack,spreed", "allowed: binpack, spread, mutex"),
    (NODE_POLICY, "Binpacking", "allowed: binpack, spread"),
    (NODE_POLICY, "mutex", "allowed: binpack, spread"),
])
def test_a_misspelt_policy_is_refused_naming_it(key: str, value: str, allowed: str) -> None:
    msg = denied(pod(slice_ctr(), annotations={key: value}))
    assert f"annotation {key}={value!r}" in msg and allowed in msg, msg


@pytest.mark.parametrize(("key", "value"), [
    (GPU_POLICY, "binpack"), (GPU_POLICY, "Spread"), (GPU_POLICY, " mutex "), (GPU_POLICY, "binpack,numa"),
    (GPU_POLICY, "spread, topology-aware"), (NODE_POLICY, "spread"), (NODE_POLICY, "BINPACK"),
    (GPU_POLICY, ""), (NODE_POLICY, " "),  # empty: the default, as when unset
])
def test_hami_policy_values_pass(key: str, value: str) -> None:
    d = decide(pod(slice_ctr(), annotations={key: value}), MIXED, (96, 160))
    assert d.allowed, d.message


def test_policies_on_pods_of_other_vendors_are_theirs() -> None:
    d = decide(pod(ctr(limits={"nvidia.com/gpu": 1}), annotations={GPU_POLICY: "whatever"}), MIXED, (96, 160))
    assert d.allowed and d.patch == ()


# `mthreads.ai/use-gpuuuid: ","` (only commas and blanks) names no card: HAMi reads it as "no card matches" (its
# pod never placed), mtsched read it as no constraint (any card): now refused at admission naming it, and read
# as HAMi reads it on a pod whose annotation is edited after (migration red team's observation).
USE, NOUSE = "mthreads.ai/use-gpuuuid", "mthreads.ai/nouse-gpuuuid"


@pytest.mark.parametrize("value", [",", " , ,", ",,,"])
def test_a_card_list_naming_no_card_is_refused(value: str) -> None:
    msg = denied(pod(slice_ctr(), annotations={USE: value}))
    assert f"annotation {USE}={value!r} names no card id" in msg and "<node>-mthreads-<index>" in msg, msg


@pytest.mark.parametrize(("key", "value"), [(USE, ""), (USE, "  "), (USE, "n1-mthreads-0,"), (NOUSE, ",")])
def test_card_lists_hami_reads_as_a_constraint_or_none_pass(key: str, value: str) -> None:
    d = decide(pod(slice_ctr(), annotations={key: value}), MIXED, (96, 160))
    assert d.allowed, d.message


@pytest.mark.parametrize(("annotations", "denied_cards"), [
    ({USE: ","}, {0, 1}),  # names no id: no card (HAMi's CheckUUID)
    ({USE: " "}, set()),  # blank: no constraint
    ({USE: "n1-mthreads-1,,"}, {0}),
    ({NOUSE: ","}, set()),  # names no id: denies nothing
    ({NOUSE: "n1-mthreads-0"}, {0}),
])
def test_card_selection_reads_as_hami(annotations: dict[str, str], denied_cards: set[int]) -> None:
    from shared.domain.fit import denied_cards as deny
    from tests.unit._k8s import cards

    assert deny(cards(96, 2), annotations) == denied_cards
