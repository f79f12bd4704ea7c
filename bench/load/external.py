"""Any extender on the bench: an extender started outside the benchmark, timed on the same nodes and
pods as ours, and kube-scheduler's configuration for it (and percentageOfNodesToScore for every run).

The external extender's pods are created already admitted: the bench runs our pure
`shared.domain.admission.decide` on each pod and creates the patched pod, in a namespace the
webhook ignores, so that phase needs no webhook. kube-scheduler is restarted with only that
extender (managedResources as ours: it is called for pods asking for mthreads.com/vgpu, sgpu-memory or
sgpu-core).
"""

from __future__ import annotations

import argparse
import copy
import socket
import ssl
import time
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from shared.domain.patch import apply_patch

Json = dict[str, Any]


@dataclass(frozen=True)
class External:
    """The extender under test and how kube-scheduler reaches it (its `extenders[]` entry)."""

    url: str
    name: str = "external"
    ca_file: str = ""  # CA of its serving certificate (default: the local harness CA)
    client_cert_file: str = ""  # what kube-scheduler presents to it (mTLS)
    client_key_file: str = ""
    server_name: str = ""  # tlsConfig.serverName: the name checked in its certificate
    node_cache_capable: bool = True
    filter_verb: str = "filter"
    prioritize_verb: str = "prioritize"
    bind_verb: str = "bind"
    preempt_verb: str = "preempt"
    weight: int = 1
    pid: str = ""  # its process id, or a file holding it (read when its phases start), for CPU time and RSS
    wait_seconds: float = 300.0  # how long to wait for it to answer before its phases

    def process_id(self) -> int:
        """Its pid (0: not measured): --external-pid as a number, or read from that file now."""
        text = self.pid.strip()
        if not text:
            return 0
        if not text.isdigit():
            text = Path(text).read_text().strip()
        return int(text)

    def spec(self) -> Any:
        from deploy.local.scheduler_config import ExtenderSpec

        def read(path: str) -> bytes | None:
            return Path(path).read_bytes() if path else None

        return ExtenderSpec(self.url.rstrip("/"), ca_pem=read(self.ca_file),
                            filter_verb=self.filter_verb or None, prioritize_verb=self.prioritize_verb or None,
                            bind_verb=self.bind_verb or None, preempt_verb=self.preempt_verb or None,
                            weight=self.weight, node_cache_capable=self.node_cache_capable,
                            client_cert_pem=read(self.client_cert_file), client_key_pem=read(self.client_key_file))


def add_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("an extender started outside the benchmark (local mode)")
    g.add_argument("--external-extender", metavar="URL", default="",
                   help="also time this extender (urlPrefix, http:// or https://) on the same nodes and pods")
    g.add_argument("--external-name", default="external", help="its name in the results (default external)")
    g.add_argument("--external-ca", default="", metavar="FILE", help="CA of its serving certificate (PEM; "
                   "default: the local harness CA)")
    g.add_argument("--external-client-cert", default="", metavar="FILE",
                   help="client certificate kube-scheduler presents to it (PEM, with --external-client-key)")
    g.add_argument("--external-client-key", default="", metavar="FILE")
    g.add_argument("--external-server-name", default="", help="name checked in its certificate (tlsConfig.serverName)")
    g.add_argument("--external-node-cache-capable", choices=("true", "false"), default="true",
                   help="nodeCacheCapable: true sends node names, false whole Node objects (default true)")
    for verb in ("filter", "prioritize", "bind", "preempt"):
        g.add_argument(f"--external-{verb}-verb", default=verb, metavar="PATH",
                       help=f"its {verb} verb (path under the URL; '' to leave it out; default {verb})")
    g.add_argument("--external-weight", type=int, default=1, help="its prioritize weight (default 1)")
    g.add_argument("--external-pid", default="", metavar="PID|FILE",
                   help="its process id, or a file holding it (read when its phases start), for CPU time and RSS")
    g.add_argument("--external-wait", type=float, default=300.0,
                   help="seconds to wait for it to answer before its phases (default 300)")
    g.add_argument("--publish-kubeconfig", default="", metavar="PATH",
                   help="write the local control plane's admin kubeconfig here as soon as it is up, so the "
                        "external extender (and its own watchers) can be started against the same cluster")


