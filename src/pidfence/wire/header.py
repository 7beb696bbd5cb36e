"""The ``pf`` record header codec (DESIGN §3).

Value: a msgpack array ``[1, pid, generation, seq, flags]``. Decoding is strict: anything that is
not exactly a version-1 header raises :class:`MalformedHeader` with a reason, and nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import msgpack

from pidfence.wire.errors import MalformedHeader

PF_HEADER_KEY: Final = "pf"
PF_VERSION: Final = 1
FLAG_FENCE: Final = 0x1
KNOWN_FLAGS: Final = FLAG_FENCE
MAX_HEADER_BYTES: Final = 64

PID_LIMIT: Final = 2**63
GENERATION_LIMIT: Final = 2**31
SEQ_LIMIT: Final = 2**63


@dataclass(frozen=True, slots=True)
class PfHeader:
    """One decoded ``pf`` header. ``pid == 0`` marks a producer that opted out."""

    pid: int
    generation: int
    seq: int
    flags: int = 0

    @property
    def is_fence(self) -> bool:
        """True for a control record that announces ``generation`` and is never appended."""
        return bool(self.flags & FLAG_FENCE)

    def encode(self) -> bytes:
        """The header's wire bytes (same as :func:`encode_pf`)."""
        return encode_pf(self.pid, self.generation, self.seq, self.flags)


def _check(pid: Any, generation: Any, seq: Any, flags: Any) -> None:
    for name, value, limit in (
        ("pid", pid, PID_LIMIT),
        ("generation", generation, GENERATION_LIMIT),
        ("seq", seq, SEQ_LIMIT),
    ):
        # bool is an int subclass; msgpack decodes True as bool, and it is never a valid field.
        if type(value) is not int:
            raise MalformedHeader(f"{name} must be an int, got {type(value).__name__}")
        if not 0 <= value < limit:
            raise MalformedHeader(f"{name} {value} out of range [0, {limit})")
    if type(flags) is not int:
        raise MalformedHeader(f"flags must be an int, got {type(flags).__name__}")
    if flags & ~KNOWN_FLAGS or flags < 0:
        raise MalformedHeader(f"unknown flag bits {flags:#x} (version 1 knows only FENCE=0x1)")


def valid_fields(pid: Any, generation: Any, seq: Any, flags: Any) -> bool:
    """Whether decoded header fields are ints in range with known flags (:func:`_check` says
    what is wrong when they are not)."""
    return (
        type(pid) is int
        and type(generation) is int
        and type(seq) is int
        and type(flags) is int
        and 0 <= pid < PID_LIMIT
        and 0 <= generation < GENERATION_LIMIT
        and 0 <= seq < SEQ_LIMIT
        and not flags & ~KNOWN_FLAGS
        and flags >= 0
    )


def encode_pf(pid: int, generation: int, seq: int, flags: int = 0) -> bytes:
    """Encode a version-1 ``pf`` header.

    Args:
        pid: producer id, ``0`` for a producer that opted out, else ``1 <= pid < 2**63``.
        generation: fencing token, ``0 <= generation < 2**31``.
        seq: per-partition sequence number, ``0 <= seq < 2**63``.
        flags: ``FLAG_FENCE`` or 0.

    Raises:
        MalformedHeader: a value is of the wrong type or out of range.
    """
    _check(pid, generation, seq, flags)
    return msgpack.packb([PF_VERSION, pid, generation, seq, flags])


def decode_pf(data: bytes) -> PfHeader:
    """Decode a ``pf`` header value.

    Raises:
        MalformedHeader: for anything that is not exactly a version-1 header, with the reason.
    """
    return PfHeader(*decode_pf_fields(data))


def decode_pf_fields(data: bytes) -> tuple[int, int, int, int]:
    """``(pid, generation, seq, flags)`` of a ``pf`` header value: :func:`decode_pf` without
    building the object, for the rules' per-record path (a rebuild replays every record).

    Raises:
        MalformedHeader: for anything that is not exactly a version-1 header, with the reason.
    """
    if type(data) is not bytes:
        if not isinstance(data, bytearray | memoryview):
            raise MalformedHeader(f"expected bytes, got {type(data).__name__}")
        data = bytes(data)
    if len(data) > MAX_HEADER_BYTES:
        raise MalformedHeader(f"{len(data)} bytes exceeds the {MAX_HEADER_BYTES}-byte limit")
    try:
        # The 64-byte limit above bounds nesting and sizes, so unpacking cannot blow up.
        value = msgpack.unpackb(data, raw=True, strict_map_key=False)
    except msgpack.ExtraData as exc:
        raise MalformedHeader("trailing bytes after the header") from exc
    except (ValueError, TypeError, msgpack.UnpackException, RecursionError) as exc:
        raise MalformedHeader(f"not msgpack ({exc.__class__.__name__}: {exc})") from exc
    if type(value) is not list:
        raise MalformedHeader(f"expected a msgpack array, got {type(value).__name__}")
    if len(value) != 5:
        raise MalformedHeader(f"expected 5 elements, got {len(value)}")
    version, pid, generation, seq, flags = value
    if type(version) is not int or version != PF_VERSION:
        raise MalformedHeader(f"unsupported version {version!r}")
    # One chained test for the valid case; _check names what is wrong otherwise.
    if not valid_fields(pid, generation, seq, flags):
        _check(pid, generation, seq, flags)
    return pid, generation, seq, flags
