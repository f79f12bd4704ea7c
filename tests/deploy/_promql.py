"""Metric names in PromQL, and what a /metrics scrape exports: for the tests that check the dashboard's
panels and the chart's alert rules query only metrics our roles export (tests/deploy/test_monitoring.py,
tests/e2e/test_dashboard_metrics.py).

Not a PromQL parser: string literals, label matchers, ranges, label lists of by/without/on/ignoring/
group_left/group_right, Grafana variables and numbers are cut away; what is left and names a series
(an identifier followed by `{`, `[` or used bare, and not a function, aggregation or keyword) is a
metric name. `{__name__="x"}` selectors count as x.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "helm" / "hami" / "dashboards" / "mtsched.json"
BUILD_PROMQL = ROOT / "deploy" / "helm-tools" / "build-promql-check.sh"

AGGREGATIONS = {"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk",
                "topk", "quantile", "limitk", "limit_ratio"}
FUNCTIONS = {
    "abs", "absent", "absent_over_time", "acos", "acosh", "asin", "asinh", "atan", "atanh", "avg_over_time",
    "ceil", "changes", "clamp", "clamp_max", "clamp_min", "cos", "cosh", "count_over_time", "day_of_month",
    "day_of_week", "day_of_year", "days_in_month", "deg", "delta", "deriv", "double_exponential_smoothing", "exp",
    "floor", "histogram_avg", "histogram_count", "histogram_fraction", "histogram_quantile", "histogram_stddev",
    "histogram_stdvar", "histogram_sum", "holt_winters", "hour", "idelta", "increase", "info", "irate",
    "label_join", "label_replace", "last_over_time", "ln", "log10", "log2", "mad_over_time", "max_over_time",
    "min_over_time", "minute", "month", "predict_linear", "present_over_time", "quantile_over_time", "rad",
    "rate", "resets", "round", "scalar", "sgn", "sin", "sinh", "sort", "sort_by_label", "sort_by_label_desc",
    "sort_desc", "sqrt", "stddev_over_time", "stdvar_over_time", "sum_over_time", "tan", "tanh", "time",
    "timestamp", "vector", "year",
}
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "offset", "bool", "and", "or",
            "unless", "atan2", "inf", "nan", "start", "end"}
NOT_METRICS = AGGREGATIONS | FUNCTIONS | KEYWORDS

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_NAME_MATCHER = re.compile(r'__name__\s*=\s*"([a-zA-Z_:][a-zA-Z0-9_:]*)"')
_BRACES = re.compile(r"\{[^{}]*\}")
_BRACKETS = re.compile(r"\[[^\[\]]*\]")
_LABEL_LIST = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_GRAFANA_VAR = re.compile(r"\$\{[^}]*\}|\$[A-Za-z_][A-Za-z0-9_]*|\[\[[^\]]*\]\]")
_IDENT = re.compile(r"(?<![\w:.])[a-zA-Z_:][a-zA-Z0-9_:]*(?![\w:])")
_NUMBER = re.compile(r"(?<![\w:])(?:0x[0-9a-fA-F]+|\d[\w.]*(?:[eE][+-]?\d+)?)")
_LABEL_VALUES = re.compile(r"^\s*label_values\s*\((.*)\)\s*$", re.S)
_QUERY_RESULT = re.compile(r"^\s*query_result\s*\((.*)\)\s*$", re.S)


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (Grafana variables allowed)."""
    names = set(_NAME_MATCHER.findall(expr))
    text = _GRAFANA_VAR.sub(" ", expr)  # before strings: "$node" inside a matcher goes with it anyway
    text = _STRING.sub('""', text)
    text = _BRACES.sub("{}", text)
    text = _BRACKETS.sub("[]", text)
    text = _LABEL_LIST.sub(" ", text)
    text = _NUMBER.sub(" ", text)
    for m in _IDENT.finditer(text):
        word = m.group(0)
        rest = text[m.end():].lstrip()
        if word in NOT_METRICS or rest.startswith("("):  # an aggregation, a function call or a keyword
            continue
        names.add(word)
    return names


def variable_metric_names(query: str) -> set[str]:
    """Metric names in a Grafana template variable's query: label_values(expr, label), query_result(expr),
    or plain PromQL. label_values(label) alone names no metric."""
    m = _LABEL_VALUES.match(query)
    if m:
        args = m.group(1)
        depth, cut = 0, -1
        for i, ch in enumerate(args):  # the last top-level comma separates the label
            depth += ch in "({["
            depth -= ch in ")}]"
            if ch == "," and depth == 0:
                cut = i
        return metric_names(args[:cut]) if cut >= 0 else set()
    m = _QUERY_RESULT.match(query)
    return metric_names(m.group(1) if m else query)


# ------------------------------------------------------------------------------ where queries live
def _panels(panels: Iterable[Mapping[str, Any]]) -> Iterator[Mapping[str, Any]]:
    for p in panels:
        yield p
        yield from _panels(p.get("panels") or [])  # rows keep their panels when collapsed