def from_args(args: argparse.Namespace) -> External | None:
    if not args.external_extender:
        return None
    if bool(args.external_client_cert) != bool(args.external_client_key):
        raise SystemExit("--external-client-cert and --external-client-key go together")
    scheme = urlsplit(args.external_extender).scheme
    if scheme not in ("http", "https"):
        raise SystemExit(f"--external-extender: got {args.external_extender!r}; allowed: an http:// or https:// URL")
    if args.kubeconfig:
        raise SystemExit("--external-extender needs the local control plane (kube-scheduler is configured to "
                         "call it): leave out --kubeconfig")
    return External(args.external_extender, args.external_name, args.external_ca, args.external_client_cert,
                    args.external_client_key, args.external_server_name, args.external_node_cache_capable == "true",
                    args.external_filter_verb, args.external_prioritize_verb, args.external_bind_verb,
                    args.external_preempt_verb, args.external_weight, args.external_pid, args.external_wait)


def tune_scheduler_config(cfg: Json, percentage: int, server_name: str = "") -> Json:
    """kube-scheduler's configuration with percentageOfNodesToScore (0: kube-scheduler's own adaptive
    default) globally and in every profile, and tlsConfig.serverName on the extender."""
    out = copy.deepcopy(cfg)
    if not 0 <= percentage <= 100:
        raise ValueError(f"percentageOfNodesToScore: got {percentage}; allowed: 0 (default) to 100")
    if percentage:
        out["percentageOfNodesToScore"] = percentage
        for prof in out.get("profiles") or []:
            prof["percentageOfNodesToScore"] = percentage
    else:
        out.pop("percentageOfNodesToScore", None)
        for prof in out.get("profiles") or []:
            prof.pop("percentageOfNodesToScore", None)
    if server_name:
        for ext in out.get("extenders") or []:
            if "tlsConfig" in ext:
                ext["tlsConfig"]["serverName"] = server_name
    return out


def admit(pod: Json, cfg: Any, reported: Collection[int]) -> Json:
    """The pod as our webhook would admit it (decide + its patch); an error if it would be denied."""
    from shared.domain.admission import decide

    d = decide(pod, cfg, reported)
    if not d.allowed:
        raise ValueError(f"{pod['metadata']['name']}: the webhook would deny it: {d.message}")
    return apply_patch(pod, d.patch)


def answers(url: str, ctx: ssl.SSLContext | None, timeout: float = 2.0) -> bool:
    """Something accepts a connection (and a TLS handshake, for https) at the URL's host and port."""
    u = urlsplit(url)
    port = u.port or (443 if u.scheme == "https" else 80)
    try:
        with socket.create_connection((u.hostname or "127.0.0.1", port), timeout=timeout) as s:
            if u.scheme == "https" and ctx is not None:
                with ctx.wrap_socket(s, server_hostname=u.hostname):
                    pass
        return True
    except (OSError, ssl.SSLError):
        return False


def wait_until_answers(ext: External, default_ca: Path, say: Any) -> bool:
    ctx: ssl.SSLContext | None = None
    if ext.url.startswith("https://"):
        ctx = ssl.create_default_context(cafile=ext.ca_file or str(default_ca))
        ctx.check_hostname = False  # kube-scheduler checks the name (tlsConfig.serverName); here: alive
        if ext.client_cert_file:
            ctx.load_cert_chain(ext.client_cert_file, ext.client_key_file)
    deadline = time.monotonic() + ext.wait_seconds
    said = False
    while True:
        if answers(ext.url, ctx):
            return True
        if time.monotonic() > deadline:
            return False
        if not said:
            say(f"waiting up to {ext.wait_seconds:g}s for {ext.name} at {ext.url}")
            said = True
        time.sleep(1.0)
