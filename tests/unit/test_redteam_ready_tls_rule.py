"""The serving certificate's readiness rule (shared/domain/serving_cert.py) and what CertReloader feeds it: the
validity of the pair it loaded, and why a newer pair did not load (tests/redis/test_redteam_ready_tls_expiry.py runs
the webhook role through an expiry and a renewal)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from deploy.local.pki import make_ca, make_serving_cert
from shared.config import load_config
from shared.domain.serving_cert import EARLY_ALLOWED_SECONDS, cert_problem, client_ca_problem
from shared.serving.listen import webhook_policy
from shared.serving.tls import CertReloader


def test_within_its_validity_the_certificate_is_no_problem() -> None:
    assert cert_problem("/t.crt", 100.0, 200.0, 150.0) == ""
    assert cert_problem("/t.crt", 100.0, 200.0, 200.0) == ""  # (its last second included, as X.509 reads it)


def test_past_its_end_the_role_cannot_serve_and_the_problem_names_the_file_and_the_time() -> None:
    why = cert_problem("/etc/mtsched/tls/tls.crt", 0.0, 1_800_000_000.0, 1_800_000_001.0)
    assert "/etc/mtsched/tls/tls.crt expired at 2027-01-15T08:00:00Z" in why
    assert "renew it" in why


def test_a_newer_pair_that_does_not_load_is_named() -> None:
    why = cert_problem("/t.crt", 0.0, 10.0, 11.0, reload_error="SSLError: KEY_VALUES_MISMATCH")
    assert "does not load: SSLError: KEY_VALUES_MISMATCH" in why


def test_a_start_a_little_ahead_of_this_hosts_clock_is_not_a_spurious_unready() -> None:
    # cert-manager's new certificate, loaded within seconds by a host whose clock is behind the issuer's
    assert cert_problem("/t.crt", 1000.0, 5000.0, 1000.0 - 30) == ""
    assert "not valid before" in cert_problem("/t.crt", 1000.0, 5000.0, 1000.0 - EARLY_ALLOWED_SECONDS - 1)


def test_the_reloader_reports_the_loaded_validity_and_a_renewal_that_failed(tmp_path: Path) -> None:
    ca = make_ca()
    first = make_serving_cert(ca, "w")
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert.write_bytes(first.cert_pem)
    key.write_bytes(first.key_pem)
    now = [0.0]
    reloader = CertReloader(str(cert), str(key), clock=lambda: now[0])
    assert reloader.not_before < reloader.not_after
    now[0] = reloader.not_after - 1
    assert reloader.problem() == ""
    other = make_serving_cert(ca, "w")
    cert.write_bytes(other.cert_pem)  # the key is the first pair's: the new pair cannot load
    os.utime(cert, (now[0], 1_900_000_000))
    try:
        reloader.maybe_reload()
        raise AssertionError("a mismatched pair loaded")
    except Exception as e:  # (watch_certs records it so)
        reloader.reload_error = f"{type(e).__name__}: {e}"
    assert reloader.problem() == ""  # the previous one still serves, and is valid
    now[0] = reloader.not_after + 1
    assert "expired at" in reloader.problem() and "does not load" in reloader.problem()
    key.write_bytes(other.key_pem)
    os.utime(key, (now[0], 1_900_000_001))
    assert reloader.maybe_reload()
    now[0] = reloader.not_after - 1
    assert reloader.problem() == "" and reloader.reload_error == ""


def test_client_cas_one_valid_ca_is_enough_and_none_read_is_no_verdict() -> None:
    cas = [(0.0, 100.0), (50.0, 500.0)]  # a bundle in its rotation: the old CA expired, the new one valid
    assert client_ca_problem("webhookClientCAFile", "/ca.crt", cas, 200.0) == ""
    assert client_ca_problem("webhookClientCAFile", "/ca.crt", [], 10**10) == ""
    why = client_ca_problem("webhookClientCAFile", "/ca.crt", cas, 501.0)
    assert why.startswith("every CA in webhookClientCAFile /ca.crt has expired (the last at 1970-01-01T00:08:20Z)")
    assert "restart the role" in why


def test_the_policy_reads_the_validity_of_its_client_ca_file(tmp_path: Path) -> None:
    ca = make_ca()
    (tmp_path / "ca.crt").write_bytes(ca.cert_pem + make_ca("another").cert_pem)
    now = [0.0]
    policy = webhook_policy(load_config(env={}, flags={"webhookClientCAFile": str(tmp_path / "ca.crt"),
                                                        "tlsCertFile": "/t.crt", "tlsKeyFile": "/t.key"}))
    check = policy.client_ca_check(clock=lambda: now[0])
    assert check is not None
    now[0] = time.time()
    assert check() == ""
    now[0] = time.time() + 2 * 365 * 86400
    assert "has expired" in check()
    assert webhook_policy(load_config(env={}, flags={})).client_ca_check() is None
