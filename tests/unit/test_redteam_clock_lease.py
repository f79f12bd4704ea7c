"""Red team, clocks: the leader's extender judges whether kube-scheduler's Lease has lapsed by comparing its
`renewTime` with a clock. kube-scheduler (client-go) stamps `renewTime` with its own host's wall clock, and the
holder `holds()` names is this very pod's kube-scheduler, on this host. A host whose wall clock lags the API
server's by more than `leaseDurationSeconds` (15 s) made every fresh renewal look lapsed on the API server's
clock: the extender never handed the leadership over, and an unready leader stayed so beside a Ready replica for
as long as its fault lasted (the hand-over's bound, docs/runbooks.md, never came)."""

from __future__ import annotations

import time
from email.utils import formatdate

from controller.leadership import micro_time
from shared.domain.leadership import yielded_holder
from tests.unit.test_leadership import MINE, POD, READY, StandIn, lease, look

SKEW_S = 40.0  # this host's wall clock behind the API server's (NTP broken on the node)


def renewed_now_here() -> dict[str, object]:
    """The Lease as this pod's kube-scheduler just renewed it: on this host's wall clock."""
    held = lease(MINE)
    held["spec"]["renewTime"] = micro_time(time.time())
    return held


async def test_a_host_clock_behind_the_api_server_still_hands_over() -> None:
    kube = StandIn(renewed_now_here(), READY)
    kube.server_clock.note(formatdate(time.time() + SKEW_S, usegmt=True))  # the API server's Date: ahead
    reason, y = await look(kube, 30)
    assert reason and y.yields == 1, "a Lease renewed a moment ago was taken for lapsed"
    put = next(c for c in kube.calls if c[0] == "PUT")
    assert put[2]["spec"]["holderIdentity"] == yielded_holder(POD)


async def test_a_host_clock_ahead_of_the_api_server_still_leaves_a_lapsed_lease() -> None:
    """The other side: a renewal older than the duration on the renewer's clock is lapsed, whatever the API
    server's clock says (it is behind here, so on it the stale renewal would look fresh)."""
    held = lease(MINE)
    held["spec"]["renewTime"] = micro_time(time.time() - 3 * 15)
    kube = StandIn(held, READY)
    kube.server_clock.note(formatdate(time.time() - SKEW_S, usegmt=True))
    reason, y = await look(kube, 30)
    assert reason == "" and y.yields == 0 and not [c for c in kube.calls if c[0] == "PUT"]
