"""Connection admission (``pid_allocator/admission.py``) and the audit trail (``audit.py``):
issue 22 cases 4 and 6 and the audit item, decided without sockets (real servers:
``tests/integration/test_hostile_lease_connections.py``)."""

from __future__ import annotations

import logging

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pidfence.pid_allocator.admission import STAGE_NEW, STAGE_STARTED, Admission
from pidfence.pid_allocator.audit import AuditTrail
from pidfence.pid_allocator.metrics import ServerMetrics


class Conn:
    def __init__(self, address: str, name: str = "") -> None:
        self.address = address
        self.stage = STAGE_NEW
        self.name = name

    def __repr__(self) -> str:
        return self.name or f"Conn({self.address})"


def test_a_full_pending_pool_evicts_the_least_advanced_oldest() -> None:
    admission = Admission(max_connections=10, max_pending=3, max_per_address=10)
    old, started, newer = Conn("a", "old"), Conn("a", "started"), Conn("a", "newer")
    for conn in (old, started, newer):
        assert admission.accept(conn) == []
    admission.advance(started)
    assert started.stage == STAGE_STARTED
    assert admission.accept(Conn("a", "fourth")) == [old]  # stage 0 before stage 1, oldest first
    assert admission.accept(Conn("a", "fifth")) == [newer]
    assert admission.pending == 3


def test_eviction_takes_from_the_address_that_holds_the_most() -> None:
    admission = Admission(max_connections=10, max_pending=4, max_per_address=10)
    client = Conn("10.0.0.1", "client")
    admission.accept(client)  # the oldest of all, still at stage 0
    flood = [Conn("10.0.0.9", f"flood{i}") for i in range(3)]
    for conn in flood:
        admission.accept(conn)
    evicted = [admission.accept(Conn("10.0.0.9"))[0] for _ in range(10)]
    assert client not in evicted  # a flood from one address evicts its own connections
    assert evicted[:3] == flood


def test_admitted_connections_have_room_pending_ones_cannot_take() -> None:
    admission = Admission(max_connections=2, max_pending=2, max_per_address=5)
    clients = [Conn("c"), Conn("c")]
    for conn in clients:
        admission.accept(conn)
        assert admission.admit(conn) is None
    assert admission.admitted == 2 and admission.pending == 0
    for _ in range(50):  # however many pending connections come, the admitted ones stay
        evicted = admission.accept(Conn("x"))
        assert not set(evicted) & set(clients)
    assert admission.admitted == 2 and admission.pending == 2
    third = Conn("c")
    admission.accept(third)
    assert admission.admit(third) == "connection limit reached; try another lease server"
    admission.release(clients[0])
    assert admission.admit(third) is None


def test_admitted_connections_per_address_are_capped() -> None:
    admission = Admission(max_connections=10, max_pending=10, max_per_address=2)
    conns = [Conn("a") for _ in range(3)]
    for conn in conns:
        admission.accept(conn)
    assert admission.admit(conns[0]) is None
    assert admission.admit(conns[1]) is None
    refused = admission.admit(conns[2])
    assert refused is not None and "this address" in refused
    other = Conn("b")
    admission.accept(other)
    assert admission.admit(other) is None


@given(st.lists(st.tuples(st.sampled_from("acc"), st.sampled_from("aaar")), max_size=200))
def test_counts_stay_exact_under_any_sequence(steps: list[tuple[str, str]]) -> None:
    admission = Admission(max_connections=5, max_pending=4, max_per_address=3)
    live: list[Conn] = []
    for kind, address in steps:
        if kind == "a" or not live:
            conn = Conn(address)
            for victim in admission.accept(conn):
                live.remove(victim)  # type: ignore[arg-type]
            live.append(conn)
        else:
            conn = live.pop(0)
            if admission.admit(conn) is not None:
                admission.release(conn)
            else:
                live.append(conn)
        assert admission.pending <= 4
        assert admission.admitted <= 5
        assert admission.pending + admission.admitted == len(live)
    for conn in live:
        admission.release(conn)
        admission.release(conn)  # idempotent
    assert admission.pending == admission.admitted == 0


def test_audit_logs_once_per_peer_kind_and_interval(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    metrics = ServerMetrics()
    audit = AuditTrail(metrics, interval_s=60, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="pidfence.lease_server.audit"):
        for _ in range(100):
            audit.note("hello_failed", "10.0.0.1", "unknown auth token")
        audit.note("hello_failed", "10.0.0.2")
        audit.note("not_owner", "10.0.0.1")
        now[0] = 61.0
        audit.note("hello_failed", "10.0.0.1")
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "hello_failed from 10.0.0.1: unknown auth token",
        "hello_failed from 10.0.0.2",
        "not_owner from 10.0.0.1",
        "hello_failed from 10.0.0.1 (and 99 more since the last line)",
    ]
    assert metrics.audit_events == {"hello_failed": 102, "not_owner": 1}
    assert caplog.records[0].peer == "10.0.0.1"  # type: ignore[attr-defined]
    sample = metrics.registry.get_sample_value(
        "pidfence_audit_events_total", {"event": "hello_failed"}
    )
    assert sample == 102
