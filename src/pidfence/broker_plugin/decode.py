"""Decoding a column of ``pf`` headers at once (numpy), exactly as ``decode_pf`` row by row."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from pidfence.wire import GENERATION_LIMIT, MalformedHeader, decode_pf
from pidfence.wire.header import KNOWN_FLAGS

I64 = npt.NDArray[np.int64]
U8 = npt.NDArray[np.uint8]
BoolArr = npt.NDArray[np.bool_]

#: Width in bytes of the msgpack unsigned int that follows each tag byte (0: not one).
_UINT_SIZE: Final = np.zeros(256, dtype=np.int64)
_UINT_SIZE[[0xCC, 0xCD, 0xCE, 0xCF]] = [1, 2, 4, 8]


@dataclass
class DecodedHeaders:
    """``pf`` headers decoded column-wise."""

    present: BoolArr
    malformed: BoolArr
    pid: I64
    generation: I64
    seq: I64
    flags: U8


def _binary_array(headers: Any) -> pa.Array:
    if isinstance(headers, pa.ChunkedArray):
        headers = headers.combine_chunks()
    if isinstance(headers, pa.Array):
        if pa.types.is_large_binary(headers.type):
            return headers
        if pa.types.is_binary(headers.type):
            return headers
        if pa.types.is_binary_view(headers.type):
            return headers.cast(pa.binary())
        if pa.types.is_null(headers.type):
            return pa.array([None] * len(headers), type=pa.binary())
        raise TypeError(f"headers must be a binary arrow array, got {headers.type}")
    # A value that is not bytes is MALFORMED, as offer_header judges it: 0xc1 is the one byte
    # msgpack never uses.
    return pa.array(
        [
            h if h is None or isinstance(h, bytes | bytearray | memoryview) else b"\xc1"
            for h in headers
        ],
        type=pa.binary(),
    )


def _read_uint(data: U8, pos: I64) -> tuple[I64, I64, BoolArr]:
    """Decode a msgpack non-negative int at each position: (value, encoded length, ok)."""
    raw_tag = data[pos]
    size = _UINT_SIZE[raw_tag]
    tag = raw_tag.astype(np.int64)
    fix = tag <= 0x7F
    value = np.where(fix, tag, 0).astype(np.uint64)
    acc = np.zeros(len(pos), dtype=np.uint64)
    widest = int(size.max()) if len(size) else 0
    for k in range(widest):
        byte = data[pos + 1 + k].astype(np.uint64)
        acc = np.where(size > k, (acc << np.uint64(8)) | byte, acc)
    value = np.where(fix, value, acc)
    ok = (fix | (size > 0)) & (value < np.uint64(2**63))  # fits int64 (PID_LIMIT, SEQ_LIMIT)
    length = np.where(fix, 1, 1 + size).astype(np.int64)
    return value.astype(np.int64), length, ok


def decode_headers(headers: Any) -> DecodedHeaders:
    """Decode a column of ``pf`` header values (``None`` = no header) without a Python loop.

    Rows in the canonical encoding (msgpack-python's: fixarray of 5, unsigned ints) decode
    vectorised; anything else goes through :func:`pidfence.wire.decode_pf`, so the result is
    exactly what ``decode_pf`` says for every row.
    """
    arr = _binary_array(headers)
    n = len(arr)
    large = pa.types.is_large_binary(arr.type)
    validity, offsets_buf, data_buf = arr.buffers()
    off_type = np.int64 if large else np.int32
    offsets: I64 = np.frombuffer(offsets_buf, dtype=off_type)[
        arr.offset : arr.offset + n + 1
    ].astype(np.int64)
    raw = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.empty(0, np.uint8)
    # Padding lets every gather read past any start without bounds checks: up to 30 bytes (array
    # and int tags, three 9-byte ints, the flags), whatever a row's own length.
    data = np.concatenate([raw, np.zeros(64, dtype=np.uint8)])
    present = (
        np.ones(n, dtype=bool)
        if arr.null_count == 0
        else np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    )
    del validity
    start, end = offsets[:-1], offsets[1:]
    start_c = np.minimum(start, len(raw))
    ok = present & (end - start >= 6)
    ok &= (data[start_c] == 0x95) & (data[start_c + 1] == 0x01)
    pos = start_c + 2
    fields = []
    for _ in range(3):
        value, length, good = _read_uint(data, pos)
        ok &= good
        fields.append(value)
        pos = pos + length
    flag_byte = data[np.minimum(pos, len(data) - 1)]
    # Flags as one positive fixint byte with no unknown bits (others take the exact path).
    ok &= (flag_byte & ~np.uint8(KNOWN_FLAGS) == 0) & (pos + 1 == end)
    pid, gen, seq = fields
    ok &= gen < GENERATION_LIMIT
    flags = np.where(ok, flag_byte, 0).astype(np.uint8)
    pid = np.where(ok, pid, 0)
    gen = np.where(ok, gen, 0)
    seq = np.where(ok, seq, 0)
    malformed = np.zeros(n, dtype=bool)
    slow = np.flatnonzero(present & ~ok)
    if len(slow):
        values = arr.take(pa.array(slow)).to_pylist()
        for row, value in zip(slow.tolist(), values, strict=True):
            try:
                pf = decode_pf(value)
            except MalformedHeader:
                malformed[row] = True
                continue
            pid[row], gen[row], seq[row], flags[row] = pf.pid, pf.generation, pf.seq, pf.flags
    return DecodedHeaders(present, malformed, pid, gen, seq, flags)
