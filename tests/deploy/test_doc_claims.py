"""The checkable claims of README.md and docs/ against the code: paths, links, metrics, alerts, values, keys.

"Each claim in the docs can be pointed to in the code": these are the classes of claim a test can check
mechanically. docs/install.md's commands and values blocks are checked against the rendered chart in
tests/deploy/test_docs.py; here, every page an operator or a user reads:

- every repository path a page names (`controller/watchers.py`, `tests/e2e/test_faults.py`) exists, and an
  identifier named beside a Python file (`shared/kube.py` `_read_env_once`, `controller/pod_watch.py:BOUND_GRACE`)
  is in that file;
- every relative link resolves, to a heading where it names one;
- every `mtsched_*` metric is one the roles export, with the labels named in `{...}` among its labels and the
  label values quoted there written somewhere in the code;
- every `Mtsched*` alert is in the chart's PrometheusRule;
- every value of docs/install.md's "Values reference" is in values.yaml with the default the table states;
- every key of README's configuration table is a configuration key with the default the table states;
- every `--set key=` of a `helm` command names a chart value, of an `mtsched` command a configuration key;
- the placement policies listed for each annotation are the ones the webhook accepts for it;
- every `Class.attribute` named is defined on that class (or a base), and every HTTP path named is a route one
  of the roles serves;
- a range README's configuration table gives a key (`(2..3600)`) is the one the configuration enforces;
- the durations and windows docs/runbooks.md gives an alert (`for 2 minutes`, `in 10 minutes`) are the rule's.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import json
import pkgutil
import re
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *(ROOT / "docs" / f"{n}.md" for n in
                              ("rules", "runbooks", "redis-layout", "architecture", "install"))]
VALUES = ROOT / "deploy" / "helm" / "hami" / "values.yaml"
RULES = ROOT / "deploy" / "helm" / "hami" / "templates" / "monitoring" / "prometheusrule.yaml"
CODE_DIRS = ("shared", "controller", "webhook")


def _text(page: Path) -> str:
    return page.read_text()


def _where(page: Path, text: str, pos: int) -> str:
    return f"{page.relative_to(ROOT)}:{text[:pos].count(chr(10)) + 1}"


def _prose(text: str) -> str:
    """The page without its fenced blocks and inline code (for links), lengths kept so positions stay."""
    text = re.sub(r"```.*?```", lambda m: " " * len(m.group(0)), text, flags=re.S)
    return re.sub(r"`[^`]*`", lambda m: " " * len(m.group(0)), text)


@cache
def _code() -> str:
    parts = [p.read_text() for d in CODE_DIRS for p in sorted((ROOT / d).rglob("*.py"))]
    parts += [p.read_text() for p in sorted((ROOT / "shared" / "store" / "lua").glob("*.lua"))]
    return "\n".join(parts)


# -- paths and identifiers ---------------------------------------------------------------------------------

PATH = re.compile(r"(?<![\w./-])((?:shared|controller|webhook|deploy|tests|bench|docs)/[\w./-]*\w)")


def test_every_named_path_exists() -> None:
    missing = []
    for page in PAGES:
        text = _text(page)
        for m in PATH.finditer(text):
            path = m.group(1)
            if path.startswith("deploy/hami-") or path == "deploy/mt-controller-manager":
                continue  # kubectl's deploy/<name>, not a path
            if not (ROOT / path).exists() and not (ROOT / (path + ".py")).exists():  # controller/extender (N)
                missing.append(f"{_where(page, text, m.start())}: {path}")
    assert not missing, "\n".join(missing)


IDENT = re.compile(r"`((?:shared|controller|webhook|deploy|bench)/[\w/]+\.(?:py|lua))(?::(\w+))?`"
                   r"(?:\s*`([\w.]+)(?:\(\))?`)?")


def test_identifiers_named_beside_a_file_are_in_it() -> None:
    missing = []
    for page in PAGES:
        text = _text(page)
        for m in IDENT.finditer(text):
            path, idents = m.group(1), [i for i in (m.group(2), m.group(3)) if i]
            src = (ROOT / path).read_text()
            for ident in idents:
                for part in ident.split("."):
                    if not re.search(rf"\b{re.escape(part)}\b", src):
                        missing.append(f"{_where(page, text, m.start())}: {part} is not in {path}")
    assert not missing, "\n".join(missing)


# -- links ---------------------------------------------------------------------------------------------------

def _slug(heading: str) -> str:
    s = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return s.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    out: set[str] = set()
    seen: dict[str, int] = {}
    for line in re.sub(r"```.*?```", "", page.read_text(), flags=re.S).splitlines():
        m = re.match(r"#+\s+(.*)", line)
        if m:
            s = _slug(m.group(1))
            n = seen.get(s, 0)
            seen[s] = n + 1
            out.add(s if n == 0 else f"{s}-{n}")
    return out


def test_every_relative_link_resolves() -> None:
    broken = []
    for page in PAGES:
        text = _text(page)
        for m in re.finditer(r"\]\(([^)\s]+)\)", _prose(text)):
            link = m.group(1)
            if re.match(r"[a-z]+:", link):
                continue
            path, _, frag = link.partition("#")
            target = (page.parent / path).resolve() if path else page
            if not target.exists():
                broken.append(f"{_where(page, text, m.start())}: {link} (no such file)")
            elif frag and target.suffix == ".md" and frag not in _anchors(target):
                broken.append(f"{_where(page, text, m.start())}: {link} (no such heading)")
    assert not broken, "\n".join(broken)


# -- metrics and alerts --------------------------------------------------------------------------------------

@cache
def _metric_labels() -> dict[str, tuple[str, ...]]:
    """Every metric the roles' modules register, by exposed name, with its label names."""
    from prometheus_client import REGISTRY

    for pkg in CODE_DIRS:
        for mod in pkgutil.walk_packages([str(ROOT / pkg)], pkg + "."):
            importlib.import_module(mod.name)
    out: dict[str, tuple[str, ...]] = {}
    for collector, names in REGISTRY._collector_to_names.items():  # collect() lists no labels of unused metrics
        for name in names:
            out[name] = tuple(getattr(collector, "_labelnames", ()) or ())
    return out


