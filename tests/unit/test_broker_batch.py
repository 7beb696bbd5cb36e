"""The batch path's header decoder and input checks.

The vectorised decoder must say exactly what ``decode_pf`` says for every row, including msgpack
encodings the canonical encoder never produces (wider or signed ints, array16), so the table's
decisions cannot depend on how a producer's msgpack library chose to encode the same header.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pidfence.broker_plugin import ProducerStateTable, decode_headers
from pidfence.wire import FLAG_FENCE, MalformedHeader, Verdict, decode_pf, encode_pf

_UNSIGNED = [(0xCC, ">B", 2**8), (0xCD, ">H", 2**16), (0xCE, ">I", 2**32), (0xCF, ">Q", 2**64)]
_SIGNED = [(0xD0, ">b", 2**7), (0xD1, ">h", 2**15), (0xD2, ">i", 2**31), (0xD3, ">q", 2**63)]


@st.composite
def msgpack_int(draw: st.DrawFn, value: int) -> bytes:
    """``value`` in any msgpack int encoding that can hold it."""
    options: list[bytes] = []
    if 0 <= value <= 0x7F:
        options.append(bytes([value]))
    if -32 <= value < 0:
        options.append(struct.pack(">b", value))
    for tag, fmt, limit in _UNSIGNED:
        if 0 <= value < limit:
            options.append(bytes([tag]) + struct.pack(fmt, value))
    for tag, fmt, limit in _SIGNED:
        if -limit <= value < limit:
            options.append(bytes([tag]) + struct.pack(fmt, value))
    if not options:  # too large for any msgpack int: emit a float, which is malformed anyway
        return b"\xcb" + struct.pack(">d", float(value))
    return draw(st.sampled_from(options))


field_value = st.one_of(
    st.integers(0, 200),
    st.integers(0, 2**64 - 1),
    st.sampled_from([2**31 - 1, 2**31, 2**62, 2**63 - 1, 2**63, -1, -33]),
)


@st.composite
def header(draw: st.DrawFn) -> bytes | None:
    """A ``pf`` header value: canonical, oddly encoded, damaged, garbage or missing."""
    kind = draw(st.sampled_from(["canonical", "odd", "odd", "garbage", "none"]))
    if kind == "none":
        return None
    if kind == "garbage":
        return draw(st.binary(max_size=40))
    if kind == "canonical":
        return encode_pf(
            draw(st.integers(0, 2**63 - 1)),
            draw(st.integers(0, 2**31 - 1)),
            draw(st.integers(0, 2**63 - 1)),
            draw(st.sampled_from([0, FLAG_FENCE])),
        )
    count = draw(st.sampled_from([5, 5, 5, 4, 6]))
    array = draw(st.sampled_from([bytes([0x90 | count]), b"\xdc" + struct.pack(">H", count)]))
    fields = [draw(st.sampled_from([1, 1, 1, 0, 2]))]
    fields += [draw(field_value) for _ in range(3)]
    fields.append(draw(st.sampled_from([0, 1, 1, 2, -1])))
    body = b"".join(draw(msgpack_int(v)) for v in fields[:count])
    if count == 6:
        body += b"\x00"
    data = array + body
    cut = draw(st.sampled_from(["keep", "keep", "truncate", "extend"]))
    if cut == "truncate" and data:
        data = data[: draw(st.integers(0, len(data) - 1))]
    elif cut == "extend":
        data += draw(st.binary(min_size=1, max_size=3))
    return data


def expected(value: bytes | None) -> tuple[bool, bool, int, int, int, int]:
    if value is None:
        return (False, False, 0, 0, 0, 0)
    try:
        pf = decode_pf(value)
    except MalformedHeader:
        return (True, True, 0, 0, 0, 0)
    return (True, False, pf.pid, pf.generation, pf.seq, pf.flags)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(header(), max_size=40), st.integers(0, 5), st.booleans())
def test_decode_headers_agrees_with_decode_pf_row_by_row(
    values: list[bytes | None], offset: int, large: bool
) -> None:
    # A sliced array (non-zero offset) and large_binary must decode like a plain one.
    padded = [b"\x95\x01\x01\x01\x01\x00"] * offset + values
    arr = pa.array(padded, type=pa.large_binary() if large else pa.binary()).slice(offset)
    dec = decode_headers(arr)
    got = list(
        zip(
            dec.present.tolist(),
            dec.malformed.tolist(),
            dec.pid.tolist(),
            dec.generation.tolist(),
            dec.seq.tolist(),
            dec.flags.tolist(),
            strict=True,
        )
    )
    assert got == [expected(v) for v in values]


def test_odd_but_valid_encodings_are_decided_like_canonical_ones() -> None:
    canonical = encode_pf(7, 3, 0)
    wide = b"\xdc\x00\x05" + b"\xd3" + struct.pack(">q", 1) + b"\xcf" + struct.pack(">Q", 7)
    wide += b"\xce" + struct.pack(">I", 3) + b"\xcc\x00" + b"\xd0\x00"
    assert decode_pf(wide) == decode_pf(canonical)
    table = ProducerStateTable(4, 1000)
    res = table.offer_batch([wide, encode_pf(7, 3, 1), canonical], np.zeros(3, np.int64))
    assert res.verdicts() == [Verdict.APPENDED, Verdict.APPENDED, Verdict.DUPLICATE]


def test_extreme_values_take_the_exact_path() -> None:
    top = 2**63 - 1
    headers = [
        encode_pf(top, 2**31 - 1, top - 1, FLAG_FENCE),
        encode_pf(top, 2**31 - 1, top - 1),
        encode_pf(top, 2**31 - 1, top - 1),
        encode_pf(top, 2**31 - 1, top),
    ]
    one_by_one = ProducerStateTable(4, 1000)
    expected_verdicts = [one_by_one.offer_header(h, 0)[0].verdict for h in headers]
    # The fence sets highwater = top - 2; then top - 1, its resend, and top follow.
    assert expected_verdicts == [
        Verdict.FENCE,
        Verdict.APPENDED,
        Verdict.DUPLICATE,
        Verdict.APPENDED,
    ]
    batched = ProducerStateTable(4, 1000)
    res = batched.offer_batch(pa.array(headers), np.zeros(4, np.int64))
    assert res.verdicts() == expected_verdicts
    assert res.pid.tolist() == [top] * 4
    assert batched == one_by_one


def test_header_values_of_the_wrong_type_are_malformed_in_a_batch_as_one_by_one() -> None:
    headers: list[Any] = [5, "text", 1.5, [1], None, encode_pf(1, 0, 0)]
    one_by_one = ProducerStateTable(4, 1000)
    expected_verdicts = [one_by_one.offer_header(h, 0)[0].verdict for h in headers]
    assert expected_verdicts[:4] == [Verdict.MALFORMED] * 4
    batched = ProducerStateTable(4, 1000)
    assert batched.offer_batch(headers, np.zeros(6, np.int64)).verdicts() == expected_verdicts
    assert batched == one_by_one


def test_a_timestamp_outside_int64_is_refused_before_anything_is_decided() -> None:
    table = ProducerStateTable(4, 1000)
    with pytest.raises(ValueError, match="int64"):
        table.offer(1, 0, 0, 2**64)
    assert table.snapshot() == ProducerStateTable(4, 1000).snapshot()


def test_timestamps_going_backwards_in_a_batch_use_the_running_maximum() -> None:
    headers = [encode_pf(1, 0, 0), encode_pf(2, 0, 0), encode_pf(1, 0, 1)]
    table = ProducerStateTable(4, 100)
    table.offer_batch(headers, np.array([500, 400, 599], np.int64))
    assert table.get(2) == (0, 0, 500)
    assert table.clock == 599
    # 500 + 100 <= 600: both entries expire, so seq 2 of pid 1 is unknown now.
    res = table.offer_batch([encode_pf(1, 0, 2)], np.array([600], np.int64))
    assert res.verdicts() == [Verdict.UNKNOWN_PID]


def test_rows_held_by_an_earlier_batch_come_back_in_released_with_their_refs() -> None:
    table = ProducerStateTable(4, 1000)
    first = table.offer_batch(
        [encode_pf(1, 0, 0), encode_pf(1, 0, 2), encode_pf(1, 0, 3)],
        np.zeros(3, np.int64),
        refs=[(0, 10), (0, 11), (0, 12)],
    )
    assert first.verdicts() == [Verdict.APPENDED, Verdict.BUFFERED, Verdict.BUFFERED]
    assert first.log_order.tolist() == [0]
    second = table.offer_batch([None, encode_pf(1, 0, 1)], np.zeros(2, np.int64))
    assert second.verdicts() == [Verdict.NON_IDEMPOTENT, Verdict.APPENDED]
    assert [(d.ref, d.verdict) for d in second.released] == [
        ((0, 11), Verdict.APPENDED),
        ((0, 12), Verdict.APPENDED),
    ]
    # Log order: the header-less row, the gap filler, then the two released records.
    assert second.log_order.tolist() == [0, 1, -1, -2]


@pytest.mark.parametrize(
    ("headers", "ts", "refs", "error", "match"),
    [
        ([encode_pf(1, 0, 0)], np.zeros(2, np.int64), None, ValueError, "shape"),
        ([encode_pf(1, 0, 0)], np.zeros(1, np.int64), [1, 2], ValueError, "refs"),
        (pa.array([1, 2]), np.zeros(2, np.int64), None, TypeError, "binary"),
    ],
)
def test_bad_batch_arguments_are_refused_before_any_state_changes(
    headers: Any, ts: Any, refs: Any, error: type[Exception], match: str
) -> None:
    table = ProducerStateTable(4, 1000)
    before = table.state()
    with pytest.raises(error, match=match):
        table.offer_batch(headers, ts, refs)
    assert table.state() == before


def test_empty_and_all_null_batches() -> None:
    table = ProducerStateTable(4, 1000)
    empty = table.offer_batch([], np.zeros(0, np.int64))
    assert len(empty.verdict) == 0
    assert len(empty.log_order) == 0
    nulls = table.offer_batch(pa.nulls(3), np.arange(3))
    assert nulls.verdicts() == [Verdict.NON_IDEMPOTENT] * 3
    assert nulls.log_order.tolist() == [0, 1, 2]
    assert nulls.counts() == {Verdict.NON_IDEMPOTENT: 3}


@given(
    st.lists(st.integers(0, 2**63 - 1), max_size=300), st.sampled_from([2**8, 2**20, 2**40, 2**63])
)
def test_stable_order_is_numpy_stable_argsort(values: list[int], span: int) -> None:
    """The radix grouping of pids orders exactly like numpy's stable sort, at every span."""
    from pidfence.broker_plugin.batch import _stable_order

    arr = np.array([v % span for v in values], dtype=np.int64)
    assert _stable_order(arr).tolist() == np.argsort(arr, kind="stable").tolist()


