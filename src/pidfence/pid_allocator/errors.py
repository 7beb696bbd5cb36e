"""Errors of the PID lease protocol: one class per wire error code (DESIGN.md §5)."""

from __future__ import annotations

from typing import ClassVar

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


class UnsupportedVersion(LeaseError):
    """The request's ``v`` is not a protocol version this server speaks."""

    code = "UNSUPPORTED_VERSION"


class UnknownOp(LeaseError):
    """The request's ``op`` is not ``lease``, ``bump`` or ``ping``."""

    code = "UNKNOWN_OP"


class UnknownPid(LeaseError):
    """A bump of a pid that was never issued or whose lease expired: lease a new pid."""

    code = "UNKNOWN_PID"


class StaleGeneration(LeaseError):
    """A bump from a generation that is not the pid's latest: another caller bumped it (fenced)."""

    code = "STALE_GENERATION"


class LeaseCapacityExhausted(LeaseError):
    """The server's lease ring is full of live leases: add servers or raise ``--capacity``."""

    code = "CAPACITY"


class LeaseServiceUnavailable(LeaseError):
    """The server cannot reach ZooKeeper right now; retry (another server may answer)."""

    code = "UNAVAILABLE"
    retriable = True


class LeaseServerUnreachable(LeaseError):
    """No lease server answered within the client's retries."""

    code = "UNREACHABLE"
    retriable = True


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
    )
}


def error_from_reply(code: str, message: str) -> LeaseError:
    """The exception for an error reply; an unknown code becomes a plain ``LeaseError``."""
    cls = ERRORS_BY_CODE.get(code)
    if cls is None:
        error = LeaseError(f"lease server answered unknown error code {code!r}: {message}")
        return error
    return cls(message)
