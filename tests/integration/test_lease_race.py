"""Owners race the lease authority through two real servers, with faults (issue 40, point 1).

Two ``pidfence lease-server`` processes on one ZooKeeper of this test's own; three lineages, each
with four owners racing bumps and rolls of its head pid from the same generation in every round
(``tests/integration/lease_race.py``: every grant logged and judged against ZooKeeper). Meanwhile
the fault plan runs: server A SIGSTOPped, server B's link to ZooKeeper blackholed and then
losing every reply (writes that land unanswered), ZooKeeper SIGSTOPped past the servers' session
timeout, ZooKeeper SIGKILLed and restarted, server B SIGKILLed and restarted. The race must end
with no anomaly: no duplicate grant, one winner per round, no generation moving back, every
grant in ZooKeeper.

The same race, without faults, against servers running a broken compare-and-set
(``--mutation lineage-fresh-version`` or ``lineage-unversioned-set``) must find duplicate grants:
the race has teeth.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pidfence.pid_allocator import LeaseServerSettings
from pidfence.pid_allocator.settings_sources import settings_argv
from pidfence.services import ZooKeeperEnsemble, new_chroot
from pidfence.services.lease_server import LeaseServerProcess, spawn_lease_server
from pidfence.services.ports import free_port
from pidfence.services.process import ManagedProcess
from pidfence.testing import (
    FaultKind,
    FaultPlan,
    FaultScript,
    Link,
    LinkFaults,
    NetworkNemesis,
    Toxiproxy,
    drive,
    link_proxies,
    run_argv,
    step,
)
from tests.integration.lease_race import Race

pytestmark = pytest.mark.timeout(300)

SESSION_S = 4.0
#: Small blocks (claims happen during the faults), long leases, a short ZooKeeper session.
SETTINGS: dict[str, Any] = {
    "block_size": 10,
    "lifetime_ms": 600_000,
    "zk_session_timeout_s": SESSION_S,
    "zk_op_timeout_s": 2.0,
}
PLAN = FaultPlan(
    (
        step(FaultKind.PAUSE, "lease-a", at_s=3, duration_s=2.5),
        step(FaultKind.BLACKHOLE, Link.LEASE_ZOOKEEPER, at_s=7, duration_s=2.5, timeout_ms=0),
        step(FaultKind.ONE_WAY_LOSS, Link.LEASE_ZOOKEEPER, at_s=11, duration_s=2),
        step(FaultKind.PAUSE, "zookeeper", at_s=15, duration_s=SESSION_S + 2),
        step(FaultKind.KILL, "zookeeper", at_s=24, duration_s=2),
        step(FaultKind.KILL, "lease-b", at_s=31, duration_s=1),
    )
)
#: Rounds raced after the last fault healed (the servers serve again).
AFTER_S = 3.0


@dataclass(eq=False)
class ProcessFaults(FaultScript):
    """The plan's process steps on named processes at their times: ``pause`` for the step's
    duration, ``kill`` and restart after it (each target has ``pause/resume/kill/restart``)."""

    name = "processes"

    plan: FaultPlan
    targets: Mapping[str, Any]
    started: float | None = field(default=None, init=False)
    _on: set[int] = field(default_factory=set, init=False)
    _off: set[int] = field(default_factory=set, init=False)

    def poll(self) -> None:
        if self.done:
            return
        now = self.clock()
        self.started = now if self.started is None else self.started
        elapsed = now - self.started
        steps = [(i, s) for i, s in enumerate(self.plan) if not s.network]
        for index, fault in steps:
            target = self.targets[fault.target]
            if index not in self._on and elapsed >= fault.at_s:
                (target.pause if fault.kind is FaultKind.PAUSE else target.kill)()
                self._on.add(index)
                self.happened = True
                self.note(f"t={elapsed:.1f}s {fault.kind} {fault.target}")
            elif index in self._on and index not in self._off and elapsed >= fault.ends_s:
                (target.resume if fault.kind is FaultKind.PAUSE else target.restart)()
                self._off.add(index)
                self.note(f"t={self.clock() - self.started:.1f}s {fault.target} back")
        self.done = len(self._off) == len(steps)


@dataclass
class Node:
    """Node ``index`` of an ensemble with the fault hooks of a process."""

    ensemble: ZooKeeperEnsemble
    index: int = 0

    def pause(self) -> None:
        self.ensemble.pause(self.index)

    def resume(self) -> None:
        self.ensemble.resume(self.index)

    def kill(self) -> None:
        self.ensemble.kill(self.index)

    def restart(self) -> None:
        self.ensemble.restart(self.index)


@pytest.fixture
def own_zookeeper() -> Iterator[ZooKeeperEnsemble]:
    """A ZooKeeper of this test's own: the faults pause and kill it."""
    ensemble = ZooKeeperEnsemble(1).start()
    try:
        yield ensemble
    finally:
        ensemble.stop()


