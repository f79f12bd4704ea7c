"""Red team, what docs/benchmarks.md and README.md say the benchmark printed, against bench/results/ and the code.

- The docs called five different runs `latest.json` and the plot ("now", or with no "then"), and headed a
  2026-12-01 table "Latest figures" above the plot, which is `latest.json`'s run (its title names the run).
- Tables of pods/s from A/B runs that no file in bench/results/ holds read like the kept runs' tables.
- README described the end-to-end mix as "80% slices, 15% exclusive, 5% multi-card": the generator's odds, not
  the 1000 pods its runs placed (`bench.workload.shapes`, fixed seed 7).
- `--extender-tls chart` "meant https before 2026-12-03", but the chart's default changed that evening
  (`4c2a096`): the A/B's HTTPS files of 2026-12-03 say `chart`, and the next full run says `chart` for http.
"""

from __future__ import annotations

import glob
import json
import re
from collections import Counter
from pathlib import Path

from bench.workload import shapes

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "benchmarks.md"
README = ROOT / "README.md"
RESULTS = ROOT / "bench" / "results"
NOT_KEPT = "not kept in `bench/results/`"
HISTORICAL = ("then", "until", "kept beside", "without replacing", "was ")


def _latest() -> str:
    return str(json.loads((RESULTS / "latest.json").read_text())["run_id"])


def _claims(text: str) -> list[tuple[str, str]]:
    """(run id, the text from it to the claim) for every place that names a run as `latest.json` or the plot."""
    out = []
    for m in re.finditer(r"latest\.json|throughput\.png` is this run's", text):
        before = text[max(0, m.start() - 250):m.end() + 30]
        runs = list(re.finditer(r"run-(\d{8}-\d{6})", before[:250]))
        if runs:
            out.append((runs[-1].group(1), " ".join(before[runs[-1].start():].split())))
    return out


def test_only_the_latest_run_is_called_latest() -> None:
    latest = _latest()
    for path in (DOCS, README):
        for run, said in _claims(path.read_text()):
            if not any(w in said for w in HISTORICAL):
                assert run == latest, f"{path.name}: {said!r} names {run}, latest.json is {latest}"
    for head in re.findall(r"^#+ .*[Ll]atest.*$", DOCS.read_text(), re.M):
        assert latest in head, head


def _pods_s_kept() -> set[float]:
    vals = set()
    for f in glob.glob(str(RESULTS / "**" / "*.json"), recursive=True):
        d = json.loads(Path(f).read_text())
        for p in d.get("phases", []) + d.get("warmups", []):
            vals.add(round(p["throughput_pods_s"], 1))
        for r in d.get("summary", []):
            for k in ("ours_pods_s", "plain_pods_s", "plain2_pods_s", "paced_pods_s", "external_pods_s"):
                if r.get(k) is not None:
                    vals.add(round(r[k], 1))
    return vals


def test_every_table_of_pods_per_second_is_a_kept_run_or_says_it_is_not() -> None:
    kept = _pods_s_kept()
    lines = DOCS.read_text().splitlines()
    sections: list[tuple[str, list[str]]] = []
    for line in lines:
        if line.startswith("#"):
            sections.append((line, []))
        elif sections:
            sections[-1][1].append(line)
    unsupported = []
    for head, body in sections:
        text = "\n".join(body)
        for i, line in enumerate(body[:-1]):
            if not (line.startswith("|") and re.fullmatch(r"\|[-| ]+\|", body[i + 1].strip())):
                continue
            cols = [j for j, h in enumerate(c.strip() for c in line.strip("|").split("|"))
                    if "pods/s" in h and not re.search(r"p50|p99|ms|CPU|round trips", h)]
            for row in body[i + 2:]:
                if not row.startswith("|"):
                    break
                cells = [c.strip() for c in row.strip("|").split("|")]
                nums = [float(x) for j in cols if j < len(cells)
                        for x in re.findall(r"(?<![\d.])\d+\.\d(?!\d)", cells[j])]
                if nums and not all(any(abs(x - v) < 0.051 for v in kept) for x in nums) and NOT_KEPT not in text:
                    unsupported.append(f"{head}: {row[:80]}")
    assert not unsupported, "\n".join(unsupported)


