"""Red team: an allocation record with a number of more than 4300 digits.

Python refuses to convert a decimal string of more than 4300 digits to an int with a plain ValueError
(sys.int_max_str_digits). A record holding such a number (memory, cores or card index; reachable with the
admission policy off, docs/install.md "What the ledger trusts") made `usage_from_annotations` raise that
ValueError past the pod watcher's `except AnnotationError` (PodWatcher.learn and .record), so the pod
stream failed on that pod at every replay and every watcher replica gave up: no releases, no repairs.
docs/rules.md promises a malformed record is an error that keeps the ledger's booking and is counted.
"""

from __future__ import annotations

import pytest

from shared.domain.annotations import ALLOCATED, AnnotationError, usage_from_annotations
from tests.unit._k8s import ctr, pod

HUGE = "1" * 5000  # more digits than int() converts (4300)


@pytest.mark.parametrize("record", [
    f"n1-mthreads-0,Mthreads,{HUGE},1:;",
    f"n1-mthreads-0,Mthreads,512,{HUGE}:;",
    f"n1-mthreads-{HUGE},Mthreads,512,1:;",
], ids=["memory", "cores", "index"])
def test_redteam_a_record_with_a_huge_number_is_an_annotation_error(record: str) -> None:
    p = pod(ctr("a"), annotations={ALLOCATED: record}, nodeName="n1")
    with pytest.raises(AnnotationError):
        usage_from_annotations(p)
