"""Reading ``LeaseServerSettings`` from command-line flags, the environment and a settings file,
and writing them back as flags (the spawner in ``pidfence.services`` runs the real CLI with them).

Every setting is declared once, on its field (``settings.py``); the same names serve every source:

* flags: ``pidfence lease-server --lifetime 90s`` (the CLI builds its options from the
  declarations);
* environment: ``PIDFENCE_LEASE_SERVER_LIFETIME=90s`` (the option name, upper case, ``_``);
* a TOML file (``--config FILE``): ``lifetime = "90s"``, ``max-connections = 256``,
  ``insecure = true``; a relative path in it is relative to the file's folder.

A flag beats the environment, which beats the file, which beats the default. Every value is
checked by ``LeaseServerSettings`` itself, so there is one way to validate whatever the source.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pidfence.durations import format_duration_ms, parse_duration_ms
from pidfence.pid_allocator.declaration import Setting, SettingsError
from pidfence.pid_allocator.settings import LeaseServerSettings, declared

ENV_PREFIX = "PIDFENCE_LEASE_SERVER_"
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def parse_listen(text: str, default_host: str | None = None) -> tuple[str, int]:
    """``HOST:PORT`` to a pair; ``:PORT`` is ``default_host``'s port when one is given.

    Raises:
        ValueError: not ``HOST:PORT`` with a port of 0..65535 (nor ``:PORT`` with a default).
    """
    host, sep, port = text.rpartition(":")
    host = host.strip("[]") or (default_host or "")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"{text!r} is not HOST:PORT (e.g. 127.0.0.1:7070)")
    return host, int(port)


def host_port(host: str, port: int) -> str:
    """``HOST:PORT`` as :func:`parse_listen` and the lease client read it back: an IPv6 host in
    brackets (``[::1]:7070``)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ValueError(f"{text!r} is not true or false")


def flag(item: Setting) -> str:
    """``--name``."""
    return f"--{item.option}"


def env_name(item: Setting) -> str:
    """The environment variable naming a setting."""
    return ENV_PREFIX + item.option.upper().replace("-", "_")


def _values(item: Setting, text: str) -> dict[str, Any]:
    """The field values ``text`` gives (``--listen`` gives two).

    Raises:
        ValueError: the text does not read as the setting's kind.
    """
    if item.kind == "listen":
        host, port = parse_listen(text, default_host=LeaseServerSettings().host)
        return {"host": host, "port": port}
    optional = getattr(LeaseServerSettings(), item.field) is None
    if optional and item.kind in ("int", "ms") and text.strip().lower() in ("", "none", "off"):
        return {item.field: None}
    readers: dict[str, Any] = {
        "text": str,
        "int": int,
        "float": float,
        "path": Path,
        "flag": _bool,
        "ms": lambda t: parse_duration_ms(t, low=0),
        "seconds": lambda t: parse_duration_ms(t, low=0) / 1000,
    }
    return {item.field: readers[item.kind](text)}


def _parse(item: Setting, text: str, where: str) -> dict[str, Any]:
    """The values ``text`` gives, checked against the setting's bounds here, where the message
    can say where the text came from."""
    try:
        values = _values(item, text)
        problem = item.problem(values.get(item.field))
        if problem is not None:
            raise ValueError(problem)
    except ValueError as exc:
        raise SettingsError(f"{flag(item)} ({where}): {exc}") from None
    return values


def _file_values(path: Path) -> dict[str, tuple[str, str]]:
    """``{option name: (text, where)}`` from a TOML settings file."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise SettingsError(f"cannot read settings file {path}: {exc.strerror or exc}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise SettingsError(f"settings file {path} is not TOML: {exc}") from None
    out: dict[str, tuple[str, str]] = {}
    by_option = {item.option: item for item in declared()}
    for key, value in data.items():
        name = str(key).replace("_", "-")
        item = by_option.get(name)
        if item is None or isinstance(value, dict | list):
            raise SettingsError(f"{path}: unknown setting {key!r}; known: {', '.join(by_option)}")
        text = str(value).lower() if isinstance(value, bool) else str(value)
        if item.kind == "path" and not Path(text).is_absolute():
            text = str(path.parent / text)
        out[name] = (text, f"from {path}")
    return out


#: What Kubernetes puts in every pod's environment for a Service named ``pidfence-lease-server``
#: (``…_SERVICE_HOST``, ``…_PORT_7070_TCP_ADDR``): not settings, never refused as unknown ones.
_SERVICE_LINK = re.compile(r"SERVICE_HOST|SERVICE_PORT(_\w+)?|PORT(_\d+_(TCP|UDP|SCTP)(_\w+)?)?")


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
    by_option = {item.option: item for item in declared()}
    chosen: dict[str, tuple[str, str]] = {} if file is None else _file_values(file)
    for name, text in (env or {}).items():
        if name.startswith(ENV_PREFIX) and not _SERVICE_LINK.fullmatch(name[len(ENV_PREFIX) :]):
            item = next((i for i in by_option.values() if env_name(i) == name), None)
            if item is None:
                raise SettingsError(f"unknown environment setting {name}")
            chosen[item.option] = (text, f"from ${name}")
    for name, value in (flags or {}).items():
        if value is None or value is False:
            continue
        if name not in by_option:
            raise SettingsError(f"unknown lease server option --{name}")
        chosen[name] = ("true" if value is True else str(value), "command line")
    values: dict[str, Any] = {}
    for name, (text, where) in chosen.items():
        values.update(_parse(by_option[name], text, where))
    return (base or LeaseServerSettings()).with_overrides(**values)


def settings_argv(settings: LeaseServerSettings) -> list[str]:
    """The ``pidfence lease-server`` options that rebuild ``settings``: ``--listen`` always,
    then every setting that differs from its default."""
    defaults = LeaseServerSettings()
    argv = ["--listen", f"{settings.host}:{settings.port}"]
    for item in declared():
        value = getattr(settings, item.field)
        if item.kind == "listen" or value == getattr(defaults, item.field):
            continue
        if item.kind == "flag":
            argv.append(flag(item))
        else:
            argv += [flag(item), "none" if value is None else value_text(item, value)]
    return argv


def default_text(item: Setting) -> str:
    """A setting's default as ``--help`` and the docs show it."""
    defaults = LeaseServerSettings()
    if item.kind == "listen":
        return f"{defaults.host}:{defaults.port}"
    value = getattr(defaults, item.field)
    if value is None or value is False:
        return item.unset
    return value_text(item, value)


def value_text(item: Setting, value: Any) -> str:
    """A value as the option takes it (``1d``, ``90s``, ``1024``)."""
    if item.kind in ("ms", "seconds"):
        return format_duration_ms(value if item.kind == "ms" else value * 1000)
    return str(value)


def options_table() -> str:
    """The options table of ``docs/lease-server.md``, made from the declarations."""
    rows = ["| option | default | meaning |", "|---|---|---|"]
    for item in declared():
        shown = default_text(item)
        plain = shown == "off" or shown.startswith(("(", "the ", "`")) or shown.isdigit()
        rows.append(f"| `--{item.option}` | {shown if plain else f'`{shown}`'} | {item.help} |")
    return "\n".join(rows)
