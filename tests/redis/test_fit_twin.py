"""The card rule and its Lua twin agree: one table of cases (every reason, every ordering that matters)
runs through shared.domain.fit.card_rule and through the reserve script on a real redis-server, and a
hypothesis property compares them on random card states. And two replicas racing cannot break `mutex`.
"""

from __future__ import annotations

from itertools import count

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis.asyncio import Redis

from deploy.local.redis import RedisServer
from shared.config import Config
from shared.domain.annotations import PodUsage
from shared.domain.fit import CardNeed, CardView, card_rule, plan_booking, view_of
from shared.domain.models import CardModel
from shared.domain.node import Card, Inventory
from shared.domain.request import pod_request
from shared.store.ledger import Ledger
from shared.store.placing import place
from tests.redis.helpers import S4000, S5000, slice_pod

pytestmark = pytest.mark.redis

_names = count()


def card(health: str = "ok", capacity: int = S4000, mem: int = 0, cores: int = 0, slices: int = 0,
         limit: int = 16, index: int = 3) -> CardView:
    return CardView(index, health, capacity, mem, 16, cores, slices, limit)


def need(mem: int = 8, cores: int = 2, slices: int = 1, accepts: frozenset[int] | None = None,
         deny: frozenset[int] = frozenset(), idle: bool = False) -> CardNeed:
    return CardNeed(mem, cores, slices, accepts, deny, idle)


CASES: list[tuple[str, CardView | None, CardNeed, str]] = [
    ("fits", card(), need(), ""),
    ("no such card", None, need(), "CardNotFound"),
    ("removed card still held", card("removed", mem=8, cores=2, slices=1), need(), "CardNotFound"),
    ("unhealthy", card("unhealthy"), need(), "CardNotHealth"),
    ("cordoned", card("cordoned"), need(), "CardCordoned"),
    ("a health nothing writes", card("draining"), need(), "CardNotHealth"),
    ("model not accepted", card(capacity=S4000), need(accepts=frozenset({S5000})), "CardTypeMismatch"),
    ("no model accepted", card(), need(accepts=frozenset()), "CardTypeMismatch"),
    ("model accepted", card(capacity=S5000), need(accepts=frozenset({S4000, S5000})), ""),
    ("use/nouse-gpuuuid", card(), need(deny=frozenset({3})), "CardUuidMismatch"),
    ("another card denied", card(), need(deny=frozenset({1})), ""),
    ("slice instances used up", card(mem=16, cores=8, slices=16), need(), "CardTimeSlicingExhausted"),
    ("per-card max_inst", card(mem=8, cores=4, slices=4, limit=4), need(), "CardTimeSlicingExhausted"),
    ("per-card max_inst: the last slice fits", card(mem=8, cores=4, slices=3, limit=4), need(), ""),
    ("per-card max_inst 1 on an idle card", card(limit=1), need(), ""),
    ("per-card max_inst 1 taken", card(mem=2, cores=1, slices=1, limit=1), need(), "CardTimeSlicingExhausted"),
    ("two slices past a per-card limit", card(mem=8, cores=4, slices=3, limit=4), need(slices=2),
     "CardTimeSlicingExhausted"),
    ("whole card or mutex on a used card", card(mem=2, cores=1, slices=1), need(idle=True),
     "ExclusiveDeviceAllocateConflict"),
    ("whole card or mutex on an idle card", card(), need(mem=96, cores=16, idle=True), ""),
    # each part of "idle" on its own (red team, mutants: a dropped term of the idle test went unseen)
    ("idle needed, the card holds memory only", card(mem=2), need(idle=True), "ExclusiveDeviceAllocateConflict"),
    ("idle needed, the card holds core groups only", card(cores=1), need(idle=True),
     "ExclusiveDeviceAllocateConflict"),
    ("idle needed, the card holds a slice instance only", card(slices=1), need(idle=True),
     "ExclusiveDeviceAllocateConflict"),
    ("memory", card(mem=90, cores=1, slices=1), need(mem=8), "CardInsufficientMemory"),
    ("memory exactly enough", card(mem=88, cores=1, slices=1), need(mem=8), ""),
    ("over-committed card has none free", card(mem=112, cores=2, slices=2), need(mem=2), "CardInsufficientMemory"),
    ("no core group left for a 0-core ask", card(mem=8, cores=16, slices=1), need(cores=0),
     "CardComputeUnitsExhausted"),
    ("cores", card(mem=8, cores=15, slices=1), need(cores=2), "CardInsufficientCore"),
    ("cores exactly enough", card(mem=8, cores=14, slices=1), need(cores=2), ""),
    # the order, pairwise: the earlier check wins
    ("unhealthy before model", card("unhealthy"), need(accepts=frozenset({S5000})), "CardNotHealth"),
    ("cordoned before model", card("cordoned"), need(accepts=frozenset({S5000})), "CardCordoned"),
    ("model before uuid", card(), need(accepts=frozenset({S5000}), deny=frozenset({3})), "CardTypeMismatch"),
    ("uuid before slices", card(slices=16, mem=16, cores=8), need(deny=frozenset({3})), "CardUuidMismatch"),
    ("slices before exclusive", card(mem=16, cores=8, slices=16), need(idle=True), "CardTimeSlicingExhausted"),
    ("exclusive before memory", card(mem=96, cores=1, slices=1), need(idle=True), "ExclusiveDeviceAllocateConflict"),
    ("memory before cores", card(mem=96, cores=16, slices=1), need(), "CardInsufficientMemory"),
]


