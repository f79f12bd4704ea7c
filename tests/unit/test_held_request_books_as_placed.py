"""held_request (what a placed pod holds, its card pin unread) books on a card exactly what pod_request (the pin read,
as placement reads it) books there, on every model of a mixed S4000/S5000 fleet: the pin chooses the card, never the
amount (whole cards at the card's own capacity, slices at their sgpu-memory). A pin changed after the bind therefore
cannot make the watchers book less than the pod holds (red team of today's held_request)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from shared.domain.request import PIN_ANNOTATION, RequestError, held_request, pod_request
from tests.unit._k8s import MEM, S4000, S5000, VGPU, cfg, ctr, pod, slice_ctr

CFG = cfg((S4000, S5000))

PODS: dict[str, dict[str, Any]] = {
    "slice": pod(slice_ctr(memory=32, cores=8)),
    "slice default cores": pod(slice_ctr(memory=8, cores=None)),
    "two slices": pod(slice_ctr("a", 16, 4), slice_ctr("b", 24, 4)),
    "init + app": pod(slice_ctr("app", 16, 4), init=[slice_ctr("i", 48, 8)]),
    "exclusive": pod(ctr(limits={VGPU: 1})),
    "multi": pod(ctr(limits={VGPU: 2})),
    "multi S4000 memory": pod(ctr(limits={VGPU: 2, MEM: 2 * S4000})),
    "multi S5000 memory": pod(ctr(limits={VGPU: 3, MEM: 3 * S5000})),
}
PINS = [None, str(S4000), str(S5000), "s4000", "S5000"]


def pinned(p: dict[str, Any], pin: str | None) -> dict[str, Any]:
    q = {**p, "metadata": {**p["metadata"]}}
    if pin is not None:
        q["metadata"]["annotations"] = {PIN_ANNOTATION: pin}
    return q


@pytest.mark.parametrize(("shape", "pin", "capacity"),
                         list(itertools.product(PODS, PINS, (S4000, S5000))))
def test_held_request_books_what_the_pinned_request_books(shape: str, pin: str | None, capacity: int) -> None:
    p = pinned(PODS[shape], pin)
    try:
        placed = pod_request(p, CFG)
    except RequestError:
        placed = None  # not placeable with this pin (its slice on no card of the model): compared unpinned
        p = pinned(PODS[shape], None)
    held = held_request(p, CFG)
    want = placed or pod_request(p, CFG)
    assert held is not None and want is not None
    assert (held.mode, held.cards) == (want.mode, want.cards)
    assert held.booking_for(capacity) == want.booking_for(capacity), (shape, pin, capacity)
    assert held.booking_for(capacity) >= (0, 0, 0)


@pytest.mark.parametrize("pin", PINS[1:])
def test_a_pin_changed_after_the_bind_changes_nothing_booked(pin: str) -> None:
    for shape, p in PODS.items():
        for capacity in (S4000, S5000):
            a, b = held_request(pinned(p, None), CFG), held_request(pinned(p, pin), CFG)
            assert a is not None and b is not None
            assert a.booking_for(capacity) == b.booking_for(capacity), (shape, pin, capacity)
