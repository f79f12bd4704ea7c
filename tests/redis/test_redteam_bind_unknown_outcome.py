"""Red team: a Binding whose outcome is unknown must not give its cards away.

The Binding POST can time out (or fail with a 5xx) after the API server wrote it: the pod is then bound to
the node with its allocation record. Bind asks the API server whether that happened (`_already_bound`),
but when that GET fails too (the API server overloaded: the reason the POST timed out in the first place),
it released the reservation as if the Binding had been refused. The pod runs on the card anyway, and until a
watcher sees its record the card is offered again: the next pod is booked onto it, and both hold more of
the card than it has. A booking is given back only when the Binding is known not to exist; otherwise it
stays pending, and the janitor expires it after pendingTTLSeconds if no pod turns up with its record."""

from __future__ import annotations

from collections.abc import Mapping
from types import SimpleNamespace

import aiohttp
import pytest

from shared.kube import KubeError
from tests.redis.test_extender_bind import FakeKube, pod, setup  # noqa: F401 (the fixture)

pytestmark = pytest.mark.redis

EXCLUSIVE = {"mthreads.com/vgpu": 1, "mthreads.com/sgpu-memory": 96, "mthreads.com/sgpu-core": 16}


class LostAnswerKube(FakeKube):
    """The API server writes the Binding, then the answer is lost; reading the pod back fails too."""

    def __init__(self, error: BaseException) -> None:
        super().__init__()
        self.error = error
        self.reads_fail = True

    async def bind(self, ns: str, name: str, uid: str, node: str, annotations: Mapping[str, str],
                   until: float | None = None) -> None:
        await super().bind(ns, name, uid, node, annotations)  # it went through on the server
        raise self.error

    async def get_pod(self, ns: str, name: str):  # type: ignore[no-untyped-def]
        if self.reads_fail:
            raise KubeError(503, {"message": "the server is currently unable to handle the request"}, "get")
        return await super().get_pod(ns, name)


@pytest.mark.parametrize("error", [TimeoutError(), KubeError(504, {"message": "timeout"}, "bind")],
                         ids=["timeout", "504"])
async def test_redteam_a_binding_of_unknown_outcome_keeps_its_cards(setup, error) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    ext, _fake, ledger = setup
    kube = LostAnswerKube(error)
    ext.kube = kube
    # s4k has two S4000 cards: two exclusive pods fill it, a third must find nothing
    for uid in ("a", "b"):
        kube.pods[("ns", f"p-{uid}")] = pod(uid, EXCLUSIVE)
    ext.filter({"Pod": pod("a", EXCLUSIVE), "NodeNames": ["s4k"], "Nodes": None})
    out = await ext.bind({"PodName": "p-a", "PodNamespace": "ns", "PodUID": "a", "Node": "s4k"})
    assert out["Error"]  # kube-scheduler is told the bind did not (knowably) succeed
    (_, _, _, record), = kube.bound  # ... but the pod is bound to s4k with its record
    snap = await ledger.snapshot("s4k")
    assert snap is not None and "a" in snap.reservations, (
        f"the booking of a pod that may be bound was released ({out['Error']})")
    # the API server answers again: two more exclusive pods, one card left for them
    kube.reads_fail = False
    kube.error = None  # type: ignore[assignment]

    async def plain_bind(ns: str, name: str, uid: str, node: str, annotations: Mapping[str, str],
                         until: float | None = None) -> None:
        kube.bound.append((f"{ns}/{name}", uid, node, dict(annotations)))

    kube.bind = plain_bind  # type: ignore[method-assign]
    kube.pods[("ns", "p-c")] = pod("c", EXCLUSIVE)
    outs = [await ext.bind({"PodName": f"p-{u}", "PodNamespace": "ns", "PodUID": u, "Node": "s4k"})
            for u in ("b", "c")]
    await ext.settled()
    cards = [ann["mthreads.com/gpu-index"] for _, _, _, ann in kube.bound]
    assert len(cards) == len(set(cards)), f"two pods bound to one whole card: {kube.bound}, {outs}"
    assert record["mthreads.com/gpu-index"] in cards


class NoConnectionKube(LostAnswerKube):
    """The API server could not be reached at all: the Binding was never sent."""

    async def bind(self, ns: str, name: str, uid: str, node: str, annotations: Mapping[str, str],
                   until: float | None = None) -> None:
        key = SimpleNamespace(host="127.0.0.1", port=6443, ssl=True, is_ssl=True)
        raise aiohttp.ClientConnectorError(key, OSError(111, "Connection refused"))  # type: ignore[arg-type]


async def test_redteam_a_binding_never_sent_releases_its_cards(setup) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    ext, _fake, ledger = setup
    kube = NoConnectionKube(TimeoutError())
    ext.kube = kube
    ext.filter({"Pod": pod("a", EXCLUSIVE), "NodeNames": ["s4k"], "Nodes": None})
    out = await ext.bind({"PodName": "p-a", "PodNamespace": "ns", "PodUID": "a", "Node": "s4k"})
    assert "reservation released" in out["Error"], out
    snap = await ledger.snapshot("s4k")
    assert snap is not None and not snap.reservations


class RetryWithoutConnectionKube(LostAnswerKube):
    """The first Binding is written but its answer lost; the retry's gets no connection in time; the pod
    cannot be read throughout (the same outage)."""

    async def bind(self, ns: str, name: str, uid: str, node: str, annotations: Mapping[str, str],
                   until: float | None = None) -> None:
        if not self.bound:
            await super().bind(ns, name, uid, node, annotations)  # written, answer lost
        raise aiohttp.ConnectionTimeoutError("Connection timeout to host")


async def test_redteam_a_retry_never_sent_keeps_the_booking_an_earlier_attempt_made(setup) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    """Red team (round 2): the retry's Binding was never sent, but the first attempt's may exist: the booking
    that attempt made is not given back while the pod cannot be read."""
    ext, _fake, ledger = setup
    kube = RetryWithoutConnectionKube(TimeoutError())
    ext.kube = kube
    kube.pods[("ns", "p-a")] = pod("a", EXCLUSIVE)
    args = {"PodName": "p-a", "PodNamespace": "ns", "PodUID": "a", "Node": "s4k"}
    for attempt in range(2):
        ext.filter({"Pod": pod("a", EXCLUSIVE), "NodeNames": ["s4k"], "Nodes": None})
        out = await ext.bind(args)
        assert "kept" in out["Error"], (attempt, out)
        snap = await ledger.snapshot("s4k")
        assert snap is not None and "a" in snap.reservations, (attempt, out)
    assert len(kube.bound) == 1  # the first attempt's Binding: the pod holds the card
