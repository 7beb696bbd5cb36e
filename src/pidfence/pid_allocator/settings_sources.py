"""Reading ``LeaseServerSettings`` from command-line flags, the environment and a settings file,
and writing them back as flags (the spawner in ``pidfence.services`` runs the real CLI with them).

One table, :data:`OPTIONS`, names every setting once: its option (``--lifetime``), the field(s)
it sets, how its text is read and its help. The same names serve every source:

* flags: ``pidfence lease-server --lifetime 90s`` (the CLI builds its options from this table);
* environment: ``PIDFENCE_LEASE_SERVER_LIFETIME=90s`` (the option name, upper case, ``_``);
* a TOML file (``--config FILE``): ``lifetime = "90s"``, ``max-connections = 256``,
  ``insecure = true``; a relative path in it is relative to the file's folder.

A flag beats the environment, which beats the file, which beats the default. Every value is
checked by ``LeaseServerSettings`` itself, so there is one way to validate whatever the source.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from pidfence.pid_allocator.settings import LeaseServerSettings, SettingsError

ENV_PREFIX = "PIDFENCE_LEASE_SERVER_"
_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def parse_duration_ms(text: str, low: int = 1) -> int:
    """``"24h"``, ``"90s"``, ``"500ms"``, ``"15m"``, ``"2d"`` (or bare milliseconds) in ms.

    Raises:
        ValueError: not a whole duration of at least ``low`` ms.
    """
    match = re.fullmatch(r"\s*(\d+)\s*(ms|s|m|h|d)?\s*", text)
    value = None if match is None else int(match.group(1)) * _UNITS_MS[match.group(2) or "ms"]
    if value is None or value < low:
        raise ValueError(f"{text!r} is not a duration like 24h, 90s, 15m or 500ms")
    return value


def format_duration_ms(ms: int) -> str:
    """``ms`` in the largest unit that holds it whole: ``86400000`` -> ``"1d"``, ``90000`` ->
    ``"90s"`` (what :func:`parse_duration_ms` reads back)."""
    for unit in ("d", "h", "m", "s"):
        if ms and ms % _UNITS_MS[unit] == 0:
            return f"{ms // _UNITS_MS[unit]}{unit}"
    return f"{ms}ms"


def _ms_or_zero(text: str) -> int:
    return parse_duration_ms(text, low=0)


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` to a pair.

    Raises:
        ValueError: not ``HOST:PORT`` with a port of 0..65535.
    """
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"{text!r} is not HOST:PORT (e.g. 127.0.0.1:7070)")
    return host.strip("[]"), int(port)


def _bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ValueError(f"{text!r} is not true or false")


def _seconds(text: str) -> float:
    return parse_duration_ms(text) / 1000


def _seconds_or_zero(text: str) -> float:
    return parse_duration_ms(text, low=0) / 1000


def _optional_int(text: str) -> int | None:
    return None if text.strip().lower() in ("", "none", "off") else int(text)


@dataclass(frozen=True, slots=True)
class Option:
    """One setting as the user names it.

    Attributes:
        name: the option without dashes (``lifetime``); the flag is ``--NAME``, the variable
            ``PIDFENCE_LEASE_SERVER_NAME``, the file key ``NAME``.
        field: the ``LeaseServerSettings`` field it sets (``listen`` sets host and port).
        parse: text to value (raises ValueError with a reason).
        help: one line for ``--help``.
        kind: ``duration``, ``path``, ``flag`` or ``value``: how it is written back as a flag.
        unset: what an unset (None) value means, for ``--help``.
    """

    name: str
    field: str
    parse: Callable[[str], Any]
    help: str
    kind: str = "value"
    unset: str = "off"

    def default_text(self) -> str:
        """The default as ``--help`` shows it."""
        defaults = LeaseServerSettings()
        if self.name == "listen":
            return f"{defaults.host}:{defaults.port}"
        value = getattr(defaults, self.field)
        if value is None or value is False:
            return self.unset
        return _text(self, value)

    @property
    def flag(self) -> str:
        """``--name``."""
        return f"--{self.name}"

    @property
    def env(self) -> str:
        """The environment variable naming this option."""
        return ENV_PREFIX + self.name.upper().replace("-", "_")


