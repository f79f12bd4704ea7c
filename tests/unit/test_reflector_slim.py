"""The reflector hands objects to its handlers without `metadata.managedFields` (controller/reflector.py):
the list holds every object of a kind until on_sync, and no handler reads the field owners."""

from __future__ import annotations

from typing import Any, cast

from controller.reflector import Reflector
from shared.kube import Kube

OWNERS = [{"manager": "kubectl", "fieldsV1": {"f:metadata": {"f:labels": {"f:a": {}}}}}]


def node(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": "7", "labels": {"a": "1"},
                         "managedFields": list(OWNERS)}, "status": {"capacity": {"mthreads.com/vgpu": "8"}}}


class Pages:
    """Two pages of nodes, then the end of the list."""

    def __init__(self) -> None:
        self.queries: list[dict[str, Any]] = []

    async def request(self, method: str, path: str, query: dict[str, Any], **_: Any) -> dict[str, Any]:
        self.queries.append(dict(query))
        if "continue" not in query:
            return {"metadata": {"continue": "t1"}, "items": [node("a"), node("b")]}
        return {"metadata": {"resourceVersion": "9"}, "items": [node("c")]}


async def _nothing(*_: Any) -> None:
    return None


async def test_list_pages_come_without_field_owners_and_everything_else_is_kept() -> None:
    kube = Pages()
    r = Reflector(cast(Kube, kube), "/api/v1/nodes", _nothing, _nothing, "nodes", page_size=2)
    items, rv = await r.list()
    assert rv == "9" and [i["metadata"]["name"] for i in items] == ["a", "b", "c"]
    want = node("a")
    del want["metadata"]["managedFields"]
    assert items[0] == want  # labels, resourceVersion, status: all there
    assert kube.queries[1]["continue"] == "t1"


async def test_watch_events_reach_the_handler_without_field_owners() -> None:
    seen: list[tuple[str, dict[str, Any]]] = []

    async def on_event(kind: str, obj: dict[str, Any]) -> None:
        seen.append((kind, obj))

    r = Reflector(cast(Kube, Pages()), "/api/v1/nodes", on_event, _nothing, "nodes")
    await r._handle({"type": "MODIFIED", "object": node("a")})
    ((kind, obj),) = seen
    assert kind == "MODIFIED" and "managedFields" not in obj["metadata"] and obj["metadata"]["labels"] == {"a": "1"}
    assert r.resource_version == "7"
