"""Audit, the load benchmark's results file of a run that stopped on an error (a check that could not read the
API server or Redis, a kube-scheduler that went away): `main` saved the document with the summary of the phases
that had finished, every counter 0, and nothing in it said that the run did not finish (only the exit status and a
traceback did): a results file quoted later read as a complete, clean run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench.load import cli


def test_a_run_stopped_by_an_error_says_so_in_its_results(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def amain(args: Any, doc: dict[str, Any], ext: Any = None) -> None:
        doc.update({"run_id": "t", "summary": [], "micro": [], "phases": []})
        raise ConnectionError("Error 111 connecting to 127.0.0.1:6379")  # the ledger check's Redis, say

    monkeypatch.setattr(cli, "amain", amain)
    with pytest.raises(ConnectionError):
        cli.main(["--out", str(tmp_path)])
    doc = json.loads((tmp_path / "run-t.json").read_text())
    assert doc["aborted"] == "ConnectionError: Error 111 connecting to 127.0.0.1:6379"


def test_a_finished_run_is_not_marked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def amain(args: Any, doc: dict[str, Any], ext: Any = None) -> None:
        doc.update({"run_id": "t", "summary": [], "micro": [], "phases": []})

    monkeypatch.setattr(cli, "amain", amain)
    assert cli.main(["--out", str(tmp_path)]) == 0
    assert "aborted" not in json.loads((tmp_path / "run-t.json").read_text())