async def lua_rule(led: Ledger, c: CardView | None, n: CardNeed) -> str:
    """The same question asked of the reserve script: a node with this one card, its usage booked by
    holders (observe books what the API says, even past capacity), then a reservation with `n`."""
    node = f"tw-{next(_names)}"
    index = c.index if c is not None else 3
    if c is None:
        inv = Inventory(node, (Card(node, 0, S4000),))  # card 3 does not exist
    else:
        base = c.health if c.health in ("cordoned", "unhealthy") else "ok"
        inv = Inventory(node, (Card(node, index, c.capacity, c.slice_limit, healthy=base != "unhealthy",
                                    cordoned=base == "cordoned"),))
    await led.upsert_node(inv)
    if c is not None:
        mem, cores, slices = c.mem_used, c.cores_used, c.slices
        part = 0
        while mem or cores or slices:  # observe takes at most 16 cores and 16 slices per holder
            step = (min(mem, 96), min(cores, 16), min(slices, 16))
            await led.observe(f"h{part}", PodUsage(node, (index,), *step))
            mem, cores, slices = mem - step[0], cores - step[1], slices - step[2]
            part += 1
        if c.health == "removed":
            await led.upsert_node(Inventory(node, (Card(node, 0, S4000),)))  # card 3 no longer reported
        elif c.health != base:  # a value no script writes: put in the card hash by hand
            await led.redis.hset(led.keys.card(node, index), "health", c.health)  # type: ignore[misc]
    out, _ = await led.reserve(node, "candidate", [index], n.memory, n.cores, n.slices, need=n)
    await led.remove_node(node)
    return "" if out.ok else out.reason


@pytest.mark.parametrize(("c", "n", "reason"), [case[1:] for case in CASES], ids=[case[0] for case in CASES])
async def test_the_twins_agree_on_the_table(ledger: Ledger, c: CardView | None, n: CardNeed, reason: str) -> None:
    assert card_rule(c, n) == reason
    assert await lua_rule(ledger, c, n) == reason


def test_the_table_names_every_reason() -> None:
    named = {case[3] for case in CASES}
    assert named >= {"", "CardNotFound", "CardNotHealth", "CardCordoned", "CardTypeMismatch", "CardUuidMismatch",
                     "CardTimeSlicingExhausted", "ExclusiveDeviceAllocateConflict", "CardInsufficientMemory",
                     "CardComputeUnitsExhausted", "CardInsufficientCore"}