def _card_metrics() -> str:
    """The per-card gauges are rendered as text from the mirror, not registered."""
    return (ROOT / "shared" / "store" / "card_metrics.py").read_text()


METRIC = re.compile(r"(?<![\w/.-])((?:mtsched|hami)_[a-z0-9_]+)(\{[^}]*\})?")


def test_every_metric_named_is_exported_with_its_labels() -> None:
    known = _metric_labels()
    problems = []
    for page in PAGES:
        text = _text(page)
        for m in METRIC.finditer(text):
            name, braces = m.group(1), m.group(2)
            if name.endswith("_"):
                continue  # a prefix in prose ("mtsched_card_memory_allocated_units / _limit_units")
            where = _where(page, text, m.start())
            base = re.sub(r"_(total|bucket|count|sum)$", "", name)
            labels = known.get(name, known.get(base))
            if labels is None:
                if not re.search(rf"\b{re.escape(name)}\b", _card_metrics()):
                    problems.append(f"{where}: {name} is not exported")
                continue
            for part in (braces or "{}")[1:-1].split(","):
                label = re.split(r"=~|!=|=", part)[0].strip().strip("`")
                if not label:
                    continue
                if label not in labels:
                    problems.append(f"{where}: {name} has no label {label!r} (labels: {', '.join(labels)})")
                for quoted in re.findall(r'"([^"]+)"', part):
                    for value in quoted.split("|"):
                        if f'"{value}"' not in _code() and f"'{value}'" not in _code():
                            problems.append(f"{where}: {name}{{{label}}}: {value!r} is written nowhere in the code")
    assert not problems, "\n".join(problems)


