"""The preflight's answer for a service nobody runs: a refused connect is final after a grace."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from pidfence.cli.preflight import (
    KafkaUnreachable,
    ZooKeeperUnreachable,
    check_kafka,
    check_zookeeper,
)
from pidfence.reachability import parse_address, refused_everywhere, zookeeper_servers
from pidfence.services.ports import free_port


@pytest.fixture
def silent_listener() -> Iterator[str]:
    """A port that accepts connections and never answers (a hung broker)."""
    server = socket.create_server(("127.0.0.1", 0))
    yield f"127.0.0.1:{server.getsockname()[1]}"
    server.close()


def test_a_port_nobody_listens_on_is_refused_everywhere() -> None:
    assert refused_everywhere(f"127.0.0.1:{free_port()},127.0.0.1:{free_port()}", grace_s=0.2)


def test_one_listening_address_is_enough(silent_listener: str) -> None:
    assert not refused_everywhere(f"127.0.0.1:{free_port()},{silent_listener}", grace_s=0.2)


@pytest.mark.parametrize("servers", ["", "kafka", "host:port", "no-such-host.invalid:9092"])
def test_what_is_not_a_refusal_is_left_to_the_client(servers: str) -> None:
    assert not refused_everywhere(servers, grace_s=0.2)


@pytest.mark.parametrize(
    ("entry", "address"),
    [
        ("127.0.0.1:9092", ("127.0.0.1", 9092)),
        ("[::1]:9092", ("::1", 9092)),
        ("SASL_SSL://broker:9093", ("broker", 9093)),
        (" b:1 ", ("b", 1)),
    ],
)
def test_addresses_parse(entry: str, address: tuple[str, int]) -> None:
    assert parse_address(entry) == address


def test_a_server_binding_its_port_within_the_grace_is_not_refused() -> None:
    port = free_port()

    def bind_late() -> None:
        time.sleep(0.3)
        server = socket.create_server(("127.0.0.1", port))
        time.sleep(1.0)
        server.close()

    late = threading.Thread(target=bind_late)
    late.start()
    try:
        assert not refused_everywhere(f"127.0.0.1:{port}", grace_s=0.8)
    finally:
        late.join()


def test_kafka_refused_is_one_line_naming_the_refusal() -> None:
    gone = f"127.0.0.1:{free_port()}"
    with pytest.raises(KafkaUnreachable, match=r"connection refused for 3 s .*check --bootstrap"):
        check_kafka(gone, [])


def test_kafka_that_accepts_and_never_answers_fails_at_the_metadata_timeout(
    silent_listener: str,
) -> None:
    with pytest.raises(KafkaUnreachable, match=r"no broker answered within 1 s"):
        check_kafka(silent_listener, [], timeout_s=1.0)


def test_zookeeper_refused_names_zookeeper() -> None:
    gone = f"127.0.0.1:{free_port()}"
    with pytest.raises(ZooKeeperUnreachable, match=r"ZooKeeper at .*/chroot: connection refused"):
        check_zookeeper(f"{gone}/chroot")


def test_a_zookeeper_connect_string_loses_its_chroot() -> None:
    assert zookeeper_servers("h1:2181,h2:2181/app/x") == "h1:2181,h2:2181"
    assert zookeeper_servers("h1:2181") == "h1:2181"
