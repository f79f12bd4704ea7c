"""Shares of a role's CPU by function, from the collapsed stacks of `MTSCHED_BENCH_SAMPLE_WINDOW`
(bench/timed_role.py): each function's inclusive share (samples with it anywhere on the stack) and self share
(samples with it innermost).

  python -m bench.stacks /tmp/s/s.extender.1234.1 [--top 40] [--match Mirror]
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from collections.abc import Iterable

_PREFIX = re.compile(r"/\S*?/lib/python3\.\d+/(site-packages/)?")


def shares(lines: Iterable[str]) -> tuple[int, Counter[str], Counter[str]]:
    """(samples, inclusive samples by frame, self samples by frame) of collapsed stacks."""
    total, inclusive, own = 0, Counter[str](), Counter[str]()
    for line in lines:
        stack, _, count = line.rstrip("\n").rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = [_PREFIX.sub("", f) for f in stack.split(";")]
        for frame in set(frames):
            inclusive[frame] += n
        own[frames[-1]] += n
    return total, inclusive, own


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("file")
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--match", default="", help="only frames whose text holds this")
    a = ap.parse_args(argv)
    with open(a.file) as f:
        total, inclusive, own = shares(f)
    if not total:
        print("no samples", file=sys.stderr)
        return 1
    print(f"{total} samples")
    for title, counts in (("inclusive", inclusive), ("self", own)):
        print(f"-- {title}")
        rows = [(k, v) for k, v in counts.most_common() if a.match in k][:a.top]
        for frame, n in rows:
            print(f"{100 * n / total:5.1f} %  {frame}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