def test_every_alert_named_is_in_the_rules() -> None:
    alerts = set(re.findall(r"alert: (\w+)", RULES.read_text()))
    missing = []
    for page in PAGES:
        text = _text(page)
        for m in re.finditer(r"\b(Mtsched[A-Z]\w+)", text):
            if m.group(1) not in alerts:
                missing.append(f"{_where(page, text, m.start())}: {m.group(1)}")
    assert not missing, "\n".join(missing)


# -- chart values and configuration keys ---------------------------------------------------------------------

@cache
def _values() -> dict[str, Any]:
    return dict(yaml.safe_load(VALUES.read_text()))


_MISSING = object()


def _value(path: str) -> Any:
    node: Any = _values()
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return _MISSING
        node = node[part]
    return node


def _settable(path: str) -> bool:
    """A chart value, or a key inside a map value the chart leaves empty (`monitoring.podMonitor.labels.release`)."""
    parts = path.split(".")
    return _value(path) is not _MISSING or any(
        _value(".".join(parts[:i])) == {} for i in range(1, len(parts)))


def _empty(v: Any) -> bool:
    return v in ("", None) or (isinstance(v, dict | list) and all(_empty(x) for x in
                                                                   (v.values() if isinstance(v, dict) else v)))


def _same(stated: str, actual: Any) -> bool:
    """Does a default as the table writes it (`true`, `[96]`, `""`, `…/sgpu-memory`) say `actual`?"""
    if stated in ("release namespace", "appVersion", "none", "in-cluster"):
        return _empty(actual)
    if stated.startswith("…"):
        return isinstance(actual, str) and actual.endswith(stated[1:])
    try:
        parsed = yaml.safe_load(stated)
    except yaml.YAMLError:
        parsed = stated
    if _empty(parsed) and _empty(actual):
        return True
    return bool(parsed == actual or str(parsed) == str(actual))


def _stated(cell: str) -> list[str]:
    """The defaults of one table cell: `a` / `b`, or `a`, `b` for a brace list; the first backticked word of each."""
    items = re.split(r" / |, (?=`|appVersion|release namespace)", cell)
    out = []
    for item in items:
        m = re.match(r"\s*`([^`]*)`", item)
        out.append(m.group(1) if m else item.strip().split(" (")[0])
    return out


def _value_rows() -> list[tuple[str, list[str], list[str]]]:
    text = _text(ROOT / "docs" / "install.md")
    table = text[text.index("## Values reference"):text.index("## Differences from HAMi")]
    rows = []
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2 or not cells[0].startswith("`") or cells[0].startswith("`<"):
            continue
        names = re.findall(r"`([^`]+)`", cells[0])
        first = names[0]
        brace = re.match(r"(.*)\.\{([^}]*)\}$", first)
        if brace:
            paths = [f"{brace.group(1)}.{n}" for n in brace.group(2).split(",")]
        else:
            parent = first.rsplit(".", 1)[0] + "." if "." in first else ""
            paths = [first] + [n if n.startswith(("scheduler.", "webhook.", "watcher.")) else parent + n
                               for n in names[1:]]
        rows.append((line, paths, _stated(cells[1]) if cells[1] else []))
    return rows


def test_values_reference_names_chart_values_with_their_defaults() -> None:
    rows = _value_rows()
    assert len(rows) >= 35
    problems = []
    for line, paths, stated in rows:
        for i, path in enumerate(paths):
            actual = _value(path)
            if actual is _MISSING:
                problems.append(f"{path}: not in values.yaml ({line[:60]}...)")
            elif stated and i < len(stated) and not _same(stated[i], actual):
                problems.append(f"{path}: the table says {stated[i]!r}, values.yaml has {actual!r}")
    assert not problems, "\n".join(problems)


