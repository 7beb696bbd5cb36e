"""The load generator behind ``pidfence produce``: deterministic records, resumable.

Record ``i`` of producer ``name`` always has the same key, partition and value, so a producer
restarted from its state file (checkpoint + next ``i``, saved atomically after a flush) re-sends
exactly the records after its checkpoint with exactly the seqs they had: the broker rules drop
the ones that had already landed as ``DUPLICATE``.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pidfence.pid_allocator.clock import wall_clock_ms
from pidfence.producer.checkpoint import ProducerCheckpoint
from pidfence.producer.errors import BadCheckpoint
from pidfence.producer.idempotent import IdempotentProducer
from pidfence.producer.opening import OpenProducer, PeriodicCheckpoints
from pidfence.producer.statefile import load_state, save_state

log = logging.getLogger(__name__)

STATE_VERSION = 1


@dataclass(frozen=True)
class LoadSpec:
    """What one load generator writes.

    Attributes:
        name: producer name, written into every value.
        topic: an existing topic.
        count: records in total, across restarts.
        value_size: bytes per value (JSON padded with spaces; never truncated).
        keys: distinct keys ``k0..k{keys-1}`` (0: unkeyed records, record ``i`` to partition
            ``i % partitions``: a restart must put every record where it went before).
        rate: records per second (0: as fast as possible).
        resend_every: every N records re-send the last acknowledged record of each partition
            with its original header (a simulated lost acknowledgement; 0: never).
        checkpoint_every: flush and save the state file every N records.
        stop_after_checkpoint: fault hook for chaos tests: right after saving the state file
            for the N-th time in this run, the process stops itself with SIGSTOP (a zombie
            frozen at a checkpoint; the test sends SIGCONT). 0: never.
    """

    name: str
    topic: str
    count: int
    value_size: int = 100
    keys: int = 1000
    rate: float = 0.0
    resend_every: int = 0
    checkpoint_every: int = 500
    stop_after_checkpoint: int = 0

    def __post_init__(self) -> None:
        if self.count < 0 or self.keys < 0 or self.value_size < 0 or self.rate < 0:
            raise ValueError("count, keys, value_size and rate must be >= 0")
        if self.checkpoint_every < 1 or self.resend_every < 0:
            raise ValueError("checkpoint_every must be >= 1 and resend_every >= 0")


def make_value(name: str, i: int, ts_ms: int, size: int) -> bytes:
    """Record ``i``'s value: ``{"producer", "i", "uid", "ts"}`` JSON, space-padded to ``size``."""
    uid = (i * 2654435761) % 100_003
    body = json.dumps(
        {"producer": name, "i": i, "uid": f"u{uid}", "ts": ts_ms}, separators=(",", ":")
    ).encode()
    return body + b" " * (size - len(body)) if len(body) < size else body


@dataclass
class LoadResult:
    """What one run did."""

    first_i: int
    next_i: int
    resumed: bool
    resumed_from_expired: bool
    resent: int
    rollovers: int
    pid: int
    generation: int


