"""Red team: a node's reason for offering no card is longer than the ledger takes.

node_inventory quoted the `mtsched.io/max-inst` annotation whole in the node's error (`...={raw!r} is
outside 1..16`), and so did the card-knobs errors (a value, a version or a field name of the annotation),
and the scripts refuse an error of more than 4096 bytes (BADINPUT, `check_error` in _lib.lua). An
annotation of a few KiB (anyone who may patch the Node) so made every write of that node fail: the node
watcher's event, its re-list and the rebuild raised LedgerError on every replay in every watcher replica,
and the node kept whatever the ledger held before (the cards it offered under the old limit) instead of
being closed with the reason, as docs/rules.md says a malformed annotation does.
"""

from __future__ import annotations

from typing import Any

import pytest

from shared.config import load_config
from shared.domain.knobs import ANNOTATION as KNOBS_ANNOTATION
from shared.domain.node import MAX_INST_ANNOTATION, node_inventory
from shared.store.ledger import Ledger

pytestmark = pytest.mark.redis
CFG = load_config(env={}, flags={"memoryPerCard": "96"})


def node(annotations: dict[str, str]) -> dict[str, Any]:
    return {"metadata": {"name": "n1", "annotations": annotations},
            "status": {"capacity": {"mthreads.com/sgpu-core": "32", "mthreads.com/sgpu-memory": "192"}}}


@pytest.mark.parametrize("annotations", [
    {MAX_INST_ANNOTATION: "x" * 8000},
    {MAX_INST_ANNOTATION: "1" * 8000},
    {KNOBS_ANNOTATION: '{"v":1,"cards":{"' + "9" * 8000 + '":{}}}'},
    {KNOBS_ANNOTATION: '{"v":1,"cards":{"0":{"max_inst":"' + "x" * 8000 + '","overcommit_ratio":100,"policy":0,'
                       '"time_slice":1}}}'},
    {KNOBS_ANNOTATION: '{"v":"' + "x" * 8000 + '","cards":{}}'},
    {KNOBS_ANNOTATION: '{"v":1,"cards":{},"' + "x" * 8000 + '":1}'},
    {KNOBS_ANNOTATION: '{"v":1,"cards":{},"' + "é" * 3000 + '":1}'},  # 2 bytes a character
], ids=["max-inst-text", "max-inst-digits", "knobs-index", "knobs-value", "knobs-version", "knobs-field",
        "knobs-field-unicode"])
async def test_redteam_a_long_reason_still_closes_the_node(ledger: Ledger, annotations: dict[str, str]) -> None:
    assert await ledger.upsert_node(node_inventory(node({}), CFG)) > 0  # open, two cards
    inv = node_inventory(node(annotations), CFG)
    assert inv.error and not inv.cards
    await ledger.upsert_node(inv)  # raised LedgerError (BADINPUT: error of more than 4096 bytes)
    snap = await ledger.snapshot("n1")
    assert snap is not None and snap.error and not snap.cards
