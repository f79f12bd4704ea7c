"""Where a role's API listens and who may call it.

The extender books cards and creates Bindings with the scheduler's credentials, so only
kube-scheduler may call it: by default it listens on loopback (kube-scheduler runs in the same
pod), and on any other address it requires a client certificate signed by `extenderClientCAFile`
(mutual TLS), unless `extenderAllowUnauthenticated` says otherwise out loud. The webhook must be
reachable by the API server, so it keeps listening on all addresses.

The checks are pure; `ListenPolicy.apply` is the one step with I/O (reading the client CA), run
by shared.serving.http.serve() when it opens the role's port.
"""

from __future__ import annotations

import ipaddress
import ssl
from dataclasses import dataclass

from aiohttp import web

from shared.config import Config, ConfigError

EXTENDER_LISTEN = "127.0.0.1:8443"
WEBHOOK_LISTEN = "0.0.0.0:8443"


def host_of(addr: str) -> str:
    host = addr.rpartition(":")[0]
    return host.strip("[]") or "0.0.0.0"


def is_loopback(host: str) -> bool:
    """Only IP literals count ("localhost" resolves through files we do not control)."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class ListenPolicy:
    role: str
    default: str
    client_ca: str = ""
    auth_off_loopback: bool = False  # a non-loopback address needs client authentication
    allow_unauthenticated: bool = False

    def address(self, configured: str) -> str:
        return configured or self.default

    def problems(self, addr: str, tls: bool) -> list[str]:
        out = []
        if self.client_ca and not tls:
            out.append(f"{self.role}: extenderClientCAFile is set but the API is not served over TLS; "
                       "set tlsCertFile and tlsKeyFile")
        if (self.auth_off_loopback and not is_loopback(host_of(addr)) and not self.client_ca
                and not self.allow_unauthenticated):
            out.append(f"{self.role}: listen {addr!r} is not a loopback address, and anyone who reaches it could "
                       "book cards and bind pods; set extenderClientCAFile (mutual TLS with kube-scheduler's "
                       "client certificate), or listen on 127.0.0.1, or set extenderAllowUnauthenticated: true")
        return out

    def apply(self, configured: str, context: ssl.SSLContext | None) -> tuple[str, ssl.SSLContext | None]:
        """The address to open and the TLS context to serve with; ConfigError when it must not start."""
        addr = self.address(configured)
        problems = self.problems(addr, context is not None)
        if problems:
            raise ConfigError("; ".join(problems))
        if self.client_ca and context is not None:
            context.load_verify_locations(cafile=self.client_ca)
            context.verify_mode = ssl.CERT_REQUIRED  # no certificate, or one the CA did not sign: no handshake
        return addr, context


def extender_policy(cfg: Config) -> ListenPolicy:
    return ListenPolicy("extender", EXTENDER_LISTEN, cfg.extender_client_ca_file, auth_off_loopback=True,
                        allow_unauthenticated=cfg.extender_allow_unauthenticated)


def webhook_policy(cfg: Config) -> ListenPolicy:
    return ListenPolicy("webhook", WEBHOOK_LISTEN)


def start_problems(cfg: Config, role: str) -> list[str]:
    """What stops a role from starting with this configuration (checked before anything connects)."""
    policy = {"extender": extender_policy, "webhook": webhook_policy}.get(role)
    if policy is None:
        return []
    p = policy(cfg)
    return p.problems(p.address(cfg.listen), bool(cfg.tls_cert_file))


# serve() reads the role's policy from its application (set by the role's routes()).
LISTEN_POLICY = web.AppKey("mtsched_listen_policy", ListenPolicy)
