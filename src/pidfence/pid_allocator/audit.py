"""The audit trail of a lease server: who was refused, logged once per peer, kind and interval.

Every refusal an attacker can cause (a failed ``hello``, a frame that breaks a decode limit, a
NOT_OWNER answer, a RATE_LIMITED answer, a pending connection evicted or timed out, a refused
connection) is counted in ``pidfence_audit_events_total{event}`` and logged with the peer's
address, but at most once per (event, address) per ``interval_s``: the next line after a quiet
interval says how many were not logged in between. A flood therefore costs the log one line per
peer and interval, and the metric still counts every event.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from pidfence.pid_allocator.metrics import ServerMetrics

log = logging.getLogger("pidfence.lease_server.audit")

#: Event names (the metric's ``event`` label).
HELLO_FAILED = "hello_failed"
UNAUTHENTICATED = "unauthenticated"
FRAME_LIMIT = "frame_limit"
NOT_OWNER = "not_owner"
RATE_LIMITED = "rate_limited"
EVICTED = "evicted"
PENDING_TIMEOUT = "pending_timeout"
REFUSED = "refused"
TLS_FAILED = "tls_failed"

#: Peers remembered at most; past it, entries older than the interval are forgotten.
MAX_PEERS = 10_000


class AuditTrail:
    """Counts refusals and logs each (event, peer) at most once per interval.

    Args:
        metrics: where the counts go.
        interval_s: at most one line per (event, address) this often.
        clock: monotonic seconds (injected in tests).
        logger: where the lines go.
    """

    def __init__(
        self,
        metrics: ServerMetrics,
        interval_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        logger: logging.Logger = log,
    ) -> None:
        self._counts = metrics.audit_events
        self.interval_s = interval_s
        self._clock = clock
        self._log = logger
        self._last: dict[tuple[str, str], list[float]] = {}

    def note(self, event: str, address: str, detail: str = "") -> None:
        """Count one ``event`` from ``address``; log it unless this pair was logged lately."""
        self._counts[event] = self._counts.get(event, 0) + 1
        key = (event, address)
        now = self._clock()
        entry = self._last.get(key)
        if entry is not None and now - entry[0] < self.interval_s:
            entry[1] += 1
            return
        suppressed = 0 if entry is None else int(entry[1])
        if entry is None and len(self._last) >= MAX_PEERS:
            self._forget(now)
        self._last[key] = [now, 0]
        self._log.warning(
            "%s from %s%s%s",
            event,
            address,
            f": {detail}" if detail else "",
            f" (and {suppressed} more since the last line)" if suppressed else "",
            extra={"audit": event, "peer": address, "suppressed": suppressed},
        )

    def _forget(self, now: float) -> None:
        stale = [k for k, (at, _) in self._last.items() if now - at >= self.interval_s]
        for key in stale:
            del self._last[key]
        if len(self._last) >= MAX_PEERS:
            self._last.clear()  # a flood from more peers than that: log more, never grow