@cache
def _config_defaults() -> dict[str, Any]:
    """Every configuration key with its default, as `mtsched check-config` prints them (controller/cli.py)."""
    from shared.config import key_of, load_config

    cfg = load_config(None, env={})
    raw = dataclasses.asdict(cfg)
    raw["memory_per_card"] = [m.memory for m in cfg.models]
    return {key_of(k): json.loads(json.dumps(v, default=str)) for k, v in raw.items()}


def test_readme_configuration_table_names_keys_with_their_defaults() -> None:
    text = _text(ROOT / "README.md")
    table = text[text.index("| key | default | meaning |"):]
    table = table[:table.index("\n\n")]
    defaults = _config_defaults()
    problems = []
    rows = 0
    for line in table.splitlines()[2:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        keys = re.findall(r"`(\w+)`", cells[0])
        stated = re.sub(r"\s*\([^)]*\)", "", cells[1])  # "`0` (chart: `1`)": the role's own default
        values = [v.strip() for v in stated.split(" / ")]
        rows += 1
        for i, key in enumerate(keys):
            if key not in defaults:
                problems.append(f"README configuration table: {key} is no configuration key")
                continue
            if len(values) == len(keys):
                word = re.sub(r"^`|`$", "", values[i])
                if key in ("listen",):  # per role: shared/serving/listen.py
                    continue
                if not _same(word, defaults[key]):
                    problems.append(f"README configuration table: {key} default {word!r}, the code's "
                                    f"{defaults[key]!r}")
    assert rows >= 30
    assert not problems, "\n".join(problems)


def test_every_set_flag_names_a_value_or_key() -> None:
    keys = set(_config_defaults()) | {"key"}  # `--set key=value`, the syntax itself
    problems = []
    for page in PAGES:
        text = _text(page)
        for m in re.finditer(r"--set ([A-Za-z0-9_.]+)=", text):
            flag = m.group(1)
            command = text[:m.start()].rsplit("\n", 1)[-1] + text[m.start():].split("\n", 1)[0]
            start = text.rfind("helm ", 0, m.start())
            mt = text.rfind("mtsched ", 0, m.start())
            is_helm = "helm " in command or (start > mt and "\\\n" in text[start:m.start()])
            if flag == "device.mthreads.enabled":  # the old guide's typo, documented as ignored
                continue
            if is_helm and not _settable(flag):
                problems.append(f"{_where(page, text, m.start())}: --set {flag} is no chart value")
            if not is_helm and flag not in keys and not _settable(flag):
                problems.append(f"{_where(page, text, m.start())}: --set {flag} is no configuration key")
    assert not problems, "\n".join(problems)


# -- placement policies ----------------------------------------------------------------------------------------

POLICY_LIST = re.compile(r"`(hami\.io/(?:node|gpu)-scheduler-policy)`(?:\s*/\s*`(hami\.io/(?:node|gpu)-scheduler-"
                         r"policy)`)?\s*\(([^)]*)\)")


@pytest.mark.parametrize("page", [ROOT / "README.md", ROOT / "docs" / "rules.md"], ids=lambda p: p.name)
def test_placement_policies_listed_are_accepted(page: Path) -> None:
    """A policy a page lists for an annotation is one the webhook accepts on it (shared/domain/admission.py)."""
    from shared.domain.admission import policy_problems

    text = _text(page)
    found = 0
    problems = []
    for m in POLICY_LIST.finditer(text):
        values = [v for v in re.findall(r"`([a-z-]+)`", m.group(3))]
        for key in filter(None, (m.group(1), m.group(2))):
            for value in values:
                found += 1
                if policy_problems({key: value}):
                    problems.append(f"{_where(page, text, m.start())}: {key}: {value} is refused")
    assert found >= 5
    assert not problems, "\n".join(problems)


def test_the_cordon_example_cordons_the_card() -> None:
    """docs/rules.md's `kubectl annotate ... hami.io/device-cordon=...` takes that card out (shared/domain/node.py)."""
    from shared.config import load_config
    from shared.domain.node import node_inventory

    text = _text(ROOT / "docs" / "rules.md")
    m = re.search(r"kubectl annotate node (\S+) --overwrite hami\.io/device-cordon=([\w-]+)", text)
    assert m is not None
    node, value = m.group(1), m.group(2)
    index = int(value.rsplit("-", 1)[1])
    inv = node_inventory({"metadata": {"name": node, "annotations": {"hami.io/device-cordon": value}},
                          "status": {"capacity": {"mthreads.com/sgpu-core": "64", "mthreads.com/sgpu-memory": "640"}}},
                         load_config(None, env={}, flags={"memoryPerCard": [160]}))
    assert [c.index for c in inv.cards if c.cordoned] == [index]


def test_objects_the_operator_commands_name_are_rendered(helm: Path) -> None:
    """The kubectl commands and object names of README.md and docs/ (runbooks above all) name objects the chart
    renders with every optional part on: Deployments and DaemonSets, their containers, the label selectors, the
    Lease, the admission policies and the NetworkPolicies (docs/install.md alone: tests/deploy/test_docs.py)."""
    from tests.deploy._chart import Case, find, objects, template

    objs = objects(template(helm, Case(
        {"nodeAgent": {"enabled": True}, "networkPolicy": {"enabled": True},
         "monitoring": {"dashboard": {"enabled": True}, "prometheusRule": {"enabled": True}}})).stdout)
    workloads = {o["metadata"]["name"]: o for o in find(objs, "Deployment") + find(objs, "DaemonSet")}
    names = {(o["kind"], o["metadata"]["name"]) for o in objs}
    components = {o["spec"]["template"]["metadata"]["labels"].get("app.kubernetes.io/component")
                  for o in workloads.values()}
    sched_cfg = yaml.safe_load(next(o for o in find(objs, "ConfigMap") if o["metadata"]["name"] == "hami-scheduler")
                               ["data"]["scheduler-config.yaml"])
    problems = []
    for page in PAGES:
        text = _text(page)
        for m in re.finditer(r"\b(?:deploy|daemonset|ds)/(hami-[a-z-]*[a-z])(?: -c ([a-z-]+))?", text):
            w = workloads.get(m.group(1))
            if w is None:
                problems.append(f"{_where(page, text, m.start())}: no Deployment or DaemonSet {m.group(1)}")
            elif m.group(2) and m.group(2) not in [c["name"] for c in w["spec"]["template"]["spec"]["containers"]]:
                problems.append(f"{_where(page, text, m.start())}: {m.group(1)} has no container {m.group(2)}")
        for m in re.finditer(r"-l app\.kubernetes\.io/component=([a-z-]+)", text):
            if m.group(1) not in components:
                problems.append(f"{_where(page, text, m.start())}: no pods of component {m.group(1)}")
        for m in re.finditer(r"get lease ([a-z-]+)", text):
            if m.group(1) != sched_cfg["leaderElection"]["resourceName"]:
                problems.append(f"{_where(page, text, m.start())}: kube-scheduler's Lease is not {m.group(1)}")
        for m in re.finditer(r"(?:validatingadmissionpolicybinding |(?<!Network)[Pp]olicy `)(hami-[a-z-]*[a-z])", text):
            if ("ValidatingAdmissionPolicy", m.group(1)) not in names:
                problems.append(f"{_where(page, text, m.start())}: no ValidatingAdmissionPolicy {m.group(1)}")
        for m in re.finditer(r"NetworkPolicy `(hami-[a-z-]*[a-z])`", text):
            if ("NetworkPolicy", m.group(1)) not in names:
                problems.append(f"{_where(page, text, m.start())}: no NetworkPolicy {m.group(1)}")
    assert not problems, "\n".join(problems)


# -- classes, attributes and routes ----------------------------------------------------------------------------

# Classes the pages name that are not ours: redis-py's, and the ExtenderArgs field kube-scheduler sends
FOREIGN_CLASSES = {"RedisCluster", "Nodes"}


@cache
def _class_attributes() -> dict[str, set[str]]:
    """Every class of the repository's Python (tests included: a page may name a test's helper) with the names it
    defines or assigns on self, its bases' included."""
    own: dict[str, set[str]] = {}
    bases: dict[str, set[str]] = {}
    for d in (*CODE_DIRS, "deploy", "bench", "tests"):
        for path in sorted((ROOT / d).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, ast.ClassDef):
                    continue
                names = own.setdefault(node.name, set())
                bases.setdefault(node.name, set()).update(
                    b.id if isinstance(b, ast.Name) else b.attr
                    for b in node.bases if isinstance(b, ast.Name | ast.Attribute))
                for sub in ast.walk(node):
                    if isinstance(sub, ast.FunctionDef | ast.AsyncFunctionDef):
                        names.add(sub.name)
                    elif isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) and sub.value.id == "self":
                        names.add(sub.attr)
                    elif isinstance(sub, ast.AnnAssign) and isinstance(sub.target, ast.Name):
                        names.add(sub.target.id)
                    elif isinstance(sub, ast.Assign):
                        names.update(t.id for t in sub.targets if isinstance(t, ast.Name))

    def closed(name: str, seen: frozenset[str] = frozenset()) -> set[str]:
        out = set(own.get(name, ()))
        for base in bases.get(name, ()):
            if base not in seen:
                out |= closed(base, seen | {name})
        return out

    return {name: closed(name) for name in own}


