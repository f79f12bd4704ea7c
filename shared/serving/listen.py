"""Where a role's API listens and who may call it.

The extender books cards and creates Bindings with the scheduler's credentials, so only
kube-scheduler may call it: by default it listens on loopback (kube-scheduler runs in the same
pod), and on any other address it requires a client certificate signed by `extenderClientCAFile`
(mutual TLS), unless `extenderAllowUnauthenticated` says otherwise out loud. The webhook must be
reachable by the API server, so it keeps listening on all addresses; with `webhookClientCAFile`
it answers only a caller presenting a certificate of that CA (the API server's, given by its
AdmissionConfiguration), since a forged review makes it list a namespace's quotas and pods.

A CA often signs more than one client (a cluster CA signs every kubelet's), so `<role>ClientNames`
can narrow it to the certificates naming one of them (subject CN or a DNS SAN): refused with 403.

The checks are pure; `ListenPolicy.apply` is the one step with I/O (reading the client CA), run
by shared.serving.http.serve() when it opens the role's port.
"""

from __future__ import annotations

import ipaddress
import logging
import ssl
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from shared.config import Config, ConfigError
from shared.domain.serving_cert import client_ca_problem
from shared.serving.metrics import CLIENTS_REFUSED
from shared.serving.tls import pem_certificates

log = logging.getLogger("mtsched")

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


def cert_names(peercert: Mapping[str, Any] | None) -> list[str]:
    """The names a verified peer certificate (ssl's getpeercert() form) carries: its subject CN, then DNS SANs.

    A subject with several CNs names none of them: Kubernetes reads the last as the user (Go's x509), so a
    certificate approved for "CN=x, CN=system:node:n1" (a CA copying the request's subject) must not pass as x.
    """
    if not peercert:
        return []
    cns = [v for rdn in peercert.get("subject", ()) for k, v in rdn if k == "commonName"]
    return (cns if len(cns) == 1 else []) + [v for k, v in peercert.get("subjectAltName", ()) if k == "DNS"]


def name_allowed(peercert: Mapping[str, Any] | None, allowed: Iterable[str]) -> bool:
    return not set(cert_names(peercert)).isdisjoint(allowed)


@dataclass(frozen=True)
class ListenPolicy:
    role: str
    default: str
    client_ca: str = ""
    auth_off_loopback: bool = False  # a non-loopback address needs client authentication
    allow_unauthenticated: bool = False
    client_names: tuple[str, ...] = ()  # empty: any certificate client_ca signed
    # logged at start without client_ca ("{addr}": the address): what an unauthenticated caller can do
    unauthenticated_warning: str = ""

    @property
    def ca_key(self) -> str:
        return f"{self.role}ClientCAFile"

    def address(self, configured: str) -> str:
        return configured or self.default

    def problems(self, addr: str, tls: bool) -> list[str]:
        out = []
        if self.client_ca and not tls:
            out.append(f"{self.role}: {self.ca_key} is set but the API is not served over TLS; "
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
            try:
                context.load_verify_locations(cafile=self.client_ca)
            except (OSError, ssl.SSLError) as e:  # a role that cannot check its callers must not start
                raise ConfigError(f"{self.ca_key}: cannot read {self.client_ca!r} as PEM certificates: "
                                  f"{getattr(e, 'strerror', None) or e}") from e
            context.verify_mode = ssl.CERT_REQUIRED  # no certificate, or one the CA did not sign: no handshake
        elif self.unauthenticated_warning:
            log.warning("%s: %s is not set, so %s", self.role, self.ca_key,
                        self.unauthenticated_warning.format(addr=addr))
        return addr, context

    def client_ca_check(self, clock: Callable[[], float] = time.time) -> Callable[[], str] | None:
        """The readiness check of the client CAs (shared/domain/serving_cert.py client_ca_problem), read from the
        file as `apply` loaded it at the start, every certificate OpenSSL trusts from it (a "TRUSTED CERTIFICATE"
        too: shared/serving/tls.py pem_certificates); None without client_ca, or a file with a certificate
        cryptography cannot read (OpenSSL took it: no verdict rather than a spurious one)."""
        if not self.client_ca:
            return None
        try:
            with open(self.client_ca, "rb") as f:
                cas = pem_certificates(f.read())
        except (OSError, ValueError) as e:
            log.warning("%s: cannot read the validity of %s (%s): its expiry is not checked", self.role,
                        self.client_ca, e)
            return None
        validities = [(c.not_valid_before_utc.timestamp(), c.not_valid_after_utc.timestamp()) for c in cas]
        return lambda: client_ca_problem(self.ca_key, self.client_ca, validities, clock())

    def middleware(self) -> Middleware | None:
        """With client_names: 403 for a certificate of the CA that names none of them."""
        return client_name_middleware(self.role, self.client_names) if self.client_names else None


def client_name_middleware(role: str, client_names: Iterable[str]) -> Middleware:
    """403 (a Kubernetes Status) for a request whose verified client certificate names none of `client_names`
    (checked per request, ~5 µs: ssl re-reads the verified certificate; a connection's never changes)."""
    allowed = frozenset(client_names)
    logged: set[tuple[str, ...]] = set()

    @web.middleware
    async def client_name(request: web.Request, handler: Handler) -> web.StreamResponse:
        peer = request.transport.get_extra_info("peercert") if request.transport is not None else None
        if name_allowed(peer, allowed):
            return await handler(request)
        names = cert_names(peer)
        CLIENTS_REFUSED.labels(role).inc()
        if len(logged) < 64 and (key := tuple(names)) not in logged:  # once per caller, bounded
            logged.add(key)
            log.warning("%s: refused a client certificate naming %s (not in %sClientNames)", role,
                        names or "nothing", role)
        why = (f"{role}: the client certificate names {', '.join(names) or 'nothing'}; "
               f"{role}ClientNames allows {', '.join(sorted(allowed))}")
        # a Kubernetes Status: the API server shows its message in the pods it refuses (any other body it
        # reports as "failed to call webhook: unknown")
        body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": why,
                "reason": "Forbidden", "code": 403}
        return web.Response(body=orjson.dumps(body), status=403, content_type="application/json")

    return client_name


def extender_policy(cfg: Config) -> ListenPolicy:
    return ListenPolicy("extender", EXTENDER_LISTEN, cfg.extender_client_ca_file, auth_off_loopback=True,
                        allow_unauthenticated=cfg.extender_allow_unauthenticated,
                        client_names=cfg.extender_client_names)


def webhook_policy(cfg: Config) -> ListenPolicy:
    return ListenPolicy("webhook", WEBHOOK_LISTEN, cfg.webhook_client_ca_file, client_names=cfg.webhook_client_names,
                        unauthenticated_warning="anyone who reaches {addr} may send it reviews (it then lists that "
                        "namespace's quotas and pods); docs/install.md, \"The webhook's callers\"")


def start_problems(cfg: Config, role: str) -> list[str]:
    """What stops a role from starting with this configuration (checked before anything connects)."""
    policy = {"extender": extender_policy, "webhook": webhook_policy}.get(role)
    if policy is None:
        return []
    p = policy(cfg)
    return p.problems(p.address(cfg.listen), bool(cfg.tls_cert_file))


# serve() reads the role's policy from its application (set by the role's routes()).
LISTEN_POLICY = web.AppKey("mtsched_listen_policy", ListenPolicy)
