"""Opening a producer fresh or from a checkpoint: the ``open_producer`` that a copier and the
load generator take, so a restarted process continues what its state file saved."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from pidfence.producer.checkpoint import ProducerCheckpoint
from pidfence.producer.idempotent import IdempotentProducer

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


__all__ = ["OpenProducer", "open_producer_factory"]
