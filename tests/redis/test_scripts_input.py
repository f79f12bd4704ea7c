"""Table tests: every ledger script against malformed and hostile input, on a real Redis.

Each case must end in a clear refusal (a BADINPUT LedgerError, or an {ok: false}-style answer) with
the ledger byte-for-byte unchanged: every key of the ledger is dumped before and after.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from redis import exceptions as rexc

from shared.domain.annotations import PodUsage
from shared.store.ledger import Ledger, LedgerError
from tests.redis.helpers import S4000, S5000, dump, inventory, violations

PAYLOAD_SCRIPTS = ("upsert_node", "reserve", "mark_bound", "release", "observe", "expire", "replace_node")

# Not a JSON object (or not strict JSON): cjson would accept NaN, Infinity and hex numbers by default.
NOT_JSON_OBJECTS = ["", "not json", "{", '{"uid": "u9"', "null", "42", '"text"', "true", "[]", "[1, 2]",
                    '{"uid": "u9", "cards": [0], "mem": NaN, "cores": 1, "slices": 1}',
                    '{"uid": "u9", "cards": [0], "mem": 0x10, "cores": 1, "slices": 1}',
                    '{"ttl_ms": Infinity}', "\x00\xff"]

GOOD_RES: dict[str, Any] = {"uid": "u9", "cards": [0], "mem": 8, "cores": 1, "slices": 1, "model": 0,
                            "whole": False, "pod": "ns/p9"}
GOOD_CARD: dict[str, Any] = {"index": 0, "capacity": S4000, "slice_limit": 16, "health": "ok"}
MISSING = object()


def with_(base: dict[str, Any], **over: Any) -> dict[str, Any]:
    d = dict(base)
    for k, v in over.items():
        if v is MISSING:
            d.pop(k, None)
        else:
            d[k] = v
    return d


BAD_UIDS = [MISSING, 5, "", "a b", "x" * 129, None, ["u9"], {"u": 1}, "u9\n", "{n5}:u9", "a/b", "ü", True]
BAD_CARD_LISTS = [MISSING, [], "0", 0, [-1], [1024], [0.5], ["0"], [0, 0], list(range(65)), {"0": 0}, [None],
                  [[0]], [True]]
BAD_MEM = [-1, 1.5, "8", 1e12, True, None, 1048577, [8], {"v": 8}]
BAD_CORES = [-1, 17, 2.5, "1", None, False]
BAD_SLICES = [-1, 17, 1.5, "1", None]


def reserve_cases() -> list[tuple[str, dict[str, Any]]]:
    cases = [(f"uid={u!r:.20}", with_(GOOD_RES, uid=u)) for u in BAD_UIDS]
    cases += [(f"cards={c!r:.20}", with_(GOOD_RES, cards=c)) for c in BAD_CARD_LISTS]
    cases += [(f"mem={m!r:.20}", with_(GOOD_RES, mem=m)) for m in [*BAD_MEM, MISSING]]
    cases += [(f"cores={c!r}", with_(GOOD_RES, cores=c)) for c in [*BAD_CORES, MISSING]]
    cases += [(f"slices={s!r}", with_(GOOD_RES, slices=s)) for s in [*BAD_SLICES, 0, MISSING]]
    cases += [(f"model={m!r}", with_(GOOD_RES, model=m)) for m in [-1, 4097, "96", 1.5, None]]
    cases += [(f"whole={w!r}", with_(GOOD_RES, whole=w)) for w in ["yes", 1, None, [True]]]
    cases += [(f"pod={p!r:.20}", with_(GOOD_RES, pod=p)) for p in [5, "x" * 513, ["a"], None]]
    return cases


def observe_cases() -> list[tuple[str, dict[str, Any]]]:
    base = {k: GOOD_RES[k] for k in ("uid", "cards", "mem", "cores", "slices", "pod")}
    cases = [(f"uid={u!r:.20}", with_(base, uid=u)) for u in BAD_UIDS]
    cases += [(f"cards={c!r:.20}", with_(base, cards=c)) for c in BAD_CARD_LISTS]
    cases += [(f"mem={m!r:.20}", with_(base, mem=m)) for m in BAD_MEM]
    cases += [(f"cores={c!r}", with_(base, cores=c)) for c in BAD_CORES]
    cases += [(f"slices={s!r}", with_(base, slices=s)) for s in BAD_SLICES]
    cases += [(f"pod={p!r:.20}", with_(base, pod=p)) for p in [5, "x" * 513]]
    return cases


def uid_cases() -> list[tuple[str, dict[str, Any]]]:
    return [(f"uid={u!r:.20}", with_({"uid": "u1"}, uid=u)) for u in BAD_UIDS]


def uids_cases() -> list[tuple[str, dict[str, Any]]]:
    """mark_bound's payload: each bad uid as the one entry of `uids` (a missing one: no `uids` at all)."""
    return [(name, {"uids": [p["uid"]]} if "uid" in p else p) for name, p in uid_cases()]


