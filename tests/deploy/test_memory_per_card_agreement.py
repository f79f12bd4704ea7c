"""`devices.mthreads.memoryPerCard` is judged twice: by the chart at install (templates/_helpers.tpl,
hami.memoryPerCard) and by the roles at start (shared/domain/models.py parse_memory_per_card, through
shared/config.py). One table of spellings goes through both: each is accepted by both, the chart rendering exactly
the models the roles read (sorted, each once), or refused by both, the chart's message naming the field, the value
and what is allowed.

The roles' rule is the reference. Where the two disagreed, and which side moved:
  - a whole float (96.0, [96.0, 160.0]): the roles refused it; the chart cannot tell it from 96 (Helm reads every
    number of a values file as a float), so the roles now take it too
  - a blank piece of a comma string ("96,,160", "96,"): the chart refused it, the roles skip it
  - null: the chart refused it ("is empty"), the roles read their default, 96
  - a duplicate or an order ([96, 96], [160, 96]): both accepted, but the chart rendered the list as given; it now
    renders the roles' list
  - int()'s extras ("9 6", "9_6", "+96", other scripts' digits) and brackets stripped twice ("[[96]]"): the roles
    read them as 96, the chart refused them; the roles now refuse them too
  - a quoted entry or a quoted string ('"96,160"', '["96", "160"]', [96, '"160"'], "'96'"): the chart accepted them
    (`--set x={96,"160"}` keeps the quotes), the roles refused them; the roles now take them too
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from shared.config import ConfigError, load_config
from shared.domain.models import MAX_MODEL_UNITS
from tests.deploy._chart import CHART, Json, embedded, objects, run_helm

FIELD = "devices.mthreads.memoryPerCard"
# Deterministic renders (no generated certificate or Redis password), as deploy/manifests/render.sh.
FIXED = ("tls.mode=external", "redis.auth.existingSecret=hami-redis-auth")


def _named(value: Any) -> str:
    """A value as the chart's message names it (toRawJson)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


class Refused:
    """Refused by both; the chart's message names the whole value."""


REFUSED = Refused()
# (spelling, the models both read), (spelling, REFUSED), or (spelling, how the chart's refusal names the value when
# it names an entry rather than the whole value)
ROWS: list[tuple[Any, tuple[int, ...] | Refused | str]] = [
    # the forms the docs give
    ([96], (96,)),
    ([160], (160,)),
    (96, (96,)),
    (160, (160,)),
    ([96, 160], (96, 160)),
    ("96,160", (96, 160)),
    ("[96, 160]", (96, 160)),
    ("160", (160,)),
    ("96, 160", (96, 160)),
    ([96, "160"], (96, 160)),
    (["96", " 160 "], (96, 160)),
    ("096", (96,)),
    ([2, MAX_MODEL_UNITS], (2, MAX_MODEL_UNITS)),
    # rendered as the roles read it: sorted, each model once (the chart kept the order and the duplicate)
    ([160, 96], (96, 160)),
    ([96, 96], (96,)),
    ("160,96,160", (96, 160)),
    # a whole float (the roles refused it; a values file's 96 reaches the chart as 96.0)
    (96.0, (96,)),
    ([96.0, 160.0], (96, 160)),
    # blank pieces of a comma string are skipped (the chart refused them)
    ("96,,160", (96, 160)),
    ("96,", (96,)),
    # null: the roles' default (the chart refused it)
    (None, (96,)),
    # quotes, as --set keeps them (the roles refused them)
    ([96, '"160"'], (96, 160)),
    ('"96,160"', (96, 160)),
    ('["96", "160"]', (96, 160)),
    ("'96'", (96,)),
    ("[96", (96,)),  # one bracket: both let it through
    # refused by both: empty
    ([], REFUSED),
    ("", REFUSED),
    (" ", REFUSED),
    (",", REFUSED),
    ("[]", REFUSED),
    ("[ ]", REFUSED),
    # not a whole number (the roles read "9 6", "9_6", "+96" and "٩٦" as 96 and "[[96]]" as 96)
    ("abc", REFUSED),
    ("96.0", REFUSED),
    (160.5, REFUSED),
    (True, REFUSED),
    ({"s5000": 160}, REFUSED),
    ("9 6", REFUSED),
    ("9_6", REFUSED),
    ("+96", REFUSED),
    ("٩٦", REFUSED),
    ("[[96]]", REFUSED),
    # blanks are Go's (strings.TrimSpace, the chart's trim): Python's strip() also took \x1c-\x1f; quotes around a
    # line break stay (the chart's regexp's `.` matches no newline): the roles read both as 96 (red team)
    ("96\x1c", REFUSED),
    ("\x1f96", REFUSED),
    ('"96\n"', REFUSED),
    ([96, "'160\n'"], REFUSED),
    ("\u00a096", (96,)),
    ("\u3000160,\u2028 96", (96, 160)),
    ("1e2", REFUSED),
    ("96;160", REFUSED),
    ([96, "abc"], REFUSED),
    ([96, ""], REFUSED),
    ([96, None], REFUSED),
    ([96, 160.5], REFUSED),
    ([True], REFUSED),
    ([[96, 160]], REFUSED),
    ([96, {"s5000": 160}], REFUSED),
    (["96,160"], REFUSED),
    # out of range
    (0, REFUSED),
    (1, REFUSED),
    (-1, REFUSED),
    ("-1", REFUSED),
    (MAX_MODEL_UNITS + 1, REFUSED),
    ("99999999999999999999", REFUSED),
    ([96, -160], REFUSED),
    # the cards' GiB: the message names the entry and the units to write
    (48, "entry 48"),
    (80, "entry 80"),
    ([96, 48], "entry 48"),
    ("96,80", "entry 80"),
]


