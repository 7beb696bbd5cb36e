"""A fault serving one connection stays with that connection.

The review's finding: before ``hello``, a frame whose ``op`` is a list or a map made the pre-auth
check raise ``TypeError`` (an unhashable key), which escaped the turn before it cleared
``_scheduled``; from then on the server accepted connections and answered nothing, pings
included. Both layers are fixed: such a frame is malformed (for its connection only), and a turn
schedules the next one whatever happened while serving.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest

from pidfence.pid_allocator import LeaseClient, LeaseServerThread
from pidfence.pid_allocator.errors import MalformedRequest
from pidfence.pid_allocator.fair import Turns
from pidfence.pid_allocator.protocol import (
    PingRequest,
    RequestRejected,
    encode_frame,
    parse_request,
)
from tests.unit.lease_kit import token_server
from tests.unit.test_lease_turns import Connection

TOKEN = "a" * 32


def _body(message: dict[str, Any]) -> bytes:
    data: bytes = msgpack.packb(message, use_bin_type=True)
    return data


@pytest.mark.parametrize("op", [[], {}, [1, 2], {"op": "ping"}, 1.5, b"ping", None])
@pytest.mark.parametrize("pre_auth", [True, False])
def test_an_op_that_is_no_string_is_malformed(op: Any, pre_auth: bool) -> None:
    with pytest.raises(RequestRejected) as rejected:
        parse_request(_body({"v": 1, "op": op, "id": 2}), pre_auth=pre_auth)
    assert isinstance(rejected.value.error, MalformedRequest)
    assert rejected.value.request_id == 2


def test_any_unexpected_error_while_parsing_is_malformed(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(message: dict[Any, Any], request_id: Any) -> Any:
        raise KeyError("a check nobody wrote")

    monkeypatch.setattr("pidfence.pid_allocator.protocol._parse_fields", broken)
    with pytest.raises(RequestRejected) as rejected:
        parse_request(_body({"v": 1, "op": "ping", "id": 9}))
    assert isinstance(rejected.value.error, MalformedRequest)
    assert rejected.value.request_id == 9
    assert "KeyError" in str(rejected.value.error)


# -- the turns ---------------------------------------------------------------------------------


class Loop:
    """What ``Turns`` uses of an event loop; callbacks run when the test says."""

    def __init__(self) -> None:
        self.soon: list[Callable[[], None]] = []

    def time(self) -> float:
        return 100.0

    def call_soon(self, callback: Callable[[], None]) -> None:
        self.soon.append(callback)

    def call_later(self, delay: float, callback: Callable[..., None], *args: Any) -> None:
        raise AssertionError("nothing here is muted")

    def run(self) -> None:
        soon, self.soon = self.soon, []
        for callback in soon:
            callback()


class Peer(Connection):
    """A connection holding ``frames`` frames, logging its client as it serves one; ``broken``
    ones raise while being served."""

    def __init__(
        self, turns: Turns, client: str, frames: int, served: list[str], *, broken: bool = False
    ) -> None:
        super().__init__(turns, client, client, frames, served)
        self.broken = broken

    def has_frame(self) -> bool:
        return bool(self.frames) and not self.closed

    def serve_one(self) -> None:
        if self.broken:
            self.frames.popleft()
            raise TypeError("unhashable type: 'list'")
        super().serve_one()

    def abort(self) -> None:
        self.closed = True


def test_a_turn_whose_serve_raises_drops_that_connection_and_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    loop = Loop()
    turns = Turns(loop, 32, ((0, 1), (0, 1)))  # type: ignore[arg-type]
    served: list[str] = []
    first = Peer(turns, "addr:first", 1, served)
    broken = Peer(turns, "addr:broken", 3, served, broken=True)
    other = Peer(turns, "addr:other", 3, served)
    turns.ready(first)  # nobody waits: answered at once
    turns.ready(broken)  # the turn to come is already scheduled: these wait for it
    turns.ready(other)
    assert loop.soon
    loop.run()  # the turn: the broken one raises
    assert broken.closed and not other.closed
    assert "serving a connection of addr:broken failed" in caplog.text
    while loop.soon:
        loop.run()
    assert served == ["addr:first"] + ["addr:other"] * 3  # everyone else was served
    assert other.flushed >= 1
    # Nothing is left scheduled or stuck: a newcomer is answered at once, as on a quiet server.
    late = Peer(turns, "addr:late", 1, served)
    turns.ready(late)
    assert served[-1] == "addr:late" and not loop.soon


def test_a_connection_answered_at_once_that_raises_is_dropped_alone() -> None:
    loop = Loop()
    turns = Turns(loop, 32, ((0, 1), (0, 1)))  # type: ignore[arg-type]
    served: list[str] = []
    broken = Peer(turns, "addr:broken", 1, served, broken=True)
    turns.ready(broken)
    assert broken.closed and not loop.soon
    turns.ready(Peer(turns, "addr:next", 1, served))
    assert served == ["addr:next"]


# -- a real server -----------------------------------------------------------------------------


@pytest.fixture
def auth_server(tmp_path: Path) -> Iterator[LeaseServerThread]:
    server = token_server(tmp_path, {"alice": TOKEN})
    yield server
    server.stop()


def _replies(sock: socket.socket) -> list[dict[str, Any]]:
    """Every reply until the server closes the connection."""
    sock.settimeout(10)
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    replies = []
    while data:
        (length,) = struct.unpack_from(">I", data)
        replies.append(msgpack.unpackb(data[4 : 4 + length], raw=False))
        data = data[4 + length :]
    return replies


@pytest.mark.parametrize("op", [[], {}])
def test_a_frame_before_hello_whose_op_is_no_string_leaves_the_server_serving(
    auth_server: LeaseServerThread, op: Any
) -> None:
    host, port = auth_server.address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as peer:
        # A valid ping, then the frame, in one write (as the review's peer sent them).
        peer.sendall(
            encode_frame({"v": 1, "op": "ping", "id": 1})
            + encode_frame({"v": 1, "op": op, "id": 2})
        )
        replies = _replies(peer)  # and then the server closes this connection
    assert [r["id"] for r in replies] == [1, None]
    assert replies[0]["error"] is None and isinstance(replies[0]["now_ms"], int)
    assert replies[1]["error"] == "UNAUTHENTICATED"
    with LeaseClient(auth_server.address, token=TOKEN, retries=0, request_timeout_s=5) as client:
        assert isinstance(client.ping()["now_ms"], int)
        assert client.lease().pid > 0
    with socket.create_connection((host, int(port)), timeout=10) as unauthenticated:
        unauthenticated.sendall(encode_frame({"v": 1, "op": "ping", "id": 3}))
        (length,) = struct.unpack(">I", unauthenticated.recv(4, socket.MSG_WAITALL))
        pong = msgpack.unpackb(unauthenticated.recv(length, socket.MSG_WAITALL), raw=False)
    assert pong["id"] == 3 and pong["error"] is None


def test_parse_request_still_reads_a_plain_ping() -> None:
    assert parse_request(_body({"v": 1, "op": "ping", "id": 4}), pre_auth=True) == PingRequest(4)