def card_list_cases() -> list[tuple[str, Any]]:
    """Bad `cards` for upsert_node / replace_node."""
    cases: list[tuple[str, Any]] = [("missing", MISSING), ("string", "x"), ("number", 3),
                                    ("object", {"0": GOOD_CARD}), ("list of numbers", [1]),
                                    ("duplicate index", [GOOD_CARD, GOOD_CARD]),
                                    ("1025 cards", [with_(GOOD_CARD, index=i % 1024) for i in range(1025)])]
    for field, values in {"index": [-1, 1024, 1.5, "0", None, MISSING],
                          "capacity": [0, 1, 4097, 96.5, "96", None, MISSING, -96],
                          "slice_limit": [0, 17, 1.5, "16", None, MISSING],
                          "health": ["broken", "removed", 1, None, MISSING, "OK"]}.items():
        cases += [(f"{field}={v!r:.12}" if v is not MISSING else f"{field} missing",
                   [with_(GOOD_CARD, **{field: v})]) for v in values]
    return cases


BAD_ERRORS = [5, ["x"], "x" * 4097, None, {"e": 1}, True]


def upsert_cases() -> list[tuple[str, dict[str, Any]]]:
    cases = [(f"cards {name}", with_({"error": "", "cards": [GOOD_CARD]}, cards=c))
             for name, c in card_list_cases()]
    cases += [(f"error={e!r:.12}", {"error": e, "cards": [GOOD_CARD]}) for e in BAD_ERRORS]
    return cases


def replace_cases() -> list[tuple[str, dict[str, Any]]]:
    good_bound = [{k: GOOD_RES[k] for k in ("uid", "cards", "mem", "cores", "slices", "pod")}]
    base = {"error": "", "cards": [GOOD_CARD], "bound": good_bound}
    cases = [(f"cards {name}", with_(base, cards=c)) for name, c in card_list_cases()]
    cases += [(f"error={e!r:.12}", with_(base, error=e)) for e in BAD_ERRORS]
    cases += [(f"bound={b!r:.30}", with_(base, bound=b)) for b in
              [MISSING, "x", 5, {"u9": good_bound[0]}, [5], [None], [[]]]]
    cases += [(f"bound entry {name}", with_(base, bound=[entry])) for name, entry in observe_cases()]
    cases.append(("bound uid repeats", with_(base, bound=good_bound * 2)))
    cases.append(("bound: one good, one bad", with_(base, bound=[*good_bound, with_(good_bound[0], uid="u10",
                                                                                   mem=-5)])))
    return cases


