"""Red team, `python -m bench.ledger_bench`: the pods/s of several client processes was the sum of each
client's own rate (its pods over its own timed fill). In place mode the clients fill the cluster in rounds that
start at a barrier; a round lasts until the slowest client is done, so a client that finished early counted
at a rate the ledger as a whole never reached in that time: two clients placing 100 pods each, one in 1 s and
one in 2 s, made "150 pods/s" of a ledger that placed 200 pods in 2 s."""

from __future__ import annotations

from typing import Any


def _out(count: int, rounds: list[float]) -> dict[str, Any]:
    return {"count": count, "elapsed": sum(rounds), "round_elapsed": rounds}


def test_several_clients_rate_over_the_time_they_took_together() -> None:
    from bench.ledger_bench import aggregate_rate  # was: sum(count / elapsed) inline in run_clients

    assert aggregate_rate([_out(100, [1.0]), _out(100, [2.0])]) == 100.0
    # two rounds: the slowest of each round (2 + 1 s) for 300 pods
    assert aggregate_rate([_out(150, [2.0, 0.5]), _out(150, [1.0, 1.0])]) == 100.0


def test_one_client_is_its_own_rate() -> None:
    from bench.ledger_bench import aggregate_rate

    assert aggregate_rate([_out(500, [2.0, 3.0])]) == 100.0
    assert aggregate_rate([{"count": 500, "elapsed": 5.0}]) == 100.0  # cycle mode: one measured window
    assert aggregate_rate([_out(0, [0.0])]) == 0.0
