"""Suite-wide wiring: tier markers from folders, and the fixture plugins of each component."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["tests.fixtures.services", "tests.fixtures.lease"]

_TIERS = {"integration": "integration", "chaos": "chaos", "sim": "sim"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test with its tier, taken from the folder it lives in."""
    del config
    for item in items:
        parts = Path(str(item.fspath)).parts
        for folder, marker in _TIERS.items():
            if folder in parts:
                item.add_marker(getattr(pytest.mark, marker))
