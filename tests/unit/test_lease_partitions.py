"""What one frame may cost: ``partitions`` (informational, read by no server) holds at most
``MAX_PARTITIONS`` pairs, and a longer list is refused at its array header, before any pair is
decoded. The review's finding: 100,000 pairs were decoded and checked one by one, about 0.3 s of
the event loop per frame, by a client that is never rate-limited for it."""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator
from typing import Any

import msgpack
import pytest

from pidfence.pid_allocator import LeaseClient, LeaseServerThread, MemoryCoordinator
from pidfence.pid_allocator.decode import MAX_PARTITIONS, decode_message
from pidfence.pid_allocator.errors import FrameLimitExceeded
from pidfence.pid_allocator.protocol import LeaseRequest, RequestRejected, parse_request


def _lease(pairs: int, request_id: int = 1) -> dict[str, Any]:
    return {"v": 1, "op": "lease", "id": request_id, "partitions": [["t", i] for i in range(pairs)]}


def _body(message: dict[str, Any]) -> bytes:
    data: bytes = msgpack.packb(message, use_bin_type=True)
    return data


def test_the_cap_is_a_thousand_pairs() -> None:
    assert MAX_PARTITIONS == 1_000
    request = parse_request(_body(_lease(MAX_PARTITIONS)))
    assert isinstance(request, LeaseRequest) and len(request.partitions) == MAX_PARTITIONS
    with pytest.raises(RequestRejected) as rejected:
        parse_request(_body(_lease(MAX_PARTITIONS + 1)))
    assert isinstance(rejected.value.error, FrameLimitExceeded)
    assert rejected.value.error.code == "MALFORMED_REQUEST"


def test_a_longer_list_is_refused_at_its_header_before_any_pair_is_read() -> None:
    """The header promises 65,535 (or 100,000) pairs and one follows, then padding or the
    frame's end: a decoder that read the pairs would stop at the first that is none and name
    it; one that keeps the cap refuses the count it was promised, at the header."""
    head = b"\x83" + _body("v") + _body(1) + _body("op") + _body("lease") + _body("partitions")
    body = head + b"\xdc" + struct.pack(">H", 65_535) + _body(["t", 0]) + b"\x00" * 2048
    with pytest.raises(FrameLimitExceeded, match="partitions holds 65535 items; at most 1000"):
        decode_message(body)
    huge = head + b"\xdd" + struct.pack(">I", 100_000) + _body(["t", 0]) * 400
    with pytest.raises(FrameLimitExceeded, match="partitions holds 100000 items"):
        decode_message(huge)


# -- on a server -------------------------------------------------------------------------------


@pytest.fixture
def server() -> Iterator[LeaseServerThread]:
    running = LeaseServerThread(None, coordinator=MemoryCoordinator(), block_size=100).start()
    yield running
    running.stop()


def _exchange(sock: socket.socket, message: dict[str, Any]) -> dict[str, Any]:
    body = _body(message)
    sock.sendall(struct.pack(">I", len(body)) + body)
    (length,) = struct.unpack(">I", sock.recv(4, socket.MSG_WAITALL))
    reply: dict[str, Any] = msgpack.unpackb(sock.recv(length, socket.MSG_WAITALL), raw=False)
    return reply


def test_a_client_sending_the_largest_frames_is_served_and_others_are_unaffected(
    server: LeaseServerThread,
) -> None:
    host, port = server.address.rsplit(":", 1)
    largest = 1_000  # MAX_PARTITIONS, spelled out: the test states the cap it checks
    pids: list[int] = []
    with (
        socket.create_connection((host, int(port)), timeout=10) as heavy,
        LeaseClient(server.address, retries=0, request_timeout_s=10) as other,
    ):
        for n in range(20):
            reply = _exchange(heavy, _lease(largest, n))
            assert (reply["id"], reply["error"]) == (n, None)  # the same connection, served
            pids.append(reply["pid"])
            pids.append(other.lease([("orders", 0)]).pid)
        refused = _exchange(heavy, _lease(largest + 1, 99))
        assert refused["error"] == "MALFORMED_REQUEST"
        assert f"at most {largest}" in refused["message"]
        assert heavy.recv(1) == b""  # a broken decode limit: that connection is closed
        pids.append(other.lease().pid)
        assert isinstance(other.ping()["now_ms"], int)
    assert len(set(pids)) == len(pids) == 41