def test_every_class_attribute_named_is_defined() -> None:
    """`Ledger.reread`, `Reconciler.touch`, `Confirmations._rebook`: the class exists and defines that name."""
    classes = _class_attributes()
    problems = []
    found = 0
    for page in PAGES:
        text = _text(page)
        for m in re.finditer(r"`([A-Z][A-Za-z0-9_]*)\.([a-z_][A-Za-z0-9_]*)(?:\(\))?`", text):
            cls, attr = m.groups()
            if cls in FOREIGN_CLASSES:
                continue
            found += 1
            if cls not in classes:
                problems.append(f"{_where(page, text, m.start())}: no class {cls} (for {cls}.{attr})")
            elif attr not in classes[cls]:
                problems.append(f"{_where(page, text, m.start())}: {cls} defines no {attr}")
    assert found >= 50
    assert not problems, "\n".join(problems)


def _routes() -> set[str]:
    return set(re.findall(r"router\.add_(?:get|post)\(\"(/[^\"]*)\"", _code()))


def test_every_http_path_named_is_served() -> None:
    """`/filter`, `/mutate`, `/debug/explain?pod=...`, `/readyz`: routes of the extender, the webhook or every
    role's health port (file paths such as `/proc/sgpu_km` and a URL's `/0` are not HTTP paths)."""
    routes = _routes()
    assert {"/filter", "/bind", "/mutate", "/readyz", "/metrics"} <= routes
    problems = []
    found = 0
    for page in PAGES:
        text = _text(page)
        for m in re.finditer(r"`(?:GET |POST )?(/[a-z][a-z/]*)(?:\?[^`]*)?`", text):
            path = m.group(1)
            if path.split("/")[1] in ("proc", "etc", "host", "run", "dev", "tmp", "var", "data", "mymaster"):
                continue
            found += 1
            if path not in routes:
                problems.append(f"{_where(page, text, m.start())}: {path} is no route (routes: {sorted(routes)})")
    assert found >= 10
    assert not problems, "\n".join(problems)


