"""The chart's settings with a fixed set of values (templates/_helpers.tpl, hami.choices): a wrong value fails
`helm template` with one message naming the field, the value given and the values allowed, e.g.

    scheduler.extender.scheme: "htp" is not allowed; use one of http, https

Before, values.schema.json refused them first with "at '/scheduler/extender/scheme': value must be one of 'http',
'https'" (the value given unnamed) and a wrong type with "got number, want string" (neither named); the schema now
only describes these fields.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from shared.config import Config
from tests.deploy._chart import CHART, Case, embedded, objects, one, template

# field -> (allowed values, what null or missing means; None: refused)
CHOICES: dict[str, tuple[tuple[str, ...], str | None]] = {
    "scheduler.extender.scheme": (("http", "https"), "http"),
    "tls.mode": (("generate", "certManager", "external"), "generate"),
    "scheduler.admissionWebhook.failurePolicy": (("Fail", "Ignore"), "Fail"),
    "scheduler.admissionWebhook.reinvocationPolicy": (("Never", "IfNeeded"), "Never"),
    # null: the roles' defaults (a missing key in their configuration), not "" (which every role refuses at start)
    "scheduler.defaultSchedulerPolicy.nodeSchedulerPolicy": (("binpack", "spread"), Config().node_scheduler_policy),
    "scheduler.defaultSchedulerPolicy.gpuSchedulerPolicy": (("binpack", "spread"), Config().gpu_scheduler_policy),
    # required by the schema: null is "missing property" (tests/deploy/test_redteam_user_values.py)
    "mtsched.logLevel": (("debug", "info", "warning", "error"), None),
    "mtsched.logFormat": (("json", "text"), None),
    "image.pullPolicy": (("Always", "IfNotPresent", "Never"), ""),
    "scheduler.kubeScheduler.image.pullPolicy": (("Always", "IfNotPresent", "Never"), ""),
    "redis.image.pullPolicy": (("Always", "IfNotPresent", "Never"), ""),
}
OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")
# Deterministic renders (no generated certificate or Redis password), as deploy/manifests/render.sh.
FIXED = ("tls.mode=external", "redis.auth.existingSecret=hami-redis-auth")
SCHEMA_WORDS = ("don't meet the specifications", "value must be one of", "want string")


def _nested(field: str, value: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    node = out
    *parents, last = field.split(".")
    for key in parents:
        node = node.setdefault(key, {})
    node[last] = value
    return out


def _message(field: str, value: Any, allowed: tuple[str, ...]) -> str:
    return f"{field}: {json.dumps(value, separators=(',', ':'))} is not allowed; use one of {', '.join(allowed)}"


def _refused(helm: Path, case: Case, message: str) -> None:
    proc = template(helm, case, check=False)
    assert proc.returncode != 0, "rendered"
    errors = [line for line in proc.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and errors[0].endswith(message), proc.stderr
    assert not any(w in proc.stderr for w in SCHEMA_WORDS), proc.stderr


WRONG: list[tuple[str, Any]] = [(f, v) for f, (allowed, _) in CHOICES.items()
                                for v in (allowed[0].swapcase(), allowed[0] + "x", "", 1, True, [allowed[0]])]


@pytest.mark.parametrize(("field", "value"), WRONG, ids=[f"{f}={v!r}" for f, v in WRONG])
def test_a_wrong_value_is_named_with_what_is_allowed(helm: Path, field: str, value: Any) -> None:
    _refused(helm, Case(_nested(field, value)), _message(field, value, CHOICES[field][0]))


@pytest.mark.parametrize("sets", [
    # --set gives a string, a number or a boolean as typed
    ("scheduler.extender.scheme=htp", 'scheduler.extender.scheme: "htp" is not allowed; use one of http, https'),
    ("scheduler.extender.scheme=1", "scheduler.extender.scheme: 1 is not allowed; use one of http, https"),
    ("mtsched.logLevel=warn", 'mtsched.logLevel: "warn" is not allowed; use one of debug, info, warning, error'),
    ("tls.mode=selfsigned", 'tls.mode: "selfsigned" is not allowed; use one of generate, certManager, external'),
])
def test_a_wrong_value_from_set(helm: Path, sets: tuple[str, str]) -> None:
    _refused(helm, Case(sets=(sets[0],)), sets[1])


@pytest.mark.parametrize("field", [f for f, (_, default) in CHOICES.items() if default is not None])
def test_null_is_the_default(helm: Path, field: str) -> None:
    """`--set field=null` deletes the chart's default (so does --reuse-values from a chart without the key): the
    render is the default's."""
    default = CHOICES[field][1]
    fixed = () if field == "tls.mode" else FIXED
    null = objects(template(helm, Case(sets=(*fixed, f"{field}=null"))).stdout)
    if field == "tls.mode":  # (generate: a new certificate each render)
        given = objects(template(helm, Case(sets=(f"{field}={default}",))).stdout)
        assert [(o["kind"], o["metadata"]["name"]) for o in null] == [(o["kind"], o["metadata"]["name"]) for o in given]
    elif default:
        assert null == objects(template(helm, Case(sets=(*fixed, f"{field}={default}"))).stdout)
    else:  # no pull policy: Kubernetes' own default
        def unset(objs: list[dict[str, Any]]) -> int:
            return sum(1 for o in objs if o["kind"] in ("Deployment", "DaemonSet", "StatefulSet")
                       for c in o["spec"]["template"]["spec"]["containers"] if c.get("imagePullPolicy") is None)
        assert unset(null) > unset(objects(template(helm, Case(sets=fixed)).stdout))
    if field.startswith("scheduler.defaultSchedulerPolicy."):
        assert embedded(null, "hami-config", "config.yaml")[field.rsplit(".", 1)[1]] == default


