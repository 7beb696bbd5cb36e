"""Free ports: one machine-wide registry, so parallel test workers never get the same port."""

from __future__ import annotations

import socket
from pathlib import Path

from pidfence.services import free_port
from pidfence.services.ports import HOLD_S, _claim


def test_a_claimed_port_is_refused_until_its_hold_ends(tmp_path: Path) -> None:
    registry = tmp_path / "ports"
    assert _claim(40001, now=1000.0, registry=registry)
    assert not _claim(40001, now=1000.0 + HOLD_S - 1, registry=registry)
    assert _claim(40002, now=1001.0, registry=registry)
    assert _claim(40001, now=1000.0 + HOLD_S + 0.5, registry=registry)  # its hold ended
    assert not _claim(40002, now=1000.0 + HOLD_S + 0.5, registry=registry)  # not this one's
    # Expired entries are dropped when the file is rewritten.
    assert _claim(40003, now=1100.0 + HOLD_S, registry=registry)
    assert [line.split("@")[0] for line in registry.read_text().split()] == ["40001", "40003"]


def test_an_unwritable_registry_refuses_nothing(tmp_path: Path) -> None:
    assert _claim(40003, registry=tmp_path / "missing" / "ports")


def test_free_ports_are_distinct_and_bindable() -> None:
    ports = {free_port() for _ in range(20)}
    assert len(ports) == 20
    for port in ports:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))
