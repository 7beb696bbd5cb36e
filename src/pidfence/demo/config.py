"""The demo's knobs, the names of the faults it can inject, and the fault plan they make."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Final

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


#: The share of a lease after which the demo's producers roll over to a new pid
#: (``--lifetime-rollover``; :func:`pidfence.demo.produce`). Not 23/24, the producer's default:
#: the drain before a roll must finish inside the lease, and with the demo's short leases 1/24
#: (333 ms of an 8 s lease) is less than an acknowledgement can take on a loaded machine.
ROLLOVER_AT: Final = 0.75

#: The share of its lease a producer must have left when the zombie fault pauses it: just after a
#: rollover. The replacement's start and FENCEs must happen before the zombie's own rollover
#: point, or the woken zombie's roll is refused before it writes anything past the fence (no
#: FENCED to show). With half a lease left, that room was a quarter of a lifetime (2 s of an 8 s
#: lease), too little on a loaded machine; four fifths leave 55 % (4.4 s).
ZOMBIE_LEASE_LEFT: Final = 0.8

#: Where each producer fault strikes: the share of ``--records`` acknowledged first.
KILL_AT: Final = 0.3
ZOMBIE_AT: Final = 0.4
LEASE_ZOMBIE_AT: Final = 0.5


class BadDemoOption(PidfenceError):
    """A demo option is out of range; the message says which and what is allowed."""


def zombie_can_pause(lease_lifetime_s: float, produce_seconds: float) -> bool:
    """Whether the zombie fault (under short leases) can find its moment: a producer with
    :data:`ZOMBIE_LEASE_LEFT` of a lease left (the first fifth of a lease, right after a roll at
    :data:`ROLLOVER_AT`) at or after :data:`ZOMBIE_AT` of its paced run and before its end."""
    due = ZOMBIE_AT * produce_seconds
    window = (1 - ZOMBIE_LEASE_LEFT) * lease_lifetime_s
    every = ROLLOVER_AT * lease_lifetime_s  # leases start at 0, 3/4 L, 3/2 L, ...
    first = max(0, math.ceil((due - window) / every))  # the first lease whose window reaches due
    return first * every < produce_seconds


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
        lease_lifetime_s: lease lifetime given to the lease servers when a short-lease fault is
            on (``rollover``, ``lease-zombie``, ``net``; else 24 h).
        produce_seconds: the producers' target run time: it sets their rate when a paced fault
            is on (``kill``, ``zombie``, ``rollover``, ``lease-zombie``, ``net``; else they run
            unthrottled); the rollover needs it to exceed :data:`ROLLOVER_AT` (3/4) of
            ``lease_lifetime_s``, since producers roll at 3/4 of a lease.
        copier_records: records the upstream producer writes for the copier (0: no copier;
            the ``copier`` fault needs at least one).
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
        # ``not x > 0`` refuses NaN too.
        if not self.produce_seconds > 0 or self.produce_seconds == float("inf"):
            raise BadDemoOption(f"--produce-seconds must be > 0, got {self.produce_seconds:g}")
        if not self.lease_lifetime_s > 0 or self.lease_lifetime_s == float("inf"):
            raise BadDemoOption(f"--lease-lifetime must be > 0, got {self.lease_lifetime_s:g}")
        if self.copier_records < 0:
            raise BadDemoOption(f"--copier-records must be >= 0, got {self.copier_records}")
        if Fault.COPIER in self.faults and self.copier_records == 0:
            raise BadDemoOption(
                "the copier fault needs --copier-records > 0 (or leave copier out of --faults)"
            )
        lifetime, seconds = self.lease_lifetime_s, self.produce_seconds
        if Fault.ROLLOVER in self.faults and seconds <= ROLLOVER_AT * lifetime:
            raise BadDemoOption(
                f"the rollover fault needs --produce-seconds > {ROLLOVER_AT:g} x --lease-lifetime "
                f"(producers roll at {ROLLOVER_AT:g} of a lease), got {seconds:g} and {lifetime:g}"
            )
        if (
            Fault.ZOMBIE in self.faults
            and self.short_leases
            and not zombie_can_pause(lifetime, seconds)
        ):
            raise BadDemoOption(
                f"the zombie fault can never strike with --lease-lifetime {lifetime:g} and "
                f"--produce-seconds {seconds:g}: it pauses a producer after "
                f"{ZOMBIE_AT:.0%} of its run within the first "
                f"{1 - ZOMBIE_LEASE_LEFT:.0%} of a lease, and producers roll every "
                f"{ROLLOVER_AT:g} lease; use a shorter --lease-lifetime or a longer "
                "--produce-seconds"
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
            (Fault.KILL, FaultKind.KILL, KILL_AT),
            (Fault.ZOMBIE, FaultKind.ZOMBIE, ZOMBIE_AT),
            (Fault.LEASE_ZOMBIE, FaultKind.LEASE_ZOMBIE, LEASE_ZOMBIE_AT),
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
