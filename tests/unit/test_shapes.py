"""Shape checks (shared/domain/shapes.py) and the byte-bounded cache (shared/serving/bounded.py), by tables."""

from __future__ import annotations

from typing import Any

import pytest

from shared.domain.shapes import (
    MAX_CONTAINERS,
    MAX_PROBLEMS,
    describe,
    first_bad_name,
    is_dns_label,
    is_dns_subdomain,
    is_uid,
    key_path,
    pod_problems,
)
from shared.serving.bounded import ByteLRU


@pytest.mark.parametrize(("value", "shown"), [
    (None, "null"), (True, "true"), (False, "false"), (7, "7"), (-3, "-3"), (1.5, "1.5"),
    (2**80, "an integer of 81 bits"), ("ab", "'ab'"), ("x" * 64, repr("x" * 64)),
    ("y" * 65, repr("y" * 64) + "... (65 characters)"), ([1, 2], "a list of 2 items"),
    ({"a": 1}, "an object with 1 keys"), ({1, 2}, "a set"),
])
def test_describe(value: object, shown: str) -> None:
    assert describe(value) == shown


def test_describe_never_renders_a_container() -> None:
    deep: list[Any] = []
    for _ in range(5000):  # repr() of this would recurse 5000 levels
        deep = [deep]
    assert describe(deep) == "a list of 1 items"


@pytest.mark.parametrize(("key", "path"), [
    ("mthreads.com/vgpu", 'limits["mthreads.com/vgpu"]'),
    ('a"b', 'limits["a\\"b"]'),
    ("k" * 70, 'limits["' + "k" * 64 + '"...]'),
    (5, 'limits["5"]'),
])
def test_key_path(key: object, path: str) -> None:
    assert key_path("limits", key) == path


@pytest.mark.parametrize(("name", "ok"), [
    ("n1", True), ("s5000-node-1", True), ("a.b-c.d", True), ("1", True), ("a" * 253, True),
    ("", False), ("a" * 254, False), ("A", False), ("-a", False), ("a-", False), ("a..b", False),
    ("a.-b", False), ("a-.b", False), (".a", False), ("a.", False), ("a_b", False), ("a b", False),
    ("ä", False), ("a\n", False), (5, False), (None, False), (["a"], False),
])
def test_dns_subdomain(name: object, ok: bool) -> None:
    assert is_dns_subdomain(name) is ok


@pytest.mark.parametrize(("names", "bad"), [
    ([], None), (["a", "b.c"], None), (["a" * 253], None), (["a", "B"], 1), (["a\nb"], 0), (["a", "b\n"], 1),
    (["a", ""], 1), (["", "a"], 0), (["a", "", "b"], 1), (["a-", "b"], 0), (["a", "-b"], 1), (["a", "b."], 1),
    (["a.b", "c..d"], 1), (["a", 5], 1), ([["a"]], 0), (["a" * 254], 0), (["ok", "a_b"], 1),
])
def test_first_bad_name_agrees_with_the_per_name_check(names: list[Any], bad: int | None) -> None:
    assert first_bad_name(names) == bad
    assert bad == next((i for i, n in enumerate(names) if not is_dns_subdomain(n)), None)


@pytest.mark.parametrize(("name", "ok"), [("ns", True), ("a" * 63, True), ("a" * 64, False), ("a.b", False),
                                          ("", False), ("-x", False)])
def test_dns_label(name: object, ok: bool) -> None:
    assert is_dns_label(name) is ok


@pytest.mark.parametrize(("uid", "ok"), [
    ("0b4f5d2e-7c1a-4e2b-9a57-1d3c8f6e2a90", True), ("u1", True), ("a" * 128, True), ("a" * 129, False),
    ("", False), ("-a", False), ("a b", False), ("a/b", False), (5, False),
])
def test_uid(uid: object, ok: bool) -> None:
    assert is_uid(uid) is ok


def c(**kw: Any) -> dict[str, Any]:
    return {"name": "c", **kw}