def keep_bound_cases() -> list[tuple[str, str, dict[str, Any]]]:
    """keep_bound (observe, replace_node) is a boolean or absent."""
    obs = {k: GOOD_RES[k] for k in ("uid", "cards", "mem", "cores", "slices", "pod")}
    rep = {"error": "", "cards": [GOOD_CARD], "bound": [obs]}
    return [(script, f"keep_bound={v!r}", with_(base, keep_bound=v))
            for script, base in (("observe", obs), ("replace_node", rep)) for v in ["yes", 1, 0, None, [True], {}]]


def expire_cases() -> list[tuple[str, dict[str, Any]]]:
    return [(f"ttl_ms={t!r}", {} if t is MISSING else {"ttl_ms": t})
            for t in [MISSING, 999, 0, -1, 1000.5, "1000", 86400001, 1e300, None, True, [1000]]] + [
        (f"uids={u!r}", {"ttl_ms": 1000, "uids": u}) for u in ["u1", 5, True, [1], [None], [["u1"]], {"u1": 1}]]


TABLE: list[tuple[str, str, str, dict[str, Any]]] = (
    [("reserve", "n4", name, p) for name, p in reserve_cases()]
    # validated before the node is looked up:
    + [("reserve", "nope", name, p) for name, p in reserve_cases()[:3]]
    + [("observe", "n4", name, p) for name, p in observe_cases()]
    + [("mark_bound", "n4", name, p) for name, p in uids_cases()]
    + [("release", "n4", name, p) for name, p in uid_cases()]
    + [("upsert_node", "n4", name, p) for name, p in upsert_cases()]
    + [("upsert_node", "brand-new", name, p) for name, p in upsert_cases()[:4]]
    + [("replace_node", "n4", name, p) for name, p in replace_cases()]
    + [("expire", "n4", name, p) for name, p in expire_cases()]
    + [(script, "n4", name, p) for script, name, p in keep_bound_cases()]
)


def _json(p: dict[str, Any]) -> str:
    return orjson.dumps(p).decode()


@pytest.mark.redis
@pytest.mark.parametrize(("script", "node", "payload"),
                         [(s, n, _json(p)) for s, n, _name, p in TABLE],
                         ids=[f"{s}[{n}]:{name}" for s, n, name, _p in TABLE])
async def test_bad_fields_are_refused_and_change_nothing(populated: Ledger, script: str, node: str,
                                                         payload: str) -> None:
    led = populated
    before = await dump(led.redis)
    with pytest.raises(LedgerError, match="BADINPUT"):
        await led._call(script, node, orjson.loads(payload))
    assert await dump(led.redis) == before


@pytest.mark.redis
@pytest.mark.parametrize("script", PAYLOAD_SCRIPTS)
@pytest.mark.parametrize("raw", NOT_JSON_OBJECTS, ids=[repr(r)[:24] for r in NOT_JSON_OBJECTS])
async def test_payload_that_is_not_a_json_object_is_refused(populated: Ledger, script: str, raw: str) -> None:
    led = populated
    before = await dump(led.redis)
    with pytest.raises(rexc.ResponseError, match="BADINPUT"):
        await led.redis.evalsha(led._scripts[script].sha, 1, led.node_key("n4"), led.feed, "n4", raw)  # type: ignore[misc]
    assert await dump(led.redis) == before


@pytest.mark.redis
async def test_snapshot_takes_no_payload_and_ignores_garbage_there(populated: Ledger) -> None:
    led = populated
    before = await dump(led.redis)
    raw = await led.redis.evalsha(led._scripts["snapshot"].sha, 1, led.node_key("nope"), led.feed, "nope",  # type: ignore[misc]
                                  "not json")
    assert orjson.loads(raw)["exists"] is False
    assert await dump(led.redis) == before


@pytest.mark.redis
@pytest.mark.parametrize("body", ["not json", '{"keep_ms": -1}', '{"keep_ms": 1.5}', '{"keep_ms": "10"}'])
async def test_remove_node_refuses_a_bad_payload_and_changes_nothing(populated: Ledger, body: str) -> None:
    led = populated
    before = await dump(led.redis)
    with pytest.raises(rexc.ResponseError, match="BADINPUT"):
        await led.redis.evalsha(led._scripts["remove_node"].sha, 1, led.node_key("n4"), led.feed, "n4",  # type: ignore[misc]
                                body)
    assert await dump(led.redis) == before