# -- numbers users rely on -----------------------------------------------------------------------------------

def test_readme_configuration_ranges_are_enforced() -> None:
    """A range in a row of README's configuration table (`(2..3600)`, `(60-3600; ...)`) is what the configuration
    accepts for the row's first key: both ends load, one past either end is refused naming the key."""
    from shared.config import ConfigError, load_config

    text = _text(ROOT / "README.md")
    table = text[text.index("| key | default | meaning |"):]
    table = table[:table.index("\n\n")]
    checked = []
    for line in table.splitlines()[2:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        key = re.findall(r"`(\w+)`", cells[0])[0]
        for lo, hi in re.findall(r"\((\d+)(?:\.\.|-)(\d+)[;)]", cells[2]):
            checked.append(key)
            for value in (int(lo), int(hi)):
                load_config(None, env={}, flags={key: value})
            for value in (int(lo) - 1, int(hi) + 1):
                if value == 0 and key == "leaderYieldSeconds":
                    continue  # 0: never, as the row says
                with pytest.raises(ConfigError, match=key):
                    load_config(None, env={}, flags={key: value})
    assert {"reconcileSeconds", "watchersLostAfterSeconds", "cardKnobsSeconds", "leaderYieldSeconds"} <= set(checked)


_MINUTES = {"a": 1, "one": 1, "two": 2}


def _minutes(word: str) -> int:
    return _MINUTES[word] if word in _MINUTES else int(word)


def test_runbook_alert_durations_are_the_rules() -> None:
    """Each `### Mtsched...` section of docs/runbooks.md that says how long a condition lasts before the alert
    fires (`for 2 minutes`) or over which window it counts (`in the last 10 minutes`) says what the chart's rule
    does: its `for:` and its range `[10m]`."""
    rules = {m.group(1): (m.group(2), m.group(3)) for m in re.finditer(
        r"- alert: (\w+)\n\s+expr: (.*)\n(?:\s+for: (\d+)m)?", RULES.read_text())}
    text = _text(ROOT / "docs" / "runbooks.md")
    problems = []
    checked = 0
    for m in re.finditer(r"^### (Mtsched\w+)\n(.*?)(?=^##)", text, flags=re.M | re.S):
        name, body = m.group(1), m.group(2)
        expr, wait = rules[name]
        for said in re.findall(r"\b[Ff]or\s+(a|one|two|\d+)\s+minutes?\b", body):
            checked += 1
            if wait is None or _minutes(said) != int(wait):
                problems.append(f"{name}: the runbook says for {said} minute(s), the rule's for: is {wait}m")
        for said in re.findall(r"\bin\s+(?:the\s+last\s+)?(\d+)\s+minutes\b", body):
            checked += 1
            if f"[{said}m]" not in expr:
                windows = re.findall(r"\[(\w+)\]", expr)
                problems.append(f"{name}: the runbook says in {said} minutes, the rule counts over {windows}")
    assert checked >= 9
    assert not problems, "\n".join(problems)


def test_scripts_send_only_commands_the_documented_acl_grants() -> None:
    """Redis checks each command a script sends against the caller's ACL user: a command in a .lua file that
    docs/install.md's rule line does not grant fails only on the path that sends it, under that user (HEXISTS in
    _lib.lua did, found by reading). Read statically, so a path no test takes is covered too."""
    line = re.search(r"^~mt:\* &mt:feed (\+.*)$", _text(ROOT / "docs" / "install.md"), flags=re.M)
    assert line, "docs/install.md: the ACL rule line is gone"
    granted = {g[1:].split("|")[0].upper() for g in line.group(1).split()}
    sent: dict[str, set[str]] = {}
    for lua in sorted((ROOT / "shared" / "store" / "lua").glob("*.lua")):
        for cmd in re.findall(r"redis\.p?call\(\s*['\"](\w+)['\"]", lua.read_text()):
            sent.setdefault(cmd.upper(), set()).add(lua.name)
    assert {"HGET", "HSET", "PUBLISH", "TIME", "INFO"} <= sent.keys()  # the scan reads the scripts' calls
    missing = {c: sorted(files) for c, files in sent.items() if c not in granted}
    assert not missing, f"commands the scripts send that docs/install.md's ACL does not grant: {missing}"
