"""``pidfence lease-server`` and ``pidfence keys`` argument parsing (no server is started)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pidfence.cli import app
from pidfence.durations import parse_duration_ms
from pidfence.pid_allocator import LeaseServerThread, MemoryCoordinator
from pidfence.pid_allocator.settings_sources import parse_listen
from tests.unit.test_lease_client import ipv6_loopback


@pytest.mark.parametrize(
    ("text", "ms"),
    [("24h", 86_400_000), ("90s", 90_000), ("15m", 900_000), ("500ms", 500), ("2d", 172_800_000)],
)
def test_durations(text: str, ms: int) -> None:
    assert parse_duration_ms(text) == ms


@pytest.mark.parametrize("text", ["", "0s", "-5s", "1.5h", "10y", "h"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration_ms(text)


def test_the_cli_duration_parser_is_a_usage_error() -> None:
    """Other commands (``--message-timeout``) parse durations with ``cli.lease``'s."""
    import typer

    from pidfence.cli.lease import parse_duration_ms as cli_duration

    assert cli_duration("90s") == 90_000
    with pytest.raises(typer.BadParameter, match="duration"):
        cli_duration("forever")


def test_listen() -> None:
    assert parse_listen("127.0.0.1:7070") == ("127.0.0.1", 7070)
    with pytest.raises(ValueError, match="HOST:PORT"):
        parse_listen("7070")


@pytest.mark.parametrize(
    ("option", "says"),
    [
        (("--lifetime", "forever"), "duration"),
        (("--log-format", "xml"), "log_format"),
        (("--listen", "0.0.0.0:0"), "--insecure"),  # no auth off loopback
        (("--record-mac-secret", "s"), "TLS"),  # a MAC secret needs TLS
    ],
)
def test_bad_options_exit_with_usage_error(option: tuple[str, str], says: str) -> None:
    result = CliRunner().invoke(app, ["lease-server", "--zk", "h:1", *option])
    assert result.exit_code == 2
    assert says in result.output