# -- public methods with hostile values -------------------------------------------------------------

PUBLIC_BAD_CALLS: list[tuple[str, Any]] = [
    ("reserve negative mem", lambda led: led.reserve("n4", "u9", [0], -8, 1, 1)),
    ("reserve huge mem", lambda led: led.reserve("n4", "u9", [0], 10**15, 1, 1)),
    ("reserve float mem", lambda led: led.reserve("n4", "u9", [0], 2.5, 1, 1)),
    ("reserve string mem", lambda led: led.reserve("n4", "u9", [0], "8", 1, 1)),
    ("reserve cores 17", lambda led: led.reserve("n4", "u9", [0], 8, 17, 1)),
    ("reserve zero slices", lambda led: led.reserve("n4", "u9", [0], 8, 1, 0)),
    ("reserve duplicate cards", lambda led: led.reserve("n4", "u9", [0, 0], 8, 1, 1)),
    ("reserve no cards", lambda led: led.reserve("n4", "u9", [], 8, 1, 1)),
    ("reserve bad uid", lambda led: led.reserve("n4", "no spaces allowed", [0], 8, 1, 1)),
    ("reserve model string", lambda led: led.reserve("n4", "u9", [0], 8, 1, 1, model="96")),
    ("mark_bound empty uid", lambda led: led.mark_bound("n4", "")),
    ("release empty uid", lambda led: led.release("n4", "")),
    ("release uid with a key pattern", lambda led: led.release("n4", "*")),
    ("observe negative mem", lambda led: led.observe("u9", PodUsage("n4", (0,), -1, 1, 1))),
    ("observe duplicate cards", lambda led: led.observe("u9", PodUsage("n4", (1, 1), 8, 1, 1))),
    ("observe card index 5000", lambda led: led.observe("u9", PodUsage("n4", (5000,), 8, 1, 1))),
    ("expire ttl below 1 s", lambda led: led.expire("n4", 0.5)),
    ("expire negative ttl", lambda led: led.expire("n4", -10)),
    ("upsert duplicate cards", lambda led: led.upsert_node(
        inventory("n4", S4000, indices=[0, 1, 0]))),
    ("upsert capacity 1", lambda led: led.upsert_node(inventory("n4", 1))),
    ("upsert slice_limit 17", lambda led: led.upsert_node(inventory("n4", S4000, slice_limit=17))),
    ("replace_node duplicate bound uid", lambda led: led._call("replace_node", "n4", {
        "error": "", "cards": [GOOD_CARD],
        "bound": [{"uid": "a", "cards": [0], "mem": 8, "cores": 1, "slices": 1}] * 2})),
]


@pytest.mark.redis
@pytest.mark.parametrize("call", [c for _n, c in PUBLIC_BAD_CALLS], ids=[n for n, _c in PUBLIC_BAD_CALLS])
async def test_public_methods_refuse_bad_values(populated: Ledger, call: Any) -> None:
    led = populated
    before = await dump(led.redis)
    with pytest.raises(LedgerError, match="BADINPUT"):
        await call(led)
    assert await dump(led.redis) == before


# -- unknown nodes: answered, nothing created ---------------------------------------------------------

@pytest.mark.redis
async def test_unknown_node_is_refused_and_nothing_is_created(populated: Ledger) -> None:
    led = populated
    before = await dump(led.redis)
    out, snap = await led.reserve("ghost", "u9", [0], 8, 1, 1)
    assert not out.ok and out.reason == "node unregistered"
    assert snap is not None and snap.version == 0 and not snap.cards
    assert await led.mark_bound("ghost", "u1") is False
    assert await led.release("ghost", "u1") is False
    assert await led.expire("ghost", 1) == []
    assert await led.snapshot("ghost") is None
    assert await led.snapshots(["ghost"]) == {}
    obs = await led.observe("u9", PodUsage("ghost", (0,), 8, 1, 1))
    assert obs["ok"] is False  # a pod on an unknown node never creates the node half-way
    assert await dump(led.redis) == before
    assert await led.remove_node("ghost") is False
    assert await dump(led.redis) == before