def _roles(value: Any, tmp_path: Path) -> tuple[int, ...] | str:
    """What the roles make of the value in their configuration file (the Helm-values form, and the flat form)."""
    read: list[tuple[int, ...] | str] = []
    for i, doc in enumerate(({"devices": {"mthreads": {"memoryPerCard": value}}}, {"memoryPerCard": value})):
        path = tmp_path / f"config-{i}.yaml"
        path.write_text(json.dumps(doc, ensure_ascii=False))  # JSON is YAML: the value arrives typed as written
        try:
            read.append(tuple(m.memory for m in load_config(path, env={}).models))
        except ConfigError as e:
            read.append(str(e))
    assert isinstance(read[0], str) == isinstance(read[1], str) and (isinstance(read[0], str) or read[0] == read[1])
    return read[0]


def _chart(helm: Path, value: Any, tmp_path: Path) -> list[tuple[str, Json | str]]:
    """What the chart renders for the value from a values file and from --set-json: the roles' config.yaml, or the
    error. The values file is JSON (YAML's parsers differ on bare words: Helm's reads 1e2 as a number, PyYAML as a
    string), so that both sides get the value typed alike."""
    values = tmp_path / "values.json"
    values.write_text(json.dumps({"devices": {"mthreads": {"memoryPerCard": value}}}))
    base = ["template", "hami", str(CHART), "--namespace", "kube-system", "--show-only", "templates/config.yaml",
            *[a for s in FIXED for a in ("--set", s)]]
    out: list[tuple[str, Json | str]] = []
    for how, args in (("values file", ["-f", str(values)]),
                      ("--set-json", ["--set-json", f"{FIELD}={json.dumps(value)}"])):
        proc = run_helm(helm, [*base, *args], check=False)
        if proc.returncode:
            out.append((how, proc.stderr))
        else:
            out.append((how, embedded(objects(proc.stdout), "hami-config", "config.yaml")))
    return out


@pytest.mark.parametrize(("value", "expected"), ROWS, ids=[repr(v) for v, _ in ROWS])
def test_the_chart_accepts_what_the_roles_accept(helm: Path, tmp_path: Path, value: Any,
                                                 expected: tuple[int, ...] | Refused | str) -> None:
    roles = _roles(value, tmp_path)
    for how, chart in _chart(helm, value, tmp_path):
        if isinstance(expected, tuple):
            assert roles == expected, f"the roles: {roles}"
            assert isinstance(chart, dict), f"{how}: {chart}"
            assert chart["memoryPerCard"] == list(expected), f"{how}: the chart: {chart['memoryPerCard']}"
            # ... and the roles read the rendered configuration as it stands
            rendered = tmp_path / "rendered.yaml"
            rendered.write_text(json.dumps(chart))
            assert tuple(m.memory for m in load_config(rendered, env={}).models) == expected
        else:
            assert isinstance(roles, str) and "memoryPerCard" in roles, f"the roles accepted it: {roles}"
            assert isinstance(chart, str), f"{how}: the chart rendered {chart}"
            (error,) = [line for line in chart.splitlines() if line.startswith("Error:")]
            named = expected if isinstance(expected, str) else _named(value)
            assert FIELD in error and named in error, f"{how}: {error}"
            assert "allowed: whole numbers of 512 MiB units" in error or "the unit is 512 MiB: use" in error, error


def test_the_table_covers_the_chart_s_own_examples() -> None:
    """The spellings values.schema.json and values.yaml show are rows of the table."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    field = schema["properties"]["devices"]["properties"]["mthreads"]["properties"]["memoryPerCard"]
    default = yaml.safe_load((CHART / "values.yaml").read_text())["devices"]["mthreads"]["memoryPerCard"]
    spellings = [v for v, _ in ROWS]
    for example in [*field["examples"], default]:
        assert example in spellings, example
