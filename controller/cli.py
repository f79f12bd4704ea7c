"""`mtsched`: one command for every role and tool.

  mtsched extender|webhook|watcher [--config FILE] [--set key=value ...]
  mtsched node-agent [--config FILE]        publish this node's /proc/sgpu_km card knobs (MTSCHED_NODE_NAME)
  mtsched cards [--redis-url URL]          the card table from Redis
  mtsched explain NAMESPACE/POD [-o json]  why a pod is Pending: per node and card, reason, holders, fix
  mtsched check-config [--config FILE] [--role ROLE]   validate a configuration and print it; with --role,
                                           also what would stop that role from starting with it (exit 2)
  mtsched demo                             the quick start (local control plane + sample pods)

A command that cannot run says why in one line on stderr, `mtsched <command>: ...`, naming the flag or setting, its
value and what to do: exit 2 when what it was given is wrong (a setting, a flag, a kubeconfig file, Redis credentials
refused), 1 when something it needs failed (Redis or the API server unreachable).
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
    from redis.asyncio import Redis

    from shared.domain.state import NodeSnapshot
    from shared.kube import Kube
    from shared.store.redis_conn import RedisOptions


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
    flags = _parse_sets(args.set or [])
    url = getattr(args, "redis_url", None)  # `cards` and `explain`: the redisUrl setting, as a flag of its own
    if not url:
        return load_config(path, flags=flags)
    try:  # checked by the configuration's own rules, as `--set redisUrl=` is
        return load_config(path, flags={**flags, "redisUrl": url})
    except ConfigError as e:
        try:  # the flag alone: a mistake elsewhere is said as it is, not blamed on the flag
            load_config(env={}, flags={"redisUrl": url})
        except ConfigError:
            raise ConfigError(f"--redis-url sets redisUrl; {e}") from e
        raise


class Refused(Exception):
    """What a one-shot command was given cannot work (a kubeconfig, Redis credentials): its one line, exit 2."""


def _redis_source(args: argparse.Namespace) -> str:
    return "--redis-url" if getattr(args, "redis_url", None) else "redisUrl"


async def _ledger_client(args: argparse.Namespace, cfg: Config, options: RedisOptions) -> Redis:
    """The client `cards` and `explain` read Redis with, after one PING: credentials Redis refuses (none given, a
    wrong password) are Refused at once, naming the URL and how to give the password (sending again cannot cure
    them; the roles, which serve for long, keep trying); any other failure is sent again as the reads are."""
    from shared.store.ledger import Ledger, connect
    from shared.store.redis_conn import credentials_refused, explain

    try:
        client = connect(cfg.redis_url, options)
    except ValueError as e:  # e.g. redis+sentinel:// without the service name
        raise Refused(f"{_redis_source(args)} {redact_url(cfg.redis_url)}: {e}") from e
    try:
        await Ledger(client, cfg.key_prefix).ping(give_up=credentials_refused)
    except Exception as e:
        await client.aclose()
        if credentials_refused(e):
            raise Refused(f"{_redis_source(args)} {redact_url(cfg.redis_url)}: {explain(e)}") from e
        raise
    return client


def _redis_denied(args: argparse.Namespace, cfg: Config, error: BaseException) -> str:
    """A one-shot command's read refused by the Redis user's ACL past its first PING (a command, key or channel the
    reads need, a script's too): said as a refused PING is, naming the URL and what to grant; "" for anything else."""
    from shared.store.redis_conn import acl_refused, explain

    if not acl_refused(error):
        return ""
    return f"{_redis_source(args)} {redact_url(cfg.redis_url)}: {explain(error)}"


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


def kubeconfig_source(given: str, setting: str, path: str, env: Mapping[str, str]) -> str:
    """Where explain_kubeconfig's `path` came from, as an error message names it."""
    if given:
        return "--kubeconfig"
    if setting:
        return "the kubeconfig setting"
    if not path:
        return "the pod's ServiceAccount"
    if path in env.get("KUBECONFIG", "").split(os.pathsep):
        return "$KUBECONFIG's"
    return "the default kubeconfig"


def kubeconfig_problem(path: str) -> str:
    """Why the file at `path` is no kubeconfig (missing, a directory, unreadable, not text, not a YAML mapping);
    "" when it may be one (kubernetes-asyncio's loader says the rest). `~` is the home directory, as for the
    loader; several files joined as in $KUBECONFIG, and a pipe (read here, the loader would find it empty), are left
    to the loader."""
    import yaml

    if os.pathsep in path:
        return ""
    file = Path(path).expanduser()
    try:
        if file.is_fifo():
            return ""  # a pipe (`--kubeconfig <(kubectl config view --raw)`): read once, by the loader
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        return "no such file"
    except IsADirectoryError:
        return "a directory, not a file"
    except OSError as e:
        return f"cannot be read ({e.strerror})"
    except UnicodeDecodeError:
        return "not a kubeconfig (not text)"
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        return f"not a kubeconfig (not YAML: {getattr(e, 'problem', None) or type(e).__name__}{where})"
    if not isinstance(doc, dict):
        return "not a kubeconfig (empty)" if doc is None else "not a kubeconfig (not a YAML mapping)"
    return ""


async def _kube(args: argparse.Namespace, cfg: Config) -> Kube:
    """The API client `explain` reads with; Refused naming the kubeconfig (where it came from, its path) when it
    cannot be read or loaded."""
    from shared.kube import Kube

    path = explain_kubeconfig(args.kubeconfig or cfg.kubeconfig, os.environ)
    where = f"{kubeconfig_source(args.kubeconfig, cfg.kubeconfig, path, os.environ)} {path}".rstrip()
    fix = "give --kubeconfig FILE (or set KUBECONFIG) naming a kubeconfig, as `kubectl config view --raw` prints one"
    problem = kubeconfig_problem(path) if path else ""
    if problem:
        raise Refused(f"{where}: {problem}; {fix}")
    try:
        return await Kube.create(path)
    except Exception as e:  # kubernetes-asyncio's loader: a key missing, a context it names but lacks, a bad cert
        text = " ".join(str(e).split())
        raise Refused(f"{where}: cannot be loaded ({type(e).__name__}: {text}); {fix}") from e


def _explain(args: argparse.Namespace, cfg: Config) -> int:
    """The pod from the API server (kubeconfig), the cards from Redis, as `mtsched cards` reads them."""
    from controller.explain import ExplainError, gather, render
    from shared.domain.upkeep import unkept_problem
    from shared.store.ledger import Ledger, RedisOptions

    try:
        options = RedisOptions.from_config(cfg)
    except ConfigError as e:
        print(f"mtsched explain: {e}", file=sys.stderr)
        return 2

    async def run() -> str:
        kube = await _kube(args, cfg)
        try:
            client = await _ledger_client(args, cfg, options)
        except BaseException:
            await kube.close()
            raise
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
    except Refused as e:
        print(f"mtsched explain: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # Redis or the API server unreachable: one line, not a traceback
        denied = _redis_denied(args, cfg, e)
        print(f"mtsched explain: {denied or f'{type(e).__name__}: {e}'}", file=sys.stderr)
        return 2 if denied else 1
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
    demo.add_argument("--keep", action="store_true", help="keep everything running until Ctrl-C, SIGTERM or SIGHUP")
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
        from shared.store.ledger import Ledger, RedisOptions

        try:
            options = RedisOptions.from_config(cfg)
        except ConfigError as e:
            print(f"mtsched cards: {e}", file=sys.stderr)
            return 2

        async def show() -> str:
            client = await _ledger_client(args, cfg, options)
            try:
                return await card_table(Ledger(client, cfg.key_prefix), cfg.watchers_lost_after_seconds)
            finally:
                await client.aclose()

        try:
            print(asyncio.run(show()))
        except Refused as e:
            print(f"mtsched cards: {e}", file=sys.stderr)
            return 2
        except Exception as e:  # Redis refusing or hanging (its socket timeout): one line, as explain says it
            denied = _redis_denied(args, cfg, e)
            print(f"mtsched cards: {denied or f'{type(e).__name__}: {e}'}", file=sys.stderr)
            return 2 if denied else 1
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
