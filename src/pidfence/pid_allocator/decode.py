"""Bounded decoding of request frames: what one frame may cost the server before anything in it
is trusted (DESIGN.md §5 amended again).

A request is a msgpack map of scalars; only ``partitions`` holds a list of ``[topic, partition]``
pairs, at most ``MAX_PARTITIONS`` of them (the list is informational: no server reads it, so
a frame may not buy milliseconds of the event loop with it). So no valid request nests deeper
than three levels, no string is longer than 1024 bytes and no bin longer than 64. A frame that
breaks such a limit raises :class:`FrameLimitExceeded` (the server answers MALFORMED_REQUEST
naming the limit, then closes the connection):

* frames up to ``FAST_DECODE_BYTES`` are decoded by msgpack's C decoder with every length
  limit (at most that many objects, a fraction of a millisecond whatever the bytes), then
  :func:`check_shape` refuses nesting (the caller runs it once it has read the request id, so
  the refusal can echo it);
* larger frames (only admitted clients may send them) are read one field at a time, looking at
  each value's type byte before decoding it, so a nested structure is refused at its first byte
  rather than decoded: a 1 MiB "decode bomb" costs microseconds, not the quarter second a plain
  ``unpackb`` spends building a million empty lists.
"""

from __future__ import annotations

from typing import Any

import msgpack

from pidfence.pid_allocator.errors import FrameLimitExceeded, MalformedRequest

#: Largest frame of an admitted connection (DESIGN.md §5: requests at most 1 MiB).
MAX_FRAME_BYTES = 1 << 20
#: Frames up to this size are decoded in one C call; larger ones field by field.
FAST_DECODE_BYTES = 1024
MAX_FIELDS = 16
MAX_STR_BYTES = 1024
MAX_BIN_BYTES = 64
#: Pairs in ``partitions``: a longer list is refused at its array header, before any pair is
#: read (each pair read costs about a microsecond of the event loop; 1,000 cost ~1.5 ms).
MAX_PARTITIONS = 1_000
#: The limits msgpack enforces as it reads a frame, whole or field by field.
_LIMITS: dict[str, Any] = {
    "raw": False,
    "strict_map_key": False,
    "max_str_len": MAX_STR_BYTES,
    "max_bin_len": MAX_BIN_BYTES,
    "max_array_len": MAX_PARTITIONS,
    "max_map_len": MAX_FIELDS,
    "max_ext_len": 0,
}

_CONTAINERS = (list, dict)
#: Every field any request has (``protocol.py`` reads them).
KNOWN_FIELDS = frozenset(
    {"v", "op", "id", "partitions", "pid", "generation", "secret", "token", "key"}
)
#: First bytes of msgpack arrays and maps (fix, 16- and 32-bit forms).
_ARRAY_MARKERS = frozenset(range(0x90, 0xA0)) | {0xDC, 0xDD}
_MAP_MARKERS = frozenset(range(0x80, 0x90)) | {0xDE, 0xDF}
_CONTAINER_MARKERS = _ARRAY_MARKERS | _MAP_MARKERS
_NESTED = "a request is a map of scalars (only partitions holds [topic, partition] pairs)"


def decode_message(body: bytes) -> dict[Any, Any]:
    """The request map in ``body``, decoded within the limits above (run :func:`check_shape`
    on it next).

    Raises:
        FrameLimitExceeded: a length, the field count or (large frames) the nesting is beyond a
            request's.
        MalformedRequest: not msgpack, trailing bytes, or not a map.
    """
    if len(body) > FAST_DECODE_BYTES:
        return _decode_large(body)
    try:
        message = msgpack.unpackb(body, **_LIMITS)
    except Exception as exc:  # noqa: BLE001 - msgpack raises many types for bad bytes
        raise _decode_error(exc) from None
    if type(message) is not dict:
        raise MalformedRequest("frame must hold a msgpack map")
    return message


def check_shape(message: dict[Any, Any]) -> None:
    """Refuse nesting beyond a request's: only ``partitions`` holds ``[topic, partition]`` pairs.

    A known field that holds something else is left to its own check (MALFORMED_REQUEST, the
    connection stays); a field no request has is refused here when it is nested.

    Raises:
        FrameLimitExceeded: a nested unknown field, or partitions nested deeper than pairs.
    """
    if message.keys() <= KNOWN_FIELDS:  # every request a client sends: one set comparison
        partitions = message.get("partitions")
        if partitions and type(partitions) is list:
            _check_pairs(partitions)
        return
    for key, value in message.items():
        if type(value) in _CONTAINERS and key not in KNOWN_FIELDS:
            raise FrameLimitExceeded(f"field {str(key)[:40]!r} is nested: {_NESTED}")
    check_shape({k: v for k, v in message.items() if k in KNOWN_FIELDS})


def _decode_error(exc: Exception) -> MalformedRequest:
    if isinstance(exc, msgpack.exceptions.StackError) or "exceeds max_" in str(exc):
        return FrameLimitExceeded(str(exc) or type(exc).__name__)
    return MalformedRequest(f"frame is not msgpack: {exc or type(exc).__name__}")


def _check_pairs(value: list[Any]) -> None:
    for item in value:
        if type(item) is dict or (type(item) is list and any(type(x) in _CONTAINERS for x in item)):
            raise FrameLimitExceeded(f"partitions nest too deep: {_NESTED}")


class _Reader:
    """Field-by-field reading of one large frame, refusing nesting at its type byte."""

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.unpacker = msgpack.Unpacker(max_buffer_size=len(body), **_LIMITS)
        self.unpacker.feed(body)

    def marker(self) -> int:
        offset = self.unpacker.tell()
        if offset >= len(self.body):
            raise MalformedRequest("frame ends inside a value")
        return self.body[offset]

    def scalar(self) -> Any:
        if self.marker() in _CONTAINER_MARKERS:
            raise FrameLimitExceeded(f"a nested value where a scalar belongs: {_NESTED}")
        return self.unpacker.unpack()

    def array_header(self, limit: int, what: str) -> int:
        if self.marker() not in _ARRAY_MARKERS:
            raise FrameLimitExceeded(f"{what} must be an array: {_NESTED}")
        count = int(self.unpacker.read_array_header())
        if count > limit:
            raise FrameLimitExceeded(f"{what} holds {count} items; at most {limit}")
        return count


def _decode_large(body: bytes) -> dict[Any, Any]:
    reader = _Reader(body)
    try:
        if reader.marker() not in _MAP_MARKERS:
            raise MalformedRequest("frame must hold a msgpack map")
        count = int(reader.unpacker.read_map_header())
        if count > MAX_FIELDS:
            raise FrameLimitExceeded(f"a request has at most {MAX_FIELDS} fields, not {count}")
        message: dict[Any, Any] = {}
        for _ in range(count):
            key = reader.scalar()
            if key == "partitions" and reader.marker() in _ARRAY_MARKERS:
                pairs = reader.array_header(MAX_PARTITIONS, "partitions")
                message[key] = [
                    [reader.scalar() for _ in range(reader.array_header(2, "a partition"))]
                    for _ in range(pairs)
                ]
            else:
                message[key] = reader.scalar()
        if reader.unpacker.tell() != len(body):
            raise MalformedRequest("frame has bytes after its map")
    except MalformedRequest:
        raise
    except Exception as exc:  # noqa: BLE001 - msgpack raises many types for bad bytes
        raise _decode_error(exc) from None
    return message
