"""Fixtures for tests against the real local control plane (deploy/local).

* ``control_plane``: session-wide etcd + kube-apiserver (watch cache on). The scheduler is started
  by the tests that need it (``await control_plane.start_scheduler_async(...)``).
* ``control_plane_no_watch_cache``: a second plane with ``--watch-cache=false``, started on first
  use, for tests that need etcd semantics (410 Gone after compaction).
* ``api_client`` / ``api_client_no_watch_cache``: kubernetes_asyncio ApiClients (admin token).
* ``namespace``: a fresh namespace per test. Without kube-controller-manager namespaces never
  finish deleting, so every test gets a unique one and only its pods are deleted (grace 0).
* ``https_server``: serves an aiohttp app on https://127.0.0.1:PORT with the harness cert.

Binaries: built once by deploy/local/build-binaries.sh. The tests skip only when Go is missing
*and* the binaries are not built; a failing build fails the session.
"""

from __future__ import annotations

import contextlib
import re
import socket
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import web
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

from deploy.local.controlplane import (
    BuildError,
    ControlPlane,
    ControlPlaneError,
    ensure_binaries,
    go_available,
)
from deploy.local.identities import Identities, provision
from deploy.local.nodes import LABEL_GPU_COUNT, LABEL_GPU_NODE, LABEL_SLICED_CORES
from shared.kube import Kube

# Set on namespaces made by the fixtures; webhook tests may select on it.
E2E_LABEL = "mtsched.io/e2e"

_planes: list[ControlPlane] = []


def _bin_dir(pytestconfig: pytest.Config) -> Path:
    # A cold build takes minutes: show its progress lines live instead of capturing them.
    capman = pytestconfig.pluginmanager.getplugin("capturemanager")
    uncaptured = capman.global_and_fixture_disabled() if capman else contextlib.nullcontext()
    try:
        with uncaptured:
            return ensure_binaries(progress=sys.stderr)
    except BuildError as e:
        error = e
    if not go_available():
        pytest.skip(
            "e2e: control-plane binaries are not built and Go (1.26+) is not installed; "
            "install Go and run `python -m deploy.local build`"
        )
    pytest.fail(f"e2e: building the control-plane binaries failed: {error}", pytrace=False)


def _start_plane(pytestconfig: pytest.Config, **kwargs: Any) -> ControlPlane:
    cp = ControlPlane(_bin_dir(pytestconfig), **kwargs)
    try:
        cp.start()
    except ControlPlaneError as e:
        pytest.fail(f"e2e: control plane failed to start: {e}\n{cp.log_tails()}", pytrace=False)
    _planes.append(cp)
    return cp


@contextlib.contextmanager
def _plane(pytestconfig: pytest.Config, **kwargs: Any) -> Iterator[ControlPlane]:
    cp = _start_plane(pytestconfig, **kwargs)
    try:
        yield cp
    finally:
        _planes.remove(cp)
        cp.stop()


@pytest.fixture(scope="session")
def control_plane(pytestconfig: pytest.Config) -> Iterator[ControlPlane]:
    with _plane(pytestconfig) as cp:
        yield cp


@pytest.fixture(scope="session")
def control_plane_no_watch_cache(pytestconfig: pytest.Config) -> Iterator[ControlPlane]:
    with _plane(pytestconfig, watch_cache=False) as cp:
        yield cp


@pytest_asyncio.fixture
async def cluster(stack: Any, redis_server: Any) -> AsyncIterator[Any]:
    """A scenario (tests/e2e/test_product.py Cluster) on the module's own `stack` fixture: its namespace, API client
    and ledger, its pods and nodes deleted after."""
    from tests.e2e.test_product import Cluster

    async with Cluster.opened(stack, redis_server.url) as c:
        yield c


@pytest_asyncio.fixture
async def admin(control_plane: ControlPlane) -> AsyncIterator[Kube]:
    """The control plane's admin client, for a test's own setup and checks (the roles under test run under the
    chart's identities)."""
    kube = await Kube.create(str(control_plane.kubeconfig_path))
    try:
        yield kube
    finally:
        await kube.close()