def _uint(value: int) -> bytes:
    """``value`` as msgpack's widest unsigned int (what the vectorised path reads)."""
    return b"\xcf" + struct.pack(">Q", value)


@pytest.mark.parametrize(
    "value",
    [
        pytest.param(b"\x95\x01" + _uint(2**63) + b"\x03\x00\x00", id="pid-2**63"),
        pytest.param(b"\x95\x01\x07" + _uint(2**31) + b"\x00\x00", id="generation-2**31"),
        pytest.param(b"\x95\x01\x07\x03" + _uint(2**63) + b"\x00", id="seq-2**63"),
        pytest.param(b"\x95\x01\x07\x03\x00\x00\x00", id="trailing-byte"),
        pytest.param(b"\x95\x01\x07\x03\x00\x02", id="unknown-flag-bit"),
    ],
)
def test_just_out_of_range_canonical_headers_are_malformed_in_a_batch(value: bytes) -> None:
    """Headers laid out as the fast path reads them, one step past a limit (or one byte too
    long), are MALFORMED in a batch exactly as ``decode_pf`` and ``offer_header`` say."""
    with pytest.raises(MalformedHeader):
        decode_pf(value)
    dec = decode_headers(pa.array([value, encode_pf(7, 3, 0)], type=pa.binary()))
    assert dec.malformed.tolist() == [True, False]
    assert (dec.pid.tolist(), dec.generation.tolist(), dec.seq.tolist()) == ([0, 7], [0, 3], [0, 0])
    table = ProducerStateTable(4, 1000)
    assert table.offer_batch([value], np.zeros(1, np.int64)).verdicts() == [Verdict.MALFORMED]
    assert len(table) == 0
