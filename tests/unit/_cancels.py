"""A task body that swallows cancellations, as one awaiting a reply may lose them (docs/runbooks.md "lost
cancellations"): for the tests of whatever cancels and waits (Supervisor.cancel, Mirror.stop)."""

from __future__ import annotations

import asyncio


class DeafTo:
    """Waits for ever, swallowing its first `deaf` cancellations and heeding the next; counts them."""

    def __init__(self, deaf: int) -> None:
        self.deaf, self.cancels = deaf, 0
        self.inside = asyncio.Event()  # set once it waits

    async def __call__(self) -> None:
        while True:
            self.inside.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cancels += 1
                if self.cancels > self.deaf:
                    raise
