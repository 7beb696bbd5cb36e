"""Frames and requests of the lease protocol (DESIGN.md §5).

A frame is a 4-byte big-endian length, then that many bytes of one msgpack map, decoded within
the limits of ``decode.py``. Requests are validated field by field here, so the server's handlers
only ever see well-typed values. Before ``hello`` a connection may send only a ``ping`` of exactly
``{v, op, id}`` or a ``hello`` of ``{v, op, id, token}``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import msgpack

from pidfence.pid_allocator.decode import MAX_PARTITIONS, check_shape, decode_message
from pidfence.pid_allocator.errors import (
    FrameLimitExceeded,
    MalformedRequest,
    UnknownOp,
    UnsupportedVersion,
)
from pidfence.pid_allocator.generations import GENERATION_LIMIT
from pidfence.wire.cert import PRODUCER_KEY_BYTES

PROTOCOL_VERSION = 1
LENGTH = struct.Struct(">I")
PID_LIMIT = 2**63
PARTITION_LIMIT = 2**31
MAX_TOPIC_CHARS = 249
MAX_ID_CHARS = 128
MAX_TOKEN_CHARS = 64
MAX_SECRET_BYTES = 64
MAX_AUTH_TOKEN_CHARS = 256
OPS = ("hello", "lease", "bump", "roll", "describe", "ping")
#: The only fields a frame may carry before ``hello``, per op.
PRE_AUTH_FIELDS = {
    "ping": frozenset({"v", "op", "id"}),
    "hello": frozenset({"v", "op", "id", "token"}),
}

RequestId = int | str | None


@dataclass(slots=True)
class LeaseRequest:
    """``op=lease``: the partitions the caller will write (informational) and, optionally, the
    producer's raw Ed25519 public key for a v2 ``cert``."""

    id: RequestId
    partitions: tuple[tuple[str, int], ...]
    key: bytes | None = None


@dataclass(slots=True)
class PidRequest:
    """A request about a leased pid: the caller's pid, current generation and the pid's secret;
    ``token`` makes a retry idempotent; ``key`` names the producer's key for a v2 ``cert``. A
    missing secret is ``b""`` (answered NOT_OWNER, never MALFORMED)."""

    id: RequestId
    pid: int
    generation: int
    secret: bytes
    token: str | None
    key: bytes | None = None


@dataclass(slots=True)
class BumpRequest(PidRequest):
    """``op=bump``: hand out ``generation + 1`` of ``pid``."""


@dataclass(slots=True)
class RollRequest(PidRequest):
    """``op=roll``: retire ``pid`` at ``generation`` and issue its successor (its ``cert``
    naming ``key`` when given)."""


@dataclass(slots=True)
class DescribeRequest:
    """``op=describe``: what the lease authority knows of ``pid`` (read-only)."""

    id: RequestId
    pid: int


@dataclass(slots=True)
class HelloRequest:
    """``op=hello``: authenticate the connection with an auth token."""

    id: RequestId
    token: str


@dataclass(slots=True)
class PingRequest:
    """``op=ping``."""

    id: RequestId


#: Requests are plain slotted dataclasses, not frozen ones: one is built per frame, and a
#: frozen dataclass's ``__init__`` (``object.__setattr__`` per field) costs twice as much.
Request = LeaseRequest | BumpRequest | RollRequest | DescribeRequest | PingRequest | HelloRequest


class RequestRejected(Exception):
    """A request that gets an error reply; ``id`` is echoed when it could be read."""

    def __init__(self, request_id: RequestId, error: Exception) -> None:
        super().__init__(str(error))
        self.request_id = request_id
        self.error = error


def encode_frame(message: dict[str, Any]) -> bytes:
    """Length-prefixed msgpack frame of ``message``."""
    body: bytes = msgpack.packb(message, use_bin_type=True)
    return LENGTH.pack(len(body)) + body


def _int(value: Any, name: str, lo: int, hi: int) -> int:
    if type(value) is not int or not lo <= value < hi:
        raise MalformedRequest(f"{name} must be an integer in [{lo}, {hi}), got {value!r:.80}")
    return value


def _request_id(message: dict[Any, Any]) -> RequestId:
    value = message.get("id")
    if value is None:
        return None
    if type(value) is int and -PID_LIMIT <= value < PID_LIMIT:
        return value
    if isinstance(value, str) and len(value) <= MAX_ID_CHARS:
        return value
    raise MalformedRequest(f"id must be an int64 or a string of <= {MAX_ID_CHARS} characters")


