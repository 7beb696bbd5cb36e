"""Deliberately broken builds: patches that a proof must catch (its teeth).

Each mutation changes the product the way a plausible bug would, in the process that installs it
(``python -m pidfence.testing.run --mutation NAME -- produce ...``), through the public API only,
so it survives refactors of the code it breaks. A test runs the proof with a mutation installed
and asserts that the proof fails.

* ``resend-new-seq-on-timeout``: a record not acknowledged within
  :data:`RESEND_AFTER_S` is sent again as a new record (a new seq), as an application that
  "retries on timeout" above the producer would do. When the first copy did land (its reply was
  lost on the way back) the same event is appended twice: ``event_duplicate``.
* ``lease-share-per-connection``: the lease server gives each connection the share meant for
  each client (its turns, in-flight bound and rate buckets), so a flooder's connection count
  buys it more of the server, as a server keyed by connection would.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from pidfence.wire import PidfenceError

#: How long the broken producer waits for an acknowledgement before it re-sends.
RESEND_AFTER_S = 1.0


class UnknownMutation(PidfenceError):
    """A mutation name that does not exist; the message lists the names that do."""


class _Pending:
    """Records a broken producer sent and has not seen acknowledged, with their send time."""

    def __init__(self) -> None:
        self.records: dict[int, tuple[float, dict[str, Any]]] = {}
        self.next_token = 0


def _resend_new_seq_on_timeout() -> None:
    from pidfence.producer import IdempotentProducer

    produce, poll, flush = (
        IdempotentProducer.produce,
        IdempotentProducer.poll,
        IdempotentProducer.flush,
    )

    def pending_of(producer: Any) -> _Pending:
        found: _Pending | None = producer.__dict__.get("_mutation_pending")
        if found is None:
            found = producer.__dict__["_mutation_pending"] = _Pending()
        return found

    def send(producer: Any, kwargs: dict[str, Any], resent: bool) -> int:
        pending = pending_of(producer)
        token = pending.next_token
        pending.next_token += 1
        user = kwargs.get("on_delivery")

        def acknowledged(err: Any, msg: Any) -> None:
            pending.records.pop(token, None)
            if user is not None:
                user(err, msg)

        if not resent:  # the copy is never re-sent again: one extra copy per record
            pending.records[token] = (time.monotonic(), kwargs)
        return produce(producer, **{**kwargs, "on_delivery": acknowledged})

    def resend_overdue(producer: Any) -> None:
        pending = pending_of(producer)
        now = time.monotonic()
        overdue = [t for t, (sent, _) in pending.records.items() if now - sent >= RESEND_AFTER_S]
        for token in overdue:
            _, kwargs = pending.records.pop(token)
            send(producer, kwargs, resent=True)

    def broken_produce(self: Any, topic: str, value: Any, **kwargs: Any) -> int:
        resend_overdue(self)
        return send(self, {"topic": topic, "value": value, **kwargs}, resent=False)

    def broken_poll(self: Any, timeout: float = 0.0) -> int:
        served: int = poll(self, timeout)
        resend_overdue(self)
        return served

    def broken_flush(self: Any, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = deadline and max(0.0, deadline - time.monotonic())
            step = RESEND_AFTER_S if left is None else min(RESEND_AFTER_S, left)
            in_flight: int = flush(self, step)
            resend_overdue(self)
            if in_flight == 0 and not pending_of(self).records:
                return 0
            if deadline is not None and time.monotonic() >= deadline:
                return in_flight

    IdempotentProducer.produce = broken_produce  # type: ignore[method-assign,assignment]
    IdempotentProducer.poll = broken_poll  # type: ignore[method-assign]
    IdempotentProducer.flush = broken_flush  # type: ignore[method-assign]


def _lease_share_per_connection() -> None:
    from pidfence.pid_allocator.fair import Served, Turns

    def per_connection(self: Turns, connection: Served) -> str:
        return f"{connection.client}#{id(connection)}"

    Turns.key = per_connection  # type: ignore[method-assign]


MUTATIONS: dict[str, Callable[[], None]] = {
    "resend-new-seq-on-timeout": _resend_new_seq_on_timeout,
    "lease-share-per-connection": _lease_share_per_connection,
}


def install_mutation(name: str) -> None:
    """Break this process's product as ``name`` says.

    Raises:
        UnknownMutation: no mutation has that name.
    """
    try:
        MUTATIONS[name]()
    except KeyError:
        raise UnknownMutation(
            f"unknown mutation {name!r}: use one of {', '.join(sorted(MUTATIONS))}"
        ) from None
