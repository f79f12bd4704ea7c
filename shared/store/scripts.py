"""The ledger's Lua scripts (shared/store/lua/): their sources and the digest naming a release's booking rules."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path

LUA_DIR = Path(__file__).with_name("lua")
SCRIPTS = ("upsert_node", "reserve", "mark_bound", "release", "observe", "expire", "snapshot", "replace_node",
           "remove_node", "clock")


def script_source(name: str) -> str:
    """The text Redis runs for script `name`: _lib.lua, then the script's own file."""
    return (LUA_DIR / "_lib.lua").read_text() + "\n" + (LUA_DIR / f"{name}.lua").read_text()


def scripts_digest(sources: Mapping[str, str] | None = None) -> str:
    """12 hex digits naming this release's ledger scripts (`mtsched_build_info{scripts}`): replicas showing two
    digests for long run two releases' booking rules side by side (a roll stuck half-way, docs/install.md
    "While two releases run side by side"). Pure over `sources` (name -> text); the installed files by default."""
    texts = sources if sources is not None else {n: script_source(n) for n in SCRIPTS}
    h = hashlib.sha1()
    for name in sorted(texts):
        h.update(f"{name}\0{texts[name]}\0".encode())
    return h.hexdigest()[:12]
