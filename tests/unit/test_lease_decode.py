"""Bounded decoding of request frames (``pid_allocator/decode.py``) and the pre-auth shapes:
issue 22 case 1, decided without a server (the real-server figures are in
``tests/integration/test_hostile_lease_decode.py``); and where a frame's length limit falls, on a
loopback server."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pidfence.pid_allocator import (
    FrameLimitExceeded,
    LeaseServerThread,
    MalformedRequest,
    MemoryCoordinator,
)
from pidfence.pid_allocator.decode import FAST_DECODE_BYTES, MAX_FRAME_BYTES, decode_message
from pidfence.pid_allocator.protocol import (
    LENGTH,
    BumpRequest,
    LeaseRequest,
    PingRequest,
    RequestRejected,
    parse_request,
)
from tests.fixtures.hostile import bombs

_HEAD = b"\x84\xa1v\x01\xa2op\xa5lease\xa2id\x07\xa1x"  # {v: 1, op: lease, id: 7, x: ...}


def _rejected(body: bytes, *, pre_auth: bool = False) -> RequestRejected:
    with pytest.raises(RequestRejected) as caught:
        parse_request(body, pre_auth=pre_auth)
    return caught.value


@pytest.mark.parametrize("index", [0, 1, 2])
def test_every_bomb_breaks_a_decode_limit(index: int) -> None:
    frame = bombs()[index]
    body = frame[4:]
    assert len(body) <= MAX_FRAME_BYTES
    error = _rejected(body).error
    assert isinstance(error, FrameLimitExceeded)
    assert "decode limit" in str(error) and "connection closed" in str(error)


def test_a_large_bomb_is_refused_at_its_first_nested_byte() -> None:
    """The field-by-field reader never builds the million lists: the same bytes with the nesting
    one field later are refused at that field, whatever follows."""
    tail = b"\xdd" + (1 << 20).to_bytes(4, "big") + b"\x90" * ((1 << 20) - 64)
    body = _HEAD + tail
    assert len(body) > FAST_DECODE_BYTES
    with pytest.raises(FrameLimitExceeded, match="nested"):
        decode_message(body)


@pytest.mark.parametrize(
    ("value", "match"),
    [
        ({"v": 1, "op": "ping", "x": [[1]]}, "nested"),
        ({"v": 1, "op": "ping", "x": {"a": 1}}, "nested"),
        ({"v": 1, "op": "lease", "partitions": [["t", [0]]]}, "nest"),
        ({"v": 1, "op": "lease", "partitions": [{"t": 0}]}, "nest"),
        ({"v": 1, "op": "bump", "secret": b"s" * 65}, "max_bin_len"),
        ({"v": 1, "op": "hello", "token": "t" * 1025}, "max_str_len"),
        ({f"k{i}": i for i in range(17)}, "max_map_len"),
    ],
)
def test_frames_beyond_a_requests_shape_break_a_limit(value: Any, match: str) -> None:
    body = msgpack.packb(value, use_bin_type=True)
    error = _rejected(body).error
    assert isinstance(error, FrameLimitExceeded)
    assert match in str(error)


def test_a_shape_refusal_echoes_the_request_id() -> None:
    body = msgpack.packb({"v": 1, "op": "lease", "id": 6, "x": [[0]]})
    rejected = _rejected(body)
    assert isinstance(rejected.error, FrameLimitExceeded)
    assert rejected.request_id == 6
    # A known field of the wrong shape is merely malformed: its own check names it.
    known = _rejected(msgpack.packb({"v": 1, "op": "lease", "id": 6, "partitions": {"t": 0}}))
    assert type(known.error) is MalformedRequest and known.request_id == 6


def test_garbage_that_breaks_no_limit_is_merely_malformed() -> None:
    for body in (b"", b"\xc1", b"\xa3ab", msgpack.packb([1, 2])):
        error = _rejected(body).error
        assert isinstance(error, MalformedRequest)
        assert not isinstance(error, FrameLimitExceeded)


_TOPICS = st.sampled_from(["orders", "payments.eu-1", "t", "x" * 249])


@given(st.lists(st.tuples(_TOPICS, st.integers(0, 2**31 - 1)), min_size=300, max_size=400))
def test_large_frames_read_field_by_field_equal_one_c_call(pairs: list[tuple[str, int]]) -> None:
    message = {"v": 1, "op": "lease", "id": "big", "partitions": [list(p) for p in pairs]}
    body = msgpack.packb(message, use_bin_type=True)
    assert len(body) > FAST_DECODE_BYTES
    assert decode_message(body) == msgpack.unpackb(body, raw=False)
    assert parse_request(body) == LeaseRequest("big", tuple(pairs))


def test_large_frames_refuse_trailing_bytes_and_too_many_fields() -> None:
    body = msgpack.packb({"v": 1, "op": "lease", "partitions": [["t", 0]] * 400})
    with pytest.raises(MalformedRequest, match="after its map"):
        decode_message(body + b"\x00")
    many = b"\xde\x00\x20" + b"".join(msgpack.packb(f"k{i}") + b"\x00" for i in range(32))
    with pytest.raises(FrameLimitExceeded, match="fields"):
        decode_message(many + b"\x00" * FAST_DECODE_BYTES)


def test_before_hello_only_the_fixed_ping_and_hello_shapes() -> None:
    ping = msgpack.packb({"v": 1, "op": "ping", "id": 3})
    assert parse_request(ping, pre_auth=True) == PingRequest(3)
    hello = msgpack.packb({"v": 1, "op": "hello", "id": 4, "token": "t" * 20})
    assert parse_request(hello, pre_auth=True).id == 4
    extras: list[dict[str, Any]] = [{"x": 1}, {"pad": "p" * 500}, {"partitions": []}]
    for extra in extras:
        body = msgpack.packb({"v": 1, "op": "ping", "id": 3, **extra})
        assert isinstance(_rejected(body, pre_auth=True).error, FrameLimitExceeded)
        assert parse_request(body) == PingRequest(3)  # after hello extra fields are ignored
    # Other ops parse as usual: the server answers them UNAUTHENTICATED.
    bump = msgpack.packb({"v": 1, "op": "bump", "id": 5, "pid": 1, "generation": 0})
    assert isinstance(parse_request(bump, pre_auth=True), BumpRequest)


@pytest.mark.parametrize("op", ["lease", "bump", "roll"])
def test_a_producer_key_is_32_bytes_of_bin(op: str) -> None:
    base: dict[str, Any] = {"v": 1, "op": op, "id": 1, "pid": 5, "generation": 1}
    key = bytes(range(32))
    parsed = parse_request(msgpack.packb({**base, "key": key}, use_bin_type=True))
    assert getattr(parsed, "key") == key  # noqa: B009 - every request type with a key
    assert getattr(parse_request(msgpack.packb(base)), "key") is None  # noqa: B009
    for bad in (key[:31], key + b"x", key.hex(), 5):
        body = msgpack.packb({**base, "key": bad}, use_bin_type=True)
        error = _rejected(body).error
        assert type(error) is MalformedRequest
        assert "32 bytes" in str(error)


def _ping_of(size: int) -> bytes:
    """A ping request of exactly ``size`` bytes (its id padded to fit)."""
    for pad in range(size):
        body: bytes = msgpack.packb({"v": 1, "op": "ping", "id": "x" * pad})
        if len(body) == size:
            return body
    raise AssertionError(f"no ping of {size} bytes")


def test_a_frame_of_exactly_the_limit_is_answered_and_one_byte_more_is_refused(
    tmp_path: Path,
) -> None:
    """The frame limit is inclusive: before ``hello`` a frame of exactly
    ``max_pre_auth_frame_bytes`` is answered; only a longer one is refused."""
    tokens = tmp_path / "tokens"
    tokens.write_text("alice " + "t" * 32 + "\n")
    tokens.chmod(0o600)
    replies: list[dict[str, Any]] = []
    with LeaseServerThread(
        None,
        coordinator=MemoryCoordinator(),
        auth_tokens_file=tokens,
        max_pre_auth_frame_bytes=64,
    ) as server:
        host, port = server.address.rsplit(":", 1)
        for size in (64, 65):
            with socket.create_connection((host, int(port)), timeout=10) as sock:
                body = _ping_of(size)
                sock.sendall(LENGTH.pack(len(body)) + body)
                (length,) = LENGTH.unpack(sock.recv(4, socket.MSG_WAITALL))
                replies.append(msgpack.unpackb(sock.recv(length, socket.MSG_WAITALL)))
    at_limit, over = replies
    assert at_limit["error"] is None, at_limit
    assert over["error"] == MalformedRequest.code
    assert "frame of 65 bytes exceeds the 64-byte limit before hello" in over["message"]
