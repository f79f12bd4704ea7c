"""The serving certificate of every role's HTTPS API, reloaded when its files change (no restart)."""

from __future__ import annotations

import asyncio
import base64
import logging
import math
import os
import re
import ssl
import time
from collections.abc import Callable

from cryptography import x509

from shared.domain.serving_cert import RELOAD_EVERY_SECONDS, cert_problem

# The logger names these lines had before they moved here (log queries may select on them).
log = logging.getLogger("mtsched.webhook")
loop_log = logging.getLogger("mtsched")

# The PEM blocks OpenSSL reads as certificates, as the served one (the chain file's first) and as CAs: besides
# cryptography's two labels, "TRUSTED CERTIFICATE" (`openssl x509 -trustout`, OpenSSL's own trust stores), its DER
# the certificate's followed by OpenSSL's trust settings, if any.
_PEM_CERTIFICATE = re.compile(rb"-----BEGIN (CERTIFICATE|X509 CERTIFICATE|TRUSTED CERTIFICATE)-----\r?\n"
                              rb"(.*?)-----END \1-----", re.DOTALL)


def pem_certificates(pem: bytes) -> list[x509.Certificate]:
    """The certificates of a PEM file in the order OpenSSL reads them (the first: the one a chain file serves);
    ValueError for one cryptography cannot read, rather than a judgement on some of them only."""
    out = []
    for m in _PEM_CERTIFICATE.finditer(pem):
        der = base64.b64decode(m.group(2))
        if len(der) > 2:  # the certificate's own length (DER): what follows it is OpenSSL's trust settings
            n = der[1] & 0x7F if der[1] & 0x80 else 0
            der = der[:2 + n + (int.from_bytes(der[2:2 + n], "big") if n else der[1])]
        out.append(x509.load_der_x509_certificate(der))
    return out


class CertReloader:
    """Serves the certificate from files and picks up renewed files without a restart."""

    def __init__(self, cert: str, key: str, clock: Callable[[], float] = time.time):
        self.cert, self.key = cert, key
        self._clock = clock
        self.not_before, self.not_after = 0.0, 0.0  # the loaded certificate's validity (Unix seconds)
        self.reload_error = ""  # why the files' newer pair did not load ("" once one did)
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        # No TLS 1.3 session tickets: our callers (kube-scheduler's extender client, the API server's webhook
        # client) keep no session cache, so a ticket is never redeemed, yet OpenSSL makes two per full handshake
        # (each serializes and encrypts the session with the client's certificate): 14-18 % of a handshake's
        # CPU in bench/tls_micro.py. Nothing is weakened; a client that would resume makes a full handshake.
        self.context.num_tickets = 0
        self._stamp: tuple[tuple[int, int, int], ...] = ()
        self.reloads = 0
        self.maybe_reload()

    def maybe_reload(self) -> bool:
        # the change time too: a renewal copied with its times kept (`cp -p`, `rsync -a`) leaves the mtime as it was
        stamp = tuple((s.st_mtime_ns, s.st_ctime_ns, s.st_ino) for s in map(os.stat, (self.cert, self.key)))
        if stamp == self._stamp:
            return False
        with open(self.cert, "rb") as f:
            pem = f.read()
        leaf: x509.Certificate | None = None
        unread = ""
        try:
            leaf = pem_certificates(pem)[0]  # (the first of the file's chain: the one served)
        except (ValueError, IndexError) as e:  # OpenSSL may serve it still: its validity unknown, no verdict
            unread = f"{type(e).__name__}: {e}"
        self.context.load_cert_chain(self.cert, self.key)  # new handshakes use the new pair
        self._stamp = stamp
        self.not_before, self.not_after = -math.inf, math.inf
        if leaf is not None:
            self.not_before = leaf.not_valid_before_utc.timestamp()
            self.not_after = leaf.not_valid_after_utc.timestamp()
        self.reload_error = ""
        self.reloads += 1
        if leaf is None:
            log.warning("loaded TLS certificate %s, but cannot read its validity (%s): its expiry is not checked",
                        self.cert, unread)
        else:
            log.info("loaded TLS certificate %s (valid until %s)", self.cert, leaf.not_valid_after_utc.isoformat())
        return True

    def problem(self) -> str:
        """The role's readiness check: "" while the certificate it serves is within its validity
        (shared/domain/serving_cert.py)."""
        return cert_problem(self.cert, self.not_before, self.not_after, self._clock(), self.reload_error)


async def watch_certs(reloader: CertReloader | None) -> None:
    """Check the files every RELOAD_EVERY_SECONDS; a pair that fails to load leaves the previous one in use (and
    its error in `reload_error`, which the readiness check names once that one is out of its validity)."""
    while reloader is not None:
        await asyncio.sleep(RELOAD_EVERY_SECONDS)
        try:
            reloader.maybe_reload()
        except (OSError, ssl.SSLError, ValueError) as e:  # (ValueError: cryptography's, a file that is no PEM)
            reloader.reload_error = f"{type(e).__name__}: {e}"[:300]
            loop_log.error("TLS certificate reload failed, keeping the previous one: %s", e)