def _o(
    name: str,
    field: str,
    parse: Callable[[str], Any],
    help: str,
    kind: str = "value",
    unset: str = "off",
) -> Option:
    return Option(name, field, parse, help, kind, unset)


_D, _P = "duration", "path"

#: Every lease-server setting, in ``--help`` order.
OPTIONS: tuple[Option, ...] = (
    _o("zk", "zk_hosts", str, "ZooKeeper hosts, e.g. h1:2181,h2:2181/app (required)"),
    _o("listen", "host", parse_listen, "HOST:PORT to listen on (non-loopback needs --auth-tokens)"),
    _o("auth-tokens", "auth_tokens_file", Path, "'NAME TOKEN' lines; clients must hello", _P),
    _o("tls-cert", "tls_cert", Path, "PEM certificate: serve TLS", _P),
    _o("tls-key", "tls_key", Path, "PEM key of --tls-cert", _P),
    _o("tls-client-ca", "tls_client_ca", Path, "PEM CA: require client certificates", _P),
    _o("zk-auth-file", "zk_auth_file", Path, "USER:PASSWORD: ZooKeeper digest auth and ACLs", _P),
    _o("signing-key", "signing_key", Path, "Ed25519 PEM key: sign every lease (cert)", _P),
    _o("record-mac-secret", "record_mac_secret", Path, "Per-record MAC secret (hex, 0600)", _P),
    _o("insecure", "insecure", _bool, "Trusted network: allow no-auth off loopback", "flag"),
    _o("lifetime", "lifetime_ms", parse_duration_ms, "Lease lifetime: 24h, 90s, ...", _D),
    _o("block-size", "block_size", int, "Pids per ZooKeeper claim, at least"),
    _o("max-claim-blocks", "max_claim_blocks", int, "Most blocks one claim takes when busy"),
    _o("block-ttl", "block_ttl_ms", parse_duration_ms, "Issue from a claimed block this long", _D),
    _o("retention", "retention_ms", _ms_or_zero, "Keep ended pids known this long", _D, "lifetime"),
    _o("gc-interval", "gc_interval_s", _seconds_or_zero, "Delete old records this often", _D),
    _o("claim-timeout", "claim_timeout_s", _seconds_or_zero, "A lease waits for a block", _D),
    _o("capacity", "capacity", int, "Live leases held (lease ring)"),
    _o("client-share", "client_share", float, "Fraction of the ring one client may hold"),
    _o("max-connections", "max_connections", int, "Admitted connections at most"),
    _o(
        "max-pending-connections",
        "max_pending_connections",
        _optional_int,
        "Connections in their TLS handshake or before hello",
        unset="max-connections, at most 256",
    ),
    _o("max-connections-per-address", "max_connections_per_address", int, "Per client address"),
    _o("max-in-flight", "max_in_flight", int, "Requests of one client answered at once"),
    _o("bump-rate", "bump_rate", float, "Bumps and rolls/s of a client beside its others (0: off)"),
    _o("bump-burst", "bump_burst", int, "Bumps and rolls a client may send at once past the rate"),
    _o("lease-rate", "lease_rate", float, "Leases/s of a client beside its others (0: off)"),
    _o("lease-burst", "lease_burst", int, "Leases a client may send at once past the rate"),
    _o("idle-timeout", "idle_timeout_s", _seconds, "Close connections idle this long", _D),
    _o("frame-timeout", "frame_timeout_s", _seconds, "A started frame must end within this", _D),
    _o("hello-timeout", "hello_timeout_s", _seconds, "Handshake and hello within this", _D),
    _o("tls-handshake-timeout", "tls_handshake_timeout_s", _seconds, "TLS handshake deadline", _D),
    _o("max-pre-auth-frame", "max_pre_auth_frame_bytes", int, "Largest frame before hello"),
    _o("zk-queue", "zk_queue", int, "ZooKeeper jobs queued at most (more: RATE_LIMITED)"),
    _o("zk-client-share", "zk_client_share", float, "Fraction of --zk-queue one client may fill"),
    _o("zk-workers", "zk_workers", int, "Threads serving bumps and rolls"),
    _o("zk-root", "zk_root", str, "Znode folder of pidfence's state"),
    _o("zk-session-timeout", "zk_session_timeout_s", _seconds, "ZooKeeper session timeout", _D),
    _o("zk-op-timeout", "zk_op_timeout_s", _seconds, "Longest wait for one ZooKeeper answer", _D),
    _o("metrics-port", "metrics_port", _optional_int, "Serve Prometheus metrics on this port"),
    _o("metrics-host", "metrics_host", str, "Address of the metrics endpoint"),
    _o("audit-interval", "audit_interval_s", _seconds, "Log refusals once per peer this often", _D),
    _o("log-format", "log_format", str, "json or text"),
    _o("loop", "event_loop", str, "Event loop: auto (uvloop when installed), asyncio or uvloop"),
    _o("ready-file", "ready_file", Path, "Write HOST:PORT here once listening", _P),
)

