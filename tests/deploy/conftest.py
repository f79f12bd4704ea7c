"""Fixtures for the chart tests: the helm binary (built once from the pinned Go module) and
rendered values combinations, cached per session (genCA output differs per render)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.deploy._chart import CASES, Json, helm_binary, objects, template


@pytest.fixture(scope="session")
def helm(pytestconfig: pytest.Config) -> Path:
    return helm_binary(pytestconfig)


@pytest.fixture(scope="session")
def rendered(helm: Path) -> Callable[[str], list[Json]]:
    cache: dict[str, list[Json]] = {}

    def get(name: str) -> list[Json]:
        if name not in cache:
            cache[name] = objects(template(helm, CASES[name]).stdout)
        return cache[name]

    return get
