"""Red team, upkeep: the preempt verb while no watcher keeps the ledger current (controller/preempt.py).

The filter places no slice pod while the stamp is too old (controller/extender.py `unkept`), but the preempt verb
went on choosing victims from the same unkept ledger: cards held for pods deleted since look full, a card gone
unhealthy looks fine, so kube-scheduler evicted running pods for a preemptor that the filter then refuses
everywhere, on a card state nobody keeps. kube-scheduler asks for preemption after a filter that left nodes
resolvable: a filter answered just before the stamp aged (the extenders read it every 5 s), or by another replica
behind a balancer whose read was earlier. Fail closed: while unkept, no eviction, saying why."""

from __future__ import annotations

import asyncio

from controller.preempt import Preemption
from tests.unit._servers import FakeKube, extender
from tests.unit.test_preempt import meta, preemptor, snapshot

UNKEPT = "no watcher has kept the ledger current for 95 s (watchersLostAfterSeconds is 90): ..."


async def test_no_eviction_while_no_watcher_keeps_the_ledger() -> None:
    kube = FakeKube()
    ext = extender(kube=kube)
    held = [("a", (0,), 64, 4, 5), ("b", (0,), 32, 4, 9), ("c", (1,), 64, 4, 3), ("d", (1,), 32, 4, 9)]
    ext.mirror.put(snapshot(held))
    args = {"Pod": preemptor(), "NodeNameToMetaVictims": meta("s4k", "a", "c")}
    ext.unkept = lambda: UNKEPT
    assert await Preemption(ext).preempt(args) == {"NodeNameToMetaVictims": {}}, "victims chosen on an unkept ledger"
    assert not ext.nominations.by_uid, "nominated on an unkept ledger"
    for _ in range(200):  # the event is sent by a task of its own
        if kube.events:
            break
        await asyncio.sleep(0.01)
    ((reason, message),) = kube.events
    assert reason == "PreemptionNotHelpful" and "no watcher has kept the ledger current" in message, message
    ext.unkept = lambda: ""  # kept again: the same proposal stands
    out = await Preemption(ext).preempt(args)
    assert out == {"NodeNameToMetaVictims": meta("s4k", "a", "c")}
