"""Red team (the admission chain): the pod the API server stores is what the last mutating webhook left, so the
extender judges the final pod by the webhook's rules as well, not only by the sharing rules `pod_request` reads
(tests/e2e/test_redteam_chain_webhooks.py runs a later webhook against a real API server).

Before, a slice container a later webhook made privileged (it then sees every card) was placed like any slice, a
placement policy naming none (`binpak`) was placed by spread without a word, and an `sgpu-memory` no card model
accepts was held with `CardTypeMismatch` on every card, naming no value.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from shared.domain.admission import placement_request
from shared.domain.request import RequestError, pod_request
from tests.unit._servers import CFG, CORE, MEM, VGPU, FakeKube, FakeLedger, bind_args, extender, pod

PRIVILEGED = 'container "c" is privileged: a privileged container sees every card, so it cannot hold a slice'
BAD_MEMORY = ('container "c": mthreads.com/sgpu-memory=3 is not a valid slice size; allowed: 2, 4, 8, 16, 32, 64, '
              "96, 128, 160 (memoryPerCard [96, 160])")
BAD_MULTI = ("mthreads.com/sgpu-memory=200 with mthreads.com/vgpu=2: multi-card pods take whole cards; "
             "mthreads.com/sgpu-memory must be mthreads.com/vgpu x a card's memory "
             "(192 for MTT S4000, 320 for MTT S5000)")


def privileged(p: dict[str, Any]) -> dict[str, Any]:
    p["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    return p


POLICY = ("annotation hami.io/gpu-scheduler-policy='binpak' names no policy; allowed: binpack, spread, mutex (or a "
          "comma list of them; HAMi's numa and topology-aware are accepted and do nothing for mthreads cards)")
SELECTION = ("annotation mthreads.ai/use-gpuuuid=' , ' names no card id, so no card may take the pod; allowed: a comma "
             "list of device ids (<node>-mthreads-<index>), or no annotation for any card")

CASES = {
    "privileged": (privileged(pod("u1")), PRIVILEGED),
    "policy typo": (pod("u1", annotations={"hami.io/gpu-scheduler-policy": "binpak"}), POLICY),
    "selects no card": (pod("u1", annotations={"mthreads.ai/use-gpuuuid": " , "}), SELECTION),
    "bad memory": (pod("u1", {VGPU: "1", MEM: "3", CORE: "4"}), BAD_MEMORY),
    "multi not a model": (pod("u1", {VGPU: "2", MEM: "200", CORE: "32"}), BAD_MULTI),
}


@pytest.mark.parametrize("case", CASES)
def test_filter_holds_a_final_pod_the_webhook_would_refuse(case: str) -> None:
    p, said = CASES[case]
    pod_request(p, CFG)  # the sharing rules alone let it through (the watchers book bound pods by them)
    ext = extender()
    out = ext.filter({"Pod": p, "NodeNames": ["s4k", "s5k"]})
    assert out["NodeNames"] == [] and out["FailedAndUnresolvableNodes"] == {"s4k": said, "s5k": said}, out


@pytest.mark.parametrize("case", CASES)
async def test_bind_of_an_unfiltered_pod_refuses_it_and_books_nothing(case: str) -> None:
    p, said = CASES[case]
    kube, ledger = FakeKube(), FakeLedger()
    kube.pods[("ns", "p-u1")] = p
    ext = extender(kube=kube, ledger=ledger)
    out = await ext.bind(bind_args("u1"))
    assert out == {"Error": said} and ledger.placed == [] and kube.bound == []
    await asyncio.sleep(0)


def test_a_valid_final_pod_is_unchanged() -> None:
    for p in (pod("u1"), pod("u1", {VGPU: "1", MEM: "160", CORE: "16"}), pod("u1", {VGPU: "2", MEM: "192", CORE: "32"}),
              pod("u1", {VGPU: "1"})):
        assert placement_request(p, CFG) == pod_request(p, CFG)
    unprivileged = pod("u1")
    unprivileged["spec"]["containers"][0]["securityContext"] = {"privileged": False}
    assert placement_request(unprivileged, CFG) is not None
    cpu = pod("u1", {"cpu": "1"})
    cpu["spec"]["containers"][0]["securityContext"] = {"privileged": True}  # holds no slice: not ours to judge
    assert placement_request(cpu, CFG) is None
    with pytest.raises(RequestError):
        placement_request(pod("u1", {MEM: "4"}), CFG)


def test_fills_a_later_webhook_took_away_are_booked_as_ours_would_have_filled_them() -> None:
    """Our webhook's fills (cores of a slice, the amounts of an exclusive or multi-card pod) removed after it: the
    extender books what the webhook would have filled, never less."""
    cores_gone = placement_request(pod("u1", {VGPU: "1", MEM: "8"}), CFG)
    assert cores_gone is not None and cores_gone.booking_for(96) == (8, CFG.default_cores, 1)
    exclusive = placement_request(pod("u1", {VGPU: "1"}), CFG)
    assert exclusive is not None and [exclusive.booking_for(c) for c in (96, 160)] == [(96, 16, 1), (160, 16, 1)]
    multi = placement_request(pod("u1", {VGPU: "2"}), CFG)
    assert multi is not None and multi.cards == 2 and multi.booking_for(160) == (160, 16, 1)
    ext = extender()  # and it is placed: the fills are what the webhook would add, not a rule
    assert ext.filter({"Pod": pod("u1", {VGPU: "1"}), "NodeNames": ["s4k", "s5k"]})["NodeNames"] == ["s4k", "s5k"]
