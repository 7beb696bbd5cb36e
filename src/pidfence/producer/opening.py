"""Opening a producer fresh or from a checkpoint, and taking its periodic checkpoints: what a
copier and the load generator share, so a restarted process continues what its state file
saved and a replaced one stops before it overwrites its replacement's state."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from pidfence.producer.checkpoint import ProducerCheckpoint
from pidfence.producer.errors import LeaseServerDown
from pidfence.producer.idempotent import IdempotentProducer

log = logging.getLogger(__name__)

#: Opens the producer: leases fresh given None, resumes the checkpoint given one.
OpenProducer = Callable[[ProducerCheckpoint | None], IdempotentProducer]


def open_producer_factory(
    config: Any,
    lease_client: Any,
    ledger: Any = None,
    topics: Sequence[str] = (),
    **kwargs: Any,
) -> OpenProducer:
    """An ``open_producer`` that leases fresh without a checkpoint and resumes with one.

    ``topics`` are the topics it writes: a resume fences and scans them even when the
    checkpoint names none yet (one saved before the first record).
    """

    def open_producer(checkpoint: ProducerCheckpoint | None) -> IdempotentProducer:
        if checkpoint is None:
            return IdempotentProducer(config, lease_client, ledger=ledger, **kwargs)
        return IdempotentProducer.resume(
            checkpoint, lease_client, config, ledger=ledger, topics=topics, **kwargs
        )

    return open_producer


class PeriodicCheckpoints:
    """A process's periodic checkpoints (``producer.checkpoint()``, which asks the lease
    authority whether this instance was replaced).

    While no lease server answers, a periodic save is skipped (logged once per outage) and the
    next interval tries again: not saving is safe, a resume re-sends from the last saved
    position and the rules drop the duplicates. The last save before the process ends is not
    skipped: its ``LeaseServerDown`` says that a rerun continues.

    ``ProducerFenced`` (this instance was replaced) is raised: the process must stop.

    Args:
        what: names the state in the log lines (e.g. ``"state file copy.json"``).
    """

    def __init__(self, what: str) -> None:
        self._what = what
        self._skipping = False
        #: Saves skipped so far because no lease server answered.
        self.skipped = 0

    def take(self, producer: IdempotentProducer, last: bool = False) -> ProducerCheckpoint | None:
        """The checkpoint to save now, or None when this periodic save is skipped.

        Raises:
            ProducerFenced: this instance was replaced: stop, save nothing.
            LeaseServerDown: ``last`` and no lease server answered.
            NotFlushed / DeliveryFailed: as ``checkpoint()`` raises them.
        """
        try:
            checkpoint = producer.checkpoint()
        except LeaseServerDown as exc:
            if last:
                raise
            self.skipped += 1
            if not self._skipping:
                log.warning(
                    "not saving %s now: no lease server confirmed this instance still owns its "
                    "pid (%s); trying again at the next checkpoint (a restart re-sends from the "
                    "last saved position)",
                    self._what,
                    exc,
                )
            self._skipping = True
            return None
        if self._skipping:
            log.info("saving %s again: a lease server answered", self._what)
        self._skipping = False
        return checkpoint


__all__ = ["OpenProducer", "PeriodicCheckpoints", "open_producer_factory"]