def test_keys_generate(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["keys", "generate", str(tmp_path / "k")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "k" / "lease-signing.key").stat().st_mode & 0o077 == 0
    again = CliRunner().invoke(app, ["keys", "generate", str(tmp_path / "k")])
    assert again.exit_code == 2  # usage: pick another directory
    assert "never overwritten" in again.output


def test_health_exits_zero_only_on_a_ping_reply() -> None:
    with LeaseServerThread(None, coordinator=MemoryCoordinator()) as server:
        ok = CliRunner().invoke(app, ["lease-server", "--health", server.address])
        assert ok.exit_code == 0, ok.output
        assert "now_ms=" in ok.output
    with socket.socket() as silent:  # accepts TCP connections, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(5)
        host, port = silent.getsockname()
        result = CliRunner().invoke(
            app, ["lease-server", "--health", f"{host}:{port}", "--timeout", "0.5"]
        )
    assert result.exit_code == 1


def test_unreadable_auth_tokens_exit_2(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("producer short\n")
    tokens.chmod(0o600)
    result = CliRunner().invoke(
        app, ["lease-server", "--zk", "127.0.0.1:1", "--auth-tokens", str(tokens)]
    )
    assert result.exit_code == 2


def test_ready_file_write_leaves_nothing_behind_on_failure(tmp_path: Path) -> None:
    from pidfence.pid_allocator.daemon import write_ready_file

    target = tmp_path / "ready"
    write_ready_file(target, "127.0.0.1:7070")
    assert target.read_text() == "127.0.0.1:7070"
    with pytest.raises(OSError):
        write_ready_file(tmp_path / "missing-dir" / "ready", "x")
    target.chmod(0o600)
    blocked = tmp_path / "a-dir"
    blocked.mkdir()
    with pytest.raises(OSError):  # replacing a directory fails after the temp file exists
        write_ready_file(blocked, "x")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-dir", "ready"]


def test_keys_mac_secret_and_usage_errors(tmp_path: Path) -> None:
    target = tmp_path / "mac" / "record-mac.secret"
    made = CliRunner().invoke(app, ["keys", "mac-secret", str(target)])
    assert made.exit_code == 0, made.output
    assert target.stat().st_mode & 0o077 == 0
    again = CliRunner().invoke(app, ["keys", "mac-secret", str(target)])
    assert again.exit_code == 2
    assert "never overwritten" in again.output
    missing_arg = CliRunner().invoke(app, ["keys", "mac-secret"])
    assert missing_arg.exit_code == 2
    unwritable = CliRunner().invoke(app, ["keys", "mac-secret", "/proc/pidfence/secret"])
    assert unwritable.exit_code == 3


def test_keys_pki_writes_the_record_mac_secret(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["keys", "pki", str(tmp_path / "pki")])
    assert result.exit_code == 0, result.output
    secret = tmp_path / "pki" / "record-mac.secret"
    assert f"record MAC secret: {secret}" in result.output
    from pidfence.wire import load_mac_secret

    assert len(load_mac_secret(secret)) == 32


def test_keys_pki_refuses_to_replace_a_pki_without_force(tmp_path: Path) -> None:
    pki = tmp_path / "pki"
    assert CliRunner().invoke(app, ["keys", "pki", str(pki)]).exit_code == 0
    ca, token = (pki / "ca.pem").read_bytes(), (pki / "producer.token").read_bytes()
    again = CliRunner().invoke(app, ["keys", "pki", str(pki)])
    assert again.exit_code == 2 and "--force" in again.stderr
    assert (pki / "ca.pem").read_bytes() == ca and (pki / "producer.token").read_bytes() == token
    forced = CliRunner().invoke(app, ["keys", "pki", str(pki), "--force"])
    assert forced.exit_code == 0, forced.output
    assert (pki / "ca.pem").read_bytes() != ca


def test_a_taken_listen_address_is_a_settings_error_naming_the_option() -> None:
    """``lease-server`` then exits 2 with the line, not a traceback (the ``--metrics-port``
    case already did)."""
    from pidfence.pid_allocator.declaration import SettingsError

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        server = LeaseServerThread(
            None, coordinator=MemoryCoordinator(), host="127.0.0.1", port=port
        )
        with pytest.raises(SettingsError, match=f"cannot listen on 127.0.0.1:{port}.*--listen"):
            server.start()


def test_lease_ping_with_a_missing_ca_file_is_a_usage_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app, ["lease-ping", "127.0.0.1:1", "--tls-ca", str(tmp_path / "missing.pem")]
    )
    assert result.exit_code == 2, result.output
    assert "missing.pem" in result.output


def test_lease_ping_errors_name_lease_ping_and_health_errors_lease_server(
    tmp_path: Path,
) -> None:
    """Each command's error line names the command the user ran (it said lease-server for
    both)."""
    missing = str(tmp_path / "missing.pem")
    for args, command in [
        (["lease-ping", "127.0.0.1:1", "--tls-ca", missing], "lease-ping"),
        (["lease-ping", "no-port"], "lease-ping"),
        (["lease-server", "--health", "127.0.0.1:1", "--tls-ca", missing], "lease-server"),
    ]:
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 2, result.output
        assert result.stderr.startswith(f"pidfence {command}: error: "), result.stderr


def test_listen_without_a_host_is_a_port_on_the_default_host() -> None:
    """``--listen :0``, as the option's help offers, is any free port on 127.0.0.1."""
    from pidfence.pid_allocator.settings_sources import load_settings

    assert parse_listen(":0", default_host="127.0.0.1") == ("127.0.0.1", 0)
    assert parse_listen("[::1]:0", default_host="127.0.0.1") == ("::1", 0)
    with pytest.raises(ValueError, match="HOST:PORT"):  # lease-ping needs a host to ping
        parse_listen(":7070")
    settings = load_settings({"listen": ":0"}, {}, None)
    assert (settings.host, settings.port) == ("127.0.0.1", 0)
    result = CliRunner().invoke(app, ["lease-server", "--zk", "h:1", "--listen", ":99999"])
    assert result.exit_code == 2 and "HOST:PORT" in result.output


#: ``pidfence lease-server`` ARGS with an in-memory store in place of ZooKeeper.
_SERVE_IN_MEMORY = """
import functools, sys
from pidfence.cli import app
from pidfence.pid_allocator import MemoryCoordinator, daemon
daemon.start_server = functools.partial(daemon.start_server, coordinator=MemoryCoordinator())
app(sys.argv[1:], prog_name="pidfence")
"""


_NO_IPV6 = pytest.mark.skipif(not ipv6_loopback(), reason="this machine has no IPv6 loopback (::1)")


@pytest.mark.parametrize(
    ("listen", "host"),
    [(":0", "127.0.0.1"), pytest.param("[::1]:0", "::1", marks=_NO_IPV6)],
)
def test_lease_server_listen_colon_zero_serves_a_free_port_and_says_which(
    tmp_path: Path, listen: str, host: str
) -> None:
    import signal
    import subprocess
    import sys
    import time

    from pidfence.pid_allocator import LeaseClient

    ready = tmp_path / "ready"
    args = [
        "lease-server",
        "--zk",
        "zk.invalid:2181",
        "--listen",
        listen,
        "--ready-file",
        str(ready),
    ]
    child = subprocess.Popen(
        [sys.executable, "-c", _SERVE_IN_MEMORY, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    address, reply = "", {}
    try:
        deadline = time.monotonic() + 60
        while not ready.exists() and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if ready.exists():
            address = ready.read_text()
            with LeaseClient(address, retries=0) as client:
                reply = client.ping()
    finally:
        child.send_signal(signal.SIGTERM)
        out, err = child.communicate(timeout=30)
    assert address, out + err  # before: exit 2, "':0' is not HOST:PORT"
    port = parse_listen(address)[1]
    assert port != 0
    assert address == (f"[{host}]:{port}" if ":" in host else f"{host}:{port}")  # IPv6: brackets
    assert isinstance(reply.get("now_ms"), int)
    assert f"listening on {address}" in err  # the port it bound, not 0
    assert child.returncode == 0, out + err


@pytest.mark.parametrize("timeout", ["-1", "0", "nan"])
@pytest.mark.parametrize(
    "command", [["lease-ping", "127.0.0.1:7070"], ["lease-server", "--health", "127.0.0.1:7070"]]
)
def test_a_timeout_that_is_not_positive_is_a_usage_error(command: list[str], timeout: str) -> None:
    """It was a traceback (``ValueError: Timeout value out of range`` from the socket)."""
    result = CliRunner().invoke(app, [*command, "--timeout", timeout])
    assert result.exit_code == 2
    name = command[0]
    assert result.output.splitlines() == [
        f"pidfence {name}: error: --timeout must be a number of seconds > 0, got {timeout}"
    ]