def _partitions(value: Any) -> tuple[tuple[str, int], ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or len(value) > MAX_PARTITIONS:
        raise MalformedRequest(f"partitions must be a list of <= {MAX_PARTITIONS} [topic, n] pairs")
    out: list[tuple[str, int]] = []
    for item in value:
        if not isinstance(item, list) or len(item) != 2:
            raise MalformedRequest("each partition must be a [topic, partition] pair")
        topic, part = item
        if not isinstance(topic, str) or not 0 < len(topic) <= MAX_TOPIC_CHARS:
            raise MalformedRequest(f"topic must be a string of 1..{MAX_TOPIC_CHARS} characters")
        out.append((topic, _int(part, "partition", 0, PARTITION_LIMIT)))
    return tuple(out)


def parse_request(body: bytes, *, pre_auth: bool = False) -> Request:
    """Decode and validate one request frame body.

    Args:
        body: the frame's bytes after the length prefix.
        pre_auth: the connection has not said ``hello`` yet: a ``ping`` or ``hello`` must have
            exactly its pre-auth fields.

    Raises:
        RequestRejected: wrapping ``MalformedRequest`` (``FrameLimitExceeded`` for a broken
            decode limit or pre-auth shape), ``UnsupportedVersion`` or ``UnknownOp``; any other
            error while reading the frame is ``MalformedRequest`` too (never raised as is).
    """
    request_id: RequestId = None
    try:
        message = decode_message(body)
        request_id = _request_id(message)
        check_shape(message)
        if pre_auth:
            _check_pre_auth(message)
        return _parse_fields(message, request_id)
    except (MalformedRequest, UnsupportedVersion, UnknownOp) as exc:
        raise RequestRejected(request_id, exc) from None
    except Exception as exc:  # noqa: BLE001 - a frame no check foresaw is this client's problem
        error = MalformedRequest(f"unreadable request ({type(exc).__name__})")
        raise RequestRejected(request_id, error) from None


def _check_pre_auth(message: dict[Any, Any]) -> None:
    op = message.get("op")
    allowed = PRE_AUTH_FIELDS.get(op) if type(op) is str else None
    if allowed is not None and not message.keys() <= allowed:
        raise FrameLimitExceeded(
            "before hello a ping carries only v, op and id, and a hello only v, op, id and token"
        )


def _key(key: Any) -> bytes | None:
    if key is None:
        return None
    if type(key) is not bytes or len(key) != PRODUCER_KEY_BYTES:
        raise MalformedRequest(
            f"key must be msgpack bin of {PRODUCER_KEY_BYTES} bytes (a raw Ed25519 public key)"
        )
    return key


def _parse_fields(message: dict[Any, Any], request_id: RequestId) -> Request:
    version = message.get("v")
    if type(version) is not int:
        raise MalformedRequest("v must be an integer (the protocol version, 1)")
    if version != PROTOCOL_VERSION:
        raise UnsupportedVersion(f"protocol version {version} unsupported; this server speaks 1")
    op = message.get("op")
    if not isinstance(op, str):
        raise MalformedRequest("op must be a string: one of " + ", ".join(OPS))
    if op == "lease":
        return LeaseRequest(
            request_id, _partitions(message.get("partitions")), _key(message.get("key"))
        )
    if op in ("bump", "roll"):
        token = message.get("token")
        if token is not None and (not isinstance(token, str) or len(token) > MAX_TOKEN_CHARS):
            raise MalformedRequest(f"token must be a string of <= {MAX_TOKEN_CHARS} characters")
        secret = message.get("secret", b"")
        if secret is None:
            secret = b""
        if not isinstance(secret, bytes) or len(secret) > MAX_SECRET_BYTES:
            raise MalformedRequest(f"secret must be msgpack bin of <= {MAX_SECRET_BYTES} bytes")
        cls = BumpRequest if op == "bump" else RollRequest
        return cls(
            request_id,
            _int(message.get("pid"), "pid", 1, PID_LIMIT),
            _int(message.get("generation"), "generation", 0, GENERATION_LIMIT),
            secret,
            token,
            _key(message.get("key")),
        )
    if op == "describe":
        return DescribeRequest(request_id, _int(message.get("pid"), "pid", 1, PID_LIMIT))
    if op == "ping":
        return PingRequest(request_id)
    if op == "hello":
        auth = message.get("token")
        if not isinstance(auth, str) or not 0 < len(auth) <= MAX_AUTH_TOKEN_CHARS:
            raise MalformedRequest(
                f"hello needs token: a string of 1..{MAX_AUTH_TOKEN_CHARS} characters"
            )
        return HelloRequest(request_id, auth)
    raise UnknownOp(f"unknown op {op[:40]!r}; expected one of {', '.join(OPS)}")


def error_reply(request_id: RequestId, code: str, message: str) -> dict[str, Any]:
    """An error reply map."""
    return {"v": PROTOCOL_VERSION, "id": request_id, "error": code, "message": message}


def ok_reply(request_id: RequestId, **fields: Any) -> dict[str, Any]:
    """A success reply map."""
    return {"v": PROTOCOL_VERSION, "id": request_id, "error": None, **fields}
