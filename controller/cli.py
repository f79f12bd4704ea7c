"""`mtsched`: one command for every role and tool.

  mtsched extender|webhook|watcher [--config FILE] [--set key=value ...]
  mtsched node-agent [--config FILE]        publish this node's /proc/sgpu_km card knobs (MTSCHED_NODE_NAME)
  mtsched cards [--redis-url URL]          the card table from Redis
  mtsched explain NAMESPACE/POD [-o json]  why a pod is Pending: per node and card, reason, holders, fix
  mtsched check-config [--config FILE] [--role ROLE]   validate a configuration and print it; with --role,
                                           also what would stop that role from starting with it (exit 2)
  mtsched demo                             the quick start (local control plane + sample pods)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import orjson
import uvloop

from shared.config import Config, ConfigError, key_of, load_config, redact_url
from shared.serving import gc_policy, logs
from shared.serving.supervise import Stopped

if TYPE_CHECKING:
    from shared.domain.state import NodeSnapshot


def _parse_sets(items: list[str]) -> dict[str, object]:
    out: dict[str, object] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--set {item!r}: expected key=value")
        out[key.strip()] = value.strip()
    return out


def _config(args: argparse.Namespace) -> Config:
    path = args.config or os.environ.get("MTSCHED_CONFIG") or None
    return load_config(path, flags=_parse_sets(args.set or []))


def _run_role(main: Callable[[Config, asyncio.Event], Awaitable[bool]], cfg: Config) -> int:
    """Runs a role until SIGTERM/SIGINT (exit 0) or until one of its tasks gave up (exit 1: restart me)."""
    async def runner() -> bool:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, stop.set)
        try:
            return await main(cfg, stop)
        except Stopped:  # SIGTERM while it still waited for Redis: nothing to hand over
            logging.getLogger("mtsched").info("stopped before the role could start")
            return True

    gc_policy.settle()  # the modules and the configuration live as long as the role
    gc_policy.install()  # after: that collection holds no request (the loop does not exist yet)
    return 0 if uvloop.run(runner()) else 1


def explain_kubeconfig(given: str, env: Mapping[str, str]) -> str:
    """The kubeconfig `explain` reads: the one given, $KUBECONFIG's first entry, ~/.kube/config when it exists;
    else, in a pod, "" (its own ServiceAccount: `kubectl exec ... -c extender -- mtsched explain`; the extender's
    and the watchers' may read pods and nodes, the webhook's may not)."""
    if given:
        return given
    first = next((p for p in env.get("KUBECONFIG", "").split(os.pathsep) if p), "")
    if first:
        return first
    home = os.path.expanduser("~/.kube/config")
    in_cluster = bool(env.get("KUBERNETES_SERVICE_HOST"))
    return home if os.path.exists(home) or not in_cluster else ""


def _explain(args: argparse.Namespace, cfg: Config) -> int:
    """The pod from the API server (kubeconfig), the cards from Redis, as `mtsched cards` reads them."""
    from controller.explain import ExplainError, gather, render
    from shared.domain.upkeep import unkept_problem
    from shared.kube import Kube
    from shared.store.ledger import Ledger, RedisOptions, connect

    try:
        options = RedisOptions.from_config(cfg)
    except ConfigError as e:
        print(f"mtsched explain: {e}", file=sys.stderr)
        return 2
    kubeconfig = explain_kubeconfig(args.kubeconfig or cfg.kubeconfig, os.environ)

    async def run() -> str:
        client = connect(args.redis_url or cfg.redis_url, options)
        kube = await Kube.create(kubeconfig)
        try:
            ledger = Ledger(client, cfg.key_prefix)

            async def snapshots() -> dict[str, NodeSnapshot]:
                return await ledger.snapshots(await ledger.nodes())

            # the extenders' verdict, from the stamp as Redis reads it
            unkept = unkept_problem(await ledger.kept_age_ms(), cfg.watchers_lost_after_seconds)
            return render(await gather(kube, args.pod, snapshots, cfg, unkept), args.output)
        finally:
            await kube.close()
            await client.aclose()

    try:
        print(asyncio.run(run()))
    except ExplainError as e:
        print(f"mtsched explain: {e}", file=sys.stderr)
        return 2 if e.status == 400 else 1
    except Exception as e:  # no kubeconfig, Redis unreachable: one line, not a traceback
        print(f"mtsched explain: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    return 0


CODE_PACKAGES = ("controller", "shared", "webhook")  # what a role runs (deploy/ and bench/ are tools)
CODE_SUFFIXES = (".py", ".lua")


def code_sources() -> dict[str, str]:
    """Every source file the roles run (path under the packages' parent -> text): the installed tree."""
    import importlib

    out: dict[str, str] = {}
    for name in CODE_PACKAGES:
        root = Path(importlib.import_module(name).__file__ or "").parent
        for f in root.rglob("*"):
            if f.suffix in CODE_SUFFIXES and f.is_file():
                out[f.relative_to(root.parent).as_posix()] = f.read_text(encoding="utf-8", errors="replace")
    return out


def code_digest(sources: Mapping[str, str] | None = None) -> str:
    """12 hex digits naming the code a process runs (`mtsched_build_info{code}`). The package version stays
    0.1.0 across releases and most fixes change no ledger script, so neither label alone tells two releases
    apart; this one changes with any file. Pure over `sources` (path -> text); the installed files by default."""
    from shared.store.ledger import scripts_digest

    return scripts_digest(sources if sources is not None else code_sources())


# The settings every role reads from the one configuration the chart renders, that decide what the ledger holds and
# what is admitted, placed or booked: two values of them at once are two configurations running side by side (a roll
# of a configuration change stuck half-way; docs/install.md, "Changing settings on a live cluster"). Not the ones set
# per role or pod (listen, nodeName, podName, the leader hand-over), nor secrets.
SHARED_SETTINGS = ("memory_per_card", "resource_count_name", "resource_memory_name", "resource_core_name",
                   "whole_card_resource_name", "scheduler_name", "node_scheduler_policy", "gpu_scheduler_policy",
                   "filter_top_k", "default_cores", "max_slices_per_card", "force_overwrite_default_scheduler",
                   "redis_url", "key_prefix", "pending_ttl_seconds", "reconcile_seconds", "events_enabled",
                   "quota_check")


def config_digest(cfg: Config) -> str:
    """12 hex digits naming the shared settings a process runs with (`mtsched_build_info{config}`); the Redis URL
    without its passwords (the userinfo's, and the query's `password=`/`sentinel_password=`, masked: a label anyone
    who scrapes reads must be no hash over a secret)."""
    import hashlib
    import json

    from shared.config import redact_url, without_password

    values = {k: getattr(cfg, k) for k in SHARED_SETTINGS}
    values["memory_per_card"] = [m.memory for m in cfg.memory_per_card]
    values["redis_url"] = redact_url(without_password(cfg.redis_url))
    return hashlib.sha256(json.dumps(values, sort_keys=True).encode()).hexdigest()[:12]


def release() -> tuple[str, str, str]:
    """(version, scripts digest, code digest) of the code this process runs: `mtsched_build_info`'s labels."""
    from importlib.metadata import PackageNotFoundError, version

    from shared.store.ledger import scripts_digest

    try:
        v = version("mtsched")
    except PackageNotFoundError:  # run from a source tree without installing it
        v = "unknown"
    return v, scripts_digest(), code_digest()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mtsched", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    for name in ("extender", "webhook", "watcher", "node-agent", "check-config", "cards", "explain"):
        p = sub.add_parser(name)
        p.add_argument("--config", help="YAML config file (also MTSCHED_CONFIG)")
        p.add_argument("--set", action="append", metavar="KEY=VALUE",
                       help="override one setting, e.g. --set memoryPerCard=96,160 (repeatable)")
        p.add_argument("--log-format", choices=("json", "text"), default=os.environ.get("MTSCHED_LOG_FORMAT", "json"))
        if name == "check-config":
            p.add_argument("--role", choices=("extender", "webhook", "watcher", "node-agent"),
                           help="also check what stops this role from starting (its listen address and TLS)")
        if name in ("cards", "explain"):
            p.add_argument("--redis-url", help="defaults to the configured redisUrl")
        if name == "explain":
            p.add_argument("pod", help="NAMESPACE/NAME")
            p.add_argument("-o", "--output", choices=("text", "json"), default="text")
            p.add_argument("--kubeconfig", help="defaults to the configured kubeconfig, then $KUBECONFIG, "
                                                "then ~/.kube/config")
    demo = sub.add_parser("demo", help="quick start on a local control plane")
    demo.add_argument("--memory-per-card", default="96,160")
    demo.add_argument("--keep", action="store_true", help="keep everything running until Ctrl-C")
    args = parser.parse_args(argv)

    if args.cmd == "demo":
        from deploy.local.demo import run_demo

        return run_demo(args.memory_per_card, keep=args.keep)
    try:
        cfg = _config(args)
    except ConfigError as e:
        print(f"mtsched {args.cmd}: {e}", file=sys.stderr)
        return 2
    logs.setup(cfg.log_level, args.log_format, args.cmd)
    if args.cmd == "check-config":
        raw = asdict(cfg)
        raw["memory_per_card"] = [m.memory for m in cfg.models]
        # printed for humans and logs: passwords never
        raw["redis_url"] = redact_url(cfg.redis_url)
        if cfg.redis_password:
            raw["redis_password"] = "***"
        doc = {key_of(k): v for k, v in raw.items()}
        print(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode())
        from shared.serving.listen import start_problems

        # the roles check their listen address and TLS only as they start (one file serves every role, each
        # with its own overrides): said here for each serving role, and fatal for the one --role names
        for serving in ("extender", "webhook"):
            problems = start_problems(cfg, serving)
            if problems and serving == args.role:
                print(f"mtsched check-config: the {serving} would not start: " + "; ".join(problems),
                      file=sys.stderr)
                return 2
            if problems and not args.role:
                print(f"mtsched check-config: note: as the {serving} this configuration would not start: "
                      + "; ".join(problems), file=sys.stderr)
        return 0
    if args.cmd == "cards":
        from controller.cards import card_table
        from shared.store.ledger import Ledger, RedisOptions, connect

        try:
            options = RedisOptions.from_config(cfg)
        except ConfigError as e:
            print(f"mtsched cards: {e}", file=sys.stderr)
            return 2

        async def show() -> str:
            client = connect(args.redis_url or cfg.redis_url, options)
            try:
                return await card_table(Ledger(client, cfg.key_prefix), cfg.watchers_lost_after_seconds)
            finally:
                await client.aclose()

        try:
            print(asyncio.run(show()))
        except Exception as e:  # Redis refusing or hanging (its socket timeout): one line, as explain says it
            print(f"mtsched cards: {type(e).__name__}: {e}", file=sys.stderr)
            return 1
        return 0
    if args.cmd == "explain":
        return _explain(args, cfg)
    from shared.serving.listen import start_problems

    problems = start_problems(cfg, args.cmd)
    if problems:  # e.g. an extender on a public address without client authentication: refuse to start
        print(f"mtsched {args.cmd}: " + "; ".join(problems), file=sys.stderr)
        return 2
    from controller import roles
    from controller.node_agent import run_node_agent
    from shared.serving.metrics import BUILD, ROLE
    from webhook.runner import run_webhook

    role = {"extender": roles.run_extender, "webhook": run_webhook, "watcher": roles.run_watcher,
            "node-agent": run_node_agent}[args.cmd]
    ROLE.labels(args.cmd).set(1)  # lets dashboards and alerts tell the roles apart
    BUILD.labels(*release(), config_digest(cfg)).set(1)  # and the releases (configurations) a roll runs side by side
    try:
        return _run_role(role, cfg)
    except ConfigError as e:  # found on the way up, e.g. an unreadable redisPasswordFile
        print(f"mtsched {args.cmd}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
