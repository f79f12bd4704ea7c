"""`devices.mthreads.memoryPerCard`: every wrong value fails `helm template` with one message naming the field, the
value given and what is allowed; every accepted form renders exactly what its plain list renders.

The chart's helper (templates/_helpers.tpl, hami.memoryPerCard) is the one place the value is judged:
values.schema.json only describes it. Before, a wrong value got the schema's internals ("'oneOf' failed, none
matched / got string, want array / ... does not match pattern '^\\s*\\[?...'"), an empty list "minItems: got 0, want
1" beside two unrelated alternatives, and a quoted number in a list ([96, "160"]) was refused although "160" and
"96,160" alone were accepted. What is accepted, and the list it renders, is the roles' rule
(tests/deploy/test_memory_per_card_agreement.py holds the two to one table).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from shared.domain.models import MAX_MODEL_UNITS
from tests.deploy._chart import Case, check_config, embedded, objects, template

FIELD = "devices.mthreads.memoryPerCard"
ALLOWED = ("allowed: whole numbers of 512 MiB units per card, one per card model (96 for MTT S4000, 160 for MTT "
           "S5000), as one number or a list, e.g. 96 or [96, 160]")
# What the schema said before the helper judged the value alone.
SCHEMA_WORDS = ("oneOf", "want array", "want integer", "does not match pattern", "minItems", "schema")
# Deterministic renders (no generated certificate, no generated Redis password), as deploy/manifests/render.sh.
FIXED = ("tls.mode=external", "redis.auth.existingSecret=hami-redis-auth")


def _mt(value: Any) -> dict[str, Any]:
    return {"devices": {"mthreads": {"memoryPerCard": value}}}


def _case(form: Any) -> Case:
    """A form is a value for a values file, or ("--set", "VALUE") for `--set devices.mthreads.memoryPerCard=VALUE`."""
    if isinstance(form, tuple) and form[:1] == ("--set",):
        return Case(sets=(*FIXED, f"{FIELD}={form[1]}"))
    return Case(_mt(form), sets=FIXED)


BAD: list[tuple[Any, str]] = [
    # a non-number string, an empty one, a float (typed in a values file, or a string from --set)
    ("abc", f'{FIELD} "abc" is not a whole number; {ALLOWED}'),
    (("--set", "abc"), f'{FIELD} "abc" is not a whole number; {ALLOWED}'),
    ("", f'{FIELD} "" is empty: list at least one card model; {ALLOWED}'),
    (("--set", ""), f'{FIELD} "" is empty: list at least one card model; {ALLOWED}'),
    (" ", f'{FIELD} " " is empty'),
    ("[]", f'{FIELD} "[]" is empty'),
    (96.5, f"{FIELD} 96.5 is not a whole number; {ALLOWED}"),
    (("--set", "96.5"), f'{FIELD} "96.5" is not a whole number; {ALLOWED}'),
    ("96.0", f'{FIELD} "96.0" is not a whole number'),  # written, a number is digits only (the roles' rule too)
    (True, f"{FIELD} true is not a whole number; {ALLOWED}"),
    # a negative number, 0, and outside what a card can have (shared/domain/models.py MAX_MODEL_UNITS)
    (-1, f"{FIELD} -1 is out of range: a card has 2 to {MAX_MODEL_UNITS} units of 512 MiB; {ALLOWED}"),
    (("--set", "-1"), f"{FIELD} -1 is out of range"),
    (0, f"{FIELD} 0 is out of range: a card has 2 to {MAX_MODEL_UNITS} units of 512 MiB; {ALLOWED}"),
    (("--set", "0"), f"{FIELD} 0 is out of range"),
    (1, f"{FIELD} 1 is out of range"),
    (MAX_MODEL_UNITS + 1, f"{FIELD} {MAX_MODEL_UNITS + 1} is out of range"),
    ("99999999999999999999", f'{FIELD} "99999999999999999999" is out of range'),
    # an empty list (a values file, --set {}), a string of blanks and commas
    ([], f"{FIELD} [] is empty: list at least one card model; {ALLOWED}"),
    (("--set", "{}"), f'{FIELD} [""] is empty: list at least one card model; {ALLOWED}'),
    (",", f'{FIELD} "," is empty: list at least one card model; {ALLOWED}'),
    # a list with a non-number: the entry and the whole value are named
    ([96, "abc"], f'{FIELD} entry "abc" (of [96,"abc"]) is not a whole number; {ALLOWED}'),
    (("--set", "{96,abc}"), f'{FIELD} entry "abc" (of [96,"abc"]) is not a whole number; {ALLOWED}'),
    ("96,abc", f'{FIELD} entry "abc" (of "96,abc") is not a whole number; {ALLOWED}'),
    ([96, ""], f'{FIELD} entry "" (of [96,""]) is not a whole number'),
    ([96, 160.5], f"{FIELD} entry 160.5 (of [96,160.5]) is not a whole number; {ALLOWED}"),
    ([96, None], f"{FIELD} entry null (of [96,null]) is not a whole number"),
    ([True], f"{FIELD} entry true (of [true]) is not a whole number"),
    ([96, 0], f"{FIELD} entry 0 (of [96,0]) is out of range"),
    ([96, -160], f"{FIELD} entry -160 (of [96,-160]) is out of range"),
    # nested lists and maps
    ([96, [160]], f"{FIELD} entry [160] (of [96,[160]]) is not a whole number; {ALLOWED}"),
    ([[96, 160]], f"{FIELD} entry [96,160] (of [[96,160]]) is not a whole number"),
    ([96, {"s5000": 160}], f'{FIELD} entry {{"s5000":160}} (of [96,{{"s5000":160}}]) is not a whole number'),
    # the cards' GiB keep their own message (tests/deploy/test_redteam_user_values.py)
    ([96, 48], f"{FIELD} entry 48 is MTT S4000's memory in GiB; the unit is 512 MiB: use 96"),
    ("80", f"{FIELD} entry 80 is MTT S5000's memory in GiB; the unit is 512 MiB: use 160"),
]


@pytest.mark.parametrize(("form", "message"), BAD, ids=[repr(f) for f, _ in BAD])
def test_a_wrong_memory_per_card_fails_with_one_clear_message(helm: Path, form: Any, message: str) -> None:
    proc = template(helm, _case(form), check=False)
    assert proc.returncode != 0, f"{form!r} rendered"
    assert message in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and proc.stderr.count(FIELD) == 1, proc.stderr
    assert not any(w in proc.stderr for w in SCHEMA_WORDS), proc.stderr


# Each accepted form and the plain list it stands for.
VALID: list[tuple[Any, list[int]]] = [
    (96, [96]),
    (160, [160]),
    ("96", [96]),
    ("96,160", [96, 160]),
    ([96, 160], [96, 160]),
    ([96, "160"], [96, 160]),
    (["96", " 160 "], [96, 160]),
    ("[96, 160]", [96, 160]),
    ([160, 96], [96, 160]),  # as the roles read it: sorted, each model once
    ([96, 96, 160], [96, 160]),
    ("96,,160", [96, 160]),  # a blank piece of a comma string is skipped, as the roles skip it
    (None, [96]),  # null (or missing): the roles' default
    ([2, MAX_MODEL_UNITS], [2, MAX_MODEL_UNITS]),
    (("--set", "96"), [96]),
    (("--set", "96\\,160"), [96, 160]),
    (("--set", "{96,160}"), [96, 160]),
    (("--set", '{96,"160"}'), [96, 160]),  # --set keeps the quotes in the string
]


@pytest.mark.parametrize(("form", "models"), VALID, ids=[repr(f) for f, _ in VALID])
def test_every_accepted_form_renders_what_its_list_renders(helm: Path, form: Any, models: list[int]) -> None:
    out = template(helm, _case(form)).stdout
    config = embedded(objects(out), "hami-config", "config.yaml")
    assert config["memoryPerCard"] == models
    # the roles read the same configuration as for the plain list: the whole render is the same, byte for byte
    assert out == template(helm, _case(models)).stdout
    # ... and the roles accept it (a quoted "160" reaches them as the number 160)
    cm = next(o for o in objects(out) if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "hami-config")
    assert "memoryPerCard: [" + ",".join(map(str, models)) + "]\n" in cm["data"]["config.yaml"]
    assert check_config(cm["data"]["config.yaml"])["memoryPerCard"] == sorted(set(models))
