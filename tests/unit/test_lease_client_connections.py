"""Admitted connections per client (``--max-connections-per-client``): one token, from however
many addresses, holds at most its share of the admitted slots. The review's finding: the caps
were in total and per address only, so one token on a few addresses held every slot and every
other client got UNAVAILABLE."""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pidfence.pid_allocator import (
    LeaseClient,
    LeaseServerSettings,
    LeaseServerThread,
    SettingsError,
)
from pidfence.pid_allocator.admission import STAGE_NEW, Admission
from pidfence.pid_allocator.protocol import encode_frame
from tests.unit.lease_kit import token_server

FLOODER, VICTIM = "f" * 32, "v" * 32


class Conn:
    def __init__(self, address: str) -> None:
        self.address = address
        self.stage = STAGE_NEW


def _admitted(admission: Admission, address: str, client: str | None) -> tuple[Conn, str | None]:
    conn = Conn(address)
    admission.accept(conn)
    return conn, admission.admit(conn, client)


def test_one_client_is_capped_over_all_its_addresses() -> None:
    admission = Admission(max_connections=10, max_pending=10, max_per_address=10, max_per_client=3)
    held = [_admitted(admission, f"10.0.0.{i}", "flood") for i in range(3)]
    assert all(refused is None for _, refused in held)
    conn, refused = _admitted(admission, "10.0.0.9", "flood")
    assert refused is not None and "--max-connections-per-client" in refused
    admission.release(conn)
    assert _admitted(admission, "10.0.0.9", "victim")[1] is None  # another client: room
    admission.release(held[0][0])
    assert _admitted(admission, "10.0.0.9", "flood")[1] is None  # one closed: one more
    assert admission.admitted == 4


def test_a_second_hello_moves_the_connection_to_the_other_clients_count() -> None:
    admission = Admission(max_connections=10, max_pending=10, max_per_address=10, max_per_client=1)
    first, _ = _admitted(admission, "a", "one")
    second, _ = _admitted(admission, "b", "two")
    assert admission.admit(first, "two") is not None  # "two" holds its one already
    assert admission.admit(first, "three") is None  # renamed: "one" has room again
    assert _admitted(admission, "c", "one")[1] is None
    admission.release(second)
    assert admission.admit(first, "two") is None
    assert admission.admitted == 2


@given(
    st.lists(
        st.tuples(st.sampled_from("aar"), st.sampled_from("xyz"), st.sampled_from("pq")),
        max_size=150,
    )
)
def test_client_counts_stay_exact_under_any_sequence(steps: list[tuple[str, str, str]]) -> None:
    admission = Admission(max_connections=8, max_pending=8, max_per_address=4, max_per_client=3)
    live: dict[Conn, str] = {}
    for kind, address, client in steps:
        if kind == "a":
            conn, refused = _admitted(admission, address, client)
            if refused is None:
                live[conn] = client
            else:
                admission.release(conn)
        elif live:
            gone = next(iter(live))
            del live[gone]
            admission.release(gone)
        for name in "pq":
            assert sum(1 for c in live.values() if c == name) <= 3
        assert admission.admitted == len(live) <= 8
    for conn in live:
        admission.release(conn)
    assert admission.admitted == admission.pending == 0


def test_the_default_is_a_quarter_of_the_admitted_connections() -> None:
    assert LeaseServerSettings().client_connection_cap == 256
    assert LeaseServerSettings(max_connections=64).client_connection_cap == 16
    assert LeaseServerSettings(max_connections=2).client_connection_cap == 1
    assert LeaseServerSettings(max_connections_per_client=7).client_connection_cap == 7
    with pytest.raises(SettingsError, match="max_connections_per_client"):
        LeaseServerSettings(max_connections_per_client=0)


# -- on a server -------------------------------------------------------------------------------


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LeaseServerThread]:
    running = token_server(
        tmp_path,
        {"victim": VICTIM, "flooder": FLOODER},
        max_connections=16,
        max_connections_per_address=16,
    )
    yield running
    running.stop()


def _hello(address: str, source: str, token: str) -> tuple[socket.socket, dict[str, Any]]:
    host, port = address.rsplit(":", 1)
    sock = socket.socket()
    sock.settimeout(10)
    sock.bind((source, 0))
    sock.connect((host, int(port)))
    sock.sendall(encode_frame({"v": 1, "op": "hello", "id": 0, "token": token}))
    (length,) = struct.unpack(">I", sock.recv(4, socket.MSG_WAITALL))
    reply: dict[str, Any] = msgpack.unpackb(sock.recv(length, socket.MSG_WAITALL), raw=False)
    return sock, reply


def test_one_token_on_many_addresses_leaves_room_for_others(server: LeaseServerThread) -> None:
    held: list[socket.socket] = []
    try:
        for i in range(4):  # a quarter of 16, from four addresses
            sock, reply = _hello(server.address, f"127.0.0.{2 + i}", FLOODER)
            held.append(sock)
            assert reply["error"] is None
        sock, refused = _hello(server.address, "127.0.0.9", FLOODER)
        held.append(sock)
        assert refused["error"] == "UNAVAILABLE"
        assert "--max-connections-per-client" in refused["message"]
        assert sock.recv(1) == b""  # and that connection is closed
        with LeaseClient(server.address, token=VICTIM, retries=0) as victim:
            assert victim.lease().pid > 0
        held.pop(0).close()
        for _ in range(100):  # the server sees the close soon; then the flooder has room again
            sock, reply = _hello(server.address, "127.0.0.9", FLOODER)
            held.append(sock)
            if reply["error"] is None:
                break
        assert reply["error"] is None
    finally:
        for sock in held:
            sock.close()
