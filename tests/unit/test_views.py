"""shared/domain/views.py: what a role keeps of an API object, whatever shape the object has."""

from typing import Any

import pytest

from shared.domain.views import part, picked, spec_view


@pytest.mark.parametrize(("obj", "key", "want"), [
    ({"status": {"nominatedNodeName": "a"}}, "status", {"nominatedNodeName": "a"}),
    ({"status": None}, "status", {}),
    ({"status": "x"}, "status", {}),
    ({"status": ["a"]}, "status", {}),
    ({}, "status", {}),
    (None, "status", {}),
    ("status", "status", {}),
    ([{"status": {}}], "status", {}),
])
def test_part_is_the_object_under_key_or_an_empty_one(obj: object, key: str, want: dict[str, Any]) -> None:
    assert part(obj, key) == want


@pytest.mark.parametrize(("obj", "keys", "want"), [
    ({"a": 1, "b": None, "c": 3}, ("a", "b"), {"a": 1, "b": None}),
    ({"a": 1}, ("z",), {}),
    (["a"], ("a",), {}),
    (None, ("a",), {}),
])
def test_picked_keeps_only_the_keys_present(obj: object, keys: tuple[str, ...], want: dict[str, Any]) -> None:
    assert picked(obj, keys) == want


def test_spec_view_cuts_containers_and_keeps_malformed_ones_as_they_are() -> None:
    spec = {"nodeName": "n", "volumes": [{"name": "v"}],
            "containers": [{"name": "c", "env": [{"name": "E"}], "resources": {"limits": {"x": "1"}}}, "junk"],
            "initContainers": "not a list"}
    assert spec_view(spec, ("nodeName",), ("name", "resources")) == {
        "nodeName": "n", "containers": [{"name": "c", "resources": {"limits": {"x": "1"}}}, "junk"],
        "initContainers": "not a list"}
    assert spec_view(None, ("nodeName",), ("name",)) == {}
