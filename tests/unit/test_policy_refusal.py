"""When the extender knows every Binding it sends will be refused (shared/domain/trust.py refused_by_own_policy,
refusal_problem): only the chart's admission policy refusing it for who it is, never a refusal a pod can cause."""

from __future__ import annotations

import pytest

from shared.domain.trust import REFUSED_BY_POLICY_SECONDS, refusal_problem, refused_by_own_policy

# what the real API server answers (tests/e2e/test_trust.py checks this rule against its own refusal)
POLICY = ("bind: HTTP 403: pods \"p\" is forbidden: ValidatingAdmissionPolicy 'hami-allocation-records' with binding "
          "'hami-allocation-records' denied request: a Binding carrying hami.io/mthreads-devices-allocated may only be "
          "made by hami-scheduler (it books the cards the record names)")


@pytest.mark.parametrize(("status", "message", "scheduler", "refused"), [
    (403, POLICY, "hami-scheduler", True),
    (403, POLICY, "other-scheduler", False),  # another release's policy: not about this extender's identity
    (422, POLICY, "hami-scheduler", False),  # not the policy's Forbidden
    (409, "bind: HTTP 409: pod p is already assigned to node n", "hami-scheduler", False),
    (404, "bind: HTTP 404: pods \"p\" not found", "hami-scheduler", False),
    # RBAC: the access review says so already (shared/serving/access.py)
    (403, "bind: HTTP 403: pods \"p\" is forbidden: User \"x\" cannot create resource \"pods/binding\"",
     "hami-scheduler", False),
    # another admission's refusal of one pod: per pod, not who we are
    (403, "bind: HTTP 403: admission webhook \"kyverno\" denied the request: binding of p refused",
     "hami-scheduler", False),
    (403, "bind: HTTP 403: ValidatingAdmissionPolicy 'zones' with binding 'zones' denied request: not here",
     "hami-scheduler", False),
    # our words echoed by another admission (its message quoting something): not the policy's own denial
    (403, "bind: HTTP 403: admission webhook \"echo\" denied the request: 'may only be made by hami-scheduler (it "
          "books the cards'", "hami-scheduler", False),
    (403, "bind: HTTP 403: ValidatingAdmissionPolicy 'echo' with binding 'echo' denied request: label x: may only be "
          "made by hami-scheduler (it books the cards", "hami-scheduler", False),
])
def test_only_the_charts_policy_refusing_our_identity_counts(status: int, message: str, scheduler: str,
                                                             refused: bool) -> None:
    assert refused_by_own_policy(status, message, scheduler) is refused


@pytest.mark.parametrize(("refused", "now", "problem"), [
    (None, 1000.0, False),
    ((1000.0, POLICY), 1000.0, True),
    ((1000.0, POLICY), 1000.0 + REFUSED_BY_POLICY_SECONDS, True),
    ((1000.0, POLICY), 1000.0 + REFUSED_BY_POLICY_SECONDS + 0.1, False),  # no pod left to bind: it ends
])
def test_the_problem_lasts_while_refusals_come(refused: tuple[float, str] | None, now: float, problem: bool) -> None:
    why = refusal_problem(refused, now)
    assert bool(why) is problem
    if problem:
        assert "admission policy refuses this extender's Bindings" in why and "ServiceAccount" in why
        assert "may only be made by hami-scheduler" in why
