"""Red team: one failure of a TLS port's accept loop closes the port for good, silently.

b6ed404 makes every TLS port (the webhook's always, the extender's with HTTPS or mutual TLS) accept its
connections itself: `shared/serving/http.py` `_TLSSite._accept`, one task, started by `start()` and held only in
`self._accepting`. Its loop survives an OSError (logged, retried 0.1 s later) but nothing else: any other
exception out of `loop.sock_accept`, `self.open()`, `loop.create_task` (a MemoryError, a RuntimeError from the
loop, a bug in the count) ends the task. The listening socket stays open, so the kernel keeps completing TCP
handshakes into its backlog; nobody accepts them: every caller (the API server calling the webhook,
kube-scheduler the extender) connects and then hangs until its own timeout, for as long as the process lives.
The task is not under the role's Supervisor, `/readyz` does not look at it, and the exception is reported only as
"Task exception was never retrieved" whenever the task happens to be collected. On aiohttp's own TCPSite (what
the port was before, and what plain-HTTP ports still are) accepting is the event loop's and no application
exception can stop it.

Expected: the accept loop outlives any exception of one accept (log it and go on, as for OSError), or its end
is the role's end (supervised / readiness fails), never an open port that accepts nothing.
Fix: shared/serving/http.py `_TLSSite._accept` (catch Exception around one iteration; or a done-callback that
restarts the task / fails the role).

Reproduce: cd /work/main && python3 -m pytest -q -p no:cacheprovider tests/unit/test_redteam_r3_tls_accept_loop.py
"""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path
from typing import Any

from shared.serving.http import serve
from tests.unit._servers import webhook_app
from tests.unit.test_serving_limits import _tls_contexts, on_both_loops

WAIT = 3.0


async def _served(port: int, client_ctx: ssl.SSLContext) -> bytes | str:
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection("127.0.0.1", port, ssl=client_ctx, server_hostname="x"), WAIT)
    except (TimeoutError, OSError) as e:
        return f"no TLS handshake within {WAIT:g} s ({type(e).__name__})"
    try:
        writer.write(b"GET /nothing HTTP/1.1\r\nHost: x\r\n\r\n")
        return await asyncio.wait_for(reader.read(12), WAIT)
    except (TimeoutError, OSError) as e:
        return f"no answer within {WAIT:g} s ({type(e).__name__})"
    finally:
        writer.close()


async def _scenario(server_ctx: ssl.SSLContext, client_ctx: ssl.SSLContext) -> None:
    loop: Any = asyncio.get_running_loop()
    real = loop.sock_accept
    failed: list[int] = []

    async def sock_accept_failing_once(sock: Any) -> Any:
        if not failed:
            failed.append(1)
            raise RuntimeError("injected: one accept fails with an exception that is no OSError")
        return await real(sock)

    loop.sock_accept = sock_accept_failing_once  # the instance's, for this loop only
    try:
        runner = await serve(webhook_app(), "127.0.0.1:0", server_ctx)
        port = runner.addresses[0][1]
        try:
            first = await _served(port, client_ctx)  # meets the one failure
            later = [await _served(port, client_ctx) for _ in range(2)]
        finally:
            await runner.cleanup()
    finally:
        del loop.sock_accept
    assert failed, "the injected failure was never reached"
    name = type(loop).__module__
    assert all(isinstance(a, bytes) and a.startswith(b"HTTP/1.1 ") for a in later), (
        f"{name}: after one accept failed with a non-OSError, the TLS port still listens but serves nobody: "
        f"first caller {first!r}, the next two {later!r}")


async def test_redteam_a_tls_port_keeps_accepting_after_one_accept_fails(tmp_path: Path) -> None:
    server_ctx, client_ctx = _tls_contexts(tmp_path)
    await on_both_loops(lambda: _scenario(server_ctx, client_ctx))
