"""Whether the certificate a role serves its API with can be served (pure).

The serving certificate is reloaded when its files change (shared/serving/tls.py): a renewal (cert-manager, a
Secret replaced) needs no restart. One that never comes, or whose files do not load (a key that is not the
certificate's, a half-written file), leaves the previous certificate in use; once that one is out of its validity
every caller refuses the handshake (the API server's webhook client, kube-scheduler's extender client over https:
"x509: certificate has expired or is not yet valid"), so the role cannot do its job and its readiness says so,
naming the certificate; it is ready again at the reload of a valid pair. A restart would not help: /healthz stays
`ok`."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

RELOAD_EVERY_SECONDS = 10.0  # the files' check (shared/serving/tls.py watch_certs)
# A certificate just issued (cert-manager dates it from its own clock, no earlier) is loaded within seconds: on a host
# whose clock is a little behind the issuer's it would look "not yet valid" to us although its callers, on the
# issuer's time, accept it; so much is allowed before it counts (its end counts at once: the callers refuse it then).
EARLY_ALLOWED_SECONDS = 300.0


def _when(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def cert_problem(path: str, not_before: float, not_after: float, now: float, reload_error: str = "") -> str:
    """Why the role cannot serve its API with the certificate it loaded from `path` ("" when it can): valid from
    `not_before` to `not_after` (Unix seconds, inclusive, as X.509 reads them), judged at `now` on this host's
    clock (a start less than EARLY_ALLOWED_SECONDS ahead counts as reached). `reload_error`: why the files' newer
    pair did not load ("": none failed since the last load)."""
    if not_before - EARLY_ALLOWED_SECONDS <= now <= not_after:
        return ""
    if now > not_after:
        what = f"expired at {_when(not_after)}"
    else:
        what = f"is not valid before {_when(not_before)} (this host's clock is behind, or the certificate early)"
    files = (f"; its files' newer pair does not load: {reload_error}" if reload_error else
             "; renew it (cert-manager, or the Secret's tls.crt and tls.key)")
    return (f"the serving certificate {path} {what}: callers refuse the handshake{files}; the role loads a valid "
            f"pair within {RELOAD_EVERY_SECONDS:g} s of its files changing (docs/runbooks.md, MtschedRoleNotReady)")


def client_ca_problem(setting: str, path: str, validities: Sequence[tuple[float, float]], now: float) -> str:
    """Why the role cannot take a call with the client CAs it loaded at its start from `path` (its `setting`,
    e.g. webhookClientCAFile) ("" when it can): each CA's (not_before, not_after), Unix seconds, judged at `now`.
    The handshake verifies every caller's chain up to one of these, each within its validity, so once none is
    (every one expired) every caller is refused. The file is read at the start only (docs/install.md): the cure is a
    valid CA in it and a restart. None read (`validities` empty): no verdict."""
    if not validities or any(nb - EARLY_ALLOWED_SECONDS <= now <= na for nb, na in validities):
        return ""
    last = max(na for _, na in validities)
    first = min(nb for nb, _ in validities)
    what = (f"every CA in {setting} {path} has expired (the last at {_when(last)})" if now > last else
            f"no CA in {setting} {path} is within its validity (the first from {_when(first)})")
    return (f"{what}: the TLS handshake refuses every caller's certificate; put a valid CA in it and restart the "
            "role (the file is read at its start; docs/install.md)")
