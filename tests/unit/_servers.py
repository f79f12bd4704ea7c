"""The real extender and webhook applications without Redis or an API server.

The mirror's nodes are filled directly (Mirror.apply is tested elsewhere); the ledger and the API
client are recording stand-ins, so a test can assert that a refused bind booked nothing.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, cast

from aiohttp import web
from redis.asyncio import Redis

from controller.extender import BODY_LIMIT as EXTENDER_BODY_LIMIT
from controller.extender import Extender
from shared.config import Config, load_config
from shared.domain.state import CardRecord, NodeSnapshot
from shared.kube import Kube, KubeError
from shared.store.ledger import Ledger, ReserveOutcome
from shared.store.mirror import Mirror
from webhook.server import BODY_LIMIT as WEBHOOK_BODY_LIMIT
from webhook.server import Webhook

# A field path: names, indexes and keys, a key quoted as JSON (shared/domain/shapes.py key_path), which may
# hold "]" itself and end in "..." when cut short.
FIELD = re.compile(r'^[A-Za-z][A-Za-z0-9]*([.][A-Za-z0-9]+|\[[^\]"]*\]|\["(?:[^"\\]|\\.)*"(?:\.\.\.)?\])*: ')


CFG = load_config(env={}, flags={"memoryPerCard": "96,160"})
VGPU = "mthreads.com/vgpu"
MEM = "mthreads.com/sgpu-memory"
CORE = "mthreads.com/sgpu-core"


def card(index: int, capacity: int) -> CardRecord:
    return CardRecord(index, capacity, 0, capacity, 16, 0, 16, 0, 16, "ok")


def mirror(nodes: Mapping[str, int] | None = None) -> Mirror:
    """A ready mirror holding two-card nodes of the given capacities (name -> units per card)."""
    m = Mirror(Ledger(Redis(port=1)))  # never connects: the nodes are set here
    for name, units in (nodes or {"s4k": 96, "s5k": 160}).items():
        m.put(NodeSnapshot(name, 1, cards={0: card(0, units), 1: card(1, units)}))
    m.ready.set()
    return m


class FakeLedger:
    """Records every reservation asked for; books card 0 (or refuses, with `refuse`)."""

    def __init__(self) -> None:
        self.placed: list[tuple[str, str]] = []
        self.bound: list[tuple[str, str]] = []
        self.released: list[tuple[str, str]] = []
        self.refuse = ""

    async def place(self, node: str, uid: str, *_: Any, **__: Any) -> tuple[ReserveOutcome, None]:
        self.placed.append((node, uid))
        if self.refuse:
            return ReserveOutcome(False, refused=self.refuse), None
        return ReserveOutcome(True, cards=(0,)), None

    async def mark_bound(self, node: str, uid: str) -> bool:
        """As Ledger.mark_bound: True, the booking this fake placed is there."""
        return not await self.mark_bound_many(node, [uid])

    async def mark_bound_many(self, node: str, uids: list[str]) -> list[str]:
        """As Ledger.mark_bound_many: the uids without a booking this fake placed."""
        self.bound.extend((node, uid) for uid in uids)
        return [uid for uid in uids if (node, uid) not in self.placed or self.refuse]

    async def release(self, node: str, uid: str) -> None:
        self.released.append((node, uid))

    async def give_back(self, node: str, uid: str, bind_no: int | None = None,
                        attempt: str = "") -> tuple[str, None]:
        await self.release(node, uid)  # as Ledger.give_back, without a mirror to feed
        return "released", None


class FakeKube:
    """Pods and nodes as the API server would return them; records Bindings and node reads."""

    def __init__(self) -> None:
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.nodes: dict[str, dict[str, Any]] = {}
        self.bound: list[tuple[str, str, str]] = []
        self.node_reads: list[str] = []
        self.events: list[tuple[str, str]] = []

    async def get_pod(self, ns: str, name: str) -> dict[str, Any]:
        if (ns, name) not in self.pods:
            raise KubeError(404, {"message": f'pods "{name}" not found'}, "get")
        return self.pods[(ns, name)]

    async def get_node(self, name: str) -> dict[str, Any]:
        self.node_reads.append(name)
        if name not in self.nodes:
            raise KubeError(404, {"message": f'nodes "{name}" not found'}, "get")
        return self.nodes[name]

    async def bind(self, ns: str, name: str, uid: str, node: str, annotations: Mapping[str, str],
                   until: float | None = None) -> None:
        self.bound.append((f"{ns}/{name}", uid, node))

    async def create_event(self, pod: Any, reason: str, message: str, kind: str, component: str) -> None:
        self.events.append((reason, message))


class PostingKube:
    """An API client that records the body of every request (the events a reporter posts) and answers {}."""

    def __init__(self) -> None:
        self.posted: list[dict[str, Any]] = []

    async def request(self, method: str, path: str, body: Any = None, **_: Any) -> Any:
        self.posted.append(body)
        return {}


def extender(cfg: Config = CFG, kube: FakeKube | None = None, ledger: FakeLedger | None = None,
             nodes: Mapping[str, int] | None = None) -> Extender:
    return Extender(cfg, cast(Ledger, ledger or FakeLedger()), mirror(nodes), cast(Kube | None, kube))


def extender_app(ext: Extender) -> web.Application:
    app = web.Application(client_max_size=EXTENDER_BODY_LIMIT)  # as controller.roles.run_extender
    ext.routes(app)
    return app


def webhook_app(cfg: Config = CFG) -> web.Application:
    app = web.Application(client_max_size=WEBHOOK_BODY_LIMIT)  # as webhook.runner.run_webhook
    Webhook(cfg, lambda: {96, 160}).routes(app)
    return app


def pod(uid: str = "u1", limits: Mapping[str, object] | None = None, annotations: Mapping[str, Any] | None = None,
        **spec: Any) -> dict[str, Any]:
    """An admitted slice pod (our scheduler) unless told otherwise."""
    limits = {VGPU: "1", MEM: "32", CORE: "8"} if limits is None else limits
    return {"metadata": {"name": f"p-{uid}", "namespace": "ns", "uid": uid, "annotations": dict(annotations or {})},
            "spec": {"schedulerName": "hami-scheduler",
                     "containers": [{"name": "c", "resources": {"limits": dict(limits)}}], **spec}}


def bind_args(uid: str = "u1", node: str = "s5k", name: str | None = None) -> dict[str, str]:
    return {"PodName": name or f"p-{uid}", "PodNamespace": "ns", "PodUID": uid, "Node": node}
