"""The demo's knobs and the names of the faults it can inject."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from pidfence.wire import PidfenceError


class Fault(StrEnum):
    """One fault the demo injects (see docs/demo.md)."""

    KILL = "kill"  # (a) a producer SIGKILLed and restarted from its --state checkpoint
    ZOMBIE = "zombie"  # (b) a producer SIGSTOPped past its replacement's bump, then SIGCONT
    RESEND = "resend"  # (c) transport resends of acknowledged records
    ROLLOVER = "rollover"  # (d) short lease lifetime: producers roll to a new pid mid-run
    COPIER = "copier"  # (e) the copier SIGKILLed and restarted
    LEASE_ZOMBIE = "lease-zombie"  # (f) a producer SIGSTOPped until its lease has ended


class BadDemoOption(PidfenceError):
    """A demo option is out of range; the message says which and what is allowed."""


def parse_faults(text: str) -> frozenset[Fault]:
    """``all``, ``none`` or a comma-separated list of :class:`Fault` names."""
    cleaned = text.strip().lower()
    if cleaned == "all":
        return frozenset(Fault)
    if cleaned in {"none", ""}:
        return frozenset()
    faults = set()
    for item in cleaned.split(","):
        try:
            faults.add(Fault(item.strip()))
        except ValueError:
            names = ", ".join(f.value for f in Fault)
            raise BadDemoOption(
                f"unknown fault {item.strip()!r}: use all, none or a list of {names}"
            ) from None
    return frozenset(faults)


@dataclass(frozen=True)
class DemoConfig:
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
        bootstrap: use this Kafka instead of starting one (topics get a unique suffix).
        zk_hosts: use this ZooKeeper instead of starting one.
    """

    records: int = 5000
    producers: int = 4
    partitions: int = 4
    faults: frozenset[Fault] = frozenset(Fault)
    out: Path = Path("out")
    keep_running: bool = False
    lease_lifetime_s: float = 20.0
    produce_seconds: float = 26.0
    copier_records: int = 2000
    sink_master: str = "local[2]"
    bootstrap: str | None = None
    zk_hosts: str | None = None

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
        """Records per second per producer (0 = unthrottled when no rollover is wanted)."""
        if Fault.ROLLOVER not in self.faults and not self.faults & {
            Fault.KILL,
            Fault.ZOMBIE,
            Fault.LEASE_ZOMBIE,
        }:
            return 0.0
        return self.records / self.produce_seconds

    @property
    def lifetime(self) -> str:
        """The lease servers' ``--lifetime``."""
        short = self.faults & {Fault.ROLLOVER, Fault.LEASE_ZOMBIE}
        return f"{self.lease_lifetime_s:g}s" if short else "24h"
