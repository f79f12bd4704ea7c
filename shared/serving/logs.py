"""Structured logs: one JSON object per line (the default), or plain text for humans."""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

import orjson

from shared.domain.shapes import printable


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            # escaped as the text form's: a C1 control or a bidi override passes JSON's escaping untouched and
            # reaches the terminal of whoever reads `kubectl logs`
            "msg": printable(record.getMessage()),
        }
        if record.exc_info:
            doc["exc"] = "\n".join(traceback_lines(self.formatException(record.exc_info)))
        return orjson.dumps(doc).decode()


def traceback_lines(text: str) -> list[str]:
    """A traceback's lines, each escaped: the frames are the role's own text, but an exception's message may carry
    what a pod or a node chose (a line break in it forged a line, an escape drove the reader's terminal)."""
    return [printable(line) for line in text.split("\n")]


class TextFormatter(logging.Formatter):
    """One line per record: a log message carries text that pods and nodes chose (a container name as a review gave
    it, before the API server validated it; a record's device ids), and a line break in it forged a line of its own,
    an escape drove the reader's terminal (red team). The message is escaped (shared.domain.shapes.printable); a
    traceback keeps its lines, each escaped and indented: a line break in an exception's message (text a pod may have
    chosen) starts an indented line, never one that reads as a record of its own."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = printable(record.message)
        return super().formatMessage(record)

    def formatException(self, ei: Any) -> str:
        return "\n".join("  " + line for line in traceback_lines(super().formatException(ei)))


def setup(level: str = "info", fmt: str = "json", role: str = "") -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TextFormatter(f"%(asctime)s %(levelname)s {role} %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


class Progress:
    """Timestamped progress lines for long interactive commands (quick start, benchmarks)."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()

    def __call__(self, msg: str) -> None:
        print(f"[{time.monotonic() - self.t0:7.1f}s] {msg}", flush=True)
