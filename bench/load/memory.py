"""Memory of each process: VmRSS and VmHWM (peak) from /proc/<pid>/status, and the growth per 1,000
nodes or pods between two samples (the parsing and the arithmetic are pure)."""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Mapping
from pathlib import Path

ROLES = ("extender", "watcher", "webhook")  # our roles; process names are "<role>-<index>"

Sample = dict[str, dict[str, int]]  # process name -> {"rss_kib", "hwm_kib"}


def parse_status(text: str) -> dict[str, int]:
    """{"rss_kib", "hwm_kib"} from the text of /proc/<pid>/status (a field missing is left out)."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        name = {"VmRSS": "rss_kib", "VmHWM": "hwm_kib"}.get(key)
        if name:
            parts = rest.split()
            if parts and parts[0].isdigit():
                out[name] = int(parts[0])  # the kernel reports kB
    return out


def sample(pids: Mapping[str, int]) -> Sample:
    """RSS and peak RSS of every process still alive."""
    out: Sample = {}
    for name, pid in pids.items():
        with contextlib.suppress(OSError):
            s = parse_status(Path(f"/proc/{pid}/status").read_text())
            if s:
                out[name] = s
    return out


def is_role(name: str) -> bool:
    return name.rsplit("-", 1)[0] in ROLES


def roles_only(s: Sample) -> Sample:
    return {k: v for k, v in s.items() if is_role(k)}


def growth_per_1000(before: Sample, after: Sample, count: int) -> dict[str, float]:
    """(RSS after - RSS before) in MiB per 1,000 of `count` things added in between, per process in both."""
    if count <= 0:
        return {}
    return {name: round((after[name]["rss_kib"] - before[name]["rss_kib"]) / 1024 * 1000 / count, 2)
            for name in sorted(set(before) & set(after))
            if "rss_kib" in before[name] and "rss_kib" in after[name]}


def mib(s: Sample, key: str = "rss_kib") -> dict[str, float]:
    return {name: round(v[key] / 1024, 1) for name, v in sorted(s.items()) if key in v}


def by_role(values: Mapping[str, float], extra: Collection[str] = ()) -> dict[str, float]:
    """Per role kind (the sum over its replicas: what that role costs the machine), and the processes
    named in `extra` (an external extender) as they are."""
    out: dict[str, float] = {}
    for name, v in values.items():
        if is_role(name) or name in extra:
            kind = name if name in extra else name.rsplit("-", 1)[0]
            out[kind] = round(out.get(kind, 0.0) + v, 2)
    return out