def dashboard_queries(dashboard: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(where, PromQL) of every panel target; template variables give their metric names via `variable:`."""
    out: list[tuple[str, str]] = []
    for p in _panels(dashboard.get("panels") or []):
        for t in p.get("targets") or []:
            if t.get("expr"):
                out.append((f"panel {p.get('title')!r} {t.get('refId')}", str(t["expr"])))
    return out


def dashboard_variable_queries(dashboard: Mapping[str, Any]) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for v in (dashboard.get("templating") or {}).get("list") or []:
        if v.get("type") != "query":
            continue
        q = v.get("query")
        text = q.get("query") if isinstance(q, dict) else q
        if text:
            out.append((f"variable {v.get('name')!r}", str(text)))
    return out


def rule_queries(objs: Sequence[Mapping[str, Any]]) -> list[tuple[str, str]]:
    """(alert or record name, PromQL) of every rule in the PrometheusRule objects among `objs`."""
    out: list[tuple[str, str]] = []
    for o in objs:
        if o.get("kind") != "PrometheusRule":
            continue
        for g in o["spec"]["groups"]:
            for r in g["rules"]:
                out.append((f"rule {r.get('alert') or r.get('record')}", str(r["expr"])))
    return out


def queried_names(dashboard: Mapping[str, Any], objs: Sequence[Mapping[str, Any]]) -> dict[str, set[str]]:
    """metric name -> where it is queried (every panel, variable and rule)."""
    out: dict[str, set[str]] = {}
    for where, expr in [*dashboard_queries(dashboard), *rule_queries(objs)]:
        for n in metric_names(expr):
            out.setdefault(n, set()).add(where)
    for where, query in dashboard_variable_queries(dashboard):
        for n in variable_metric_names(query):
            out.setdefault(n, set()).add(where)
    return out


# --------------------------------------------------------------------------------------- scrapes
@dataclass(frozen=True)
class Scrape:
    """What one or more /metrics texts export: declared families with their type, and sample names."""

    types: Mapping[str, str]
    samples: frozenset[str]

    @classmethod
    def parse(cls, *texts: str) -> Scrape:
        types: dict[str, str] = {}
        samples: set[str] = set()
        for text in texts:
            for line in text.splitlines():
                if line.startswith("# TYPE "):
                    _, _, name, kind = line.split(" ", 3)
                    types[name] = kind.strip()
                elif line and not line.startswith("#"):
                    samples.add(re.split(r"[{\s]", line, maxsplit=1)[0])
        return cls(types, frozenset(samples))

    def family(self, name: str) -> str | None:
        """The declared family `name` belongs to (histogram and summary suffixes resolved), or None."""
        if name in self.types:
            return name
        for suffix, kinds in (("_bucket", ("histogram",)), ("_sum", ("histogram", "summary")),
                              ("_count", ("histogram", "summary"))):
            base = name.removesuffix(suffix)
            if base != name and self.types.get(base) in kinds:
                return base
        return None

    def has_samples(self, name: str) -> bool:
        """A sample of `name` itself (a histogram's or summary's family name: of any of its series)."""
        if name in self.samples:
            return True
        kind = self.types.get(name)
        if kind in ("histogram", "summary"):
            return any(f"{name}{s}" in self.samples for s in ("_bucket", "_sum", "_count"))
        return False


# ------------------------------------------------------------------------- the real PromQL parser
def promql_checker(pytestconfig: pytest.Config) -> Path:
    """promql-check (Prometheus's parser, built once by deploy/helm-tools/build-promql-check.sh); skip if
    it cannot be built for lack of Go, fail if the build fails."""
    capman = pytestconfig.pluginmanager.getplugin("capturemanager")
    uncaptured = capman.global_and_fixture_disabled() if capman else contextlib.nullcontext()
    with uncaptured:
        proc = subprocess.run([str(BUILD_PROMQL)], stdout=subprocess.PIPE, stderr=None, text=True, check=False)
    path = Path(proc.stdout.strip().splitlines()[-1]) if proc.stdout.strip() else None
    if proc.returncode == 0 and path and path.is_file():
        return path
    if shutil.which("go") is None:
        pytest.skip("promql-check is not built and Go (1.26+) is not installed: "
                    "run deploy/helm-tools/build-promql-check.sh")
    pytest.fail(f"building promql-check with {BUILD_PROMQL} failed (exit {proc.returncode})", pytrace=False)


_RANGE_VARS = re.compile(r"\$\{?__(?:rate_interval|interval|range)(?:_ms|_s)?\}?")


def concrete(expr: str) -> str:
    """What Grafana sends Prometheus: its range variables as a duration, other variables as a regex."""
    return _GRAFANA_VAR.sub(".*", _RANGE_VARS.sub("5m", expr))


def parse_errors(checker: Path, exprs: Sequence[str]) -> list[str]:
    """The parser's verdict on each expression: "ok" or its error."""
    proc = subprocess.run([str(checker)], input="".join(json.dumps(e) + "\n" for e in exprs), capture_output=True,
                          text=True, check=True, timeout=60)
    out = proc.stdout.splitlines()
    assert len(out) == len(exprs), proc.stdout + proc.stderr
    return out