def _mix_percent(n: int) -> tuple[int, int, int]:
    c = Counter(s.kind for s in shapes(n, 7))
    return tuple(round(100 * c[k] / n) for k in ("slice", "exclusive", "multi"))  # type: ignore[return-value]


def test_the_stated_pod_mix_is_the_mix_the_runs_placed() -> None:
    m = re.search(r"(\d+) pods at once \((\d+) ?% slices, (\d+) ?% exclusive, (\d+) ?% (?:multi-card|two-card)",
                  README.read_text())
    assert m, "README states the mix"
    assert tuple(int(x) for x in m.groups()[1:]) == _mix_percent(int(m.group(1)))
    m = re.search(r"--pods` \(default (\d+)\).*?The mix \(fixed\s+seed\): (\d+) % slices.*?(\d+) % exclusive.*?"
                  r"(\d+) % two-card", DOCS.read_text(), re.S)
    assert m, "docs/benchmarks.md states the mix"
    assert tuple(int(x) for x in m.groups()[1:]) == _mix_percent(int(m.group(1)))


def test_the_day_chart_meant_https_ends_with_the_charts_change() -> None:
    text = DOCS.read_text()
    for f in (RESULTS / "ab-20261203-extender-http").glob("https-*.json"):
        d = json.loads(f.read_text())
        assert d["config"]["extender_tls"] == "chart" and d["started"].startswith("2026-12-03")
    assert "ab-20261203-extender-http/https-*" in text  # named among the files where chart means https
    for path in (DOCS, ROOT / "bench" / "stack.py", ROOT / "bench" / "load" / "cli.py"):
        assert not re.search(r"before 2026-12-03(?! \d| ?19:10|,? 19:10|,)", path.read_text()), path


def test_the_readmes_every_run_is_every_kept_run() -> None:
    """README said "Correctness in every run: ... 0 scheduling attempts that erred": two kept runs had some."""
    text = " ".join(README.read_text().split())
    claim = text[text.index("Correctness in every run"):][:700]
    for f in sorted(glob.glob(str(RESULTS / "**" / "run-*.json"), recursive=True)):
        d = json.loads(Path(f).read_text())
        for r in d.get("summary", []):
            for k in ("overcommitted_cards_ledger", "overcommitted_cards_annotations", "unannotated_bound",
                      "leaked_reservations", "pending_after_timeout"):
                assert not r.get(k), (f, k)
            erred = (r.get("schedule_attempts_error") or 0) + (r.get("schedule_attempts_error_plain") or 0)
            if erred:
                name = Path(f).stem
                assert f"`{name}`: {erred}" in claim, f"{name}: {erred} attempts erred, README says 0"


def test_the_2026_12_01_memory_ranges_hold_every_cell() -> None:
    """The figures of run-20261201-205119 said 7.2-7.6 MiB per 1000 nodes and "8-12 MiB per 1000 pods (25 at
    5,000 nodes)": its cells are 7.2-7.3, 7.4-11.9 at 500 and 1000 nodes, and 24.8 and 17.7 at 5,000."""
    text = " ".join(DOCS.read_text().split())
    section = text[text.index("### Figures of 2026-12-01"):]
    m = re.search(r"Extender RSS: ([\d.]+)-([\d.]+) MiB per 1000 nodes, ([\d.]+)-([\d.]+) MiB per 1000 pods at 500 "
                  r"and 1000 nodes \(([\d.]+) and ([\d.]+) at 5,000 nodes\)", section)
    assert m, section[:300]
    lo_n, hi_n, lo_p, hi_p, p5a, p5b = (float(x) for x in m.groups())
    d = json.loads((RESULTS / "run-20261201-205119.json").read_text())
    for r in d["summary"]:
        per_node = (r.get("rss_mib_per_1000_nodes") or {}).get("extender")
        if per_node is not None:
            assert lo_n - 0.05 <= per_node <= hi_n + 0.05
        per_pod = r["rss_mib_per_1000_pods"]["extender"]
        if r["nodes"] < 5000:
            assert lo_p - 0.05 <= per_pod <= hi_p + 0.05, per_pod
        else:
            assert any(abs(per_pod - x) < 0.051 for x in (p5a, p5b)), per_pod
