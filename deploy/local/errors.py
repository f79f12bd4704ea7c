"""Errors of the local control plane harness."""

from __future__ import annotations


class ControlPlaneError(RuntimeError):
    """A component failed to start or a harness request failed; the message carries log tails."""


class ApiError(ControlPlaneError):
    def __init__(self, status: int, body: str, what: str) -> None:
        super().__init__(f"{what}: HTTP {status}: {body[:2000]}")
        self.status = status
        self.body = body