cards = st.builds(
    lambda health, cap, limit, mem, cores, slices: card(health, cap, mem, cores, min(slices, limit + 1), limit),
    st.sampled_from(["ok", "ok", "ok", "cordoned", "unhealthy"]), st.sampled_from([S4000, S5000]),
    st.integers(1, 16), st.integers(0, 180), st.integers(0, 20), st.integers(0, 17))
needs = st.builds(
    lambda mem, cores, slices, accepts, deny, idle: need(mem, cores, slices, accepts, deny, idle),
    st.integers(0, 170), st.integers(0, 16), st.integers(1, 2),
    st.one_of(st.none(), st.frozensets(st.sampled_from([S4000, S5000]))),
    st.frozensets(st.sampled_from([1, 3])), st.booleans())


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(c=cards, n=needs)
async def test_the_twins_agree_on_random_cards(ledger: Ledger, c: CardView, n: CardNeed) -> None:
    assert await lua_rule(ledger, c, n) == card_rule(c, n), (c, n)


async def test_two_replicas_racing_cannot_break_mutex(ledger: Ledger, redis_server: RedisServer) -> None:
    """Replica A books a slice on card 1 while replica B, from the same stale view (both cards idle),
    plans a `mutex` pod onto card 1 too: the script refuses (the pod needs an idle card, and the flag
    travels with the reservation), B refits on the fresh state it got back, and takes card 0."""
    other = Ledger(Redis.from_url(redis_server.url, decode_responses=True))  # another replica's client
    await other.load_scripts()
    cfg = Config(memory_per_card=(CardModel(S4000),))
    await ledger.upsert_node(Inventory("race", (Card("race", 0, S4000), Card("race", 1, S4000))))
    stale = await ledger.snapshot("race")
    assert stale is not None
    slice_req = pod_request(slice_pod((8, 2)), cfg)
    mutex_req = pod_request(slice_pod((8, 2)), cfg)
    assert slice_req is not None and mutex_req is not None
    mutex = {"hami.io/gpu-scheduler-policy": "mutex"}
    # both replicas plan on the same view: the same card
    assert plan_booking(stale.card_states(), slice_req, {}).cards == plan_booking(stale.card_states(), mutex_req,
                                                                                  mutex).cards == (1,)
    a, _ = await place(ledger, "race", "pod-a", slice_req, {}, stale, "spread", pod="ns/a")
    b, _ = await place(other, "race", "pod-b", mutex_req, mutex, stale, "spread", pod="ns/b")
    assert a.ok and b.ok
    assert a.cards == (1,) and b.cards == (0,), (a, b)
    assert b.attempts == 2  # refused once, then placed on the idle card
    snap = await ledger.snapshot("race")
    assert snap is not None
    holders = {idx: [u for u, r in snap.reservations.items() if idx in r.cards] for idx in snap.cards}
    assert holders == {0: ["pod-b"], 1: ["pod-a"]}
    await other.redis.aclose()


async def test_a_card_both_sick_and_cordoned_gives_one_answer_on_both_sides(ledger: Ledger) -> None:
    """The stored health keeps the reason that decides (sick before cordoned), so the round trip through
    Redis and the mirror's snapshot cannot turn one answer into another."""
    sick = Card("both", 0, S4000, healthy=False, cordoned=True)
    await ledger.upsert_node(Inventory("both", (sick,)))
    snap = await ledger.snapshot("both")
    assert snap is not None and snap.cards[0].health == "unhealthy"
    (state,) = snap.card_states()
    n = need()
    assert card_rule(view_of(state), n) == "CardNotHealth"
    out, _ = await ledger.reserve("both", "x", [0], n.memory, n.cores, n.slices, need=n)
    assert out.reason == "CardNotHealth"
