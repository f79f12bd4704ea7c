"""What the roles make of the API server's answers about their permissions (shared/domain/access.py,
shared/serving/access.py), against a stand-in API server: a denied need the role cannot do without makes it
unready naming it, one it can do without is only counted, an unreachable API server changes nothing, and the
permission coming back clears it. The real API server's RBAC: tests/e2e/test_access.py."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import REGISTRY

from shared.domain.access import EXTENDER, WATCHER, Need, denial_problem, needs_of
from shared.kube import KubeError
from shared.serving.access import PATH, AccessProbe, review

GET_PODS = next(n for n in WATCHER if n.verb == "get" and n.resource == "pods")
PATCH_NODES = next(n for n in WATCHER if n.verb == "patch")


def test_the_review_asks_for_the_need_as_rbac_writes_it() -> None:
    binding = next(n for n in EXTENDER if n.resource == "pods/binding")
    assert review(binding)["spec"]["resourceAttributes"] == {"verb": "create", "group": "", "resource": "pods",
                                                            "subresource": "binding"}
    events = next(n for n in WATCHER if n.resource == "events")
    assert review(events)["spec"]["resourceAttributes"]["namespace"] == "default"


def test_only_fatal_needs_make_a_problem_and_it_names_them() -> None:
    assert denial_problem([(PATCH_NODES, "no")]) == ""
    got = denial_problem([(GET_PODS, 'RBAC: clusterrole "hami-watcher" lacks it'), (PATCH_NODES, "")])
    assert got.startswith("the API server denies get pods (the reconciler and the janitor: ")
    assert "hami-watcher" in got and "patch nodes" not in got


def test_every_role_has_its_needs() -> None:
    assert needs_of("extender") == EXTENDER and needs_of("watcher") == WATCHER
    assert needs_of("webhook") and needs_of("webhook", quota_check=False) == ()
    assert all(not n.fatal for n in needs_of("webhook"))  # (it stays ready: it refuses with the reason)


class StandIn:
    def __init__(self) -> None:
        self.denied: set[tuple[str, str]] = set()
        self.fail: Exception | None = None
        self.on_denied: list[Any] = []

    async def request(self, method: str, path: str, body: Any = None, **_: Any) -> Any:
        assert (method, path) == ("POST", PATH)
        if self.fail is not None:
            raise self.fail
        a = body["spec"]["resourceAttributes"]
        key = (a["verb"], a["resource"] + (f"/{a['subresource']}" if "subresource" in a else ""))
        if key in self.denied:
            return {"status": {"allowed": False, "reason": "RBAC: not allowed"}}
        return {"status": {"allowed": True}}


def gauge(need: Need) -> float | None:
    return REGISTRY.get_sample_value("mtsched_permission_denied", {"verb": need.verb, "resource": need.resource})


async def test_a_denial_and_its_end() -> None:
    api = StandIn()
    probe = AccessProbe(api, WATCHER)  # type: ignore[arg-type]
    assert api.on_denied  # told of the role's own refused calls
    await probe.check()
    assert probe.problem() == "" and gauge(GET_PODS) == 0
    api.denied = {("get", "pods"), ("patch", "nodes")}
    await probe.check()
    assert "get pods" in probe.problem() and "RBAC: not allowed" in probe.problem()
    assert "patch nodes" not in probe.problem() and gauge(PATCH_NODES) == 1
    api.fail = OSError("connection refused")  # the API server away: as last known
    await probe.check()
    assert "get pods" in probe.problem()
    api.fail, api.denied = None, set()
    await probe.check()
    assert probe.problem() == "" and gauge(GET_PODS) == 0 and gauge(PATCH_NODES) == 0


@pytest.mark.parametrize(("status", "unready"), [(401, True), (403, False), (500, False)])
async def test_credentials_refused_is_every_need_denied(status: int, unready: bool) -> None:
    api = StandIn()
    api.fail = KubeError(status, {"message": "Unauthorized" if status == 401 else "x"}, "POST")
    probe = AccessProbe(api, EXTENDER)  # type: ignore[arg-type]
    await probe.check()
    assert bool(probe.problem()) is unready
    if unready:
        assert "create pods/binding" in probe.problem() and "credentials" in probe.problem()
