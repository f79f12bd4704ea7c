"""Re-run the redis-cli session shown in docs/redis-layout.md ("Looking at it with redis-cli") against a real
redis-server and write its outputs into the page, so that what the page shows is what the ledger writes.

  python -m deploy.local.capture_layout            # rewrites docs/redis-layout.md in place

The story: two nodes, gpu-s4000-1 (2 x MTT S4000) and gpu-s5000-1 (2 x MTT S5000); ml/train-a booked on
card 1 of the S4000 node and bound, ml/notebook-b booked next to it (released once and booked again, still
pending), ml/exclusive-c given card 0 of the S5000 node whole, then card 1 of the S5000 node cordoned. Every
fenced block of the page that starts with `$ redis-cli` is run again command by command (`--no-raw`); the
`SUBSCRIBE` one gets what a subscriber saw while the story ran.
"""

from __future__ import annotations

import asyncio
import re
import shlex
import subprocess
import time
from pathlib import Path

from redis.asyncio import Redis

from deploy.local.redis import RedisServer
from shared.domain.node import Card, Inventory
from shared.store.ledger import Ledger

PAGE = Path(__file__).resolve().parents[2] / "docs" / "redis-layout.md"
TRAIN, NOTEBOOK, EXCLUSIVE = ("6f1c2a9e-0d4b-4c31-9a57-2b8e1f0c7d11", "b2d4e6f8-1a3c-4e5f-8a9b-0c1d2e3f4a5b",
                              "0e9d8c7b-6a5f-4e3d-2c1b-0a9f8e7d6c5b")
S4000, S5000 = 96, 160


def node(name: str, capacity: int, cordoned: tuple[int, ...] = ()) -> Inventory:
    return Inventory(name, tuple(Card(name, i, capacity, cordoned=i in cordoned) for i in range(2)))


async def story(led: Ledger) -> None:
    assert (await led.reserve("gpu-s4000-1", TRAIN, [1], 16, 4, 1, pod="ml/train-a"))[0].ok
    assert await led.mark_bound("gpu-s4000-1", TRAIN)
    assert (await led.reserve("gpu-s4000-1", NOTEBOOK, [1], 8, 2, 1, pod="ml/notebook-b"))[0].ok
    assert (await led.reserve("gpu-s5000-1", EXCLUSIVE, [0], S5000, 16, 1, model=S5000, whole=True,
                              pod="ml/exclusive-c"))[0].ok
    assert await led.mark_bound("gpu-s5000-1", EXCLUSIVE)
    assert await led.release("gpu-s4000-1", NOTEBOOK)
    assert (await led.reserve("gpu-s4000-1", NOTEBOOK, [1], 8, 2, 1, pod="ml/notebook-b"))[0].ok
    await led.upsert_node(node("gpu-s5000-1", S5000, cordoned=(1,)))


async def write(port: int) -> None:
    client = Redis(port=port, decode_responses=True)
    led = Ledger(client)
    await led.load_scripts()
    await story(led)
    await client.aclose()


async def nodes(port: int) -> None:
    client = Redis(port=port, decode_responses=True)
    led = Ledger(client)
    await led.load_scripts()
    await led.upsert_node(node("gpu-s4000-1", S4000))
    await led.upsert_node(node("gpu-s5000-1", S5000))
    await client.aclose()


def capture(page: Path = PAGE) -> None:
    server = RedisServer(password=None).start()
    try:
        asyncio.run(nodes(server.port))
        sub = subprocess.Popen(["redis-cli", "-p", str(server.port), "--raw", "SUBSCRIBE", "mt:feed"],
                               stdout=subprocess.PIPE, text=True)
        time.sleep(0.5)  # subscribed before the story starts (a tool run by hand, not a test)
        asyncio.run(write(server.port))
        time.sleep(0.5)
        sub.terminate()
        feed = sub.communicate()[0].rstrip("\n")

        def run(line: str) -> str:
            argv = shlex.split(line)[2:]  # after "$ redis-cli"
            if "SUBSCRIBE" in argv:
                return feed
            return subprocess.run(["redis-cli", "-p", str(server.port), "--no-raw", *argv], capture_output=True,
                                  text=True, check=True).stdout.rstrip("\n")

        def block(m: re.Match[str]) -> str:
            out = []
            for line in m.group(1).split("\n"):
                if line.startswith("$ redis-cli"):
                    out += [line, run(line)]
            return "```\n" + "\n".join(out) + "\n```"

        page.write_text(re.sub(r"```\n(\$ redis-cli.*?)\n```", block, page.read_text(), flags=re.S))
    finally:
        server.cleanup()


if __name__ == "__main__":
    capture()