@pytest.fixture(scope="module")
def ids(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Identities:
    """The chart's identities on the session's plane (deploy/local/identities.py), provisioned once per module."""
    return provision(control_plane, directory=tmp_path_factory.mktemp("ids"))


@pytest_asyncio.fixture
async def extender_kube(ids: Identities) -> AsyncIterator[Kube]:
    """An API client as the extender's identity (the chart's RBAC)."""
    k = await Kube.create(str(ids["extender"].kubeconfig))
    try:
        yield k
    finally:
        await k.close()


@pytest.fixture(scope="module")
def own_control_plane(pytestconfig: pytest.Config) -> Iterator[ControlPlane]:
    """A plane for one module alone, for tests that restart or break it (fault tests)."""
    with _plane(pytestconfig) as cp:
        yield cp


# Labels every simulated node carries (deploy/local/nodes.py gpu_node): a selector on them alone selects any node.
_EVERY_NODES_LABELS = frozenset({"kubernetes.io/os", LABEL_GPU_NODE, LABEL_SLICED_CORES, LABEL_GPU_COUNT})


def _may_land_anywhere(spec: dict[str, Any]) -> bool:
    if set(spec.get("nodeSelector") or {}) - _EVERY_NODES_LABELS:
        return False
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution")
    return not required


@pytest.fixture(autouse=True)
def _no_stray_pods(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fails a test that leaves on the session's plane an unbound pod any node may take (no nodeSelector but on
    labels every simulated node has, no required node affinity), after deleting it: namespaces never finish
    deleting here, so such a pod stays Pending and kube-scheduler places it on the next test's node, whose cards
    it then holds (a CI run saw a trust test's 8-unit pod on test_redteam_sidecar's card)."""
    yield
    if "control_plane" not in request.fixturenames or not _planes:
        return
    cp = request.getfixturevalue("control_plane")
    pods = cp.api("GET", "/api/v1/pods?fieldSelector=spec.nodeName%3D")["items"]
    stray = [p for p in pods if _may_land_anywhere(p["spec"])]
    for p in stray:
        meta = p["metadata"]
        cp.api("DELETE", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}?gracePeriodSeconds=0",
               ok=(200, 202, 404))
    assert not stray, ("left unbound pods any node may take (deleted now): "
                       + ", ".join(f"{p['metadata']['namespace']}/{p['metadata']['name']}" for p in stray))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if report.failed and _planes:
        for cp in _planes:
            report.sections.append((f"control plane logs ({cp.workdir})", cp.log_tails(30)))
    return report


async def _api_client(cp: ControlPlane) -> client.ApiClient:
    return await config.new_client_from_config(config_file=str(cp.kubeconfig_path), persist_config=False)


@pytest_asyncio.fixture(scope="session")
async def api_client(control_plane: ControlPlane) -> AsyncIterator[client.ApiClient]:
    api = await _api_client(control_plane)
    try:
        yield api
    finally:
        await api.close()


@pytest_asyncio.fixture(scope="session")
async def api_client_no_watch_cache(
    control_plane_no_watch_cache: ControlPlane,
) -> AsyncIterator[client.ApiClient]:
    api = await _api_client(control_plane_no_watch_cache)
    try:
        yield api
    finally:
        await api.close()


def unique_name(prefix: str) -> str:
    """A DNS-1123 name that is unique per call (cluster-scoped objects: nodes, namespaces)."""
    slug = re.sub(r"[^a-z0-9-]+", "-", prefix.lower()).strip("-")[:40].strip("-")
    return f"{slug}-{uuid.uuid4().hex[:6]}"


@pytest.fixture
def name_factory() -> Callable[[str], str]:
    return unique_name


NamespaceFactory = Callable[[client.ApiClient], Awaitable[str]]


@pytest_asyncio.fixture
async def namespace_factory(request: pytest.FixtureRequest) -> AsyncIterator[NamespaceFactory]:
    made: list[tuple[client.ApiClient, str]] = []

    async def make(api: client.ApiClient) -> str:
        name = unique_name(f"e2e-{request.node.name}")
        body: Any = {"metadata": {"name": name, "labels": {E2E_LABEL: "true"}}}
        await client.CoreV1Api(api).create_namespace(body=body)
        made.append((api, name))
        return name

    yield make
    for api, name in made:
        # Bound pods would wait forever for a kubelet: grace 0 removes them at once.
        try:
            await client.CoreV1Api(api).delete_collection_namespaced_pod(name, grace_period_seconds=0)
        except ApiException as e:
            if e.status != 404:
                raise


@pytest_asyncio.fixture
async def namespace(api_client: client.ApiClient, namespace_factory: NamespaceFactory) -> str:
    return await namespace_factory(api_client)


HttpsServer = Callable[[web.Application], Awaitable[str]]


@pytest_asyncio.fixture
async def https_server(control_plane: ControlPlane) -> AsyncIterator[HttpsServer]:
    """Start aiohttp apps on https://127.0.0.1:<free port> (cert: IP 127.0.0.1, DNS localhost)."""
    runners: list[web.AppRunner] = []

    async def serve(app: web.Application) -> str:
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        runners.append(runner)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))  # bound here so the port is known before serving
        port = sock.getsockname()[1]
        await web.SockSite(runner, sock, ssl_context=control_plane.server_ssl_context()).start()
        return f"https://127.0.0.1:{port}"

    yield serve
    for runner in runners:
        await runner.cleanup()
