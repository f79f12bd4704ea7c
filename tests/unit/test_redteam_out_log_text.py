"""Red team (outputs): text a pod creator or a node chose, logged by a role, must not forge log lines or drive the
terminal of whoever reads the logs (`kubectl logs` of a role run with `--log-format text`, the chart's
mtsched.logFormat: text). The webhook logs every denial with its message, which names the container as the
review gave it: a mutating webhook sees the pod before the API server validates it, so the name can hold a line
break and terminal escapes."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import orjson
import pytest

from shared.domain.admission import WARNING_CHARS
from shared.domain.shapes import printable
from shared.serving import logs
from tests.unit._k8s import MEM, VGPU, cfg, ctr, pod
from webhook.server import MAX_WARNINGS, handle_review

EVIL = 'main\r\n2026-12-07 18:00:00,000 INFO webhook mtsched.webhook: allowed default/p \x1b[2J\u202egnp.\x9b31m'


def review(p: dict[str, object]) -> bytes:
    return orjson.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                         "request": {"uid": "u1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                                     "operation": "CREATE", "namespace": "default", "object": p}})


@pytest.fixture
def captured() -> Iterator[io.StringIO]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield io.StringIO()
    root.handlers[:] = handlers
    root.setLevel(level)


def _setup(fmt: str, out: io.StringIO) -> None:
    logs.setup("info", fmt, "webhook")
    handler = logging.getLogger().handlers[0]
    assert isinstance(handler, logging.StreamHandler)
    handler.setStream(out)


def _controls(text: str) -> list[str]:
    return sorted({hex(ord(c)) for c in text if not c.isprintable()})


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_a_denial_naming_a_hostile_container_is_one_log_line_without_controls(
        fmt: str, captured: io.StringIO) -> None:
    _setup(fmt, captured)
    status, out = handle_review(review(pod(ctr(EVIL, {VGPU: 1, MEM: 3}))), cfg((96, 160)), [96])
    assert status == 200 and out["response"]["allowed"] is False
    written = captured.getvalue()
    assert written.endswith("\n")
    lines = written[:-1].split("\n")
    assert len(lines) == 1, lines  # the container name's line break forged a second line
    assert _controls(lines[0]) == []  # nor an escape, a bidi override or a C1 control reaches the reader
    shown = orjson.loads(lines[0])["msg"] if fmt == "json" else lines[0]
    assert "mthreads.com/sgpu-memory=3 is not a valid slice size" in shown  # what was refused is still said
    assert r"\r\n2026-12-07" in shown and r"\x1b[2J" in shown and r"\u202e" in shown  # the name, escaped


def test_an_exception_keeps_its_traceback_lines(captured: io.StringIO) -> None:
    """The escaping is the message's: a traceback (the role's own text) still reads as one."""
    _setup("text", captured)
    try:
        raise ValueError("boom")
    except ValueError:
        logging.getLogger("mtsched.test").exception("failed for %s", "a\nb")
    lines = captured.getvalue().splitlines()
    assert lines[0].endswith(r"failed for a\nb")
    assert lines[1] == "  Traceback (most recent call last):" and lines[-1] == "  ValueError: boom"
    assert all(line.startswith("  ") for line in lines[1:])


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_an_exception_message_with_hostile_text_forges_no_line(fmt: str, captured: io.StringIO) -> None:
    """An exception's message may carry what a pod chose: its line break started a line that read as a record of its
    own (text), and its escapes reached the terminal (both forms: JSON escapes a line break, not a C1 control or a
    bidi override)."""
    _setup(fmt, captured)
    try:
        raise ValueError(EVIL)
    except ValueError:
        logging.getLogger("mtsched.test").exception("failed")
    written = captured.getvalue()
    assert _controls(written.replace("\n", "")) == []
    lines = written[:-1].split("\n")
    if fmt == "json":
        assert len(lines) == 1, lines
        exc = orjson.loads(lines[0])["exc"]
        assert _controls(exc.replace("\n", "")) == [] and "ValueError: main" in exc
    else:
        assert lines[0].endswith("failed") and all(line.startswith("  ") for line in lines[1:]), lines
        assert any("INFO webhook mtsched.webhook: allowed" in line for line in lines[1:])  # still there, indented


@pytest.mark.parametrize(("text", "shown"), [
    ("plain text, ünïcode, 中文", "plain text, ünïcode, 中文"),
    ("a\nb\rc\td", r"a\nb\rc\td"),
    ("\x1b[31mred", r"\x1b[31mred"),
    ("\u202eevil\u200b", r"\u202eevil\u200b"),
    ("c1 \x9b2J", r"c1 \x9b2J"),
    ("back\\slash", "back\\slash"),
])
def test_printable(text: str, shown: str) -> None:
    assert printable(text) == shown
    assert _controls(printable(text)) == []


def test_an_allowed_pod_with_many_containers_gets_a_bounded_list_of_warnings() -> None:
    """One warning per exclusive container: 1,023 init containers and one app container got 1,024 warnings
    (120 KB with names as the API server allows them, 300 KB with the 253 characters the review may carry before it
    validates them), where the API server keeps 4096 characters of warnings in all and cuts each at 256."""
    inits = [ctr(f"c{i}-" + "x" * 240, {VGPU: 1}) for i in range(1023)]
    status, out = handle_review(review(pod(ctr("main", {VGPU: 1}), init=inits)), cfg((96, 160)), [96])
    assert status == 200 and out["response"]["allowed"] is True
    warnings = out["response"]["warnings"]
    assert len(warnings) == MAX_WARNINGS + 1 and warnings[-1] == f"and {1024 - MAX_WARNINGS} more warnings"
    assert all(len(w) <= WARNING_CHARS for w in warnings)
    assert warnings[0].startswith('container "c0-xxx') and "exclusive mode" not in warnings[0]  # cut at 256
