"""The fault plan: one seeded, replayable description of what goes wrong, and when.

A :class:`FaultPlan` is data: steps that kill or pause a producer or the copier, crash the sink
at a point of its commit, or put a toxic on a network link. The chaos tests and
``pidfence demo --faults`` run the producers' and copiers' steps and the toxics; a sink crash
step is for the simulation, which takes the part of a plan it models through
:func:`pidfence.testing.sim_knobs` (chaos tests crash the sink with ``--crash-at``). The
same seed gives the same plan (:meth:`FaultPlan.network`), and a plan's JSON replays it exactly.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from pidfence.wire import PidfenceError


class BadFaultPlan(PidfenceError):
    """A plan or a step that cannot run; the message names the step and what is allowed."""


class FaultKind(StrEnum):
    """What one step does."""

    KILL = "kill"  # SIGKILL, then start again (a producer resumes from its --state)
    PAUSE = "pause"  # SIGSTOP for the step's duration, then SIGCONT
    JOIN = "join"  # start one more member of a group (a copier group)
    LEAVE = "leave"  # a group member stops gracefully (SIGTERM: it hands its work over)
    ZOMBIE = "zombie"  # a producer paused past its replacement's bump, then woken
    LEASE_ZOMBIE = "lease-zombie"  # a producer paused until its lease has ended
    RESEND = "resend"  # a producer re-sends acknowledged records (lost acknowledgements)
    ROLLOVER = "rollover"  # short leases: producers roll to a new pid mid-run
    SINK_CRASH = "sink-crash"  # SIGKILL the sink's process group at a crash point
    LATENCY = "latency"  # network: delay with jitter, both directions
    BLACKHOLE = "blackhole"  # network: nothing gets through, both directions
    ONE_WAY_LOSS = "one-way-loss"  # network: requests arrive, replies are dropped
    RESET = "reset"  # network: connections reset (TCP RST)
    BANDWIDTH = "bandwidth"  # network: requests limited to a few KB/s
    SLICE = "slice"  # network: replies cut into small, delayed pieces


#: Kinds that act on a network link (through the TCP fault proxy).
NETWORK_KINDS = frozenset(
    {
        FaultKind.LATENCY,
        FaultKind.BLACKHOLE,
        FaultKind.ONE_WAY_LOSS,
        FaultKind.RESET,
        FaultKind.BANDWIDTH,
        FaultKind.SLICE,
    }
)


class Link(StrEnum):
    """A network link a plan can break; each runs through its own proxy."""

    PRODUCER_KAFKA = "producer-kafka"
    PRODUCER_LEASE = "producer-lease"
    LEASE_ZOOKEEPER = "lease-zookeeper"
    SINK_KAFKA = "sink-kafka"


@dataclass(frozen=True)
class FaultStep:
    """One fault.

    Args:
        kind: what happens.
        target: a :class:`Link` for network kinds; else the process or role it hits (``p0``,
            ``copier``, ``sink``, ``kafka``, ``zookeeper``, ``lease``).
        at_s: seconds after the plan starts (network and other timed steps).
        at_acked: for process steps: once this fraction of the victim's records is
            acknowledged (a fact, not a duration); 0 for timed steps.
        duration_s: how long it lasts (network toxics, pauses, a server kept down).
        params: the kind's settings (toxic attributes, a crash point), as sorted pairs.
    """

    kind: FaultKind
    target: str
    at_s: float = 0.0
    at_acked: float = 0.0
    duration_s: float = 0.0
    params: tuple[tuple[str, Any], ...] = field(default=())

    def __post_init__(self) -> None:
        if self.kind in NETWORK_KINDS and self.target not in set(Link):
            links = ", ".join(link.value for link in Link)
            raise BadFaultPlan(f"{self.kind} needs a link target ({links}), got {self.target!r}")
        if self.at_s < 0 or self.duration_s < 0 or not 0 <= self.at_acked <= 1:
            raise BadFaultPlan(f"{self.kind} on {self.target}: times must be >= 0, at_acked 0..1")

    @property
    def network(self) -> bool:
        """True for a toxic on a link."""
        return self.kind in NETWORK_KINDS

    @property
    def ends_s(self) -> float:
        """When a timed step is over."""
        return self.at_s + self.duration_s

    def param(self, name: str, default: Any = None) -> Any:
        """One setting of the step."""
        return dict(self.params).get(name, default)

    def describe(self) -> str:
        """One line for reports: when, where, what."""
        settings = ", ".join(f"{k}={v}" for k, v in self.params)
        when = f"at {self.at_acked:.0%} acknowledged" if self.at_acked else f"t={self.at_s:.1f}s"
        lasting = f" for {self.duration_s:.1f}s" if self.duration_s else ""
        return f"{when} {self.target}: {self.kind}{lasting}" + (
            f" ({settings})" if settings else ""
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON types."""
        return {
            "kind": self.kind.value,
            "target": self.target,
            "at_s": self.at_s,
            "at_acked": self.at_acked,
            "duration_s": self.duration_s,
            "params": dict(self.params),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FaultStep:
        """Inverse of :meth:`to_dict`."""
        try:
            return step(
                FaultKind(data["kind"]),
                str(data["target"]),
                at_s=float(data.get("at_s", 0.0)),
                at_acked=float(data.get("at_acked", 0.0)),
                duration_s=float(data.get("duration_s", 0.0)),
                **dict(data.get("params") or {}),
            )
        except (KeyError, ValueError, TypeError) as exc:
            raise BadFaultPlan(f"not a fault step: {dict(data)!r} ({exc})") from exc


def step(
    kind: FaultKind,
    target: str,
    *,
    at_s: float = 0.0,
    at_acked: float = 0.0,
    duration_s: float = 0.0,
    **params: Any,
) -> FaultStep:
    """A :class:`FaultStep` with keyword settings (``latency_ms=200``)."""
    return FaultStep(kind, target, at_s, at_acked, duration_s, tuple(sorted(params.items())))


@dataclass(frozen=True)
class FaultPlan:
    """A replayable list of faults; ``seed`` names the plan a generator made (None: by hand).

    Args:
        steps: the faults, in the order they were planned.
        seed: the seed of :meth:`network`, printed so a failing run can be replayed.
    """

    steps: tuple[FaultStep, ...] = ()
    seed: int | None = None

    def __iter__(self) -> Iterator[FaultStep]:
        return iter(self.steps)

    def __len__(self) -> int:
        return len(self.steps)

    def __add__(self, other: FaultPlan) -> FaultPlan:
        seed = self.seed if self.seed is not None else other.seed
        return FaultPlan(self.steps + other.steps, seed)

    def of_kind(self, *kinds: FaultKind) -> tuple[FaultStep, ...]:
        """The steps of these kinds."""
        return tuple(s for s in self.steps if s.kind in kinds)

    @property
    def network_steps(self) -> tuple[FaultStep, ...]:
        """The toxics, by start time."""
        return tuple(sorted((s for s in self.steps if s.network), key=lambda s: s.at_s))

    def describe(self) -> list[str]:
        """One line per step, timed steps first."""
        return [s.describe() for s in sorted(self.steps, key=lambda s: (s.at_acked, s.at_s))]

    def to_json(self) -> str:
        """The plan as JSON (replay it with :meth:`from_json`)."""
        return json.dumps({"seed": self.seed, "steps": [s.to_dict() for s in self.steps]})

    @classmethod
    def from_json(cls, text: str) -> FaultPlan:
        """Inverse of :meth:`to_json`."""
        try:
            data = json.loads(text)
            return cls(tuple(FaultStep.from_dict(s) for s in data["steps"]), data.get("seed"))
        except (ValueError, KeyError, TypeError) as exc:
            raise BadFaultPlan(f"not a fault plan ({exc})") from exc

    @classmethod
    def network(
        cls,
        seed: int,
        span_s: float = 20.0,
        links: Iterable[Link] = tuple(Link),
        per_link: int = 2,
    ) -> FaultPlan:
        """A seeded network nemesis: ``per_link`` toxics on each link within ``span_s`` seconds.

        Every link gets at least one fault; the producer-to-Kafka link always gets a one-way
        loss of at least 2.5 s (acknowledgements lost while the records land: the case a
        producer that re-sends under a new seq gets wrong). The same arguments give the same
        plan.
        """
        rng = random.Random(seed)  # noqa: S311 - a replayable schedule, not a secret
        chosen = list(dict.fromkeys(links))
        steps: list[FaultStep] = []
        kinds = sorted(NETWORK_KINDS)
        for link in chosen:
            for _ in range(per_link):
                steps.append(_toxic(rng, rng.choice(kinds), link, span_s))
        if Link.PRODUCER_KAFKA in chosen:
            duration = round(rng.uniform(2.5, 4.0), 1)
            at = round(rng.uniform(0.2, 0.6) * max(0.0, span_s - duration), 1)
            steps.append(
                step(FaultKind.ONE_WAY_LOSS, Link.PRODUCER_KAFKA, at_s=at, duration_s=duration)
            )
        return cls(tuple(sorted(steps, key=lambda s: (s.at_s, s.target))), seed)


def _toxic(rng: random.Random, kind: FaultKind, link: Link, span_s: float) -> FaultStep:
    duration = round(rng.uniform(1.0, 4.0), 1)
    at = round(rng.uniform(0.0, max(0.0, span_s - duration)), 1)
    settings: dict[str, Any] = {}
    if kind is FaultKind.LATENCY:
        settings = {"latency_ms": rng.randrange(50, 400), "jitter_ms": rng.randrange(0, 200)}
    elif kind is FaultKind.BLACKHOLE:
        # 0: drop everything until healed; else close the connection after that many ms.
        settings = {"timeout_ms": rng.choice((0, rng.randrange(500, 2000)))}
    elif kind is FaultKind.RESET:
        settings = {"timeout_ms": rng.randrange(0, 500)}
    elif kind is FaultKind.BANDWIDTH:
        settings = {"rate_kbps": rng.randrange(16, 256)}
    elif kind is FaultKind.SLICE:
        settings = {"average_size": rng.randrange(8, 64), "delay_us": rng.randrange(0, 2000)}
    return step(kind, link, at_s=at, duration_s=duration, **settings)
