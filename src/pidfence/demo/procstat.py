"""Resident memory of process trees, read from ``/proc`` by pid (never by process name).

The soak bench starts every process itself and knows its pid; the processes those start (the
Spark driver's JVM, PySpark's daemon and workers) are found as descendants through the parent
pids in ``/proc/PID/stat``. A process that exits between listing and reading is skipped.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path

PROC = Path("/proc")
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def parse_stat_ppid(stat: str) -> int:
    """The parent pid from ``/proc/PID/stat`` text (the command may hold spaces and ``)``)."""
    return int(stat[stat.rindex(")") + 2 :].split()[1])


def parent_map(proc: Path = PROC) -> dict[int, int]:
    """pid -> parent pid of every process now visible."""
    parents: dict[int, int] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parents[int(entry.name)] = parse_stat_ppid((entry / "stat").read_text())
        except (OSError, ValueError):
            continue
    return parents


def children_map(parents: Mapping[int, int]) -> dict[int, list[int]]:
    """parent pid -> its child pids, from :func:`parent_map`."""
    children: dict[int, list[int]] = defaultdict(list)
    for pid, ppid in parents.items():
        children[ppid].append(pid)
    return children


def descendants(root: int, children: Mapping[int, list[int]]) -> dict[int, int]:
    """Every process below ``root`` (not ``root`` itself) -> its depth (1 = a child)."""
    found: dict[int, int] = {}
    frontier = [(root, 0)]
    while frontier:
        pid, depth = frontier.pop()
        for child in children.get(pid, ()):
            if child not in found and child != root:
                found[child] = depth + 1
                frontier.append((child, depth + 1))
    return found


def is_stopped(pid: int, proc: Path = PROC) -> bool:
    """True when the process is stopped by a signal (state ``T``)."""
    try:
        stat = (proc / str(pid) / "stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2 :].split()[0] == "T"


def rss_bytes(pid: int, proc: Path = PROC) -> int:
    """Resident set size of one process (0 when it is gone)."""
    try:
        fields = (proc / str(pid) / "statm").read_text().split()
    except OSError:
        return 0
    return int(fields[1]) * _PAGE if len(fields) > 1 else 0


def tree_rss(roots: Iterable[int], children: Mapping[int, list[int]], proc: Path = PROC) -> int:
    """Summed RSS of ``roots`` and all their descendants (each process counted once)."""
    pids: set[int] = set()
    for root in roots:
        pids.add(root)
        pids.update(descendants(root, children))
    return sum(rss_bytes(pid, proc) for pid in pids)


def dir_bytes(path: Path) -> tuple[int, int]:
    """(bytes, files) under ``path`` (0, 0 when it does not exist yet)."""
    size = files = 0
    for folder, _, names in os.walk(path):
        for name in names:
            try:
                size += (Path(folder) / name).stat().st_size
            except OSError:
                continue
            files += 1
    return size, files
