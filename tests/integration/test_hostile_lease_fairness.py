"""Issue 22 case 5, against ``pidfence lease-server`` started by its CLI on a real ZooKeeper:
work that needs ZooKeeper is served round-robin per client, so a client bumping at full speed
delays only itself, and with two of them a third client inside its quota gets no error."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pidfence.pid_allocator import load_token_file
from pidfence.services.lease_server import LeasePki
from tests.fixtures.lease import AuditedServer, HostileProcess, RawLease, percentile
from tests.integration.test_hostile_lease_decode import audit_count, log_lines

# Asserts a p99 latency against a baseline: no other test may run beside it (tests/README.md).
pytestmark = [pytest.mark.timeout(300), pytest.mark.alone]

BUMPS = 150


def _bumps(victim: RawLease, lease: dict[str, Any], count: int) -> tuple[list[float], list[Any]]:
    """``count`` bumps of the victim's own pid, one at a time: their latencies and errors."""
    waits, errors = [], []
    for _ in range(count):
        started = time.perf_counter()
        reply = victim.call(
            "bump", pid=lease["pid"], generation=lease["generation"], secret=lease["secret"]
        )
        waits.append(time.perf_counter() - started)
        if reply["error"] is None:
            lease["generation"] = reply["generation"]
        else:
            errors.append(reply)
    return waits, errors


def test_flooders_delay_only_themselves(
    audited_server: Callable[[str], AuditedServer], hostile_pki: LeasePki, tmp_path: Path
) -> None:
    server, metrics_port = audited_server("fair")
    victim = RawLease(server.address, timeout=30)
    assert (
        victim.call("hello", token=load_token_file(hostile_pki.token_files["victim"]))["client"]
        == "victim"
    )
    lease = victim.call("lease")
    quiet, quiet_errors = _bumps(victim, lease, BUMPS)

    def flooder(name: str) -> HostileProcess:
        token = load_token_file(hostile_pki.token_files[name])
        flood = HostileProcess(
            "flood", tmp_path, name, address=server.address, connections=6, depth=32, token=token
        )
        floods.append(flood)
        flood.wait_ready()
        return flood

    floods: list[HostileProcess] = []
    try:
        flooder("flood1")
        one, one_errors = _bumps(victim, lease, BUMPS)
        flooder("flood2")
        two, two_errors = _bumps(victim, lease, BUMPS)
        results = [flood.stop() for flood in floods]
    finally:
        for flood in floods:
            flood.kill()
        victim.close()
    p99 = {name: percentile(w, 0.99) for name, w in (("quiet", quiet), ("one", one), ("two", two))}
    print(f"victim bump p99 ms: { {k: round(v * 1000, 1) for k, v in p99.items()} }")
    print(f"flooders: {results}")
    assert not quiet_errors and not one_errors and not two_errors, (one_errors + two_errors)[:3]
    assert p99["one"] < max(0.100, 3 * p99["quiet"]), p99
    for result in results:
        # Each flooder really flooded: more than its share queued, the rest refused.
        assert result.get("None", 0) + result.get("STALE_GENERATION", 0) > 100, result
        assert result.get("RATE_LIMITED", 0) > 0, result
    assert audit_count(metrics_port, "rate_limited") >= sum(r["RATE_LIMITED"] for r in results)
    assert len(log_lines(server, "rate_limited from 127.0.0.1")) == 1  # once per peer, interval
