"""Red team, the load benchmark's ratio: a phase that did not place every pod it was given (timed out, or
creates refused) still printed a ratio from the pods it did bind, and the run exited 0.

`throughput_pods_s` is the bound pods over first create -> last bind; a phase that bound 20 of its 40 pods
before --timeout reports the rate of those 20 only. Plain phases are never checked for pending pods (only ours
run `check`), so a plain phase left half unschedulable showed nowhere in the summary, the table or the exit code:
the ratio compared ours placing every pod with plain placing some of them.
"""

from __future__ import annotations

from typing import Any

from bench.load.phase import Phase
from bench.load.report import summarize, table


def _phase(mode: str, pods_s: float, rep: int = 0, bound: int = 40, **res: Any) -> Phase:
    ph = Phase(mode, 20, 1, rep)
    ph.result = {"throughput_pods_s": pods_s, "pods": 40, "created": 40, "bound": bound, "timed_out": bound < 40,
                 "scheduling_cycle": {"mean_ms": 2.0}, "cpu_ms_per_pod": {"kube-scheduler": 1.0},
                 **({"correctness": {"overcommitted_cards_annotations": 0, "unannotated_bound": 0, "pending": 0}}
                    if mode == "ours" else {}), **res}
    return ph


def test_a_plain_phase_that_left_pods_unbound_gives_no_ratio_and_fails_the_run() -> None:
    rows = summarize([_phase("ours", 50.0), _phase("plain", 100.0, bound=20)], fine=True)
    r = rows[0]
    assert r["ratio"] is None and r["ratio_pairs"] == []  # plain placed other work than ours
    assert r["unbound_pods_plain"] == 20 and r["unbound_pods"] == 0
    from bench.load.cli import failed  # the exit code's rule (was inline in main)

    assert failed(rows)
    assert "unbound ours/plain" in table(rows, []) and "| 0/20 |" in table(rows, [])


def test_an_ours_phase_with_refused_creates_gives_no_ratio_and_fails_the_run() -> None:
    # the webhook refused 10 creates: 30 pods bound of 40, none pending (the refused ones never existed)
    ours = _phase("ours", 50.0, bound=30, created=30, rejected=10, timed_out=False)
    rows = summarize([ours, _phase("plain", 100.0)], fine=True)
    assert rows[0]["ratio"] is None and rows[0]["unbound_pods"] == 10
    from bench.load.cli import failed

    assert failed(rows)


def test_only_complete_pairs_are_ratios() -> None:
    phases = [_phase("ours", 60.0, 0), _phase("plain", 100.0, 0), _phase("plain", 80.0, 1, bound=39),
              _phase("ours", 40.0, 1)]
    r = summarize(phases, fine=True)[0]
    assert r["ratio_pairs"] == [0.6]  # round 1's plain left a pod: that pair is no ratio
    assert r["ratio"] is None


def test_complete_phases_still_give_their_ratio_and_pass() -> None:
    rows = summarize([_phase("ours", 60.0), _phase("plain", 100.0)], fine=True)
    assert (rows[0]["ratio"], rows[0]["unbound_pods"], rows[0]["unbound_pods_plain"]) == (0.6, 0, 0)
    from bench.load.cli import failed

    assert not failed(rows)


def test_a_bound_pod_whose_record_does_not_decode_is_counted() -> None:
    """`check` skipped a bound pod whose allocation record raised AnnotationError (`undecodable`): it was left out
    of the over-commit recomputed from annotations, was not `unannotated`, and the summary, the table and the
    exit code never mentioned it: a run with every record garbled read 0 over-committed, 0 unannotated."""
    garbled = {"overcommitted_cards_annotations": 0, "unannotated_bound": 0, "undecodable": 40, "pending": 0,
               "overcommitted_cards_ledger": 0, "ledger_annotation_mismatches": 40}
    rows = summarize([_phase("ours", 50.0, correctness=garbled, leaked_reservations=0), _phase("plain", 100.0)],
                     fine=True)
    assert rows[0]["undecodable_records"] == 40
    from bench.load.cli import failed

    assert failed(rows)
