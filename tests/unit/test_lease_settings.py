"""One settings type for the lease server, read from flags, environment and a TOML file, checked
once (issue 25); the no-auth and record-MAC rules (issue 22)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from pidfence.cli import app
from pidfence.pid_allocator import LeaseServerSettings, SettingsError, load_settings
from pidfence.pid_allocator.settings import declared, is_loopback
from pidfence.pid_allocator.settings_sources import options_table, settings_argv


def test_flags_beat_the_environment_which_beats_the_file(tmp_path: Path) -> None:
    config = tmp_path / "lease.toml"
    config.write_text(
        'lifetime = "2h"\nmax-connections = 100\nblock_size = 7\nauth-tokens = "tokens"\n'
    )
    env = {
        "PIDFENCE_LEASE_SERVER_MAX_CONNECTIONS": "200",
        "PIDFENCE_LEASE_SERVER_ZK": "zk:2181/app",
        "HOME": "/elsewhere",  # not ours: ignored
    }
    settings = load_settings({"max-connections": "300", "lifetime": None}, env, config)
    assert settings.max_connections == 300  # flag
    assert settings.zk_hosts == "zk:2181/app"  # environment
    assert settings.lifetime_ms == 2 * 3600 * 1000  # file
    assert settings.block_size == 7  # file, snake_case key
    assert settings.auth_tokens_file == tmp_path / "tokens"  # relative to the file
    assert settings.capacity == LeaseServerSettings().capacity  # default


@pytest.mark.parametrize(
    ("flags", "env", "match"),
    [
        ({"lifetime": "forever"}, {}, r"--lifetime \(command line\).*duration"),
        ({}, {"PIDFENCE_LEASE_SERVER_LIFETIME": "0s"}, r"PIDFENCE_LEASE_SERVER_LIFETIME"),
        ({}, {"PIDFENCE_LEASE_SERVER_LIFETYME": "1s"}, "unknown environment setting"),
        ({"listen": "7070"}, {}, "HOST:PORT"),
        ({"block-size": "0"}, {}, "block_size"),
        ({"loop": "trio"}, {}, "--loop"),
        ({"tls-cert": "c.pem"}, {}, "together"),
        # kazoo refused it at start: a traceback, exit 1
        ({"zk": "127.0.0.1:abc"}, {}, r"--zk '127.0.0.1:abc' is not HOST:PORT"),
    ],
)
def test_bad_values_name_the_option_and_where_it_came_from(
    flags: dict[str, str], env: dict[str, str], match: str
) -> None:
    with pytest.raises(SettingsError, match=match):
        load_settings(flags, env)


def test_a_bad_settings_file_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("lifetime = \n")
    with pytest.raises(SettingsError, match="not TOML"):
        load_settings(file=bad)
    unknown = tmp_path / "unknown.toml"
    unknown.write_text("capasity = 3\n")
    with pytest.raises(SettingsError, match="unknown setting 'capasity'"):
        load_settings(file=unknown)
    with pytest.raises(SettingsError, match="cannot read"):
        load_settings(file=tmp_path / "missing.toml")


def test_argv_rebuilds_the_settings() -> None:
    settings = LeaseServerSettings(
        zk_hosts="zk:1/x",
        host="127.0.0.2",
        port=7000,
        lifetime_ms=90_000,
        idle_timeout_s=1.5,
        retention_ms=0,
        gc_interval_s=0,
        max_pending_connections=32,
        metrics_port=9100,
        insecure=True,
        auth_tokens_file=Path("/t"),
        event_loop="asyncio",
    )
    argv = settings_argv(settings)
    assert "--insecure" in argv
    flags: dict[str, str | bool | None] = {}
    i = 0
    while i < len(argv):
        name = argv[i][2:]
        if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            flags[name] = argv[i + 1]
            i += 2
        else:
            flags[name] = True
            i += 1
    assert load_settings(flags, {}) == settings


def test_every_field_has_one_option() -> None:
    from dataclasses import fields

    named = {o.field for o in declared()} | {"port"}  # --listen sets host and port
    assert named == {f.name for f in fields(LeaseServerSettings)}
    assert len({o.option for o in declared()}) == len(declared())


def test_the_docs_table_is_the_declarations() -> None:
    """docs/lease-server.md's options table is made from the declarations (regenerate it with
    ``pidfence.pid_allocator.settings.options_table()``)."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "lease-server.md").read_text()
    assert options_table() in page