@pytest.mark.parametrize(("field", "value"), [(f, v) for f, (allowed, _) in CHOICES.items() for v in allowed])
def test_every_allowed_value_renders(helm: Path, field: str, value: str) -> None:
    template(helm, Case(_nested(field, value)))


@pytest.mark.parametrize("operator", ["in", "Equals", "", 1, None])
def test_a_wrong_selector_operator_is_named(helm: Path, operator: Any) -> None:
    """(an objectSelector is refused whole, tests/deploy/test_chart.py)"""
    expressions = [{"key": "team", "operator": "In", "values": ["ml"]}, {"key": "gpu", "operator": operator}]
    case = Case({"scheduler": {"admissionWebhook": {"namespaceSelector": {"matchExpressions": expressions}}}})
    _refused(helm, case, _message("scheduler.admissionWebhook.namespaceSelector.matchExpressions[1].operator",
                                  operator, OPERATORS))


@pytest.mark.parametrize("operator", OPERATORS)
def test_every_operator_renders(helm: Path, operator: str) -> None:
    expression = {"key": "team", "operator": operator, **({"values": ["ml"]} if operator in ("In", "NotIn") else {})}
    objs = objects(template(helm, Case({"scheduler": {"admissionWebhook": {"namespaceSelector": {
        "matchExpressions": [expression]}}}})).stdout)
    hook = one(objs, "MutatingWebhookConfiguration", "hami-webhook")["webhooks"][0]
    assert expression in hook["namespaceSelector"]["matchExpressions"]


def _schema_node(schema: dict[str, Any], field: str) -> dict[str, Any]:
    node = schema
    for key in field.split("."):
        node = node["properties"][key]
        while "$ref" in node:
            node = schema["definitions"][node["$ref"].rsplit("/", 1)[1]]
    return node


def test_the_table_is_the_chart_s_and_the_schema_only_describes() -> None:
    """The table above is hami.choices' list; values.schema.json refuses none of these fields (its enum or type
    would answer first, with the worse message) and its description names what is allowed."""
    helpers = (CHART / "templates" / "_helpers.tpl").read_text()
    block = helpers[helpers.index('{{- define "hami.choices" -}}'):]
    block = block[:block.index("{{- end -}}")]
    assert set(re.findall(r'^\s+"([A-Za-z.]+)" ', block, re.M)) == set(CHOICES)
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert '"enum"' not in (CHART / "values.schema.json").read_text()
    operator = _schema_node(schema, "scheduler.admissionWebhook.namespaceSelector")
    operator = operator["properties"]["matchExpressions"]["items"]["properties"]["operator"]
    for field, node in [*((f, _schema_node(schema, f)) for f in CHOICES), ("operator", operator)]:
        allowed = CHOICES[field][0] if field in CHOICES else OPERATORS
        assert set(node) == {"description"}, (field, node)
        assert all(v in node["description"] for v in allowed), (field, node)