@pytest.mark.parametrize(("pod", "problems"), [
    ({}, []),
    ({"metadata": None, "spec": None}, []),
    ({"spec": {"containers": [c(resources={"limits": {"cpu": "1", "x/y": 2, "z/w": 1.5}})]}}, []),
    ({"spec": {"containers": [c(resources=None, securityContext={"privileged": None})]}}, []),
    (5, ["pod: got 5; allowed: a Pod object"]),
    ({"metadata": "m"}, ["metadata: got 'm'; allowed: an object"]),
    ({"metadata": {"name": 5}}, ["metadata.name: got 5; allowed: a string of at most 253 characters"]),
    ({"metadata": {"uid": "u" * 254}}, [f"metadata.uid: got {describe('u' * 254)}; allowed: a string of at most "
                                        "253 characters"]),
    ({"metadata": {"labels": {"a": None}}}, ['metadata.labels["a"]: got null; allowed: a string']),
    ({"metadata": {"annotations": []}}, ["metadata.annotations: got a list of 0 items; allowed: an object of "
                                         "string values"]),
    ({"spec": []}, ["spec: got a list of 0 items; allowed: a PodSpec object"]),
    ({"spec": {"containers": {}}}, ["spec.containers: got an object with 0 keys; allowed: a list of containers"]),
    ({"spec": {"initContainers": [1]}}, ["spec.initContainers[0]: got 1; allowed: a container object"]),
    ({"spec": {"containers": [c(resources={"requests": {"a/b": None}})]}},
     ['spec.containers[0].resources.requests["a/b"]: got null; allowed: a quantity (a string or a number)']),
    ({"spec": {"containers": [c(resources={"limits": {"a/b": False}})]}},
     ['spec.containers[0].resources.limits["a/b"]: got false; allowed: a quantity (a string or a number)']),
    ({"spec": {"containers": [c(resources={"limits": {"a/b": "1" * 65}})]}},
     [f'spec.containers[0].resources.limits["a/b"]: got {describe("1" * 65)}; allowed: a quantity of at most '
      "64 characters"]),
    ({"spec": {"containers": [c(securityContext={"privileged": 1})]}},
     ["spec.containers[0].securityContext.privileged: got 1; allowed: true or false"]),
])
def test_pod_problems(pod: object, problems: list[str]) -> None:
    assert pod_problems(pod) == problems


def test_pod_problems_prefix_names_the_argument() -> None:
    assert pod_problems({"spec": {"containers": [7]}}, "Pod.") == [
        "Pod.spec.containers[0]: got 7; allowed: a container object"]
    assert pod_problems(None, "Pod.") == ["Pod: got null; allowed: a Pod object"]


def test_container_cap_counts_init_and_app_containers_and_stops_there() -> None:
    half = MAX_CONTAINERS // 2
    ok = {"spec": {"initContainers": [c()] * half, "containers": [c()] * half}}
    assert pod_problems(ok) == []
    over = {"spec": {"initContainers": [5] * half, "containers": [5] * (half + 1)}}
    # one problem for the count; the (bad) containers are not looked at
    assert pod_problems(over) == [f"spec: {MAX_CONTAINERS + 1} containers and initContainers; allowed: at most "
                                  f"{MAX_CONTAINERS} in all"]


def test_problems_are_capped_and_counted() -> None:
    pod = {"metadata": {"annotations": {f"k{i}": i for i in range(1000)}}}
    out = pod_problems(pod)
    assert len(out) == MAX_PROBLEMS + 1 and out[-1] == f"and {1000 - MAX_PROBLEMS} more problems"


# --- ByteLRU ----------------------------------------------------------------------------------------


def test_byte_lru_evicts_the_least_recently_used_by_bytes() -> None:
    lru: ByteLRU[str, int] = ByteLRU(100)
    assert lru.put("a", 1, 40) and lru.put("b", 2, 40)
    assert lru.get("a") == 1  # a is now the most recent
    assert lru.put("c", 3, 40)  # 120 > 100: b goes
    assert "b" not in lru and lru.get("a") == 1 and lru.get("c") == 3 and lru.bytes == 80


def test_byte_lru_refuses_an_entry_over_the_entry_bound() -> None:
    lru: ByteLRU[str, int] = ByteLRU(100, max_entry_bytes=30)
    assert lru.put("a", 1, 30)
    assert not lru.put("big", 2, 31)
    assert "big" not in lru and lru.get("a") == 1 and lru.bytes == 30


def test_byte_lru_replacing_and_popping_keep_the_count_right() -> None:
    lru: ByteLRU[str, int] = ByteLRU(100)
    lru.put("a", 1, 60)
    lru.put("a", 2, 10)
    assert lru.bytes == 10 and lru.get("a") == 2 and len(lru) == 1
    assert lru.pop("a") == 2 and lru.pop("a") is None and lru.bytes == 0
    assert not lru.put("huge", 3, 101) and lru.bytes == 0
