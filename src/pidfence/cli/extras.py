"""A command that needs an optional extra says which one before it imports anything from it.

``pip install pidfence`` is the producer, the lease server and ``services``; the ``sink``,
``verify`` and ``demo`` extras bring what those commands import (pyspark, pyarrow, deltalake,
matplotlib...). The extras are read from the installed distribution's metadata, so the lists in
``pyproject.toml`` are the only ones.
"""

from __future__ import annotations

import re
from importlib import metadata

from pidfence.cli.exits import EXIT_UNAVAILABLE, fail

_NAME = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[([^\]]*)\])?")


def _requirements(extra: str) -> list[str]:
    """The distributions ``pidfence[extra]`` requires, following ``pidfence[other]`` in it."""
    try:
        lines = metadata.requires("pidfence") or []
    except metadata.PackageNotFoundError:  # run from a source tree that is not installed
        return []
    names: list[str] = []
    for line in lines:
        spec, _, marker = line.partition(";")
        if re.search(rf"extra\s*==\s*['\"]{re.escape(extra)}['\"]", marker) is None:
            continue
        if (match := _NAME.match(spec)) is None:
            continue
        name, inner = match.groups()
        if name.lower() == "pidfence":
            names += [n for e in (inner or "").split(",") if e.strip() for n in _requirements(e)]
        else:
            names.append(name)
    return names


def missing(extra: str) -> list[str]:
    """The distributions of ``pidfence[extra]`` that are not installed."""
    gone = []
    for name in dict.fromkeys(_requirements(extra)):
        try:
            metadata.distribution(name)
        except metadata.PackageNotFoundError:
            gone.append(name)
    return gone


def require(extra: str, command: str) -> None:
    """Exit 3 naming the extra to install when any of its distributions is missing."""
    if gone := missing(extra):
        fail(
            command,
            f"this command needs the `{extra}` extra ({', '.join(gone)} not installed): "
            f"pip install 'pidfence[{extra}]'",
            EXIT_UNAVAILABLE,
        )
