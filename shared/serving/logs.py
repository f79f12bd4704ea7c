"""Structured logs: one JSON object per line (the default), or plain text for humans."""

from __future__ import annotations

import logging
import sys
import time

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
            doc["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(doc).decode()


class TextFormatter(logging.Formatter):
    """One line per record: a log message carries text that pods and nodes chose (a container name as a review gave
    it, before the API server validated it; a record's device ids), and a line break in it forged a line of its own,
    an escape drove the reader's terminal (red team). The message is escaped (shared.domain.shapes.printable); a
    traceback, the role's own text, keeps its lines."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = printable(record.message)
        return super().formatMessage(record)


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
