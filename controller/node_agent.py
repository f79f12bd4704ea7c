"""`mtsched node-agent`: publishes this node's sgpu_km card knobs as one node annotation.

One per GPU node (a DaemonSet, optional in the chart). Every `cardKnobsSeconds` it reads
`<cardKnobsPath>/<card>/{max_inst,policy,time_slice,overcommit_ratio}` (read-only hostPath of
/proc/sgpu_km), turns them into the versioned value of `mtsched.io/card-knobs`
(shared/domain/knobs.py) and patches its Node only when that value changed. The value it last
published is kept in memory and checked against the Node at start and every `RESYNC` rounds, so an
annotation someone removed comes back without a GET per round. It needs no Redis.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import stat
from pathlib import Path

from prometheus_client import Counter, Gauge

from shared.config import Config, ConfigError
from shared.domain.knobs import ANNOTATION, KNOBS, KnobReport, build_report, encode_annotation, should_patch
from shared.kube import Kube
from shared.serving.http import serve_health
from shared.serving.supervise import Heartbeat, Supervisor

log = logging.getLogger("mtsched.node_agent")

RESYNC = 10  # rounds between reads of the Node's annotation (someone may have changed or removed it)
PATCHES = Counter("mtsched_node_agent_patches_total", "Patches of the node's card-knobs annotation")
READS = Counter("mtsched_node_agent_reads_total", "Reads of the card knob tree", ["result"])
UNREADABLE = Gauge("mtsched_node_agent_unreadable_cards", "Card directories whose knobs could not be read")
CARDS = Gauge("mtsched_node_agent_cards", "Cards whose knobs were read and published")

Tree = dict[str, dict[str, str] | str]


def read_knob(path: Path) -> str:
    """A knob file's first 64 characters. Opened without blocking and read only when it is a regular file (procfs
    entries are): a FIFO, a device or a socket in the tree blocked the agent's read for ever (red team)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        return os.read(fd, 64).decode("ascii", errors="replace")
    finally:
        os.close(fd)


def read_tree(root: Path) -> tuple[Tree, str]:
    """What the knob tree holds: card directory -> {knob: text}, or -> why it could not be read; and an
    error for the whole tree ("" if it could be listed). Files other than directories are not cards."""
    try:
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except FileNotFoundError:
        return {}, f"{root} does not exist (is the sgpu_km module loaded?)"
    except OSError as e:
        return {}, f"cannot list {root}: {e.strerror}"
    tree: Tree = {}
    for entry in entries:
        try:
            if not entry.is_dir():
                continue
        except OSError as e:
            tree[entry.name] = f"cannot stat: {e.strerror}"
            continue
        texts: dict[str, str] = {}
        problem = ""
        for knob in KNOBS:
            try:
                texts[knob] = read_knob(Path(entry.path) / knob)
            except FileNotFoundError:
                continue  # parse_card names every missing knob at once
            except OSError as e:
                problem = f"{knob}: cannot read: {e.strerror}"
                break
        tree[entry.name] = problem or texts
    return tree, ""


class NodeAgent:
    def __init__(self, kube: Kube, cfg: Config):
        if not cfg.node_name:
            raise ConfigError("node-agent: nodeName is not set (MTSCHED_NODE_NAME, from the downward API "
                              "spec.nodeName)")
        self.kube = kube
        self.node = cfg.node_name
        self.root = Path(cfg.card_knobs_path)
        self.interval = float(cfg.card_knobs_seconds)
        self.published: str | None = None  # the annotation's value on the Node, as far as we know
        self.rounds = 0
        # ready while a round succeeded lately: the Node carries what the tree says (or said a round ago)
        self.beat = Heartbeat("card knobs published", max_age=2 * self.interval + 10)
        self.last: KnobReport | None = None

    def report(self) -> KnobReport:
        tree, error = read_tree(self.root)
        report = build_report(str(self.root), tree)
        return KnobReport(report.cards, report.unreadable, error) if error else report

    async def once(self) -> bool:
        """One round: read, compare, patch if needed. Returns whether it patched."""
        report = await asyncio.to_thread(self.report)
        READS.labels("error" if report.error else ("partial" if report.unreadable else "ok")).inc()
        UNREADABLE.set(len(report.unreadable))
        CARDS.set(len(report.cards))
        if report != self.last:  # log what changed once, not every round
            if report.error:
                log.warning("card knobs of %s: %s", self.node, report.error)
            for card, why in sorted(report.unreadable.items()):
                log.warning("card %s of %s is published as unreadable: %s", card, self.node, why)
            log.info("card knobs of %s: %s", self.node,
                     {i: k.as_json() for i, k in sorted(report.cards.items())})
            self.last = report
        value = encode_annotation(report)
        if self.published is None or self.rounds % RESYNC == 0:
            node = await self.kube.get_node(self.node)
            self.published = ((node.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION)
        self.rounds += 1
        patched = False
        if should_patch(self.published, value):
            body = {"metadata": {"annotations": {ANNOTATION: value}}}
            await self.kube.request("PATCH", f"/api/v1/nodes/{self.node}", body,
                                    content_type="application/merge-patch+json")
            log.info("published %s on node %s: %s", ANNOTATION, self.node, value)
            PATCHES.inc()
            self.published = value
            patched = True
        self.beat.ok()
        return patched

    async def run(self) -> None:
        while True:  # errors go to the supervisor: API errors are retried, others end the role after 5
            try:
                await self.once()
            except BaseException as e:
                self.beat.fail(e)
                self.published = None  # read the Node again after a failure: a patch may have half-happened
                raise
            await asyncio.sleep(self.interval)


async def run_node_agent(cfg: Config, stop: asyncio.Event) -> bool:
    sup = Supervisor()
    kube = await Kube.create(cfg.kubeconfig)
    try:
        agent = NodeAgent(kube, cfg)
    except ConfigError:
        await kube.close()
        raise
    health = await serve_health(cfg, sup.problems)
    sup.check("card-knobs", agent.beat)
    sup.spawn("card-knobs", agent.run)
    ok = await sup.run(stop)
    await health.cleanup()
    await kube.close()
    return ok