def spawn_mutant(zk_hosts: str, log_dir: Path, name: str, mutation: str) -> LeaseServerProcess:
    """``pidfence lease-server`` with a lineage mutant installed (``pidfence.testing.run``)."""
    settings = LeaseServerSettings().with_overrides(
        host="127.0.0.1", port=free_port(), zk_hosts=zk_hosts, **SETTINGS
    )
    argv = run_argv(["lease-server", *settings_argv(settings)], mutations=(mutation,))
    proc = ManagedProcess(name, argv, log_dir / f"{name}.log")
    proc.start()
    handle = LeaseServerProcess(proc, settings.port)
    try:
        handle.wait_listening()
    except BaseException:
        proc.kill()
        raise
    return handle


@pytest.fixture
def servers() -> Iterator[list[LeaseServerProcess]]:
    """The test's lease servers (it appends them), stopped at teardown."""
    started: list[LeaseServerProcess] = []
    yield started
    for server in reversed(started):
        server.stop()


def report(race: Race, tmp_path: Path, *scripts: FaultScript) -> str:
    """What happened, for a failure message; the full log is saved next to it."""
    race.save(tmp_path / "race.jsonl")
    events = [e for s in scripts for e in s.events]
    return (
        f"seed {race.seed}, {dict(race.stats)}\nfaults: {events}\n"
        f"anomalies ({len(race.anomalies)}): {race.anomalies[:10]}\n"
        f"every round: {tmp_path / 'race.jsonl'}"
    )


def test_racing_owners_through_faults_never_get_a_pid_twice(
    own_zookeeper: ZooKeeperEnsemble,
    toxiproxy: Toxiproxy,
    servers: list[LeaseServerProcess],
    tmp_path: Path,
) -> None:
    direct = new_chroot(own_zookeeper.hosts)
    chroot = direct[len(own_zookeeper.hosts) :]
    proxy = link_proxies(toxiproxy, {Link.LEASE_ZOOKEEPER: own_zookeeper.hosts})
    via_proxy = proxy[Link.LEASE_ZOOKEEPER].address + chroot
    servers.append(a := spawn_lease_server(direct, tmp_path, "lease-a", **SETTINGS))
    servers.append(b := spawn_lease_server(via_proxy, tmp_path, "lease-b", **SETTINGS))
    race = Race([a.address, b.address], direct)
    nemesis = NetworkNemesis(PLAN, LinkFaults(proxy))  # server B's link to ZooKeeper
    processes = ProcessFaults(PLAN, {"lease-a": a, "lease-b": b, "zookeeper": Node(own_zookeeper)})
    healed = threading.Event()
    failed: list[BaseException] = []

    def run() -> None:
        try:
            race.run(healed.is_set)
        except BaseException as exc:  # noqa: BLE001 - asserted below
            failed.append(exc)

    runner = threading.Thread(target=run)
    started = time.monotonic()
    try:
        runner.start()
        drive([nemesis, processes], timeout=150, interval=0.1)
        time.sleep(AFTER_S)
    finally:
        nemesis.heal()
        healed.set()
        runner.join(120)
    try:
        for op in ("bump", "roll"):
            race.replay_landed(op)
        race.check_zookeeper()
    finally:
        race.close()
    took = time.monotonic() - started
    print(f"\nlease race: {took:.0f} s, {report(race, tmp_path, nemesis, processes)}")
    assert not failed, failed
    assert not race.anomalies, report(race, tmp_path, nemesis, processes)
    assert nemesis.happened and processes.happened
    stats = race.stats
    # Every round was contended on a versioned set, losers went on, owners retried through the
    # faults, and a write sent again with its token after it landed (its reply lost) was
    # answered with its grant, through either server. (Retries that won a round under the
    # faults are counted too, but how many there are depends on timing: since the fair
    # ZooKeeper queue, a request queued through an outage wins without a retry.)
    assert stats["rounds"] >= 100, stats
    assert stats["bump STALE_GENERATION"] + stats["roll STALE_GENERATION"] >= stats["rounds"]
    assert stats["retries"] > 0, stats
    lineages = race.lineages
    assert (
        stats["bump retried after it landed"] == stats["roll retried after it landed"] == lineages
    )


@pytest.mark.parametrize("mutation", ["lineage-fresh-version", "lineage-unversioned-set"])
def test_the_race_catches_a_broken_compare_and_set(
    zk_chroot: str, servers: list[LeaseServerProcess], tmp_path: Path, mutation: str
) -> None:
    for i in range(2):
        servers.append(spawn_mutant(zk_chroot, tmp_path, f"lease-{i}", mutation))
    race = Race([s.address for s in servers], zk_chroot)
    deadline = time.monotonic() + 30
    try:
        race.run(lambda: bool(race.anomalies) or time.monotonic() > deadline)
    finally:
        race.close()
    found = " ".join(race.anomalies)
    assert "won one round" in found or "granted twice" in found, report(race, tmp_path)
