"""Prometheus metrics of every role and the /metrics handler (per-card gauges: shared/store/card_metrics.py)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Mapping

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, Counter, Gauge, Histogram, generate_latest

from shared.domain.fit import Reasons, failure_names

BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)

GC_PAUSE = Histogram("mtsched_gc_pause_seconds", "Time one cyclic garbage collection held the role's event loop",
                     ["generation"], buckets=BUCKETS)
GC_FREEZES = Counter("mtsched_gc_freezes_total",
                     "Times what lives was frozen out of later garbage collections (start, state loaded, grown)")
EXTENDER_SECONDS = Histogram("mtsched_extender_request_seconds", "Extender call latency", ["verb"], buckets=BUCKETS)
EXTENDER_ERRORS = Counter("mtsched_extender_errors_total",
                          "filter and prioritize calls that raised (a bug): answered with no node, logged", ["verb"])
for _verb in ("filter", "prioritize"):  # exported at 0 from the start, so a rate() sees the first one
    EXTENDER_ERRORS.labels(_verb)
WEBHOOK_SECONDS = Histogram("mtsched_webhook_request_seconds", "Admission review latency", ["result"],
                            buckets=BUCKETS)
RESERVATIONS = Counter("mtsched_reservations_total", "Reservation attempts by outcome", ["result"])
CONFLICTS = Counter("mtsched_reservation_conflicts_total",
                    "Reservations refused because another replica booked first (refit and retried)")
TOPK_DROPPED = Counter("mtsched_filter_topk_dropped_total",
                       "Candidate nodes the filter left out once the best filterTopK fitting ones were found "
                       "(not fitted, or fitted and not among the best)")
RELEASES = Counter("mtsched_releases_total", "Reservations released", ["why"])
WAKES = Counter("mtsched_extender_wakes_total",
                "Claims that ended without their bind on a node where the filter had placed a pod nowhere meanwhile: "
                "the watchers are asked (a wake notice on the feed) to nudge kube-scheduler about the node")
NUDGES = Counter("mtsched_scheduler_nudges_total",
                 "Node annotation patches that make kube-scheduler retry pods after cards were freed (first: soon "
                 "after the release or repair; follow_up: seconds later. result: sent, error, gone: the node "
                 "was deleted, or idle: not sent, as no pod of ours was waiting to be scheduled)",
                 ["which", "result"])
MIRROR_REREADS = Counter("mtsched_mirror_rereads_total",
                         "Nodes the mirror re-read from Redis because a feed message could not be applied (counted "
                         "once read), by why: "
                         "gap (a message missed), history (the write before it is not the mirror's), "
                         "recreated (the node's keys made anew), unknown (a node the mirror lacks), rebuild, "
                         "malformed", ["why"])
MIRROR_FULL_READS = Counter("mtsched_mirror_full_reads_total",
                            "Times the mirror read every node from Redis anew, by why: start (its first read), "
                            "lost (after losing Redis, a failover or a silent feed: once connected again), "
                            "reconnected (the feed's connection was replaced under it; what was published meanwhile "
                            "may be lost). Not the periodic resyncs", ["why"])
MIRROR_MOVING = Gauge("mtsched_mirror_nodes_moving",
                      "Nodes this role's mirror cannot read while a live reshard of a Redis Cluster has their keys "
                      "split between two shards (their last state kept; the extender offers none of them): read "
                      "again after 1 s, then 2, 4, up to every 8 s, until the move ends")
FEED_SILENCES = Counter("mtsched_feed_silences_total",
                        "Feed connections the mirror gave up because they answered no PING in time (a socket that "
                        "died without a reset); each is followed by a reconnection and a full re-read")
CLIENTS_REFUSED = Counter("mtsched_clients_refused_total",
                          "Requests answered 403 because the caller's certificate (of the client CA) names none of "
                          "<role>ClientNames (a handshake without such a certificate never reaches the role)",
                          ["role"])
BINDINGS = Counter("mtsched_bindings_total", "Bind calls by outcome", ["result"])
ADMISSIONS = Counter("mtsched_admissions_total", "Admission decisions", ["result"])
QUOTA_CHECKS = Counter("mtsched_webhook_quota_checks_total",
                       "Pods checked against a namespace quota in the limits. or bare form (the forms only the "
                       "webhook enforces), by result: allowed, denied, error (quotas or pods unreadable: refused)",
                       ["result"])
WATCH_RELISTS = Counter("mtsched_watch_relists_total", "Full lists of a watched resource (start, 410 Gone, errors)",
                        ["resource"])
WATCH_RESUMES = Counter("mtsched_watch_resumes_total", "Watch streams resumed from the last resourceVersion",
                        ["resource"])
WATCH_EVENTS = Counter("mtsched_watch_events_total", "Watch events handled", ["resource", "type"])
WATCH_COALESCED = Counter("mtsched_watch_events_coalesced_total",
                          "Watch events never handled: a newer event of the same object came before their turn",
                          ["resource"])
WATCH_DEFERRED = Counter("mtsched_watch_deferred_total",
                         "Objects whose change waits its turn: handled less than the minimum interval before",
                         ["resource"])
ANNOTATION_ERRORS = Counter("mtsched_annotation_errors_total",
                            "Pods whose allocation record could not be decoded (their usage is kept, not freed)")
REDIS_ROUND_TRIPS = Counter("mtsched_redis_round_trips_total",
                            "Calls to Redis by the ledger, one per round trip (a pipeline counts once), by operation",
                            ["op"])
REDIS_RESENDS = Counter("mtsched_redis_resends_total",
                        "Round trips to Redis sent again after a connection error, a timeout or a failover, by "
                        "operation (the log names them at most once a second per operation)", ["op"])
REDIS_DAMAGED_KEYS = Counter("mtsched_redis_damaged_keys_total",
                             "Ledger keys of another type than the layout gives them (not written by mtsched) that a "
                             "script deleted; the watchers then repair their node (should stay 0)")
OVERCOMMIT = Counter("mtsched_overcommit_observed_total",
                     "Allocations observed on the API server that over-commit a card (should stay 0)")
BIND_DEADLINE_MISSED = Counter("mtsched_bind_deadline_total",
                               "Binds that met their Binding's deadline (shared/domain/timing.py) the hard way, by "
                               "when: before_send (the reservation took so long the Binding was not sent), "
                               "unknown_outcome (the Binding failed with no answer that it was refused, and the pod "
                               "was read unbound: read again after the API server's deadline)", ["when"])
for _when in ("before_send", "unknown_outcome"):  # exported at 0, so the alert's increase() sees the first one
    BIND_DEADLINE_MISSED.labels(_when)
REBOOKED = Counter("mtsched_bind_rebooked_total",
                   "Binds whose booking went while the Binding was being written (expired past the TTL, or "
                   "released by a repair), booked again from the record they wrote (should stay 0)")
SETTLE_FAILURES = Counter("mtsched_bind_settle_failures_total",
                          "Answered binds whose booking was not marked bound (the ledger's call failed after its "
                          "retries, or the role stopped first); the pod watcher books it from the record the "
                          "Binding wrote")
RECORDS = Counter("mtsched_records_total",
                  "Allocation records of bound pods the pod watcher handled, by outcome: observed (sent to the "
                  "ledger's observe script), already_bound (this replica's mirror showed the ledger holding that "
                  "very booking bound: no round trip)", ["outcome"])
RECORD_MISMATCH = Counter("mtsched_record_mismatch_total",
                          "Allocation records the ledger did not book (should stay 0): changed after our bind "
                          "(the booking is kept), or on a pod our scheduler does not place (foreign)", ["kind"])


TASK_FAILURES = Counter("mtsched_task_failures_total", "Supervised tasks that stopped and were restarted",
                        ["task", "kind"])
TASK_UP = Gauge("mtsched_task_up", "1 while a supervised task runs, 0 while it waits to be restarted", ["task"])
READY = Gauge("mtsched_ready", "1 when the role's readiness checks pass (what /readyz answers), read at scrape time")
ROLE = Gauge("mtsched_role_info", "1, labelled with the role this process runs (join on instance for a role)",
             ["role"])
BUILD = Gauge("mtsched_build_info",
              "1, labelled with the release this process runs: version (the package's), scripts (a digest of its "
              "ledger scripts, shared.store.ledger.scripts_digest) and code (a digest of every source file it runs, "
              "controller.cli.code_digest: the version is not bumped per release and most fixes change no script) "
              "and config (a digest of the settings every role shares, controller.cli.config_digest). Two values at "
              "once for long: two releases or configurations run side by side (MtschedReleasesMixed)",
              ["version", "scripts", "code", "config"])
REDIS_PARTITION_RISK = Gauge("mtsched_redis_partition_risk",
                             "1 when a booking Redis acknowledged could be lost without a change of history the "
                             "fence sees: a Sentinel master with min-replicas-to-write 0 (checked by the watchers' "
                             "full reconcile passes; docs/install.md)")
PERMISSION_DENIED = Gauge("mtsched_permission_denied",
                          "1 while the API server denies this role a call it makes (SelfSubjectAccessReview every "
                          "30 s, shared/domain/access.py; a denied call the role cannot do without also makes it "
                          "unready)", ["verb", "resource"])
LEADER_YIELDS = Counter("mtsched_leader_yields_total",
                        "Times the extender of the leader scheduler pod, unready for leaderYieldSeconds while another "
                        "replica was Ready, wrote kube-scheduler's Lease over to hand the leadership on "
                        "(controller/leadership.py)")
PODS_UNTRIED = Gauge("mtsched_pods_untried_oldest_seconds",
                     "How long the oldest pod of our scheduler waiting to be placed has gone untried by any "
                     "scheduler (no PodScheduled condition; watchers, from first seen; 0: none): minutes mean no "
                     "kube-scheduler of our profile is working")
REDIS_EVICTED_KEYS = Gauge("mtsched_redis_evicted_keys",
                           "Keys Redis dropped when full since it started (INFO stats evicted_keys, summed over a "
                           "Cluster's primaries; read by the readiness probe): each one makes every node of that "
                           "server wait for the watchers' comparison before it is booked again")
REDIS_UP = Gauge("mtsched_redis_up", "1 while Redis accepted a probe write within the last 6 s (the readiness check)")
RECONCILE_REPAIRS = Counter("mtsched_reconcile_repairs_total",
                            "Differences between the ledger and the API server that the reconciler repaired",
                            ["kind"])
NODES_VERIFIED = Counter("mtsched_nodes_verified_total",
                         "Nodes a watcher verified against the API server after a change of Redis's history (a "
                         "restart that kept data, a failover) left them unverified: each node once per change, "
                         "by whichever watcher's write verified it (sum over the watchers)")
RECONCILE_RUNS = Counter("mtsched_reconcile_runs_total", "Reconciliation passes over every node", ["result"])
RECONCILE_TOUCHED = Counter("mtsched_reconcile_touched_total",
                            "Comparisons of only the nodes where a pod bound without a record came or went",
                            ["result"])
RECONCILE_LAST = Gauge("mtsched_reconcile_last_pass_timestamp_seconds",
                       "Unix time a reconciliation pass over every node last completed (0: none yet)")
RECONCILE_SECONDS = Histogram("mtsched_reconcile_seconds", "Duration of one reconciliation pass", buckets=BUCKETS)
CONNECTIONS_REFUSED = Counter("mtsched_http_connections_refused_total",
                              "Connections closed as they were accepted: the port already had 1024 open, or 256 "
                              "from that peer address")
BODIES_REFUSED = Counter("mtsched_http_bodies_refused_total",
                         "Requests answered 503: the bodies being handled held what the server allows them (in all, "
                         "or from that peer address)")
JANITOR_KEPT = Counter("mtsched_janitor_kept_total",
                       "Pending reservations past pendingTTLSeconds the janitor kept, per sweep, by why: api_bound "
                       "(the API server has the pod bound there, the pod view not yet), api_unanswered (the API "
                       "server could not be asked), view_bound (the pod view holds the pod bound there with no "
                       "record it can book)",
                       ["why"])
JANITOR_HELD = Gauge("mtsched_janitor_held",
                     "1 while the janitor expires no pending reservation because the watcher's pod stream is down, "
                     "not listed yet, or back for less than 10 s (a booking whose record it has not seen may be a "
                     "running pod's)")
LEDGER_KEPT_AGE = Gauge("mtsched_ledger_kept_age_seconds",
                        "Extender: how old the last ready watcher's stamp on the ledger was at the last read (every "
                        "5 s; -1: no stamp, or not read yet); beyond watchersLostAfterSeconds no slice pod is placed")
LEDGER_REBUILDS = Counter("mtsched_ledger_rebuilds_total", "Full rebuilds of the ledger from the API server",
                          ["why"])
PREEMPT_NODES = Counter("mtsched_preempt_nodes_total",
                        "Candidate nodes of preempt calls by what the extender did with kube-scheduler's victims: "
                        "kept (they free a card), unchanged (the cards do not block), "
                        "no_card (no card freed: node dropped), unknown_node, not_ready, unkept (no watcher keeps the "
                        "ledger), bad_request, no_request, error", ["outcome"])
FILTER_FAILURES = Counter("mtsched_filter_failures_total",
                          "Filter calls that placed a pod on no node, once per HAMi reason any node gave",
                          ["reason"])

_REASON = re.compile(r"[A-Z][A-Za-z]{0,63}")


def failure_label(name: str) -> str:
    """A bounded label for one reason name: HAMi's CamelCase names as they are, anything else by kind."""
    if _REASON.fullmatch(name):
        return name
    return "NodeUnregistered" if name.startswith("node unregistered") else "Other"


