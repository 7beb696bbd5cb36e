"""The demo's knobs, the names of the faults it can inject, and the fault plan they make."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from pidfence.testing.plan import FaultKind, FaultPlan, FaultStep, step
from pidfence.wire import PidfenceError


class Fault(StrEnum):
    """One fault the demo injects (see docs/demo.md)."""

    KILL = "kill"  # (a) a producer SIGKILLed and restarted from its --state checkpoint
    ZOMBIE = "zombie"  # (b) a producer SIGSTOPped past its replacement's bump, then SIGCONT
    RESEND = "resend"  # (c) transport resends of acknowledged records
    ROLLOVER = "rollover"  # (d) short lease lifetime: producers roll to a new pid mid-run
    COPIER = "copier"  # (e) the copier SIGKILLed and restarted
    LEASE_ZOMBIE = "lease-zombie"  # (f) a producer SIGSTOPped until its lease has ended
    NET = "net"  # (g) seeded network faults on every link, through a TCP fault proxy


class SinkStore(StrEnum):
    """Where the sink's output and checkpoint live."""

    LOCAL = "local"  # folders under ``out``
    S3 = "s3"  # a bucket on a SeaweedFS S3 store started for the run


#: What ``--faults all`` means: every fault that needs nothing beyond the demo's own processes
#: (``net`` needs the toxiproxy server ``make setup`` builds when go is installed).
PROCESS_FAULTS = frozenset(Fault) - {Fault.NET}


class BadDemoOption(PidfenceError):
    """A demo option is out of range; the message says which and what is allowed."""


def parse_faults(text: str) -> frozenset[Fault]:
    """``all`` (every fault but ``net``), ``none``, or a comma-separated list of :class:`Fault`
    names that may include ``all`` (``all,net``: everything)."""
    cleaned = text.strip().lower()
    if cleaned in {"none", ""}:
        return frozenset()
    faults: set[Fault] = set()
    for item in cleaned.split(","):
        if item.strip() == "all":
            faults |= PROCESS_FAULTS
            continue
        try:
            faults.add(Fault(item.strip()))
        except ValueError:
            names = ", ".join(f.value for f in Fault)
            raise BadDemoOption(
                f"unknown fault {item.strip()!r}: use all, none or a list of {names}"
            ) from None
    return frozenset(faults)


@dataclass(frozen=True)
class ExistingServices:
    """The services a run uses instead of starting its own (keyword-only, after the run's own
    options).

    Args:
        bootstrap: use this Kafka instead of starting one.
        zk_hosts: use this ZooKeeper instead of starting one.
    """

    bootstrap: str | None = field(default=None, kw_only=True)
    zk_hosts: str | None = field(default=None, kw_only=True)


@dataclass(frozen=True)
class DemoConfig(ExistingServices):
    """What ``pidfence demo`` runs.

    Args:
        records: records per producer.
        producers: producer processes writing the raw topic (the copier comes on top).
        partitions: partitions of the raw and the upstream topic.
        faults: which faults to inject.
        out: where the report, ledgers, logs and the output log go.
        keep_running: leave the services up at the end (prints how to stop them).
        lease_lifetime_s: lease lifetime given to the lease servers (short, so leases roll over).
        produce_seconds: the producers' target run time (sets their rate; the rollover needs it
            to exceed 23/24 of ``lease_lifetime_s``).
        copier_records: records the upstream producer writes for the copier (0: no copier).
        sink_master: Spark master of the sink.
        store: where the sink's output and checkpoint live (:class:`SinkStore`).
        bootstrap: use this Kafka instead of starting one (topics get a unique suffix).
        zk_hosts: use this ZooKeeper instead of starting one (:class:`ExistingServices`).
        seed: the network nemesis's seed (``net``); the same seed replays the same faults.
    """

    records: int = 5000
    producers: int = 4
    partitions: int = 4
    faults: frozenset[Fault] = PROCESS_FAULTS
    out: Path = Path("out")
    keep_running: bool = False
    lease_lifetime_s: float = 20.0
    produce_seconds: float = 26.0
    copier_records: int = 2000
    sink_master: str = "local[2]"
    store: SinkStore = SinkStore.LOCAL
    seed: int = 0

    def __post_init__(self) -> None:
        if self.records < 100:
            raise BadDemoOption(f"--records must be >= 100 (faults need room), got {self.records}")
        if not 1 <= self.producers <= 16:
            raise BadDemoOption(f"--producers must be 1..16, got {self.producers}")
        if not 1 <= self.partitions <= 64:
            raise BadDemoOption(f"--partitions must be 1..64, got {self.partitions}")
        needed = sum(
            f in self.faults for f in (Fault.KILL, Fault.ZOMBIE, Fault.RESEND, Fault.LEASE_ZOMBIE)
        )
        if self.producers < needed:
            raise BadDemoOption(
                f"{needed} producer faults need --producers >= {needed}, got {self.producers}"
            )

    @property
    def rate(self) -> float:
        """Records per second per producer (0 = unthrottled when no fault needs time)."""
        paced = {Fault.ROLLOVER, Fault.KILL, Fault.ZOMBIE, Fault.LEASE_ZOMBIE, Fault.NET}
        if not self.faults & paced:
            return 0.0
        return self.records / self.produce_seconds

    @property
    def short_leases(self) -> bool:
        """True when the lease servers issue ``lease_lifetime_s`` leases (else 24 h)."""
        return bool(self.faults & {Fault.ROLLOVER, Fault.LEASE_ZOMBIE, Fault.NET})

    @property
    def lifetime(self) -> str:
        """The lease servers' ``--lifetime``."""
        return f"{self.lease_lifetime_s:g}s" if self.short_leases else "24h"

    @property
    def plan(self) -> FaultPlan:
        """The faults as a :class:`~pidfence.testing.FaultPlan`: producer faults on ``p0``,
        ``p1`` ... in the order kill, zombie, lease-zombie, resend; the network nemesis over the
        producing time when ``net`` is on."""
        steps: list[FaultStep] = []
        victims = iter(f"p{i}" for i in range(self.producers))
        for fault, kind, at in (
            (Fault.KILL, FaultKind.KILL, 0.3),
            (Fault.ZOMBIE, FaultKind.ZOMBIE, 0.4),
            (Fault.LEASE_ZOMBIE, FaultKind.LEASE_ZOMBIE, 0.5),
            (Fault.RESEND, FaultKind.RESEND, 0.0),
        ):
            if fault in self.faults:
                steps.append(step(kind, next(victims), at_acked=at))
        if Fault.ROLLOVER in self.faults:
            steps.append(step(FaultKind.ROLLOVER, "lease", lifetime_s=self.lease_lifetime_s))
        if Fault.COPIER in self.faults and self.copier_records:
            steps.append(step(FaultKind.KILL, "copier", at_acked=1 / 3))
        plan = FaultPlan(tuple(steps), self.seed)
        if Fault.NET in self.faults:
            plan += FaultPlan.network(self.seed, span_s=max(5.0, self.produce_seconds * 0.8))
        return plan