@pytest.mark.redis
async def test_upsert_with_create_false_does_not_create(populated: Ledger) -> None:
    led = populated
    before = await dump(led.redis)
    assert await led.upsert_node(inventory("ghost", S4000), create=False) == -1
    assert await dump(led.redis) == before
    assert await led.upsert_node(inventory("n4", S4000), create=False) > 0  # known node: written


# -- valid input that the cards cannot take: refused, with the fresh state --------------------------

REFUSALS: list[tuple[str, str, dict[str, Any], str]] = [
    ("card that does not exist", "n4", {"cards": [7]}, "CardNotFound"),
    ("one of two cards does not exist", "n4", {"cards": [0, 7]}, "CardNotFound"),
    ("cordoned card", "nx", {"cards": [0]}, "CardCordoned"),
    ("unhealthy card", "nx", {"cards": [1]}, "CardNotHealth"),
    ("slice limit reached", "nx", {"cards": [2], "mem": 2}, "CardTimeSlicingExhausted"),
    ("model mismatch", "n4", {"cards": [0], "model": S5000}, "CardTypeMismatch"),
    ("exclusive on a used card", "n4", {"cards": [0], "mem": 88, "cores": 14, "whole": True},
     "ExclusiveDeviceAllocateConflict"),
    ("more memory than free", "n4", {"cards": [0], "mem": 89}, "CardInsufficientMemory"),
    ("more memory than the card", "n4", {"cards": [0], "mem": 4096}, "CardInsufficientMemory"),
    ("more cores than free", "n4", {"cards": [1], "cores": 13}, "CardInsufficientCore"),
    ("card held exclusively", "n5", {"cards": [0], "mem": 2}, "CardInsufficientMemory"),
    ("second card refuses a multi-card booking", "n4", {"cards": [0, 1], "mem": 81},
     "CardInsufficientMemory"),
    ("node in error", "nerr", {"cards": [0]},
     "node unregistered: sgpu-core capacity 17 is not a multiple of 16"),
]


@pytest.mark.redis
@pytest.mark.parametrize(("node", "over", "reason"), [(n, o, r) for _d, n, o, r in REFUSALS],
                         ids=[d for d, *_ in REFUSALS])
async def test_reserve_refusals_change_nothing(populated: Ledger, node: str, over: dict[str, Any],
                                               reason: str) -> None:
    led = populated
    before = await dump(led.redis)
    p = with_(GOOD_RES, **over)
    out, snap = await led.reserve(node, p["uid"], p["cards"], p["mem"], p["cores"], p["slices"], p["model"],
                                  p["whole"], p["pod"])
    assert not out.ok
    assert out.reason == reason
    assert await dump(led.redis) == before
    # the refusal carries the node's current state, so the caller can refit without another read
    assert snap == await led.snapshot(node)
    assert snap is not None and not violations(snap)


@pytest.mark.redis
async def test_populated_fixture_is_consistent(populated: Ledger) -> None:
    snaps = await populated.snapshots(await populated.nodes())
    assert sorted(snaps) == ["n4", "n5", "nerr", "nx"]
    for s in snaps.values():
        assert violations(s) == []
    assert snaps["n4"].cards[0].mem_used == 8 and snaps["n4"].reservations["u1"].state == "bound"
    assert snaps["n5"].cards[0].mem_free == 0 and snaps["n5"].cards[0].cores_free == 0
    assert snaps["nerr"].error and not snaps["nerr"].cards