def count_filter_failures(*failed: Mapping[str, Reasons | str]) -> None:
    """One increment per distinct reason among the nodes' failures (card counts or a node-level reason)."""
    labels = {failure_label(n) for f in failed for why in f.values() for n in failure_names(why)}
    for label in labels:
        FILTER_FAILURES.labels(label).inc()


# Text-format blocks appended to the registry's on /metrics (the per-card gauges render their own, cached:
# shared/store/card_metrics.py says why)
_EXPOSITIONS: list[Callable[[], bytes]] = []


def add_exposition(render: Callable[[], bytes]) -> None:
    _EXPOSITIONS.append(render)


def exposition() -> bytes:
    """What /metrics answers: the registry, then every added block."""
    return b"".join([generate_latest(REGISTRY), *(render() for render in _EXPOSITIONS)])


# /metrics answers being made or sent at once, in all and to one peer address: the per-card block is megabytes
# at 1,000 nodes, and a caller that does not read its answer holds it in this process. More meanwhile get a 503
# (Prometheus scrapes again); one address cannot hold every slot (a Prometheus pair scrapes from two)
METRICS_AT_ONCE = 4
METRICS_PER_PEER = 1
# the longest an answer may take to reach the caller; then its connection is dropped and its memory freed
METRICS_SEND_SECONDS = 10.0
_metrics_slots = 0
_metrics_peers: dict[str, int] = {}


async def metrics_handler(request: web.Request) -> web.StreamResponse:
    global _metrics_slots
    peer = request.remote or ""
    if _metrics_slots >= METRICS_AT_ONCE or _metrics_peers.get(peer, 0) >= METRICS_PER_PEER:
        return web.Response(status=503, text="/metrics: answers are being sent (to you, or to as many callers as "
                            "it sends at once); try again\n", headers={"Retry-After": "1"})
    _metrics_slots += 1
    _metrics_peers[peer] = _metrics_peers.get(peer, 0) + 1
    try:
        body = exposition()
        resp = web.StreamResponse(headers={"Content-Type": CONTENT_TYPE_LATEST})
        resp.content_length = len(body)
        try:
            async with asyncio.timeout(METRICS_SEND_SECONDS):
                await resp.prepare(request)
                await resp.write(body)
                await resp.write_eof()
        except TimeoutError:
            if request.transport is not None:
                request.transport.abort()  # the unread rest goes with the connection
        except ConnectionError:  # the caller hung up mid-answer: nothing to say to it, nothing to log
            pass
        return resp
    finally:
        _metrics_slots -= 1
        _metrics_peers[peer] -= 1
        if not _metrics_peers[peer]:
            del _metrics_peers[peer]
