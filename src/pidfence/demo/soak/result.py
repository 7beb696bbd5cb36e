"""What a soak run measured (:class:`SoakResult`) and the services it runs on."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any


@dataclass
class SoakResult:
    """Everything a soak run measured (JSON-able through :meth:`as_dict`)."""

    config: dict[str, Any]
    samples: list[dict[str, Any]] = field(default_factory=list)
    batches: list[dict[str, Any]] = field(default_factory=list)
    faults: list[dict[str, Any]] = field(default_factory=list)
    faults_happened: Counter[str] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    anomalies: dict[str, int] = field(default_factory=dict)
    informational: dict[str, int] = field(default_factory=dict)
    examples: dict[str, list[str]] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    verdicts: dict[str, int] = field(default_factory=dict)
    phases_s: dict[str, float] = field(default_factory=dict)
    #: Wall time (epoch seconds) when the producers started: t_s = 0 of the samples.
    wall_started: float = 0.0

    @property
    def ok(self) -> bool:
        """Zero anomalies and no unexpected process exit."""
        return not any(self.anomalies.values()) and not self.failures

    def as_dict(self) -> dict[str, Any]:
        """All of it as plain JSON types."""
        return {
            "ok": self.ok,
            "config": self.config,
            "anomalies": self.anomalies,
            "informational": self.informational,
            "examples": self.examples,
            "counts": self.counts,
            "verdicts": self.verdicts,
            "faults_happened": dict(self.faults_happened),
            "failures": self.failures,
            "phases_s": self.phases_s,
            "wall_started": self.wall_started,
            "faults": self.faults,
            "samples": self.samples,
            "batches": self.batches,
        }


@dataclass(frozen=True)
class SoakServices:
    """Where the soak's Kafka and ZooKeeper are, and the process trees sampled for RSS."""

    bootstrap: str
    zk_hosts: str
    trees: dict[str, list[int]]
