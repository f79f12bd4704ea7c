"""`mtsched demo` refuses a wrong --memory-per-card before it starts anything (a new-user test: `abc` started the
whole control plane, then failed with a traceback under a page of logs)."""

from __future__ import annotations

import pytest

import deploy.local.demo as demo


@pytest.mark.parametrize(("value", "says"), [
    ("abc", "'abc' is not a whole number of 512 MiB units (2..4096"),
    ("", "memoryPerCard is empty"),
    ("96,48", "entry 48 is MTT S4000's memory in GiB; the unit is 512 MiB: use 96"),
    ("1", "out of range"),
])
def test_a_wrong_memory_per_card_starts_nothing(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                                value: str, says: str) -> None:
    def started(*_: object, **__: object) -> None:
        raise AssertionError("the demo began to start the control plane")

    monkeypatch.setattr(demo, "ensure_binaries", started)
    assert demo.run_demo(value) == 2
    err = capsys.readouterr().err
    assert err.startswith("mtsched demo: --memory-per-card: ") and says in err, err
