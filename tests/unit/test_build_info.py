"""mtsched_build_info's labels: one digest per release of the ledger scripts, and one of all the code
(MtschedReleasesMixed)."""

from __future__ import annotations

import pytest

from controller.cli import code_digest, code_sources, release
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
    version, scripts, code = release()
    assert scripts == digest and version
    assert code == code_digest(code_sources()) and len(code) == 12


def test_the_code_digest_tells_apart_releases_with_the_same_scripts() -> None:
    """Red team: 46f44a7 and ba2a96c (the preempt verb's all-or-nothing answer, 5 files of Python) both report
    version="0.1.0" and scripts="3a2d40830596"; 176 of the last 200 commits changing the roles' code changed
    no ledger script, and the version was never bumped. A roll stuck between such two releases raised nothing."""
    sources = code_sources()
    assert "controller/preempt.py" in sources and "shared/store/lua/reserve.lua" in sources
    assert "webhook/runner.py" in sources
    changed = dict(sources, **{"controller/preempt.py": sources["controller/preempt.py"] + "\n# a fix\n"})
    assert code_digest(changed) != code_digest(sources)
    assert code_digest(dict(reversed(list(sources.items())))) == code_digest(sources)  # the order read does not matter
