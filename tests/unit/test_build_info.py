"""mtsched_build_info's scripts label: one digest per release of the ledger scripts (MtschedReleasesMixed)."""

from __future__ import annotations

import pytest

from controller.cli import release
from shared.store.ledger import SCRIPTS, script_source, scripts_digest

BASE = {"reserve": "return 1", "release": "return 2"}


@pytest.mark.parametrize(("sources", "same"), [
    ({"release": "return 2", "reserve": "return 1"}, True),  # the order given does not matter
    ({"reserve": "return 1", "release": "return 3"}, False),  # one script's body changed
    ({"reserve": "return 1"}, False),  # a script removed
    ({"reserve": "return 1", "release": "return 2", "clock": ""}, False),  # one added, even empty
    ({"reserve": "return 1release", "release": "return 2"[7:]}, False),  # text moved across a boundary
])
def test_digest_follows_every_script(sources: dict[str, str], same: bool) -> None:
    assert (scripts_digest(sources) == scripts_digest(BASE)) is same


def test_the_installed_scripts() -> None:
    digest = scripts_digest()
    assert len(digest) == 12 and int(digest, 16) >= 0
    assert digest == scripts_digest({n: script_source(n) for n in SCRIPTS})
    version, scripts = release()
    assert scripts == digest and version
