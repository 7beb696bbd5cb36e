"""The demo's fault scripts wait for facts (acknowledged records, lease ends, FENCEs), never for
durations: driven here with fake processes and injected clocks."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pidfence.demo.faults import CopierCrash, LeaseZombie, Zombie
from pidfence.testing import ManualClock


@dataclass
class FakeWorker:
    name: str
    acks: int = 0
    fence_count: int = 0
    lease_end_ms: int = 0
    running: bool = True
    code: int | None = None
    log: str = ""
    paused: bool = False
    fate: str | None = None
    proc: Any = None

    def acked(self) -> int:
        return self.acks

    def fences(self) -> int:
        return self.fence_count

    def pause(self) -> None:
        self.paused = True

    def resume(self) -> None:
        self.paused = False

    def kill(self) -> None:
        self.running, self.code = False, -9

    def exit_code(self) -> int | None:
        return self.code

    def tail(self, lines: int = 30) -> str:
        return self.log


@dataclass
class FakeRole:
    instances: list[FakeWorker] = field(default_factory=lambda: [FakeWorker("p3")])
    saved: int = 0

    @property
    def current(self) -> FakeWorker:
        return self.instances[-1]

    def acked(self) -> int:
        return sum(w.acks for w in self.instances)

    def checkpointed(self) -> int:
        return self.saved

    def spawn_replacement(self) -> FakeWorker:
        self.instances.append(FakeWorker(f"p3.r{len(self.instances)}"))
        return self.instances[-1]


def test_lease_zombie_waits_for_the_lease_end_then_for_fences_then_for_the_zombie() -> None:
    role, wall = FakeRole(), ManualClock(1_000_000)
    script = LeaseZombie(role, at=100, margin_ms=500, wall_ms=wall)  # type: ignore[arg-type]
    zombie = role.current
    zombie.acks, zombie.lease_end_ms = 100, wall.now + 8_000
    script.poll()
    assert not zombie.paused  # no checkpoint yet
    role.saved = 50
    script.poll()
    assert zombie.paused and zombie.fate == "replaced"
    for _ in range(5):  # however often it is polled, nothing happens before the lease end
        script.poll()
    assert len(role.instances) == 1
    wall.now += 8_499
    script.poll()
    assert len(role.instances) == 1
    wall.now += 1
    script.poll()
    replacement = role.current
    assert replacement.name == "p3.r1"
    script.poll()
    assert zombie.paused  # the replacement has not written anything yet
    replacement.acks = 1  # an expired pid's successor writes data, maybe no FENCE
    script.poll()
    assert not zombie.paused and not script.done
    zombie.running, zombie.code, zombie.log = False, 3, "error: ProducerFenced: roll refused"
    script.poll()
    assert script.done and script.happened
    assert zombie.fate == "fenced" and script.zombie_wrote == 0


def test_lease_zombie_that_writes_on_is_reported_not_excused() -> None:
    role, wall = FakeRole(), ManualClock(1_000_000)
    role.saved, role.current.acks, role.current.lease_end_ms = 1, 10, wall.now
    script = LeaseZombie(role, at=10, margin_ms=0, wall_ms=wall)  # type: ignore[arg-type]
    script.poll()
    script.poll()
    role.current.fence_count = role.current.acks = 1
    script.poll()
    zombie = role.instances[0]
    zombie.acks += 7  # re-sent its work under a fresh pid
    zombie.running, zombie.code = False, 0
    script.poll()
    assert zombie.fate == "exited 0" and script.zombie_wrote == 7


def test_zombie_pauses_only_under_a_lease_with_room_left() -> None:
    role, wall = FakeRole(), ManualClock(1_000_000)
    role.saved, role.current.acks = 1, 10
    role.current.lease_end_ms = wall.now + 3_000
    script = Zombie(role, at=10, lease_left_ms=5_000, wall_ms=wall)  # type: ignore[arg-type]
    script.poll()
    assert not role.current.paused
    role.current.lease_end_ms = wall.now + 20_000  # it rolled over: a fresh lease
    script.poll()
    assert role.current.paused


def test_zombie_is_killed_after_its_records_not_after_a_time() -> None:
    role = FakeRole()
    role.saved, role.current.acks = 1, 10
    clock = iter(range(0, 10_000, 100))
    script = Zombie(role, at=10, zombie_records=5, clock=lambda: float(next(clock)))  # type: ignore[arg-type]
    script.poll()
    script.poll()
    role.current.fence_count = role.current.acks = 1
    script.poll()
    zombie = role.instances[0]
    for _ in range(20):
        script.poll()
    assert zombie.running  # however long it takes
    zombie.acks += 5
    script.poll()
    assert script.done and script.happened and zombie.fate == "fenced"
    assert not zombie.running


def test_copier_crash_waits_for_records_past_a_checkpoint(tmp_path: Path) -> None:
    started: list[FakeWorker] = []

    def start() -> FakeWorker:
        started.append(FakeWorker(f"copier{len(started)}"))
        return started[-1]

    state = tmp_path / "copier.json"
    script = CopierCrash(start, state, at=100)  # type: ignore[arg-type]
    started[0].acks = 500
    script.poll()
    assert started[0].running  # no checkpoint yet
    state.write_text("{}")
    script.poll()
    assert not started[0].running and started[0].fate == "killed"
    assert len(started) == 2 and script.done and script.happened


def test_copier_that_finished_first_is_not_counted_as_a_fault(tmp_path: Path) -> None:
    worker = FakeWorker("copier", running=False, code=0)
    script = CopierCrash(lambda: worker, tmp_path / "none.json", at=1)  # type: ignore[arg-type]
    script.poll()
    assert script.done and not script.happened


def _woken_zombie(role: FakeRole) -> tuple[Zombie, FakeWorker]:
    role.saved, role.current.acks = 1, 10
    script = Zombie(role, at=10, zombie_records=5)  # type: ignore[arg-type]
    script.poll()  # SIGSTOP
    script.poll()  # replacement
    role.current.fence_count = role.current.acks = 1
    script.poll()  # SIGCONT
    zombie = role.instances[0]
    assert not zombie.paused and not script.done
    return script, zombie


def test_a_woken_zombie_that_showed_nothing_did_not_happen() -> None:
    role = FakeRole()
    script, zombie = _woken_zombie(role)
    assert not script.happened  # woken is not enough
    zombie.running, zombie.code = False, 0  # ended without a write or a refused roll
    script.poll()
    assert script.done and not script.happened and zombie.fate == "replaced"


def test_a_woken_zombie_whose_roll_was_refused_happened() -> None:
    role = FakeRole()
    script, zombie = _woken_zombie(role)
    zombie.running, zombie.code, zombie.log = False, 3, "error: ProducerFenced"
    script.poll()
    assert script.done and script.happened and zombie.fate == "fenced"


def test_a_zombie_script_that_lost_its_processes_is_a_service_failure() -> None:
    import pytest

    from pidfence.services.process import ServiceFailed

    script = Zombie(FakeRole(), at=1)  # type: ignore[arg-type]
    with pytest.raises(ServiceFailed, match="lost its processes"):
        script._both()