def test_bounds_come_from_the_declarations() -> None:
    for item in declared():
        if item.low is not None:
            below = item.low - (1 if item.kind in ("int", "ms") else 0.5)
            with pytest.raises(SettingsError, match=item.field):
                LeaseServerSettings(**{item.field: below})
        if item.above is not None:
            with pytest.raises(SettingsError, match=item.field):
                LeaseServerSettings(**{item.field: item.above})
        if item.high is not None:
            with pytest.raises(SettingsError, match=item.field):
                LeaseServerSettings(**{item.field: item.high + 1})


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.5.6.7", True),
        ("::1", True),
        ("localhost", True),
        ("0.0.0.0", False),  # noqa: S104
        ("", False),
        ("10.0.0.5", False),
        ("lease.example", False),
    ],
)
def test_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_no_auth_listens_on_loopback_only_unless_insecure() -> None:
    with pytest.raises(SettingsError, match="--insecure"):
        LeaseServerSettings(host="0.0.0.0")  # noqa: S104 - the point of the test
    assert LeaseServerSettings(host="0.0.0.0", insecure=True).insecure  # noqa: S104
    assert LeaseServerSettings(host="0.0.0.0", auth_tokens_file=Path("t")).auth  # noqa: S104


def test_record_mac_secret_needs_tls_unless_insecure() -> None:
    with pytest.raises(SettingsError, match="TLS"):
        LeaseServerSettings(record_mac_secret=Path("s"))
    LeaseServerSettings(record_mac_secret=Path("s"), insecure=True)
    LeaseServerSettings(record_mac_secret=Path("s"), tls_cert=Path("c"), tls_key=Path("k"))


def test_the_pending_pool_follows_the_connection_cap() -> None:
    assert LeaseServerSettings().pending_cap == 256
    assert LeaseServerSettings(max_connections=64).pending_cap == 64
    assert LeaseServerSettings(max_connections=64, max_pending_connections=8).pending_cap == 8


def test_cli_with_insecure_gets_past_the_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    """--insecure passes the loopback check: the server then tries ZooKeeper (none here: 3)."""
    monkeypatch.setenv("PIDFENCE_LEASE_SERVER_ZK_SESSION_TIMEOUT", "1s")
    args = "lease-server --zk 127.0.0.1:1 --listen 0.0.0.0:0 --insecure --zk-op-timeout 1s"
    result = CliRunner().invoke(app, args.split())
    assert result.exit_code == 3, result.output
    assert "ZooKeeper" in result.output


def test_cli_without_zk_is_a_usage_error() -> None:
    result = CliRunner().invoke(app, ["lease-server"])
    assert result.exit_code == 2
    assert "--zk" in result.output


def test_kubernetes_service_links_are_not_settings() -> None:
    """A Service named ``pidfence-lease-server`` puts these in every pod of its namespace; the
    server refused to start on them ("unknown environment setting", exit 2)."""
    links = {
        "PIDFENCE_LEASE_SERVER_SERVICE_HOST": "10.0.0.7",
        "PIDFENCE_LEASE_SERVER_SERVICE_PORT": "7070",
        "PIDFENCE_LEASE_SERVER_SERVICE_PORT_LEASES": "7070",
        "PIDFENCE_LEASE_SERVER_PORT": "tcp://10.0.0.7:7070",
        "PIDFENCE_LEASE_SERVER_PORT_7070_TCP": "tcp://10.0.0.7:7070",
        "PIDFENCE_LEASE_SERVER_PORT_7070_TCP_ADDR": "10.0.0.7",
    }
    settings = load_settings({"zk": "zk:2181"}, {**links, "PIDFENCE_LEASE_SERVER_BLOCK_SIZE": "9"})
    assert settings.block_size == 9
    with pytest.raises(SettingsError, match="unknown environment setting"):
        load_settings({"zk": "zk:2181"}, {"PIDFENCE_LEASE_SERVER_PORTS": "7070"})
