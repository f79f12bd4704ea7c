"""CLI for the local control plane.

python -m deploy.local build          # build etcd, kube-apiserver, kube-scheduler once (progress on stderr)
python -m deploy.local up [options]   # start etcd + apiserver + scheduler, print the kubeconfig, wait
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from pathlib import Path

from deploy.local.controlplane import (
    BuildError,
    ControlPlane,
    ControlPlaneError,
    ExtenderSpec,
    ensure_binaries,
)


def _build(_: argparse.Namespace) -> int:
    t0 = time.monotonic()
    try:
        bin_dir = ensure_binaries(progress=sys.stderr)
    except BuildError as e:
        print(f"build failed: {e}", file=sys.stderr)
        return 1
    print(f"binaries ready in {time.monotonic() - t0:.0f}s", file=sys.stderr)
    print(bin_dir)
    return 0


def _up(args: argparse.Namespace) -> int:
    stop = threading.Event()
    # Handlers first, so a Ctrl-C during start-up still stops what was started.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        bin_dir = ensure_binaries(progress=sys.stderr)
    except BuildError as e:
        print(f"build failed: {e}", file=sys.stderr)
        return 1
    cp = ControlPlane(bin_dir, args.workdir, watch_cache=not args.no_watch_cache, keep_workdir=args.keep)
    t0 = time.monotonic()
    try:
        cp.start()
        if not args.no_scheduler:
            extender = None
            if args.extender_url:
                ca = Path(args.extender_ca).read_bytes() if args.extender_ca else None
                extender = ExtenderSpec(args.extender_url.rstrip("/"), ca_pem=ca)
            cp.start_scheduler(extender, scheduler_name=args.scheduler_name)
        if args.mutating_url or args.validating_url:
            cp.register_webhooks(args.mutating_url, args.validating_url)
    except ControlPlaneError as e:
        print(f"control plane failed: {e}", file=sys.stderr)
        cp.stop()
        return 1
    print(
        f"control plane up in {time.monotonic() - t0:.1f}s\n"
        f"  server:      {cp.server_url}\n"
        f"  kubeconfig:  {cp.kubeconfig_path}\n"
        f"  serving TLS: {cp.pki.serving_crt} {cp.pki.serving_key} (SANs 127.0.0.1, localhost)\n"
        f"  CA:          {cp.pki.ca_crt}\n"
        f"  logs:        {cp.workdir}/*.log\n"
        f"export KUBECONFIG={cp.kubeconfig_path}\n"
        "Ctrl-C stops everything.",
        flush=True,
    )
    try:
        while not stop.wait(1.0):
            for name, log in cp.exited_components().items():
                print(f"{name} exited; see {log}", file=sys.stderr)
                stop.set()
    finally:
        cp.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m deploy.local",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("build", help="build the control-plane binaries (once; cached)").set_defaults(func=_build)
    up = sub.add_parser("up", help="run a local control plane until Ctrl-C or SIGTERM")
    up.add_argument(
        "--workdir", help="directory for certs, kubeconfig, etcd data and logs (default: a tempdir)"
    )
    up.add_argument("--keep", action="store_true", help="keep the temporary workdir on exit")
    up.add_argument("--no-scheduler", action="store_true", help="do not start kube-scheduler")
    up.add_argument("--scheduler-name", default="hami-scheduler", help="extra scheduler profile name")
    up.add_argument("--extender-url", help="extender urlPrefix, e.g. https://127.0.0.1:8443")
    up.add_argument("--extender-ca", help="PEM CA of the extender's cert (default: the harness CA)")
    up.add_argument("--mutating-url", help="register a pod mutating webhook at this https URL")
    up.add_argument("--validating-url", help="register a pod validating webhook at this https URL")
    up.add_argument("--no-watch-cache", action="store_true", help="apiserver --watch-cache=false")
    up.set_defaults(func=_up)
    args = parser.parse_args(argv)
    rc: int = args.func(args)
    return rc


if __name__ == "__main__":
    sys.exit(main())
