"""The roles' garbage-collection policy (shared/serving/gc_policy.py): pauses are observed, and what lives
once a role is up is frozen out of later collections."""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import Iterator

import pytest
from prometheus_client import REGISTRY

from controller import cli
from shared.config import Config, load_config
from shared.serving import gc_policy
from tests._wait import eventually


def pauses(generation: int) -> float:
    return REGISTRY.get_sample_value("mtsched_gc_pause_seconds_count", {"generation": str(generation)}) or 0.0


@pytest.fixture
def thawed() -> Iterator[None]:
    yield
    gc.unfreeze()  # the rest of the test session collects as before


def test_every_collection_is_observed_once_by_generation() -> None:
    gc_policy.install()
    gc_policy.install()  # idempotent: one callback, so one sample per collection
    was = gc.isenabled()
    gc.disable()  # no automatic collection between the reads: only the two below are counted
    try:
        before = {g: pauses(g) for g in range(3)}
        gc.collect(0)
        gc.collect(2)
        after = {g: pauses(g) for g in range(3)}
    finally:
        if was:
            gc.enable()
    assert after == {0: before[0] + 1, 1: before[1], 2: before[2] + 1}
    assert gc.callbacks.count(gc_policy._on_gc) == 1


def test_settle_freezes_what_lives_and_leaves_garbage_collectable(thawed: None) -> None:
    class Node:
        def __init__(self) -> None:
            self.me = self  # a cycle: only the collector can free it

    kept = Node()
    frozen = gc_policy.settle()
    assert frozen == gc.get_freeze_count() > 0
    # what lived at settle() is out of the tracked generations: a full collection no longer walks it
    assert not any(o is kept for o in gc.get_objects())
    # garbage made afterwards is collected as before
    Node()
    assert gc.collect() >= 1
    del kept


async def test_state_that_grows_after_the_start_is_frozen_once_it_is_large(thawed: None) -> None:
    gc.collect()
    gc.freeze()  # what lives now is out of the count: only the state made below counts
    freezes = REGISTRY.get_sample_value("mtsched_gc_freezes_total") or 0.0
    task = asyncio.create_task(gc_policy.settle_when_grown(period=0.01, grown=5_000))
    try:
        await asyncio.sleep(0.05)
        assert (REGISTRY.get_sample_value("mtsched_gc_freezes_total") or 0.0) == freezes  # nothing grew yet
        grown = [[i] for i in range(10_000)]  # long-lived state that arrives later (a growing fleet)
        gc.collect()  # survived a full collection: it is in the oldest generation now
        assert len(gc.get_objects(generation=2)) > 5_000
        await eventually(lambda: (REGISTRY.get_sample_value("mtsched_gc_freezes_total") or 0.0) > freezes,
                         within=30, what="the grown state frozen")
        assert not any(o is grown[0] for o in gc.get_objects())  # frozen: no collection walks it
        assert len(gc.get_objects(generation=2)) < 5_000
    finally:
        task.cancel()


def test_the_settling_before_a_roles_loop_is_no_pause_of_the_role(thawed: None) -> None:
    """_run_role collects and freezes the imports before the role's event loop exists: that collection
    holds no request, and observed it would be the largest generation-2 pause after every restart (the
    runbook reads such a pause as state growing after start). Observed from then on, as before."""
    with contextlib.suppress(ValueError):
        gc.callbacks.remove(gc_policy._on_gc)  # as in a fresh process

    async def role(cfg: Config, stop: asyncio.Event) -> bool:
        return gc_policy._on_gc in gc.callbacks

    was = gc.isenabled()
    gc.disable()  # no automatic collection meanwhile: only _run_role's own is counted
    try:
        before = pauses(2)
        assert cli._run_role(role, load_config(env={}, flags={"memoryPerCard": "96,160"})) == 0
        after = pauses(2)
    finally:
        if was:
            gc.enable()
    assert gc.get_freeze_count() > 0 and after == before
