"""Red team, the load benchmark's correctness counters: a counter nobody checked read 0, as if checked.

- With --kubeconfig and no --redis-url there is no ledger: over-commit in the ledger, ledger/annotation
  mismatches and leaked reservations were never looked at, yet the summary said 0 and the table "0+0" and "0".
- kube-scheduler's scheduling attempts that erred are read from its /metrics; without that scrape (always with
  --kubeconfig, docs/benchmarks.md "On a kind cluster"; locally when a scrape fails) the phase recorded `{}`
  and the summary 0 errors.
- A role whose /metrics could not be read was kept as an empty scrape, and a phase's window subtracted an empty
  "before" from a full "after": the role's counters since it started (earlier phases and warm-ups included)
  read as this phase's latency and round trips.
"""

from __future__ import annotations

import socket
from typing import Any

from bench.load.cluster import Target
from bench.load.metrics import scrape_all
from bench.load.phase import Phase
from bench.load.report import summarize, table


def _ours(**res: Any) -> Phase:
    ph = Phase("ours", 20, "installed", 0)
    ph.result = {"throughput_pods_s": 50.0, "pods": 40, "created": 40, "bound": 40, "timed_out": False,
                 "cpu_ms_per_pod": {}, **res}
    return ph


# what `check` returns without a ledger: the annotation-side counts only
NO_LEDGER = {"overcommitted_cards_annotations": 0, "unannotated_bound": 0, "undecodable": 0, "pending": 0}


def test_without_a_ledger_its_counters_are_unchecked_not_zero() -> None:
    r = summarize([_ours(correctness=NO_LEDGER)], fine=False)[0]  # no ledger, kube-scheduler not scraped
    assert r["overcommitted_cards_ledger"] is None
    assert r["ledger_annotation_mismatches"] is None
    assert r["leaked_reservations"] is None
    assert r["overcommitted_cards_annotations"] == 0 and r["unannotated_bound"] == 0  # these were checked
    text = table([r], [])
    assert "| -+0 |" in text  # overcommit: ledger unchecked, annotations 0


def test_attempts_not_scraped_are_unchecked_not_zero() -> None:
    r = summarize([_ours(correctness=NO_LEDGER)], fine=False)[0]  # no ledger, kube-scheduler not scraped
    assert r["schedule_attempts_error"] is None
    assert r["schedule_attempts_error_plain"] is None  # no plain phase either


def test_checked_counters_still_add_up() -> None:
    full = {**NO_LEDGER, "overcommitted_cards_ledger": 1, "ledger_annotation_mismatches": 0}
    r = summarize([_ours(correctness=full, leaked_reservations=2, schedule_attempts={"error": 3}),
                   _ours(correctness=full, leaked_reservations=0, schedule_attempts={"scheduled": 40})],
                  fine=True)[0]
    assert (r["overcommitted_cards_ledger"], r["leaked_reservations"], r["schedule_attempts_error"]) == (2, 2, 3)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_role_whose_scrape_failed_is_left_out_not_empty() -> None:
    url = f"http://127.0.0.1:{_closed_port()}/metrics"
    got = scrape_all(Target("unused", {"extender": [url]}))
    assert "extender" not in got


def test_a_window_holds_only_what_was_scraped_at_both_ends() -> None:
    from bench.load.metrics import window  # the phase's subtraction (was inline in run_phase)

    k = ("mtsched_bench_seconds_count", (("verb", "filter"),))
    after = {"extender": {k: 900.0}, "kube-scheduler": {k: 5.0}}
    before = {"kube-scheduler": {k: 2.0}}  # the extender's scrape failed before the phase
    assert window(after, before) == {"kube-scheduler": {k: 3.0}}


def test_figures_not_measured_print_as_not_measured() -> None:
    """With --kubeconfig there is no CPU accounting and no kube-scheduler scrape: the phases record no CPU and
    no scheduling cycle, and the table printed "0.0/0.0" for both, kube-scheduler's time and CPU per pod."""
    ours = _ours(correctness=NO_LEDGER, cpu_ms_per_pod={}, scheduling_cycle={})
    plain = Phase("plain", 20, "installed", 0)
    plain.result = {"throughput_pods_s": 80.0, "pods": 40, "created": 40, "bound": 40, "cpu_ms_per_pod": {},
                    "scheduling_cycle": {}}
    r = summarize([ours, plain], fine=False)[0]
    assert r["scheduler_algorithm_ms_ours"] is None and r["scheduler_algorithm_ms_plain"] is None
    assert r["filter_nodes_mean"] is None
    row = next(line for line in table([r], []).splitlines() if line.startswith("20 | installed"))
    assert "| -/- | -/- |" in row  # sched algo ms ours/plain, CPU ms/pod ours/plain
