"""The lease servers as the sink's authority on adoption (DESIGN §4 amended a third time).

Where the sink could not see producers start (a trimmed head, ``startingOffsets=latest``, offsets
deleted before it read them) a FENCE it never saw may come before what it reads. The rules then
ask the lease servers (``describe``) about each pid they meet there, once per batch and
partition: :class:`BatchAuthority` asks and records every answer, which the batch commits with its
decisions, so a re-run or a rebuild of the state decides exactly as the live run did
(:func:`~pidfence.broker_plugin.recorded_authority`). Without lease servers (``leaseServer``
unset) nothing is adopted: such records are ``UNKNOWN_PID``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from pidfence.durations import format_duration_ms
from pidfence.spark_sink.errors import SinkOptionError
from pidfence.wire import PidfenceError, PidStatus

if TYPE_CHECKING:
    from pidfence.pid_allocator import LeaseClient

log = logging.getLogger(__name__)
#: The line ``pidfence sink`` prints at start without ``--lease-server``.
NO_AUTHORITY: Final = (
    "adoption is off: a producer the sink meets where it could not see it start (a trimmed head, "
    "--starting-offsets latest, --allow-data-loss) is refused as UNKNOWN_PID; give "
    "--lease-server HOST:PORT[,...] to adopt producers the lease servers vouch for"
)


class BatchAuthority:
    """The authority of one partition's batch: asks the lease servers once per pid and keeps
    what they answered (:attr:`answers`).

    Raises (when called):
        LeaseServerUnreachable, LeaseServiceUnavailable, RateLimited: retriable; the batch
            fails and Spark runs it again, as for any other outage.
    """

    def __init__(self, client: LeaseClient) -> None:
        self.client = client
        self.answers: dict[int, PidStatus] = {}

    def __call__(self, pid: int) -> PidStatus:
        found = self.answers.get(pid)
        if found is None:
            found = self.answers[pid] = self.client.describe(pid)
        return found

    def recorded(self) -> dict[str, list[Any]]:
        """The answers as a manifest part records them (pid as text: a JSON key)."""
        return {str(pid): status.to_list() for pid, status in sorted(self.answers.items())}


def recorded_answers(raw: Mapping[str, Any] | None) -> dict[int, PidStatus] | None:
    """A manifest part's recorded answers (None: the batch ran without lease servers)."""
    if raw is None:
        return None
    return {int(pid): PidStatus.from_list(row) for pid, row in raw.items()}


def lease_client(
    servers: str,
    token_file: str | None = None,
    tls_ca: str | None = None,
    tls_cert: str | None = None,
    tls_key: str | None = None,
) -> LeaseClient:
    """A client of the lease servers with the token and TLS the options (else the environment,
    as for producers: ``$PIDFENCE_LEASE_TOKEN_FILE``, ``$PIDFENCE_LEASE_TOKEN``,
    ``$PIDFENCE_LEASE_TLS_CA``) name."""
    from pidfence.pid_allocator import LeaseClient, lease_client_options

    def path(value: str | None) -> Path | None:
        return None if value is None else Path(value)

    options = lease_client_options(path(token_file), path(tls_ca), path(tls_cert), path(tls_key))
    return LeaseClient(servers, **options)


def check_lifetime(client: LeaseClient, lifetime_ms: int) -> None:
    """Refuse an entry ``lifetime`` shorter than the lease servers' lease lifetime: the sink
    would forget producers whose lease is live, and adopting one again could append its re-sends
    twice. Lease servers that do not answer are not a reason to refuse a start (logged).

    Raises:
        SinkOptionError: the option is shorter than the lifetime the servers give leases.
    """
    try:
        theirs = client.ping().get("lifetime_ms")
    except (PidfenceError, OSError) as exc:
        log.warning(
            "the lease servers did not say their lease lifetime (%s); the sink's lifetime "
            "(%s) must be at least theirs",
            exc,
            format_duration_ms(lifetime_ms),
        )
        return
    if not isinstance(theirs, int):
        log.warning(
            "the lease servers did not say their lease lifetime (no token here to authenticate "
            "with?); the sink's lifetime (%s) must be at least theirs",
            format_duration_ms(lifetime_ms),
        )
        return
    if lifetime_ms < theirs:
        raise SinkOptionError(
            f"option lifetime={format_duration_ms(lifetime_ms)} is shorter than the lease "
            f"servers' lease lifetime ({format_duration_ms(theirs)}): the sink would forget "
            "producers whose lease is live, and adopting one again could append its re-sends "
            f"twice. Set lifetime to {format_duration_ms(theirs)} or more (--lifetime of "
            "pidfence sink)"
        )
