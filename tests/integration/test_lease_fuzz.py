"""Bad input against a real lease server: each bad frame gets MALFORMED_REQUEST (or its
connection closed), and a well-formed client is served throughout."""

from __future__ import annotations

import random
import struct
import threading
from collections.abc import Callable, Iterator
from typing import Any

import msgpack
import pytest

from pidfence.pid_allocator import LeaseClient, LeaseServerThread
from tests.fixtures.hostile import connect, read_frame

SEED = 20261122


def _frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def _pack(message: Any) -> bytes:
    data: bytes = msgpack.packb(message, use_bin_type=True)
    return data


@pytest.fixture
def fuzz_server(lease_server_factory: Callable[..., LeaseServerThread]) -> LeaseServerThread:
    return lease_server_factory(
        max_connections=600,
        max_connections_per_address=600,
        idle_timeout_s=30.0,
        frame_timeout_s=1.0,
    )


@pytest.fixture
def good_client(fuzz_server: LeaseServerThread) -> Iterator[Callable[[], list[int]]]:
    """A well-formed client leasing in a loop while the test abuses the server."""
    stop = threading.Event()
    pids: list[int] = []
    errors: list[BaseException] = []

    def loop() -> None:
        try:
            with LeaseClient(fuzz_server.address, retries=0, request_timeout_s=10) as client:
                while not stop.is_set():
                    pids.append(client.lease().pid)
        except BaseException as exc:  # noqa: BLE001 - reported by the test below
            errors.append(exc)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()

    def finish() -> list[int]:
        stop.set()
        thread.join(30)
        assert not errors, f"well-formed client failed: {errors[0]!r}"
        return pids

    yield finish
    stop.set()
    thread.join(30)


def test_garbage_frames_get_malformed_and_connection_survives(
    fuzz_server: LeaseServerThread, good_client: Callable[[], list[int]]
) -> None:
    rng = random.Random(SEED)
    bodies: list[bytes] = [rng.randbytes(rng.randint(0, 200)) for _ in range(200)]
    bodies += [
        _pack(value)
        for value in ([1, 2], "lease", 7, None, {"v": 1}, {"v": 1, "op": None}, {1: 2, "v": 1})
    ]
    sock = connect(fuzz_server.address)
    closed = 0
    try:
        for body in bodies:
            sock.sendall(_frame(body))
            reply = read_frame(sock)
            assert reply is not None
            if reply["error"] is None:  # random bytes can be a valid msgpack map by chance
                continue
            assert reply["error"] in ("MALFORMED_REQUEST", "UNSUPPORTED_VERSION", "UNKNOWN_OP")
            assert reply["message"]
            if "decode limit" in reply["message"]:
                # A frame that breaks a decode limit (a length, the nesting) is answered, then
                # its connection is closed: the next read sees the end of the stream.
                assert read_frame(sock) is None
                closed += 1
                sock.close()
                sock = connect(fuzz_server.address)
        sock.sendall(_frame(_pack({"v": 1, "op": "ping", "id": 99})))
        reply = read_frame(sock)
        assert reply is not None
        assert (reply["id"], reply["error"]) == (99, None)
    finally:
        sock.close()
    assert closed < len(bodies) // 2  # most garbage is merely malformed: the connection stays
    assert good_client()


@pytest.mark.parametrize(
    ("message", "code"),
    [
        ({"v": 1, "op": "launch", "id": 1}, "UNKNOWN_OP"),
        ({"v": 9, "op": "lease", "id": 2}, "UNSUPPORTED_VERSION"),
        ({"v": 1, "op": "bump", "id": 3, "pid": "7", "generation": 1}, "MALFORMED_REQUEST"),
        ({"v": 1, "op": "bump", "id": 4, "pid": 7, "generation": 2**40}, "MALFORMED_REQUEST"),
        ({"v": 1, "op": "lease", "id": 5, "partitions": [["t", "0"]]}, "MALFORMED_REQUEST"),
        ({"v": 1, "op": "lease", "id": 6, "partitions": {"t": 0}}, "MALFORMED_REQUEST"),
        ({"v": 1, "op": "bump", "id": 7, "pid": 10**15, "generation": 0}, "NOT_OWNER"),
        (
            {"v": 1, "op": "roll", "id": 8, "pid": 10**15, "generation": 0, "secret": b"x"},
            "NOT_OWNER",
        ),
        (
            {"v": 1, "op": "roll", "id": 9, "pid": 1, "generation": 0, "secret": 5},
            "MALFORMED_REQUEST",
        ),
    ],
)
def test_wrong_types_and_ops_get_their_code_with_id_echoed(
    fuzz_server: LeaseServerThread, message: dict[str, Any], code: str
) -> None:
    with connect(fuzz_server.address) as sock:
        sock.sendall(_frame(_pack(message)))
        reply = read_frame(sock)
    assert reply is not None
    assert (reply["id"], reply["error"]) == (message["id"], code)


@pytest.mark.parametrize("length", [(1 << 20) + 1, 0xFFFFFFFF])
def test_absurd_length_prefix_is_refused_then_closed(
    fuzz_server: LeaseServerThread, length: int
) -> None:
    with connect(fuzz_server.address) as sock:
        sock.sendall(struct.pack(">I", length) + b"\x00" * 16)
        reply = read_frame(sock)
        assert reply is not None
        assert reply["error"] == "MALFORMED_REQUEST"
        assert read_frame(sock) is None


def test_truncated_and_slow_frames_are_closed_without_starving_others(
    fuzz_server: LeaseServerThread, good_client: Callable[[], list[int]]
) -> None:
    """Half a frame then silence: closed after frame_timeout_s; meanwhile others are served."""
    slow = [connect(fuzz_server.address) for _ in range(20)]
    try:
        for sock in slow:
            sock.sendall(struct.pack(">I", 100) + b"\x81")
        for sock in slow:
            assert read_frame(sock) is None  # closed by the server, no reply
    finally:
        for sock in slow:
            sock.close()
    with LeaseClient(fuzz_server.address) as client:
        assert client.ping()["server"]
    assert good_client()


def test_hundreds_of_idle_connections_and_the_connection_limit(
    fuzz_server: LeaseServerThread, good_client: Callable[[], list[int]]
) -> None:
    idle = [connect(fuzz_server.address) for _ in range(300)]
    try:
        with LeaseClient(fuzz_server.address) as client:
            assert client.lease().pid >= 1
        # Fill to the limit: the next connection is refused with a retriable error.
        extra = []
        while len(extra) < 400:
            sock = connect(fuzz_server.address)
            extra.append(sock)
            sock.sendall(_frame(_pack({"v": 1, "op": "ping", "id": len(extra)})))
            reply = read_frame(sock)
            if reply is None or reply["error"] is not None:
                # Refused: an UNAVAILABLE frame then close (a reset may overtake the frame).
                assert reply is None or reply["error"] == "UNAVAILABLE"
                assert read_frame(sock) is None
                break
            assert reply["id"] == len(extra)
        else:
            pytest.fail("connection limit never reached")
        assert len(extra) >= 298  # 600 allowed: 300 idle, the good client, a closing one
        for sock in extra:
            sock.close()
    finally:
        for sock in idle:
            sock.close()
    pids = good_client()
    assert len(pids) == len(set(pids))
