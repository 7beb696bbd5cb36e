"""A copier group as processes: members of ``pidfence copy --group`` that a fault plan kills,
pauses, wakes as zombies, adds and removes (the chaos tests and ``pidfence bench copier``).

Every member instance writes its own send ledger (``NAME.jsonl``; a restarted member is
``NAME.r1``, ...), so the checker sees every record any instance got acknowledged.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pidfence.demo.procs import ProducerRole, Worker, copier_argv
from pidfence.services.process import ServiceFailed
from pidfence.testing.plan import FaultKind, FaultPlan, FaultStep
from pidfence.testing.script import FaultScript, drive

#: How long past its pause a zombie waits for another member's FENCE before it is woken anyway
#: (a build that fences nobody must still finish, so its output can be judged).
TAKEOVER_WAIT_S = 60.0
#: What a member that stopped itself (``--stop-after-commit``) logs, then the partition.
STOP_NOTE = "stopping this process (SIGSTOP) before copying partition "


@dataclass
class CopierGroup:
    """The members of one copier group, started as ``pidfence copy --group GROUP``.

    Args:
        bootstrap: Kafka bootstrap servers.
        lease_servers: ``host:port[,host:port]``.
        from_topic: the input topic.
        to_topic: the output topic.
        group: the group's name.
        folder: where ledgers (``ledgers/``) and logs (``logs/``) go.
        extra: more ``pidfence copy`` arguments for every member (``--idle-exit``, ...).
        ledgers: whether members write send ledgers (a benchmark leaves them out).
    """

    bootstrap: str
    lease_servers: str
    from_topic: str
    to_topic: str
    group: str
    folder: Path
    extra: tuple[str, ...] = ()
    ledgers: bool = True
    #: Member name -> its instances, oldest first.
    members: dict[str, list[Worker]] = field(default_factory=dict)

    def start(self, name: str, *more: str) -> Worker:
        """Start member ``name`` (a new instance of it when it ran before); ``more``: extra
        arguments for this instance alone."""
        instances = self.members.setdefault(name, [])
        label = name if not instances else f"{name}.r{len(instances)}"
        ledger = self.folder / "ledgers" / f"{label}.jsonl"
        ledger.parent.mkdir(parents=True, exist_ok=True)
        logs = self.folder / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        ledger_option = ledger if self.ledgers else None
        ends = (self.bootstrap, self.lease_servers, self.from_topic, self.to_topic)
        argv = [*copier_argv(*ends, group=self.group, ledger=ledger_option), *self.extra, *more]
        worker = Worker(label, argv, logs, ledger=ledger_option).start()
        instances.append(worker)
        return worker

    def current(self, name: str) -> Worker:
        """The newest instance of member ``name``."""
        return self.members[name][-1]

    @property
    def workers(self) -> list[Worker]:
        """Every instance ever started."""
        return [w for instances in self.members.values() for w in instances]

    def running(self) -> bool:
        """True while any instance runs."""
        return any(w.running for w in self.workers)

    def acked(self) -> int:
        """Data records the members got acknowledged (re-copies included)."""
        return sum(w.acked() for w in self.workers)

    def fences_on(self, partition: int, but: str) -> int:
        """FENCE records on output ``partition`` acknowledged to members other than ``but``."""
        found = 0
        for name, instances in self.members.items():
            for worker in instances if name != but else ():
                if worker.ledger is not None and worker.ledger.exists():
                    for line in worker.ledger.read_text().splitlines():
                        if '"fence":true' in line and json.loads(line)["partition"] == partition:
                            found += 1
        return found

    def stop(self) -> None:
        """Stop every instance still running."""
        for worker in self.workers:
            worker.stop()


@dataclass(eq=False)
class GroupFaults(FaultScript):
    """Runs ``plan``'s steps on the members of ``group``, in order, each once the group has
    ``at_acked`` of ``total`` records acknowledged (and ``at_s`` seconds passed):

    * ``kill``: SIGKILL the member, start it again;
    * ``pause``: SIGSTOP it for ``duration_s``, then SIGCONT;
    * ``zombie``: wait until the member stopped itself (``--stop-after-commit``), ``duration_s``
      passed and another member FENCEd the partition it was about to copy since; then SIGCONT:
      its late records are ``FENCED``;
    * ``join``: start the member; ``leave``: SIGTERM it (it commits and leaves the group).
    """

    group: CopierGroup
    plan: FaultPlan
    total: int
    _index: int = field(default=0, init=False)
    _since_stop: float = field(default=0.0, init=False)
    #: A zombie's partition and the FENCEs other members had written there when it stopped.
    _held: tuple[int, int] = field(default=(-1, 0), init=False)

    def poll(self) -> None:
        """Advance the current step (at most one action per call)."""
        if self.done:
            return
        if self._index >= len(self.plan.steps):
            self.done = True
            return
        fault = self.plan.steps[self._index]
        if self._run_step(fault):
            self._index += 1
            self._since = self.clock()

    def _run_step(self, fault: FaultStep) -> bool:
        """Do (the next part of) ``fault``; True once it is complete."""
        name = fault.target
        if self._since_stop == 0.0:
            due = self.group.acked() >= fault.at_acked * self.total
            if not due or self._waited() < fault.at_s:
                return False
        if fault.kind in (FaultKind.PAUSE, FaultKind.ZOMBIE):
            return self._pause(fault)
        if fault.kind is FaultKind.KILL:
            self.group.current(name).kill()
            self.group.current(name).fate = "killed"
            self.group.start(name)
            self.note(f"SIGKILL {name} at {self.group.acked()} acknowledged; started again")
        elif fault.kind is FaultKind.JOIN:
            self.group.start(name)
            self.note(f"{name} joined at {self.group.acked()} acknowledged")
        elif fault.kind is FaultKind.LEAVE:
            self.group.current(name).proc.terminate()
            self.note(f"SIGTERM {name} at {self.group.acked()} acknowledged: it leaves")
        else:
            raise ServiceFailed(f"a copier group cannot run {fault.describe()}")
        self.happened = True
        return True

    def _pause(self, fault: FaultStep) -> bool:
        worker, group = self.group.current(fault.target), self.group
        if self._since_stop == 0.0:
            if fault.kind is FaultKind.PAUSE:
                worker.pause()
            else:
                log = worker.tail(50)
                if STOP_NOTE not in log:
                    if not worker.running:
                        raise ServiceFailed(f"{worker.name} ended before it stopped itself")
                    return False
                held = int(log.rsplit(STOP_NOTE, 1)[1].split()[0])
                self._held = (held, group.fences_on(held, but=fault.target))
            self._since_stop = self.clock()
            self.note(f"{worker.name} stopped at {group.acked()} acknowledged")
            return False
        if self.clock() - self._since_stop < fault.duration_s:
            return False
        held, before = self._held
        waited = self.clock() - self._since_stop
        if fault.kind is FaultKind.ZOMBIE and group.fences_on(held, but=fault.target) <= before:
            if waited < fault.duration_s + TAKEOVER_WAIT_S:
                return False  # nobody has taken its partition over yet
            self.note(f"no member FENCEd partition {held} in {waited:.0f} s: waking anyway")
        worker.resume()
        self._since_stop = 0.0
        self.happened = True
        self.note(f"SIGCONT {worker.name} after {waited:.1f} s")
        return True


def wait_all(group: CopierGroup, timeout: float) -> dict[str, int]:
    """Wait until every member instance exited; their exit codes by instance name."""
    deadline = time.monotonic() + timeout
    return {w.name: w.wait(max(1.0, deadline - time.monotonic())) for w in group.workers}


def run_with_faults(
    group: CopierGroup,
    upstream: ProducerRole,
    faults: GroupFaults,
    first: Mapping[str, Sequence[str]],
    *,
    drive_s: float,
    wait_s: float,
) -> dict[str, int]:
    """Start the upstream producer and the group's ``first`` members (name: extra arguments),
    play ``faults`` to the end, wait for the producer and then every member instance; both
    are stopped whatever happens. Returns the members' exit codes by instance name.

    Raises:
        ServiceFailed: the faults did not play out within ``drive_s``, or the upstream
            producer failed.
    """
    try:
        upstream.spawn()
        for name, args in first.items():
            group.start(name, *args)
        drive([faults], timeout=drive_s)
        code = upstream.current.wait(120)
        if code != 0:
            raise ServiceFailed(f"the upstream producer exited {code}:\n{upstream.current.tail()}")
        return wait_all(group, wait_s)
    finally:
        group.stop()
        upstream.stop()
