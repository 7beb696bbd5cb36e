"""Fixtures of the unit tier: lease services on an in-memory store (``tests/unit/lease_kit.py``)."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from pidfence.pid_allocator import LeaseService
from tests.unit.lease_kit import LeaseServers


@pytest.fixture
def executor() -> Iterator[ThreadPoolExecutor]:
    """A two-thread pool for a lease service's store calls."""
    pool = ThreadPoolExecutor(2)
    yield pool
    pool.shutdown()


@pytest.fixture
def servers(executor: ThreadPoolExecutor) -> LeaseServers:
    """Lease servers of one cluster: one in-memory store, one manual clock."""
    return LeaseServers(executor)


@pytest.fixture
def service(servers: LeaseServers) -> LeaseService:
    """One lease server of ``servers``, with the default settings."""
    return servers.service()
