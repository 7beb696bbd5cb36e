"""What ``pidfence bench soak`` runs: duration, load, fault period, sampling."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pidfence.demo.config import BadDemoOption, ExistingServices

#: Environment variable that overrides the soak's duration in minutes (fractions allowed).
MINUTES_ENV = "PIDFENCE_SOAK_MINUTES"
#: Environment variable naming the folder for the soak's ledgers, logs and output log.
OUT_ENV = "PIDFENCE_SOAK_OUT"


@dataclass(frozen=True)
class SoakConfig(ExistingServices):
    """One soak run.

    Args:
        minutes: how long producers write (no fault round starts within one lease lifetime
            plus 15 s of the end).
        out: ledgers, logs, the output log and ``samples.jsonl`` go here.
        plot: where the PNG goes (None: no plot).
        producers: producer processes (4: one per fault: kill, zombie, lease-zombie, resend).
        partitions: partitions of the raw topic.
        rate: records per second per producer.
        lease_lifetime_s: the lease servers' lease lifetime (producers roll at 23/24 of it); the
            sink's producer entry lifetime is set to the same.
        fault_every_s: one round of producer faults this often; the sink restart falls halfway.
        first_fault_s: the first round starts this long after the producers.
        sample_s: sampling period.
        trigger_s: the sink's processing-time trigger.
        resend_every: the resend producer re-sends one acknowledged record every N records.
        master: the sink's Spark master.
        sink_restarts: restart the sink halfway between fault rounds (False: one sink instance
            runs from start to end, the steady soak of ``pidfence bench soak_steady``).
        bootstrap: use this Kafka instead of starting one (its RSS is then not sampled).
        zk_hosts: use this ZooKeeper instead of starting one (:class:`ExistingServices`).
    """

    minutes: float = 30.0
    out: Path = Path("out-soak")
    plot: Path | None = None
    producers: int = 4
    partitions: int = 4
    rate: float = 100.0
    lease_lifetime_s: float = 20.0
    fault_every_s: float = 300.0
    first_fault_s: float = 10.0
    sample_s: float = 60.0
    trigger_s: float = 2.0
    resend_every: int = 100
    master: str = "local[2]"
    sink_restarts: bool = True

    def __post_init__(self) -> None:
        if not 0.5 <= self.minutes <= 24 * 60:
            raise BadDemoOption(f"soak minutes must be 0.5..1440, got {self.minutes:g}")
        if self.producers < 4:
            raise BadDemoOption(
                f"the soak needs >= 4 producers (one per fault), got {self.producers}"
            )
        if self.rate <= 0 or self.sample_s <= 0 or self.trigger_s <= 0:
            raise BadDemoOption("rate, sample_s and trigger_s must be > 0")
        if self.fault_every_s < 2 * self.lease_lifetime_s:
            raise BadDemoOption(
                f"fault_every_s ({self.fault_every_s:g}) must be at least twice the lease "
                f"lifetime ({self.lease_lifetime_s:g}): the lease-zombie waits out a lease"
            )

    @property
    def seconds(self) -> float:
        """The producing time in seconds."""
        return self.minutes * 60.0

    @property
    def lifetime(self) -> str:
        """The lease lifetime as the lease server and the sink take it."""
        return f"{self.lease_lifetime_s:g}s"


def config_from_env(
    quick: bool,
    plot: Path | None,
    environ: Mapping[str, str] | None = None,
    *,
    steady: bool = False,
) -> SoakConfig:
    """The bench's config: 30 minutes (``quick``: 3), ``PIDFENCE_SOAK_MINUTES`` overrides.

    Faults come every 5 minutes in runs of 10 minutes or more, else every minute; samples every
    minute, or a quarter of the run when it is shorter than 3 minutes. ``steady``: 2 hours by
    default, a 0.5 s trigger, and the sink never restarted (producer faults still run).
    """
    env = os.environ if environ is None else environ
    text = env.get(MINUTES_ENV, "").strip()
    try:
        default = 3.0 if quick else (120.0 if steady else 30.0)
        minutes = float(text) if text else default
    except ValueError:
        raise BadDemoOption(f"{MINUTES_ENV} must be a number of minutes, got {text!r}") from None
    out_text = env.get(OUT_ENV, "").strip()
    out = Path(out_text) if out_text else Path(tempfile.mkdtemp(prefix="pidfence-soak-"))
    return SoakConfig(
        minutes=minutes,
        out=out,
        plot=plot,
        fault_every_s=300.0 if minutes >= 10 else 60.0,
        sample_s=60.0 if minutes >= 3 else minutes * 15.0,
        trigger_s=0.5 if steady else 2.0,
        sink_restarts=not steady,
    )
