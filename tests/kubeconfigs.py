"""Kubeconfig files for tests whose API server is a stand-in on loopback (or a port nobody listens on)."""

from __future__ import annotations

from pathlib import Path


def token_kubeconfig(path: Path, server: str, insecure: bool = False) -> Path:
    """A kubeconfig at `path` for `server` (a URL) with a bearer token; `insecure`: the server's certificate
    is not checked (a stand-in that a proxy only tunnels)."""
    skip = "insecure-skip-tls-verify: true, " if insecure else ""
    path.write_text(f"""apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{{skip}server: "{server}"}}}}]
users: [{{name: u, user: {{token: t}}}}]
contexts: [{{name: x, context: {{cluster: c, user: u}}}}]
current-context: x
""")
    return path
