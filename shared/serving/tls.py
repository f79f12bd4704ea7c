"""The serving certificate of every role's HTTPS API, reloaded when its files change (no restart)."""

from __future__ import annotations

import asyncio
import logging
import os
import ssl

# The logger names these lines had before they moved here (log queries may select on them).
log = logging.getLogger("mtsched.webhook")
loop_log = logging.getLogger("mtsched")


class CertReloader:
    """Serves the certificate from files and picks up renewed files without a restart."""

    def __init__(self, cert: str, key: str):
        self.cert, self.key = cert, key
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        # No TLS 1.3 session tickets: our callers (kube-scheduler's extender client, the API server's webhook
        # client) keep no session cache, so a ticket is never redeemed, yet OpenSSL makes two per full handshake
        # (each serializes and encrypts the session with the client's certificate): 14-18 % of a handshake's
        # CPU in bench/tls_micro.py. Nothing is weakened; a client that would resume makes a full handshake.
        self.context.num_tickets = 0
        self._stamp: tuple[float, float] = (0.0, 0.0)
        self.reloads = 0
        self.maybe_reload()

    def maybe_reload(self) -> bool:
        stamp = (os.stat(self.cert).st_mtime, os.stat(self.key).st_mtime)
        if stamp == self._stamp:
            return False
        self.context.load_cert_chain(self.cert, self.key)  # new handshakes use the new pair
        self._stamp = stamp
        self.reloads += 1
        log.info("loaded TLS certificate %s", self.cert)
        return True


async def watch_certs(reloader: CertReloader | None) -> None:
    """Check the files every 10 s; a pair that fails to load leaves the previous one in use."""
    while reloader is not None:
        await asyncio.sleep(10)
        try:
            reloader.maybe_reload()
        except (OSError, ssl.SSLError) as e:
            loop_log.error("TLS certificate reload failed, keeping the previous one: %s", e)