class LoadGenerator:
    """Sends records ``next_i .. count-1`` and keeps the state file current.

    Args:
        spec: what to send.
        open_producer: ``f(checkpoint or None)`` -> a producer (resumed from the checkpoint).
        state_path: the state file (None: no resume, no saves).
        clock: monotonic seconds (rate limiting).
        sleep: sleep function.
        wall_ms: epoch milliseconds (the values' ``ts`` base on a fresh start).
    """

    def __init__(
        self,
        spec: LoadSpec,
        open_producer: OpenProducer,
        state_path: str | Path | None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        wall_ms: Callable[[], int] = wall_clock_ms,
    ) -> None:
        self.spec = spec
        self._open = open_producer
        self.state_path = Path(state_path) if state_path is not None else None
        self._clock = clock
        self._sleep = sleep
        self._wall_ms = wall_ms
        self._saves = 0
        #: Records this run handed to the producer (a failure before the first loses nothing).
        self.produced = 0
        self._checkpoints = PeriodicCheckpoints(f"state file {self.state_path}")

    def _load(self) -> tuple[int, int, ProducerCheckpoint | None]:
        data = load_state(self.state_path) if self.state_path is not None else None
        if data is None:
            return 0, self._wall_ms(), None
        try:
            if data.get("v") != STATE_VERSION or data.get("topic") != self.spec.topic:
                raise BadCheckpoint(
                    f"state file {self.state_path} is for topic {data.get('topic')!r} "
                    f"(version {data.get('v')!r}), not {self.spec.topic!r}; use another --state"
                )
            next_i, start_ms = int(data["next_i"]), int(data["start_ms"])
            raw = data.get("checkpoint")
            for option, value in self._repeated().items():
                if data.get(option, value) != value:
                    raise BadCheckpoint(
                        f"state file {self.state_path} was written with --{option} "
                        f"{data[option]}, not {value}: the records a resume sends again must "
                        f"be the same; resume with --{option} {data[option]}, or use another "
                        "--state"
                    )
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, BadCheckpoint):
                raise
            raise BadCheckpoint(f"state file {self.state_path} is incomplete ({exc!r})") from exc
        cp = ProducerCheckpoint.from_dict(raw) if raw is not None else None
        return next_i, start_ms, cp

    def _repeated(self) -> dict[str, object]:
        """The options that shape each record's key and value: a resume must repeat them."""
        spec = self.spec
        return {
            "name": spec.name,
            "keys": spec.keys,
            "value-size": spec.value_size,
            "rate": spec.rate,
        }

    def _save(
        self, producer: IdempotentProducer, next_i: int, start_ms: int, last: bool = False
    ) -> None:
        if self.state_path is None:
            return  # nothing resumes this run: no checkpoint, no lease server question
        checkpoint = self._checkpoints.take(producer, last)
        if checkpoint is not None:
            self._store(checkpoint, next_i, start_ms)

    def _store(self, checkpoint: ProducerCheckpoint, next_i: int, start_ms: int) -> None:
        if self.state_path is None:
            return
        save_state(
            self.state_path,
            {
                "v": STATE_VERSION,
                "topic": self.spec.topic,
                "next_i": next_i,
                "start_ms": start_ms,
                "checkpoint": checkpoint.to_dict(),
                **self._repeated(),
            },
        )
        self._saves += 1
        if self._saves == self.spec.stop_after_checkpoint:
            log.warning("fault hook: stopping this process (SIGSTOP) after save %d", self._saves)
            os.kill(os.getpid(), signal.SIGSTOP)

    def _checkpoint(
        self, producer: IdempotentProducer, next_i: int, start_ms: int, last: bool = False
    ) -> None:
        """Flush, then save (see :class:`~pidfence.producer.opening.PeriodicCheckpoints`:
        skipped while no lease server answers, unless ``last``; ``ProducerFenced``: this
        instance was replaced)."""
        left = producer.flush(60.0)
        while left:
            left = producer.flush(60.0)
        self._save(producer, next_i, start_ms, last)

    def run(self, on_progress: Callable[[int], None] | None = None) -> LoadResult:
        """Send until ``count`` records are done; returns what happened.

        ``on_progress(next_i)`` is called after every checkpoint and at the end.
        """
        spec = self.spec
        first_i, start_ms, checkpoint = self._load()
        producer = self._open(checkpoint)
        result = LoadResult(first_i, first_i, checkpoint is not None, False, 0, 0, 0, 0)
        try:
            result.resumed_from_expired = producer.resumed_from_expired
            # Save right away: a resumed producer holds a new generation (a restart killed
            # before this point probes it again).
            self._checkpoint(producer, first_i, start_ms)
            started = self._clock()
            interval = 1.0 / spec.rate if spec.rate else 0.0
            key_count = spec.keys
            topic = spec.topic
            for i in range(first_i, spec.count):
                if interval:
                    delay = started + (i - first_i) * interval - self._clock()
                    if delay > 0:
                        self._sleep(delay)
                if producer.rollover_due:
                    # roll() drains, rolls, and stores next_i with the successor's checkpoint:
                    # its seqs start at record i (docs/producer.md, "Lease rollover").
                    producer.roll(functools.partial(self._store, next_i=i, start_ms=start_ms))
                ts = start_ms + (int(i * interval * 1000) if interval else i)
                value = make_value(spec.name, i, ts, spec.value_size)
                event = f"{spec.name}:{i}"
                if key_count:
                    producer.produce(topic, value, key=f"k{i % key_count}".encode(), event_id=event)
                else:
                    producer.produce(
                        topic,
                        value,
                        partition=i % producer.partition_count(topic),
                        event_id=event,
                    )
                self.produced += 1
                done = i + 1
                if spec.resend_every and done % spec.resend_every == 0:
                    producer.poll(0)
                    result.resent += producer.resend_acknowledged(1)
                if done % spec.checkpoint_every == 0:
                    self._checkpoint(producer, done, start_ms)
                    if on_progress is not None:
                        on_progress(done)
                elif done % 64 == 0:
                    producer.poll(0)
            self._checkpoint(producer, max(first_i, spec.count), start_ms, last=True)
            result.next_i = max(first_i, spec.count)
            result.rollovers = producer.rollovers
            result.pid = producer.sequencer.pid
            result.generation = producer.sequencer.generation
            if on_progress is not None:
                on_progress(result.next_i)
        finally:
            producer.close()
        return result