OPTIONS_BY_NAME = {option.name: option for option in OPTIONS}


def _values(option: Option, parsed: Any) -> dict[str, Any]:
    if option.name == "listen":
        host, port = parsed
        return {"host": host, "port": port}
    return {option.field: parsed}


def _parse(option: Option, text: str, where: str) -> dict[str, Any]:
    try:
        return _values(option, option.parse(text))
    except ValueError as exc:
        raise SettingsError(f"{option.flag} ({where}): {exc}") from None


def _file_values(path: Path) -> dict[str, tuple[str, str]]:
    """``{option name: (text, where)}`` from a TOML settings file."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise SettingsError(f"cannot read settings file {path}: {exc.strerror or exc}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise SettingsError(f"settings file {path} is not TOML: {exc}") from None
    out: dict[str, tuple[str, str]] = {}
    for key, value in data.items():
        name = str(key).replace("_", "-")
        option = OPTIONS_BY_NAME.get(name)
        if option is None or isinstance(value, dict | list):
            raise SettingsError(
                f"{path}: unknown setting {key!r}; known: {', '.join(OPTIONS_BY_NAME)}"
            )
        text = str(value).lower() if isinstance(value, bool) else str(value)
        if option.kind == "path" and not Path(text).is_absolute():
            text = str(path.parent / text)
        out[name] = (text, f"from {path}")
    return out


def load_settings(
    flags: Mapping[str, str | bool | None] | None = None,
    env: Mapping[str, str] | None = None,
    file: Path | None = None,
    base: LeaseServerSettings | None = None,
) -> LeaseServerSettings:
    """Settings from ``flags`` (option name -> text; None: not given), else ``env``, else the
    TOML ``file``, else ``base`` (default: the defaults), checked once at the end.

    Raises:
        SettingsError: an unknown option, text that does not parse, or settings that cannot
            work together (the message names the option and where its value came from).
    """
    chosen: dict[str, tuple[str, str]] = {} if file is None else _file_values(file)
    for name, text in (env or {}).items():
        if name.startswith(ENV_PREFIX):
            option = next((o for o in OPTIONS if o.env == name), None)
            if option is None:
                raise SettingsError(f"unknown environment setting {name}")
            chosen[option.name] = (text, f"from ${name}")
    for name, value in (flags or {}).items():
        if value is None or value is False:
            continue
        if name not in OPTIONS_BY_NAME:
            raise SettingsError(f"unknown lease server option --{name}")
        chosen[name] = ("true" if value is True else str(value), "command line")
    values: dict[str, Any] = {}
    for name, (text, where) in chosen.items():
        values.update(_parse(OPTIONS_BY_NAME[name], text, where))
    return (base or LeaseServerSettings()).with_overrides(**values)


def _text(option: Option, value: Any) -> str:
    if option.kind == "duration":
        return format_duration_ms(value if option.field.endswith("_ms") else round(value * 1000))
    return str(value)


def settings_argv(settings: LeaseServerSettings) -> list[str]:
    """The ``pidfence lease-server`` options that rebuild ``settings``: ``--listen`` always,
    then every setting that differs from its default."""
    defaults = LeaseServerSettings()
    argv = ["--listen", f"{settings.host}:{settings.port}"]
    set_by: dict[str, Option] = {o.field: o for o in OPTIONS if o.name != "listen"}
    for item in fields(settings):
        name = item.name
        value = getattr(settings, name)
        if name in ("host", "port") or value == getattr(defaults, name):
            continue
        option = set_by[name]
        if option.kind == "flag":
            argv.append(option.flag)
        else:
            argv += [option.flag, _text(option, value)]
    return argv
