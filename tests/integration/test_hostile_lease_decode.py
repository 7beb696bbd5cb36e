"""Issue 22 case 1 and the audit trail, against ``pidfence lease-server`` started by its CLI on a
real ZooKeeper: decode bombs from two processes leave an authenticated client's pings fast; every
bomb is refused by a decode limit, counted, and logged once per peer and interval; the metrics
endpoint listens on loopback only."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from pidfence.pid_allocator import LeaseClient, load_token_file
from pidfence.services.lease_server import LeasePki, LeaseServerProcess
from pidfence.services.ports import free_port
from tests.fixtures.lease import AuditedServer, percentile
from tests.fixtures.lease_clients import HostileProcess, RawLease

pytestmark = pytest.mark.timeout(300)

PINGS = 400


def _pings(client: LeaseClient, count: int) -> list[float]:
    waits = []
    for _ in range(count):
        started = time.perf_counter()
        reply = client.ping()
        waits.append(time.perf_counter() - started)
        assert "server" in reply  # the full, authenticated ping
        time.sleep(0.002)  # spread over a second or two of the attack
    return waits


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a server's /metrics, by (name, labels)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def audit_count(port: int, event: str) -> float:
    """``pidfence_audit_events_total{event=...}`` of the server whose metrics are on ``port``."""
    return scrape(port).get(("pidfence_audit_events_total", (("event", event),)), 0.0)


def log_lines(server: LeaseServerProcess, text: str) -> list[str]:
    """Lines of the server's log that contain ``text``."""
    log = Path(server.proc.log_path).read_text()
    return [line for line in log.splitlines() if text in line]


@pytest.mark.alone  # asserts a duration: no other test may run beside it (tests/README.md)
def test_decode_bombs_from_two_processes_leave_authenticated_pings_fast(
    audited_server: Callable[[str], AuditedServer], hostile_pki: LeasePki, tmp_path: Path
) -> None:
    server, metrics_port = audited_server("bombed")
    token = load_token_file(hostile_pki.token_files["producer"])
    bomber_token = load_token_file(hostile_pki.token_files["bomber"])
    with LeaseClient(server.address, token=token, retries=0) as client:
        client.ping()  # connected and said hello
        quiet = _pings(client, PINGS)
        bombers = [
            HostileProcess("bomb", tmp_path, "before-hello", address=server.address),
            HostileProcess(
                "bomb", tmp_path, "after-hello", address=server.address, token=bomber_token
            ),
        ]
        try:
            for bomber in bombers:
                bomber.wait_ready()
            attacked = _pings(client, PINGS)
            results = [bomber.stop() for bomber in bombers]
        finally:
            for bomber in bombers:
                bomber.kill()
    quiet_p99, attacked_p99 = percentile(quiet, 0.99), percentile(attacked, 0.99)
    print(
        f"ping p99 quiet {quiet_p99 * 1000:.2f} ms, under two bombers {attacked_p99 * 1000:.2f} ms"
    )
    print(f"bombers: {results}")
    assert attacked_p99 < max(0.050, 3 * quiet_p99), (quiet_p99, attacked_p99)
    for result in results:
        assert result["sent"] >= 20, result  # the attack really ran, back to back
        assert "reply:None" not in result, result  # no bomb was ever answered as a ping
        # Each bomb got MALFORMED_REQUEST naming the limit, or (the 1 MiB one before hello) was
        # refused by its length prefix while still being sent: the reset can beat the reply.
        assert result.get("reply:MALFORMED_REQUEST", 0) >= result["sent"] // 2, result
    # Counted once per bomb, logged once per peer and interval (60 s: the whole test).
    refused = sum(r.get("reply:MALFORMED_REQUEST", 0) for r in results)
    assert audit_count(metrics_port, "frame_limit") >= refused
    assert len(log_lines(server, "frame_limit from 127.0.0.1")) == 1


def test_refusals_are_counted_and_logged_once_per_peer(
    audited_server: Callable[[str], AuditedServer], hostile_pki: LeasePki
) -> None:
    server, metrics_port = audited_server("audited")
    owner = RawLease(server.address)
    owner.call("hello", token=load_token_file(hostile_pki.token_files["producer"]))
    lease = owner.call("lease")
    for _ in range(30):
        wrong = RawLease(server.address, source="127.0.0.2")
        assert wrong.call("hello", token="x" * 20)["error"] == "UNAUTHENTICATED"
        wrong.close()
    other = RawLease(server.address, source="127.0.0.3")
    other.call("hello", token=load_token_file(hostile_pki.token_files["victim"]))
    for _ in range(30):
        reply = other.call("bump", pid=lease["pid"], generation=lease["generation"], secret=b"")
        assert reply["error"] == "NOT_OWNER"
    counts: dict[str, Any] = {
        e: audit_count(metrics_port, e) for e in ("hello_failed", "not_owner")
    }
    assert counts == {"hello_failed": 30, "not_owner": 30}
    assert len(log_lines(server, "hello_failed from 127.0.0.2")) == 1
    assert len(log_lines(server, "not_owner from 127.0.0.3")) == 1
    owner.close()
    other.close()


def _listening_addresses(port: int) -> set[str]:
    """Local addresses with a listening TCP socket on ``port`` (``/proc/net/tcp``, IPv4)."""
    found = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        address, hex_port = local.split(":")
        if state == "0A" and int(hex_port, 16) == port:
            found.add(".".join(str(int(address[i : i + 2], 16)) for i in (6, 4, 2, 0)))
    return found


def test_metrics_listen_on_loopback_unless_told(
    lease_process_factory: Callable[..., LeaseServerProcess], hostile_pki: LeasePki
) -> None:
    port = free_port()
    lease_process_factory("metrics", metrics_port=port)
    assert _listening_addresses(port) == {"127.0.0.1"}
    assert scrape(port)  # and it answers there
