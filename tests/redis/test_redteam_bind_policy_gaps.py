"""Red team on the extender's `bindings` readiness check (commit 9cdee46: controller/extender.py _judge_refusal /
bindings_problem): paths of bind where the chart's policy refusal arrives, or a Binding goes through, and the check
does not hear of it."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

from controller.extender import Extender
from shared.kube import KubeError
from shared.store.ledger import Ledger
from tests.redis.test_bind_policy_refusal import POLICY, SLICE
from tests.redis.test_extender_bind import FakeKube, pod
from tests.redis.test_extender_bind import setup as setup  # the fixture, reused

ARGS = {"PodName": "p-a", "PodNamespace": "ns", "PodUID": "a", "Node": "s5k"}


class FlakyKube(FakeKube):
    """`bind_error`: what the Binding call raises (after writing it when `writes`); `reads_fail`: pod reads 503."""

    def __init__(self) -> None:
        super().__init__()
        self.bind_error: BaseException | None = None
        self.writes = False
        self.reads_fail = False

    async def bind(self, ns: str, name: str, uid: str, node: str, annotations: Mapping[str, str],
                   until: float | None = None) -> None:
        if self.bind_error is None or self.writes:
            await super().bind(ns, name, uid, node, annotations)
            p = self.pods[(ns, name)]
            p["spec"]["nodeName"] = node
            p["metadata"]["annotations"].update(annotations)
        if self.bind_error is not None:
            raise self.bind_error

    async def get_pod(self, ns: str, name: str) -> dict[str, Any]:
        if self.reads_fail:
            raise KubeError(503, {"message": "the server is currently unable to handle the request"}, "get")
        return await super().get_pod(ns, name)


async def attempt(ext: Extender, kube: FlakyKube) -> str:
    ext.filter({"Pod": pod("a", SLICE), "NodeNames": ["s5k"], "Nodes": None})
    return str((await ext.bind(ARGS))["Error"])


async def test_rt_a_policy_refusal_of_a_retry_whose_pod_cannot_be_read_is_not_judged(
        setup: tuple[Extender, FakeKube, Ledger]) -> None:
    """An earlier attempt's Binding had an unknown outcome (its booking kept: `existing`); the retry's Binding is
    refused by the chart's policy for who we are while the pod cannot be read: bind takes the `bound is None and
    outcome.existing` branch, which returns before `_judge_refusal`, so the extender stays ready."""
    ext, _, _ = setup
    kube = FlakyKube()
    ext.kube = kube  # type: ignore[assignment]
    kube.pods[("ns", "p-a")] = pod("a", SLICE)
    kube.bind_error, kube.reads_fail = KubeError(504, {"message": "timeout"}, "bind"), True
    assert "unknown outcome" in await attempt(ext, kube)  # booking kept for this attempt
    kube.bind_error = KubeError(403, {"message": POLICY["message"]}, "bind")
    out = await attempt(ext, kube)
    assert "may only be made by hami-scheduler" in out, out
    assert ext.bindings_problem(), f"refused by the policy for who we are, yet ready: {out}"


async def test_rt_a_binding_that_went_through_with_its_answer_lost_clears_the_refusal(
        setup: tuple[Extender, FakeKube, Ledger]) -> None:
    """bindings_problem: '"" when the last one went through'. A Binding written whose answer was lost (a 504),
    read back bound with its record, is a success (`if bound:` branch) but leaves the old refusal standing for
    up to REFUSED_BY_POLICY_SECONDS."""
    ext, _, _ = setup
    kube = FlakyKube()
    ext.kube = kube  # type: ignore[assignment]
    kube.pods[("ns", "p-r")] = pod("r", SLICE)
    kube.bind_error = KubeError(403, {"message": POLICY["message"]}, "bind")
    ext.filter({"Pod": pod("r", SLICE), "NodeNames": ["s5k"], "Nodes": None})
    await ext.bind({"PodName": "p-r", "PodNamespace": "ns", "PodUID": "r", "Node": "s5k"})
    assert ext.bindings_problem()
    kube.pods[("ns", "p-a")] = pod("a", SLICE)
    kube.bind_error, kube.writes = KubeError(504, {"message": "timeout"}, "bind"), True
    assert await attempt(ext, kube) == ""  # the Binding went through: bind succeeded
    assert ext.bindings_problem() == "", "a Binding went through, yet still unready"


async def test_rt_a_policy_refusal_is_judged_even_when_the_give_back_fails(
        setup: tuple[Extender, FakeKube, Ledger], monkeypatch: Any) -> None:
    """_judge_refusal runs after `await self._give_back(...)`: a Redis error there (h_bind answers it as an error)
    skips it, although the refusal says who we are whatever Redis does."""
    ext, _, ledger = setup
    kube = FlakyKube()
    ext.kube = kube  # type: ignore[assignment]
    kube.pods[("ns", "p-a")] = pod("a", SLICE)
    kube.bind_error = KubeError(403, {"message": POLICY["message"]}, "bind")

    async def unreachable(*_: Any, **__: Any) -> Any:
        raise ConnectionError("redis down")

    monkeypatch.setattr(ledger, "give_back", unreachable)
    ext.filter({"Pod": pod("a", SLICE), "NodeNames": ["s5k"], "Nodes": None})
    with contextlib.suppress(ConnectionError):  # h_bind answers it as {"Error": ...}
        await ext.bind(ARGS)
    assert ext.bindings_problem(), "refused by the policy for who we are, yet ready"
