"""deploy.local.stack.Stack for the benchmark: roles started through bench.timed_role (fine latency
histograms), optionally the extender over plain HTTP (the sidecar topology: kube-scheduler and one
extender in the same pod talking over loopback, as HAMi deploys it)."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass

from deploy.local.stack import Role, Stack


@dataclass
class BenchStack(Stack):
    extender_http: bool = False

    def _spawn(self, role: Role) -> None:
        log = open(role.log_path, "ab")  # noqa: SIM115 - the child writes it for its lifetime
        argv = self.role_argv(role, "bench.timed_role")  # each role with its chart identity
        if role.kind == "extender" and self.extender_http:
            # loopback plain HTTP: the sidecar topology, where no client certificate is asked for
            argv += ["--set", "tlsCertFile=", "--set", "tlsKeyFile=", "--set", "extenderClientCAFile="]
        role.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def _front(self, kind: str) -> str:
        if kind == "extender" and self.extender_http:
            replicas = [r for r in self.roles if r.kind == kind]
            if len(replicas) != 1:
                raise ValueError("--extender-http is the sidecar topology: one extender replica")
            return f"http://127.0.0.1:{replicas[0].port}"
        return super()._front(kind)
