"""Request validation: every field checked, ``id`` echoed where readable."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from pidfence.pid_allocator import (
    FrameLimitExceeded,
    MalformedRequest,
    UnknownOp,
    UnsupportedVersion,
)
from pidfence.pid_allocator.protocol import (
    LENGTH,
    BumpRequest,
    HelloRequest,
    LeaseRequest,
    PingRequest,
    RequestRejected,
    RollRequest,
    encode_frame,
    parse_request,
)


def _pack(message: Any) -> bytes:
    data: bytes = msgpack.packb(message, use_bin_type=True)
    return data


def test_valid_requests_parse() -> None:
    lease = parse_request(_pack({"v": 1, "op": "lease", "id": 7, "partitions": [["t", 3]]}))
    assert lease == LeaseRequest(7, (("t", 3),))
    bump = parse_request(_pack({"v": 1, "op": "bump", "id": "a", "pid": 5, "generation": 9}))
    assert bump == BumpRequest("a", 5, 9, b"", None)  # no secret: answered NOT_OWNER later
    roll = parse_request(
        _pack({"v": 1, "op": "roll", "id": 2, "pid": 5, "generation": 9, "secret": b"s" * 24})
    )
    assert roll == RollRequest(2, 5, 9, b"s" * 24, None)
    hello = parse_request(_pack({"v": 1, "op": "hello", "id": 3, "token": "abc"}))
    assert hello == HelloRequest(3, "abc")
    assert parse_request(_pack({"v": 1, "op": "ping", "id": 1})) == PingRequest(1)
    assert parse_request(_pack({"v": 1, "op": "lease"})) == LeaseRequest(None, ())


@pytest.mark.parametrize(
    ("message", "error", "echoed"),
    [
        ({"v": 2, "op": "ping", "id": 3}, UnsupportedVersion, 3),
        ({"v": "1", "op": "ping", "id": 3}, MalformedRequest, 3),
        ({"op": "ping", "id": 3}, MalformedRequest, 3),
        ({"v": 1, "op": "steal", "id": 3}, UnknownOp, 3),
        ({"v": 1, "op": 5, "id": 3}, MalformedRequest, 3),
        ({"v": 1, "op": "ping", "id": 1.5}, MalformedRequest, None),
        ({"v": 1, "op": "ping", "id": "x" * 129}, MalformedRequest, None),
        ({"v": 1, "op": "bump", "id": 4, "pid": 0, "generation": 1}, MalformedRequest, 4),
        ({"v": 1, "op": "bump", "id": 4, "pid": 2**63, "generation": 1}, MalformedRequest, 4),
        ({"v": 1, "op": "bump", "id": 4, "pid": True, "generation": 1}, MalformedRequest, 4),
        ({"v": 1, "op": "bump", "id": 4, "pid": 1, "generation": 2**31}, MalformedRequest, 4),
        ({"v": 1, "op": "bump", "id": 4, "pid": 1, "generation": -1}, MalformedRequest, 4),
        ({"v": 1, "op": "bump", "id": 4, "pid": 1}, MalformedRequest, 4),
        (
            {"v": 1, "op": "bump", "id": 4, "pid": 1, "generation": 1, "token": 5},
            MalformedRequest,
            4,
        ),
        (
            {"v": 1, "op": "roll", "id": 4, "pid": 1, "generation": 1, "secret": "text"},
            MalformedRequest,
            4,
        ),
        (
            {"v": 1, "op": "bump", "id": 4, "pid": 1, "generation": 1, "secret": b"x" * 65},
            FrameLimitExceeded,  # no bin of a request is over 64 bytes: refused while decoding
            None,
        ),
        ({"v": 1, "op": "hello", "id": 4}, MalformedRequest, 4),
        ({"v": 1, "op": "hello", "id": 4, "token": ""}, MalformedRequest, 4),
        ({"v": 1, "op": "lease", "id": 4, "partitions": "t"}, MalformedRequest, 4),
        ({"v": 1, "op": "lease", "id": 4, "partitions": [["t"]]}, MalformedRequest, 4),
        ({"v": 1, "op": "lease", "id": 4, "partitions": [["", 0]]}, MalformedRequest, 4),
        ({"v": 1, "op": "lease", "id": 4, "partitions": [["t", -1]]}, MalformedRequest, 4),
        ({"v": 1, "op": "lease", "id": 4, "partitions": [[1, 0]]}, MalformedRequest, 4),
    ],
)
def test_invalid_fields_are_rejected(message: Any, error: type[Exception], echoed: Any) -> None:
    with pytest.raises(RequestRejected) as caught:
        parse_request(_pack(message))
    assert type(caught.value.error) is error
    assert caught.value.request_id == echoed


@pytest.mark.parametrize("body", [b"", b"\xc1", b"\x93\x01\x02\x03", _pack([1, 2]), b"\xa3ab"])
def test_non_map_or_undecodable_bodies_are_malformed(body: bytes) -> None:
    with pytest.raises(RequestRejected) as caught:
        parse_request(body)
    assert isinstance(caught.value.error, MalformedRequest)
    assert caught.value.request_id is None


def test_frame_is_length_prefixed_msgpack() -> None:
    frame = encode_frame({"a": 1})
    (length,) = LENGTH.unpack(frame[:4])
    assert length == len(frame) - 4
    assert msgpack.unpackb(frame[4:]) == {"a": 1}
