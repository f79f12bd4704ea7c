"""Namespace quotas in the forms only our webhook enforces (shared/domain/quota.py), and its shell
(webhook/quotas.py) over a recorded API: fits, refusals that name quota, asked and left, scopes,
every kind of pod with the amounts the webhook fills in, and fail-closed reads."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import pytest

from shared.config import load_config
from shared.domain.admission import decide
from shared.domain.quota import QuotaError, enforced_keys, hard_value, in_scope, judge_quotas, pod_usage
from webhook.quotas import LIVE_PODS, PAGE, QuotaReader

CFG = load_config(env={}, flags={"memoryPerCard": "96,160"})
MEM, CORE, VGPU = "mthreads.com/sgpu-memory", "mthreads.com/sgpu-core", "mthreads.com/vgpu"


def pod(name: str, *limits: Mapping[str, str], init: Mapping[str, str] | None = None, phase: str = "",
        **spec: Any) -> dict[str, Any]:
    p: dict[str, Any] = {"metadata": {"name": name}, "spec": {
        "containers": [{"name": f"c{i}", "resources": {"limits": dict(lim)}} for i, lim in enumerate(limits)],
        **spec}}
    if init is not None:
        p["spec"]["initContainers"] = [{"name": "i", "resources": {"limits": dict(init)}}]
    if phase:
        p["status"] = {"phase": phase}
    return p


def quota(name: str, scopes: list[str] | None = None, selector: list[dict[str, Any]] | None = None,
          **hard: str) -> dict[str, Any]:
    spec: dict[str, Any] = {"hard": {k.replace("__", "/").replace("_", "."): v for k, v in hard.items()}}
    if scopes:
        spec["scopes"] = scopes
    if selector:
        spec["scopeSelector"] = {"matchExpressions": selector}
    return {"metadata": {"name": name, "namespace": "team"}, "spec": spec}


def hq(name: str, **hard: str) -> dict[str, Any]:
    """A quota with spec.hard written out as keys (`limits.mthreads.com/sgpu-memory`)."""
    return {"metadata": {"name": name, "namespace": "team"}, "spec": {"hard": dict(hard)}}


def slice_(mem: int, cores: int = 1) -> dict[str, str]:
    return {VGPU: "1", MEM: str(mem), CORE: str(cores)}


def asked(p: Mapping[str, Any]) -> dict[str, int]:
    d = decide(p, CFG, {96})
    assert d.allowed, d.message
    return dict(d.usage)


def test_the_forms_enforced_here_are_limits_and_bare_never_requests() -> None:
    keys = enforced_keys(CFG)
    assert keys[f"limits.{MEM}"] == MEM and keys[MEM] == MEM and keys[f"limits.{CORE}"] == CORE
    assert f"limits.{VGPU}" in keys
    assert not any(k.startswith("requests.") for k in keys)  # the API server enforces those itself


@pytest.mark.parametrize(("text", "units"), [
    ("96", 96), ("4k", 4000), ("1500m", 1), ("999m", 0), ("1e2", 100), ("1Ki", 1024), ("0", 0), ("2.9", 2)])
def test_hard_values_round_down(text: str, units: int) -> None:
    assert hard_value(text, "q") == units


@pytest.mark.parametrize("text", ["lots", "-1", "1e400", "", "1x"])
def test_unreadable_hard_values_refuse(text: str) -> None:
    with pytest.raises(QuotaError, match=r"not a quantity|out of range"):
        hard_value(text, 'quota "q" spec.hard limits.mthreads.com/sgpu-memory')


@pytest.mark.parametrize(("p", "usage"), [
    (pod("slice", slice_(8, 2)), {VGPU: 1, MEM: 8, CORE: 2}),
    (pod("defaulted", {VGPU: "1", MEM: "8"}), {VGPU: 1, MEM: 8, CORE: 1}),  # defaultCores filled in
    (pod("exclusive", {VGPU: "1"}), {VGPU: 1, MEM: 96, CORE: 16}),  # the whole card the webhook grants
    (pod("multi", {VGPU: "2"}), {VGPU: 2, MEM: 192, CORE: 32}),
    (pod("two", slice_(8, 2), slice_(4, 1)), {VGPU: 2, MEM: 12, CORE: 3}),  # app containers add up
    (pod("init", slice_(4), init=slice_(32, 4)), {VGPU: 1, MEM: 32, CORE: 4}),  # the larger: init
    (pod("app", slice_(32, 4), init=slice_(4)), {VGPU: 1, MEM: 32, CORE: 4}),
])
def test_a_pod_is_charged_what_the_webhook_admits(p: dict[str, Any], usage: dict[str, int]) -> None:
    assert asked(p) == usage


def test_the_pinned_model_decides_the_whole_card_charge() -> None:
    p = pod("pinned", {VGPU: "1"})
    p["metadata"]["annotations"] = {"mtsched.io/card-memory": "S5000"}
    assert asked(p)[MEM] == 160


def test_terminal_pods_hold_nothing_and_unreadable_pods_refuse() -> None:
    assert pod_usage(pod("done", slice_(8), phase="Succeeded"), CFG) == {}
    assert pod_usage(pod("failed", slice_(8), phase="Failed"), CFG) == {}
    assert pod_usage(pod("running", slice_(8), phase="Running"), CFG)[MEM] == 8
    assert pod_usage(pod("cpu", {"cpu": "1"}), CFG) == {}
    with pytest.raises(QuotaError, match='pod "bad"'):
        pod_usage(pod("bad", {VGPU: "1", MEM: "1.5"}), CFG)


def test_within_quota_is_allowed_over_is_refused_naming_quota_asked_and_left() -> None:
    q = hq("gpu", **{f"limits.{MEM}": "96"})
    running = [pod("a", slice_(32), phase="Running"), pod("b", slice_(32), phase="Pending")]
    assert judge_quotas(pod("new"), {VGPU: 1, MEM: 32, CORE: 1}, [q], running, CFG) is None  # 64 + 32 = 96
    msg = judge_quotas(pod("new"), {VGPU: 1, MEM: 64, CORE: 1}, [q], running, CFG)
    assert msg == (f"exceeded quota: gpu, requested: limits.{MEM}=64, left: limits.{MEM}=32 "
                   "(used 64 by 2 pods, limited 96)")


def test_every_exceeded_limit_is_named_and_the_bare_form_counts_too() -> None:
    q1 = hq("mem", **{MEM: "16"})
    q2 = hq("cores", **{f"limits.{CORE}": "8", f"limits.{VGPU}": "1"})
    msg = judge_quotas(pod("x"), asked(pod("x", {VGPU: "2"})), [q1, q2], [], CFG)
    assert msg is not None
    assert f"exceeded quota: mem, requested: {MEM}=192, left: {MEM}=16 (used 0 by 0 pods, limited 16)" in msg
    assert f"exceeded quota: cores, requested: limits.{CORE}=32, left: limits.{CORE}=8" in msg
    assert f"requested: limits.{VGPU}=2, left: limits.{VGPU}=1" in msg


def test_terminal_pods_free_their_share_and_a_full_quota_says_zero_left() -> None:
    q = hq("gpu", **{f"limits.{MEM}": "96"})
    pods = [pod("done", slice_(64), phase="Succeeded"), pod("run", slice_(96, 16), phase="Running")]
    assert judge_quotas(pod("n"), {MEM: 2}, [q], pods, CFG) == (
        f"exceeded quota: gpu, requested: limits.{MEM}=2, left: limits.{MEM}=0 (used 96 by 1 pod, limited 96)")


def test_requests_quotas_and_quotas_on_other_resources_are_left_to_the_api_server() -> None:
    quotas = [hq("api", **{f"requests.{MEM}": "0", "requests.cpu": "1", "pods": "0"})]
    assert judge_quotas(pod("n"), {MEM: 96}, quotas, [pod("bad", {VGPU: "1.5"})], CFG) is None


def test_a_zero_quota_blocks_every_pod_asking_for_it() -> None:
    assert judge_quotas(pod("n"), {MEM: 2, CORE: 1}, [hq("none", **{f"limits.{CORE}": "0"})], [], CFG) == (
        f"exceeded quota: none, requested: limits.{CORE}=1, left: limits.{CORE}=0 (used 0 by 0 pods, limited 0)")


@pytest.mark.parametrize(("q", "p", "selects"), [
    (quota("t", scopes=["Terminating"]), pod("p", activeDeadlineSeconds=60), True),
    (quota("t", scopes=["Terminating"]), pod("p"), False),
    (quota("t", scopes=["NotTerminating"]), pod("p"), True),
    (quota("b", scopes=["BestEffort"]), pod("p", slice_(8)), True),  # extended resources alone: BestEffort
    (quota("b", scopes=["NotBestEffort"]), pod("p", {**slice_(8), "cpu": "1"}), True),
    (quota("b", scopes=["NotBestEffort"]), pod("p", slice_(8)), False),
    (quota("pc", selector=[{"scopeName": "PriorityClass", "operator": "In", "values": ["high"]}]),
     pod("p", priorityClassName="high"), True),
    (quota("pc", selector=[{"scopeName": "PriorityClass", "operator": "In", "values": ["high"]}]), pod("p"), False),
    (quota("pc", selector=[{"scopeName": "PriorityClass", "operator": "NotIn", "values": ["high"]}]), pod("p"), True),
    (quota("pc", selector=[{"scopeName": "PriorityClass", "operator": "Exists"}]), pod("p"), False),
    (quota("pc", selector=[{"scopeName": "PriorityClass", "operator": "DoesNotExist"}]), pod("p"), True),
    (quota("x", scopes=["CrossNamespacePodAffinity"]), pod("p"), False),
    (quota("x", scopes=["CrossNamespacePodAffinity"]), pod("p", affinity={"podAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": "k", "namespaceSelector": {}}]}}), True),
    (quota("none"), pod("p"), True),
])
def test_scopes_select_pods_as_the_api_server_does(q: dict[str, Any], p: dict[str, Any], selects: bool) -> None:
    assert in_scope(q, p) is selects


def test_a_scoped_quota_counts_only_the_pods_it_selects() -> None:
    q = quota("high", selector=[{"scopeName": "PriorityClass", "operator": "In", "values": ["high"]}])
    q["spec"]["hard"] = {f"limits.{MEM}": "64"}
    others = [pod("low", slice_(64), phase="Running")]
    high = pod("n", priorityClassName="high")
    assert judge_quotas(high, {MEM: 64}, [q], others, CFG) is None
    assert judge_quotas(pod("n"), {MEM: 96}, [q], others, CFG) is None  # not selected: not limited
    held = [pod("h", slice_(32), phase="Running", priorityClassName="high")]
    assert "left: limits.mthreads.com/sgpu-memory=32" in (judge_quotas(high, {MEM: 64}, [q], held, CFG) or "")


# -- the shell: what it reads, and that it fails closed ------------------------------------------------

class Api:
    def __init__(self, answers: Mapping[str, Any]):
        self.answers = answers
        self.calls: list[tuple[str, dict[str, str]]] = []

    async def request(self, method: str, path: str, body: Any = None, query: Mapping[str, Any] | None = None,
                      ok: tuple[int, ...] = (200, 201), content_type: str = "application/json",
                      timeout: float = 30.0, patience: float = 0.0) -> Any:
        self.calls.append((path, dict(query or {})))
        out = self.answers[path]
        if isinstance(out, Exception):
            raise out
        return out


QUOTAS, PODS = "/api/v1/namespaces/team/resourcequotas", "/api/v1/namespaces/team/pods"


def judged(api: Api, p: dict[str, Any]) -> tuple[bool, str]:
    d = asyncio.run(QuotaReader(api, CFG).judge("team", p, decide(p, CFG, {96})))
    return d.allowed, d.message


def test_the_reader_lists_live_pods_only_when_a_quota_needs_them() -> None:
    api = Api({QUOTAS: {"items": [hq("api", **{f"requests.{MEM}": "1"})]}})
    assert judged(api, pod("n", {VGPU: "1"})) == (True, "")
    assert [c[0] for c in api.calls] == [QUOTAS]  # a requests. quota is the API server's: no pod list
    api = Api({QUOTAS: {"items": [hq("gpu", **{f"limits.{MEM}": "96"})]},
               PODS: {"items": [pod("a", slice_(32), phase="Running")]}})
    allowed, msg = judged(api, pod("n", {VGPU: "1"}))  # exclusive: 96 filled in, 64 left
    assert not allowed
    assert msg == f"exceeded quota: gpu, requested: limits.{MEM}=96, left: limits.{MEM}=64 " \
                  "(used 32 by 1 pod, limited 96)"
    assert api.calls[1] == (PODS, {"fieldSelector": LIVE_PODS, "limit": str(PAGE)})  # consistent: no resourceVersion


class PodsApi(Api):
    """Answers the pod list with `pods(query)`, the rest as Api."""

    async def request(self, method: str, path: str, body: Any = None, query: Mapping[str, Any] | None = None,
                      ok: tuple[int, ...] = (200, 201), content_type: str = "application/json",
                      timeout: float = 30.0, patience: float = 0.0) -> Any:
        if path != PODS:
            return await super().request(method, path, body, query, ok, content_type, timeout)
        self.calls.append((path, dict(query or {})))
        return await self.pods_answer(query or {})

    async def pods_answer(self, query: Mapping[str, Any]) -> Any:
        raise NotImplementedError


class PagedApi(PodsApi):
    """Answers the pod list in pages of `page` (as etcd does), with opaque continue tokens."""

    def __init__(self, answers: Mapping[str, Any], pods: list[dict[str, Any]], page: int | None):
        super().__init__(answers)
        self.pods, self.page = pods, page

    async def pods_answer(self, query: Mapping[str, Any]) -> Any:
        start = int(str(query.get("continue", "tok-0"))[4:])
        end = len(self.pods) if self.page is None else start + self.page  # None: ignores limit, as the cache
        more = end < len(self.pods)
        return {"metadata": {"continue": f"tok-{end}"} if more else {}, "items": self.pods[start:end]}


@pytest.mark.parametrize("page", [2, 3, None])
def test_the_reader_reads_every_page_of_live_pods(page: int | None) -> None:
    held = [pod(f"h{i}", slice_(16), phase="Running") for i in range(5)]  # 80 of 96 held
    api = PagedApi({QUOTAS: {"items": [hq("gpu", **{f"limits.{MEM}": "96"})]}}, held, page)
    reader = QuotaReader(api, CFG, page=2)
    p = pod("n", slice_(32))
    d = asyncio.run(reader.judge("team", p, decide(p, CFG, {96})))
    assert not d.allowed and "left: limits.mthreads.com/sgpu-memory=16 (used 80 by 5 pods" in d.message
    pages = [q for path, q in api.calls if path == PODS]
    assert pages[0] == {"fieldSelector": LIVE_PODS, "limit": "2"}
    assert all(q == {"fieldSelector": LIVE_PODS, "limit": "2", "continue": q["continue"]} for q in pages[1:])
    assert len(pages) == (1 if page is None else -(-5 // page))


def test_the_reader_refuses_a_namespace_with_more_live_pods_than_it_reads() -> None:
    held = [pod(f"h{i}", slice_(2), phase="Running") for i in range(7)]
    api = PagedApi({QUOTAS: {"items": [hq("gpu", **{f"limits.{MEM}": "96"})]}}, held, 2)
    p = pod("n", slice_(2))
    d = asyncio.run(QuotaReader(api, CFG, page=2, max_pods=5).judge("team", p, decide(p, CFG, {96})))
    assert not d.allowed
    assert d.message == ("cannot check the ResourceQuotas of namespace team: namespace team has more than 5 live "
                         "pods; the quota check reads no more; the pod is refused until they can be read (retry)")
    assert len([c for c in api.calls if c[0] == PODS]) == 3  # stops at the page that passes the bound


def test_the_reader_leaves_pods_without_slices_alone() -> None:
    api = Api({})
    assert judged(api, pod("cpu", {"cpu": "1"})) == (True, "")
    assert api.calls == []


@pytest.mark.parametrize("answers", [
    {QUOTAS: RuntimeError("GET resourcequotas: HTTP 403: forbidden")},
    {QUOTAS: {"items": "nope"}},
    {QUOTAS: {"items": [hq("gpu", **{f"limits.{MEM}": "lots"})]}, PODS: {"items": []}},
    {QUOTAS: {"items": [hq("gpu", **{f"limits.{MEM}": "96"})]}, PODS: TimeoutError()},
])
def test_the_reader_fails_closed(answers: dict[str, Any]) -> None:
    allowed, msg = judged(Api(answers), pod("n", slice_(8)))
    assert not allowed
    assert msg.startswith("cannot check the ResourceQuotas of namespace team: ")


@pytest.mark.parametrize(("error", "code"), [
    (TimeoutError(), 503),  # the API server away: a server error, which clients retry
    (OSError("connection refused"), 503),
    (RuntimeError("GET resourcequotas: HTTP 403: forbidden"), 403),  # stays so: forbidden
])
def test_a_quota_read_failure_says_whether_to_retry(error: Exception, code: int) -> None:
    p = pod("n", slice_(8))
    d = asyncio.run(QuotaReader(Api({QUOTAS: error}), CFG).judge("team", p, decide(p, CFG, {96})))
    assert not d.allowed and d.code == code


def test_the_review_handler_answers_with_the_quota_refusal_and_updates_pass() -> None:
    import orjson

    from webhook.server import handle_review_with_quotas

    def review(op: str, p: dict[str, Any]) -> bytes:
        req: dict[str, Any] = {"uid": "u", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                               "operation": op, "namespace": "team", "object": p}
        if op == "UPDATE":
            req["oldObject"] = p
        return orjson.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": req})

    api = Api({QUOTAS: {"items": [hq("gpu", **{f"limits.{VGPU}": "1"})]},
               PODS: {"items": [pod("a", slice_(2), phase="Running")]}})
    reader = QuotaReader(api, CFG)
    status, out = asyncio.run(handle_review_with_quotas(review("CREATE", pod("n", slice_(2))), CFG, {96}, reader))
    assert status == 200 and out["response"]["allowed"] is False
    assert out["response"]["status"] == {
        "code": 403, "reason": "Forbidden",
        "message": f"exceeded quota: gpu, requested: limits.{VGPU}=1, left: limits.{VGPU}=0 "
                   "(used 1 by 1 pod, limited 1)"}
    calls = len(api.calls)
    status, out = asyncio.run(handle_review_with_quotas(review("UPDATE", pod("a", slice_(2))), CFG, {96}, reader))
    assert out["response"]["allowed"] is True and len(api.calls) == calls  # an UPDATE charges nothing new


@pytest.mark.parametrize(("cache_seconds", "quota_reads"), [(2.0, 1), (0.0, 3)])
def test_a_namespace_s_quotas_are_read_once_per_interval_and_its_pods_every_time(cache_seconds: float,
                                                                                   quota_reads: int) -> None:
    api = Api({QUOTAS: {"items": [hq("gpu", **{f"limits.{MEM}": "96"})]}, PODS: {"items": []}})
    reader = QuotaReader(api, CFG, cache_seconds=cache_seconds)

    async def three() -> None:
        for name in ("a", "b", "c"):
            p = pod(name, slice_(2))
            assert (await reader.judge("team", p, decide(p, CFG, {96}))).allowed

    asyncio.run(three())
    assert [path for path, _ in api.calls].count(QUOTAS) == quota_reads
    assert [path for path, _ in api.calls].count(PODS) == 3  # what a quota charges is always read fresh


class GatedApi(Api):
    """Answers once `gate` is set: reviews pile up on a read in flight, as in a burst."""

    def __init__(self, answers: Mapping[str, Any]):
        super().__init__(answers)
        self.gate = asyncio.Event()
        self.quota_reads = 0  # started, answered or not

    async def request(self, method: str, path: str, body: Any = None, query: Mapping[str, Any] | None = None,
                      ok: tuple[int, ...] = (200, 201), content_type: str = "application/json",
                      timeout: float = 30.0, patience: float = 0.0) -> Any:
        if path == QUOTAS:
            self.quota_reads += 1
            await self.gate.wait()
        return await super().request(method, path, body, query, ok, content_type, timeout)


def test_reviews_that_miss_the_cache_together_share_one_quota_read() -> None:
    api = GatedApi({QUOTAS: {"items": [hq("gpu", **{f"limits.{MEM}": "96"})]}, PODS: {"items": []}})
    reader = QuotaReader(api, CFG)

    async def burst() -> list[bool]:
        pods = [pod(f"p{i}", slice_(2)) for i in range(32)]
        reviews = [asyncio.ensure_future(reader.judge("team", p, decide(p, CFG, {96}))) for p in pods]
        await asyncio.sleep(0)
        reviews[0].cancel()  # its caller went away: the read the others wait for goes on
        api.gate.set()
        done = await asyncio.gather(*reviews[1:])
        return [d.allowed for d in done]

    assert asyncio.run(burst()) == [True] * 31
    assert [path for path, _ in api.calls].count(QUOTAS) == 1
    # the pods: the first review's read, then one read for the 30 that asked while it was in flight (a read
    # that began before a review asked may miss a pod admitted just before it: never shared with it)
    assert [path for path, _ in api.calls].count(PODS) == 2


def test_a_shared_quota_read_that_fails_refuses_every_review_and_is_not_kept() -> None:
    api = GatedApi({QUOTAS: TimeoutError(), PODS: {"items": []}})  # the API server away
    reader = QuotaReader(api, CFG)

    async def burst() -> list[tuple[bool, int]]:
        pods = [pod(f"p{i}", slice_(2)) for i in range(8)]
        reviews = [asyncio.ensure_future(reader.judge("team", p, decide(p, CFG, {96}))) for p in pods]
        await asyncio.sleep(0)
        api.gate.set()
        done = await asyncio.gather(*reviews)
        api.answers = {QUOTAS: {"items": []}, PODS: {"items": []}}  # back: the next review reads again
        p = pod("later", slice_(2))
        later = await reader.judge("team", p, decide(p, CFG, {96}))
        return [(d.allowed, d.code) for d in done] + [(later.allowed, later.code)]

    out = asyncio.run(burst())
    assert out[:-1] == [(False, 503)] * 8 and out[-1][0] is True
    assert [path for path, _ in api.calls].count(QUOTAS) == 2


def test_a_namespace_in_use_is_read_again_before_its_entry_lapses() -> None:
    """In the last quarter of the interval a review answers from the entry and starts the next read; no
    review waits for it, and none is answered from an entry older than the interval."""
    clock = [100.0]
    api = GatedApi({QUOTAS: {"items": []}, PODS: {"items": []}})
    reader = QuotaReader(api, CFG, cache_seconds=2.0, clock=lambda: clock[0])

    async def run() -> None:
        p = pod("a", slice_(2))
        first = asyncio.ensure_future(reader.judge("team", p, decide(p, CFG, {96})))
        await asyncio.sleep(0)
        api.gate.set()
        assert (await first).allowed
        api.gate.clear()  # from now on a read hangs until set: a review that waited for one would hang
        clock[0] = 101.0  # half way: the entry answers, nothing is read
        assert (await reader.judge("team", p, decide(p, CFG, {96}))).allowed
        assert api.quota_reads == 1
        clock[0] = 101.6  # last quarter: answered at once, and the next read starts
        assert (await asyncio.wait_for(reader.judge("team", p, decide(p, CFG, {96})), 5)).allowed
        await asyncio.sleep(0)
        assert api.quota_reads == 2
        clock[0] = 102.5  # lapsed while that read hangs: the review waits for it, never for an old entry
        late = asyncio.ensure_future(reader.judge("team", p, decide(p, CFG, {96})))
        await asyncio.sleep(0.01)
        assert not late.done()
        api.gate.set()
        assert (await late).allowed
        assert api.quota_reads == 2  # the read in flight, shared

    asyncio.run(run())


class PodGatedApi(PodsApi):
    """Holds each pod list until released; the pods listed are those in `live` when the list began."""

    def __init__(self, answers: Mapping[str, Any], live: list[dict[str, Any]]):
        super().__init__(answers)
        self.live, self.gates = live, []  # type: list[asyncio.Event]
        self.began = asyncio.Queue()  # type: asyncio.Queue[int]

    async def pods_answer(self, query: Mapping[str, Any]) -> Any:
        snapshot = {"items": list(self.live)}
        gate = asyncio.Event()
        self.gates.append(gate)
        self.began.put_nowait(len(self.gates))
        await gate.wait()
        return snapshot


def test_a_review_never_takes_a_pod_read_that_began_before_it() -> None:
    live = [pod("a", slice_(64), phase="Running")]
    api = PodGatedApi({QUOTAS: {"items": [hq("gpu", **{f"limits.{MEM}": "96"})]}}, live)
    reader = QuotaReader(api, CFG)

    async def run() -> tuple[bool, bool, bool, int]:
        first = pod("first", slice_(32))
        one = asyncio.ensure_future(reader.judge("team", first, decide(first, CFG, {96})))
        await api.began.get()
        live.append(pod("first", slice_(32), phase="Pending"))  # admitted meanwhile (another replica)
        late = [pod(f"late{i}", slice_(32)) for i in range(2)]
        later = [asyncio.ensure_future(reader.judge("team", p, decide(p, CFG, {96}))) for p in late]
        await asyncio.sleep(0.01)
        assert len(api.gates) == 1  # the next read waits for the one in flight
        api.gates[0].set()
        d1 = await one
        assert await api.began.get() == 2
        api.gates[1].set()
        d2, d3 = await asyncio.gather(*later)
        return d1.allowed, d2.allowed, d3.allowed, len(api.gates)

    # the first saw 64 of 96 held; the later two share a read begun after they asked, which holds "first" too
    assert asyncio.run(run()) == (True, False, False, 2)


def test_pods_of_at_most_max_pod_reads_namespaces_are_read_at_once() -> None:
    from webhook import quotas as Q

    spaces = [f"ns{i}" for i in range(Q.MAX_POD_READS + 3)]
    answers: dict[str, Any] = {}
    for ns in spaces:
        answers[f"/api/v1/namespaces/{ns}/resourcequotas"] = {"items": [hq("gpu", **{f"limits.{MEM}": "96"})]}
    api = Api(answers)
    inflight, peak = 0, 0

    async def request(method: str, path: str, body: Any = None, query: Mapping[str, Any] | None = None,
                      ok: tuple[int, ...] = (200, 201), content_type: str = "application/json",
                      timeout: float = 30.0, patience: float = 0.0) -> Any:
        nonlocal inflight, peak
        if not path.endswith("/pods"):
            return answers[path]
        inflight += 1
        peak = max(peak, inflight)
        await asyncio.sleep(0.01)
        inflight -= 1
        return {"items": []}

    api.request = request  # type: ignore[method-assign]
    reader = QuotaReader(api, CFG)

    async def run() -> list[bool]:
        p = pod("n", slice_(2))
        out = await asyncio.gather(*(reader.judge(ns, p, decide(p, CFG, {96})) for ns in spaces))
        return [d.allowed for d in out]

    assert asyncio.run(run()) == [True] * len(spaces)
    assert peak == Q.MAX_POD_READS
