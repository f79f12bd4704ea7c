"""The scheduler's two roles as long-running asyncio programs: the extender and the watcher.

(The webhook's runner is webhook/runner.py; how every role serves is shared/serving/http.py.)
"""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web

from controller.extender import BODY_LIMIT as EXTENDER_BODY_LIMIT
from controller.extender import Extender
from controller.leadership import LeaderYield
from controller.node_watch import NodeWatcher
from controller.pod_watch import PodWatcher
from controller.reconciler import Reconciler
from controller.upkeep import Upkeep, stamp_while_ready
from controller.watchers import janitor_for, wire
from shared.config import Config
from shared.kube import Kube
from shared.serving import gc_policy
from shared.serving.access import watch_access
from shared.serving.http import serve_api
from shared.serving.metrics import PODS_UNTRIED
from shared.serving.supervise import Backoff, Supervisor, asked_wait, unless_stopped
from shared.store.ledger import Ledger
from shared.store.session import start_role

log = logging.getLogger("mtsched")


async def run_extender(cfg: Config, stop: asyncio.Event) -> bool:
    sup = Supervisor()
    kube: Kube | None = None
    if LeaderYield.wanted(cfg):  # before the wait for Redis: an extender cut off from its start hands over too
        kube = await Kube.create(cfg.kubeconfig)
        sup.spawn("leader-yield", LeaderYield(cfg, kube, sup.problems).run)
    try:
        health, ledger, mirror = await start_role(cfg, sup, stop)
    except BaseException:
        await sup.cancel()
        if kube is not None:
            await kube.close()
        raise
    if kube is None:
        kube = await Kube.create(cfg.kubeconfig)
    watch_access(sup, kube, "extender", lease=cfg.leader_lease if LeaderYield.wanted(cfg) else "")
    app = web.Application(client_max_size=EXTENDER_BODY_LIMIT)
    ext = Extender(cfg, ledger, mirror, kube)
    ext.routes(app)
    sup.check("bindings", ext.bindings_problem)  # the admission policy refuses every Binding we send
    sup.spawn("claims", ext.expire_claims)
    upkeep = spawn_upkeep(sup, ledger, cfg)
    ext.unkept = upkeep.problem
    upkeep.on_kept.append(ext.kept_again)
    try:
        ok = await serve_api(cfg, app, sup, stop, health)
    finally:
        await ext.settled()  # the answered binds' bookings marked bound before the clients close
        await kube.close()
    return ok


def spawn_upkeep(sup: Supervisor, ledger: Ledger, cfg: Config) -> Upkeep:
    """The extender's reader of the watchers' stamp, supervised: each read that works is progress (a read that timed
    out during a Redis freeze no longer keeps the extender unready once one works: Supervisor.progress)."""
    upkeep = Upkeep(ledger, cfg.watchers_lost_after_seconds)
    upkeep.on_progress = sup.progress("upkeep")
    sup.spawn("upkeep", upkeep.run)
    return upkeep


def spawn_bound_records(sup: Supervisor, pods: PodWatcher) -> None:
    """The pod watcher's records held for our bind's confirmation (PodWatcher.confirm_deferred), supervised; each
    round that completes is progress (a round that timed out during a Redis freeze no longer keeps the watcher
    unready, and so unstamped, for `proven_after` once one works: tests/redis/test_redteam_bound_records_ready.py)."""
    pods.on_progress = sup.progress("bound-records")
    sup.spawn("bound-records", pods.confirm_deferred)


def spawn_node_events(sup: Supervisor, nodes: NodeWatcher) -> None:
    """The node stream's events, coalesced per node (NodeWatcher.run_events), supervised; each handling that works is
    progress (a handling that failed slowly during a Redis freeze no longer keeps the watcher unready, and so
    unstamped, for `proven_after` once one works: tests/redis/test_review_node_events_ready.py)."""
    nodes.on_progress = sup.progress("node-events")
    sup.spawn("node-events", nodes.run_events)


async def run_watcher(cfg: Config, stop: asyncio.Event) -> bool:
    sup = Supervisor()
    health, ledger, mirror = await start_role(cfg, sup, stop, card_metrics=True)
    kube = await Kube.create(cfg.kubeconfig)
    watch_access(sup, kube, "watcher")
    nodes = NodeWatcher(kube, ledger, cfg)
    pods = PodWatcher(kube, ledger, mirror, cfg, nodes.lost)
    wire(nodes, pods)
    log.info("nudging kube-scheduler %s (nudgeAnyNode)", "with one Node patch for all Nodes" if cfg.nudge_any_node
             else "Node by Node")
    PODS_UNTRIED.set_function(pods.untried_for)
    reconciler = Reconciler(kube, ledger, cfg, nodes, pods)
    reconciler.on_progress = sup.progress("reconciler")
    pods.unaccounted_changed = reconciler.touch
    nodes.verify_later = reconciler.verify_later  # a node it wrote that Redis's history change keeps unverified
    mirror.on_reconnect.append(reconciler.wake.set)  # Pub/Sub lost messages meanwhile: compare soon
    mirror.on_notice["wake"].append(pods.nudger.nudge)  # an extender's claim ended unused where it turned pods away
    mirror.on_notice["verify"].append(reconciler.touch)  # a booking refused on a node not compared since a failover
    sup.check("nodes", nodes.problem)  # the stream, or its events not handled (Redis away)
    sup.check("pods", pods.reflector.problem)
    rebuild_error = "not done yet"
    sup.check("rebuild",
              lambda: f"initial rebuild of the ledger from the API: {rebuild_error}" if rebuild_error else "")

    async def first_rebuild() -> None:
        nonlocal rebuild_error
        backoff = Backoff(0.5)
        while True:
            try:
                await reconciler.rebuild()
                rebuild_error = ""
                return
            except Exception as e:
                rebuild_error = f"failed ({e}); retrying"
                log.warning("initial rebuild failed (%s); retrying in %.1fs", e, max(backoff.delay, asked_wait(e)))
                await backoff.sleep(after=e)  # (an API server's 429: no sooner than its Retry-After)

    try:
        # SIGTERM meanwhile, in a retry's wait or while an API call hangs: Stopped, exit 0 (controller/cli.py)
        await unless_stopped(first_rebuild(), stop)
    except BaseException:
        await sup.cancel()  # the Redis tasks already run (open_ledger): ended as sup.run ends them
        await health.cleanup()
        await kube.close()
        raise
    gc_policy.settle()  # the nodes and pods just listed, like the mirror's cards
    sup.spawn("nodes", nodes.reflector.run)
    spawn_node_events(sup, nodes)  # the stream's events, coalesced per node (node_watch.py)
    sup.spawn("pods", pods.reflector.run)
    spawn_bound_records(sup, pods)  # records waiting for our bind's confirmation
    sup.spawn("reconciler", reconciler.run)
    janitor = janitor_for(ledger, mirror, cfg, pods)
    janitor.on_progress = sup.progress("janitor")
    sup.spawn("janitor", janitor.run)
    # what the extenders check; with nudgeAnyNode, back after no watcher kept the ledger, one nudge wakes every pod
    # they turned away meanwhile (those an extender that restarted since forgot included)
    kept_again = pods.nudger.nudge_any if cfg.nudge_any_node else None
    sup.spawn("upkeep", lambda: stamp_while_ready(ledger, lambda: sup.problems(but="upkeep"),
                                                  lost_after_seconds=cfg.watchers_lost_after_seconds,
                                                  kept_again=kept_again, progress=sup.progress("upkeep")))
    ok = await sup.run(stop)
    await health.cleanup()
    await kube.close()
    return ok
