"""Errors of the PID lease protocol: one class per wire error code (DESIGN.md §5)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from pidfence.wire import PidfenceError


class LeaseError(PidfenceError):
    """An error answered by a lease server (or raised by the client on its behalf).

    Attributes:
        code: the wire error code, e.g. ``"UNKNOWN_PID"``.
    """

    code: ClassVar[str] = "LEASE_ERROR"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class MalformedRequest(LeaseError):
    """The request frame or one of its fields is invalid; fix the caller, do not retry."""

    code = "MALFORMED_REQUEST"


class FrameLimitExceeded(MalformedRequest):
    """A frame broke a decode limit (its size, a length, its nesting or its shape before
    ``hello``): answered MALFORMED_REQUEST naming the limit, then the connection is closed."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"frame breaks a decode limit (connection closed): {reason}")


class UnsupportedVersion(LeaseError):
    """The request's ``v`` is not a protocol version this server speaks."""

    code = "UNSUPPORTED_VERSION"


class UnknownOp(LeaseError):
    """The request's ``op`` is not ``hello``, ``lease``, ``bump``, ``roll``, ``describe`` or
    ``ping``."""

    code = "UNKNOWN_OP"


class UnknownPid(LeaseError):
    """A bump of the caller's own pid whose lease ended: ``roll`` it (lineage) or lease anew.

    Only a caller holding the pid's secret gets this; anyone else gets ``NotOwner``.
    """

    code = "UNKNOWN_PID"


class StaleGeneration(LeaseError):
    """A bump or roll from a generation that is not the pid's latest, or of a retired pid.

    Another caller moved the pid on: this caller is fenced. Only a caller holding the pid's
    secret gets this reply.

    Attributes:
        successor: the pid this one was rolled into, when it was retired by a roll, else None.
        successor_generation: the successor's starting generation (what a resumer holding this
            pid's checkpoint bumps or rolls the successor from), else None.
    """

    code = "STALE_GENERATION"

    def __init__(
        self,
        message: str,
        successor: int | None = None,
        successor_generation: int | None = None,
    ) -> None:
        super().__init__(message)
        self.successor = successor
        self.successor_generation = successor_generation


class NotOwner(LeaseError):
    """The request does not carry the pid's secret, or the server knows no such pid.

    Both cases get the identical reply, which reveals nothing about the pid.
    """

    code = "NOT_OWNER"


class RateLimited(LeaseError):
    """This client is over its share (its rate, or its part of the ZooKeeper queue): retry after
    ``retry_after_ms`` (the reply's field of that name).

    Attributes:
        retry_after_ms: when the server will take this client's request again.
    """

    code = "RATE_LIMITED"
    retriable = True

    def __init__(self, message: str, retry_after_ms: int = 100) -> None:
        super().__init__(message)
        self.retry_after_ms = retry_after_ms


class Unauthenticated(LeaseError):
    """The server requires ``hello`` with a listed token first (``--auth-tokens``)."""

    code = "UNAUTHENTICATED"


class LeaseCapacityExhausted(LeaseError):
    """No lease can be issued: the server's lease ring is full of live leases (add servers or
    raise ``--capacity``), the client holds its share of it (``--client-share``), or a pid used
    every generation it may have."""

    code = "CAPACITY"


class LeaseServiceUnavailable(LeaseError):
    """The server cannot answer right now; retry (another server may answer): ZooKeeper is
    unreachable or a block claim timed out, the server is at its connection limits, or it
    failed inside."""

    code = "UNAVAILABLE"
    retriable = True


class InvalidServerList(LeaseError, ValueError):
    """A ``LeaseClient`` server list that is not ``HOST:PORT[,HOST:PORT]``; fix the option."""

    code = "INVALID_SERVER_LIST"


class LeaseServerUnreachable(LeaseError):
    """No lease server answered within the client's retries."""

    code = "UNREACHABLE"
    retriable = True


class LeaseTlsMismatch(LeaseError):
    """The client and the server disagree on TLS (one speaks it, the other does not, or the
    client does not trust the server's certificate): a rerun meets it again."""

    code = "TLS_MISMATCH"


ERRORS_BY_CODE: dict[str, type[LeaseError]] = {
    cls.code: cls
    for cls in (
        MalformedRequest,
        UnsupportedVersion,
        UnknownOp,
        UnknownPid,
        StaleGeneration,
        LeaseCapacityExhausted,
        LeaseServiceUnavailable,
        NotOwner,
        RateLimited,
        Unauthenticated,
    )
}


def _optional_int(value: Any) -> int | None:
    return value if type(value) is int else None


def error_from_reply(code: str, message: str, reply: Mapping[str, Any] | None = None) -> LeaseError:
    """The exception for an error reply; an unknown code becomes a plain ``LeaseError``."""
    cls = ERRORS_BY_CODE.get(code)
    if cls is None:
        error = LeaseError(f"lease server answered unknown error code {code!r}: {message}")
        return error
    if cls is StaleGeneration:
        fields = reply or {}
        return StaleGeneration(
            message,
            _optional_int(fields.get("successor")),
            _optional_int(fields.get("successor_generation")),
        )
    if cls is RateLimited:
        wait = _optional_int((reply or {}).get("retry_after_ms"))
        return RateLimited(message, *([] if wait is None else [max(0, wait)]))
    return cls(message)
