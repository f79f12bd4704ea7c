"""Red team on the `bindings` readiness text (9cdee46, shared/domain/trust.py refusal_problem): docs/runbooks.md says
an unready extender shows `bindings: ... (... may only be made by <schedulerName> ...)`. The extender's real Binding
carries 8 owned keys (shared/domain/annotations.py binding_annotations), so the API server's message names all of
them before "may only be made by", and refusal_problem's cut at 300 characters drops exactly the part that says
which identity the policy wants (tests/unit/test_policy_refusal.py uses a Binding with one key)."""

from __future__ import annotations

from shared.domain.annotations import SCHEDULER_OWNED_KEYS, binding_annotations
from shared.domain.trust import refusal_problem, refused_by_own_policy
from shared.kube import KubeError


def test_rt_the_readiness_text_names_the_identity_for_a_real_bindings_refusal() -> None:
    carried = [k for k in SCHEDULER_OWNED_KEYS if k in binding_annotations("node-1", [], 0)]
    assert len(carried) == 8
    message = ("pods \"train-7f9c\" is forbidden: ValidatingAdmissionPolicy 'hami-allocation-records' with binding "
               f"'hami-allocation-records' denied request: a Binding carrying {', '.join(carried)} may only be made "
               "by hami-scheduler (it books the cards the record names)")
    e = KubeError(403, {"message": message}, "POST /api/v1/namespaces/team-a/pods/train-7f9c/binding")
    assert refused_by_own_policy(e.status, str(e), "hami-scheduler")  # the match itself holds
    why = refusal_problem((0.0, str(e)), 1.0)
    assert "may only be made by hami-scheduler" in why, why
