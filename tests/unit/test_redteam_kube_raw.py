"""Red team of Kube.raw (shared/kube.py): what it hands aiohttp, against kubernetes-asyncio's call_api path
(the code before 6fa22ad), for the bodies, queries, content types, timeouts, proxy and TLS name callers use."""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from shared.kube import Kube
from tests.kubeconfigs import token_kubeconfig


async def _old_raw(kube: Kube, method: str, path: str, body: Any = None, query: Any = None,
                   timeout: Any = 30.0, content_type: str = "application/json") -> Any:
    return await kube.api.call_api(
        path, method, query_params=list((query or {}).items()),
        header_params={"Accept": "application/json", "Content-Type": content_type},
        body=body, auth_settings=["BearerToken"], _preload_content=False, _request_timeout=timeout)


CASES = [
    ("POST", "/a", {"x": "ünï", "n": 1, "f": 1.5, "l": [1, None, True]}, None, "application/json", 30.0),
    ("PATCH", "/b", {"metadata": {"annotations": {"a": "b"}}}, {"fieldManager": "m g", "dryRun": "All", "b": True},
     "application/merge-patch+json", 5.0),
    ("PATCH", "/c", {"a": 1}, None, "application/apply-patch+yaml", None),
    ("POST", "/d", {}, None, "application/json", 0),
    ("DELETE", "/e", None, {"x": "a/b&c"}, "application/json", 30.0),
    ("GET", "/f", None, {"watch": "true", "timeoutSeconds": 250, "labelSelector": "a in (b,c)"}, "application/json",
     aiohttp.ClientTimeout(total=None, sock_read=330, connect=10)),
    ("POST", "/g", {"t": datetime.datetime(2024, 1, 2, 3, 4, 5, 6, tzinfo=datetime.UTC)}, None, "application/json",
     30.0),
]


@pytest.mark.parametrize("case", CASES, ids=[c[1] for c in CASES])
async def test_raw_hands_aiohttp_what_call_api_did(tmp_path: Path, case: tuple[Any, ...]) -> None:
    kube = await Kube.create(str(token_kubeconfig(tmp_path / "kc", "https://10.0.0.1:6443")))
    rest = kube.api.rest_client
    rest.proxy, rest.proxy_headers, rest.server_hostname = "http://proxy:3128", {"X-P": "1"}, "kubernetes.default"
    seen: list[dict[str, Any]] = []

    async def capture(*args: Any, **kw: Any) -> None:
        if args:
            kw = {"method": args[0], "url": args[1], **kw}
        seen.append(kw)

    rest.pool_manager.request = capture  # type: ignore[method-assign]
    try:
        method, path, body, query, ctype, timeout = case
        await _old_raw(kube, method, path, body, query, timeout, ctype)
        await kube.raw(method, path, body, query, timeout=timeout, content_type=ctype)
        old, new = seen
        for kw in (old, new):
            kw["method"] = kw["method"].upper()
            data = kw.pop("data", None)
            kw["data"] = json.loads(data) if data is not None else None
            t = kw["timeout"]
            if t.total == 0:  # aiohttp: a total of 0 is no limit, as None (helpers.TimeoutHandle.start)
                kw["timeout"] = t._replace(total=None) if hasattr(t, "_replace") else aiohttp.ClientTimeout(
                    total=None, connect=t.connect, sock_read=t.sock_read, sock_connect=t.sock_connect)
        assert new == old
    finally:
        await kube.close()
