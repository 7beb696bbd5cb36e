"""The `pf` header codec (DESIGN §3): round trips, strict decoding, nothing but MalformedHeader."""

from __future__ import annotations

import contextlib

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pidfence.wire import (
    FLAG_FENCE,
    GENERATION_LIMIT,
    PID_LIMIT,
    SEQ_LIMIT,
    MalformedHeader,
    PfHeader,
    PidfenceError,
    Verdict,
    decode_pf,
    encode_pf,
)

pids = st.integers(0, PID_LIMIT - 1)
generations = st.integers(0, GENERATION_LIMIT - 1)
seqs = st.integers(0, SEQ_LIMIT - 1)
flags = st.sampled_from([0, FLAG_FENCE])


@given(pids, generations, seqs, flags)
def test_every_valid_header_round_trips(pid: int, gen: int, seq: int, flag: int) -> None:
    data = encode_pf(pid, gen, seq, flag)
    assert len(data) <= 64
    assert decode_pf(data) == PfHeader(pid, gen, seq, flag)
    assert PfHeader(pid, gen, seq, flag).encode() == data


@given(st.binary(max_size=96))
def test_arbitrary_bytes_decode_or_raise_malformed_only(data: bytes) -> None:
    try:
        header = decode_pf(data)
    except MalformedHeader as exc:
        assert exc.reason
    else:
        assert isinstance(header, PfHeader)
        assert decode_pf(header.encode()) == header


@given(
    st.recursive(
        st.none()
        | st.booleans()
        | st.integers(-(2**63), 2**64 - 1)
        | st.floats()
        | st.binary(max_size=8)
        | st.text(max_size=8),
        lambda children: (
            st.lists(children, max_size=6)
            | st.dictionaries(st.text(max_size=3), children, max_size=3)
        ),
        max_leaves=10,
    )
)
def test_arbitrary_msgpack_values_decode_or_raise_malformed_only(value: object) -> None:
    data = msgpack.packb(value)
    with contextlib.suppress(MalformedHeader):
        decode_pf(data)


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (msgpack.packb([2, 1, 0, 0, 0]), "unsupported version"),
        (msgpack.packb([1, 1, 0, 0]), "expected 5 elements"),
        (msgpack.packb([1, 1, 0, 0, 0, 0]), "expected 5 elements"),
        (msgpack.packb([1, -1, 0, 0, 0]), "pid -1 out of range"),
        (msgpack.packb([1, 2**63, 0, 0, 0]), "pid"),
        (msgpack.packb([1, 1, 2**31, 0, 0]), "generation"),
        (msgpack.packb([1, 1, 0, 2**63, 0]), "seq"),
        (msgpack.packb([1, 1, 0, 0, 2]), "unknown flag bits"),
        (msgpack.packb([1, True, 0, 0, 0]), "must be an int"),
        (msgpack.packb([1, 1.0, 0, 0, 0]), "must be an int"),
        (msgpack.packb({"pid": 1}), "expected a msgpack array"),
        (msgpack.packb([1, 1, 0, 0, 0]) + b"\x00", "trailing bytes"),
        (b"", "not msgpack"),
        (b"\xc1", "not msgpack"),
        (b"\x95\x01", "not msgpack"),
        (b"\x00" * 65, "exceeds the 64-byte limit"),
    ],
)
def test_malformed_headers_name_their_reason(data: bytes, reason: str) -> None:
    with pytest.raises(MalformedHeader, match=reason):
        decode_pf(data)


@pytest.mark.parametrize("bad", [None, "x", 5, [1, 2], object()])
def test_wrong_types_raise_malformed(bad: object) -> None:
    with pytest.raises(MalformedHeader, match="expected bytes"):
        decode_pf(bad)  # type: ignore[arg-type]


def test_encode_rejects_out_of_range_values() -> None:
    with pytest.raises(MalformedHeader):
        encode_pf(-1, 0, 0)
    with pytest.raises(MalformedHeader):
        encode_pf(1, 0, 0, flags=4)
    with pytest.raises(MalformedHeader):
        encode_pf(1, True, 0)


def test_fence_flag_and_error_root() -> None:
    assert decode_pf(encode_pf(7, 3, 9, FLAG_FENCE)).is_fence
    assert not decode_pf(encode_pf(7, 3, 9)).is_fence
    assert issubclass(MalformedHeader, PidfenceError)
    assert MalformedHeader.retriable is False


def test_verdicts_know_which_are_appended() -> None:
    assert {v for v in Verdict if v.appended} == {Verdict.APPENDED, Verdict.NON_IDEMPOTENT}
    assert [v for v in Verdict if not v.final] == [Verdict.BUFFERED]
