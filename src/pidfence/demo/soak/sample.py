"""One sample of a soak run: RSS per process tree, the sink's batch times, state size, counts."""

from __future__ import annotations

import os
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pidfence.demo.procs import ProducerRole
from pidfence.demo.procstat import (
    children_map,
    descendants,
    dir_bytes,
    parent_map,
    rss_bytes,
    tree_rss,
)
from pidfence.demo.soak.faults import SinkProc
from pidfence.services.lease_server import LeaseServerProcess


def take_sample(
    trees: dict[str, list[int]],
    lease_servers: Sequence[LeaseServerProcess],
    roles: Sequence[ProducerRole],
    sink: SinkProc | None,
    output: Path,
    *,
    since_s: float,
    t_s: float,
    wall_started: float,
) -> dict[str, Any]:
    """The sample at ``t_s`` seconds into the run (batch times: those after ``since_s``).

    Args:
        trees: service name -> root pids whose trees' RSS is summed.
        lease_servers: the lease server processes.
        roles: the producer roles (their running instances).
        sink: the sink's driver process (its batch lines read already).
        output: the sink's output path (its state size).
        since_s: ``t_s`` of the previous sample (-1 for the first).
        t_s: seconds since the producers started.
        wall_started: epoch seconds when they started.
    """
    children = children_map(parent_map())
    rss: dict[str, int] = {}
    for name, roots in trees.items():
        rss[name] = tree_rss(roots, children)
    for server in lease_servers:
        rss[server.proc.name] = tree_rss([server.pid] if server.pid else [], children)
    for role in roles:
        rss[role.spec.name] = tree_rss(
            [w.pid for w in role.instances if w.running and w.pid], children
        )
    rss["harness"] = rss_bytes(os.getpid())
    workers = 0
    if sink is not None and sink.pid is not None:
        below = descendants(sink.pid, children)
        rss["spark driver (python)"] = rss_bytes(sink.pid)
        rss["spark JVM"] = sum(rss_bytes(p) for p, d in below.items() if d == 1)
        rss["spark python workers"] = sum(rss_bytes(p) for p, d in below.items() if d > 1)
        workers = sum(1 for d in below.values() if d > 1)
    lines = sink.lines if sink is not None else []
    recent = [
        float(line["seconds"])
        for line in lines
        if line.get("seconds") is not None and line["t"] - wall_started > since_s
    ]
    # A Delta output keeps pidfence's own files (state among them) under _pidfence/.
    delta_state = output / "_pidfence" / "_state"
    state_root = delta_state if delta_state.is_dir() else output / "_state"
    state_bytes, state_files = dir_bytes(state_root)
    _, pidfence_files = dir_bytes(output / "_pidfence")
    _, delta_log_files = dir_bytes(output / "_delta_log")
    return {
        "t_s": t_s,
        "rss": rss,
        "state_bytes": state_bytes,
        "state_files": state_files,
        "pidfence_files": pidfence_files,
        "delta_log_files": delta_log_files,
        "batches": len(lines),
        "batches_since": len(recent),
        "batch_s_median": statistics.median(recent) if recent else None,
        "batch_s_max": max(recent) if recent else None,
        "records_in": sum(int(line["records_in"]) for line in lines),
        "appended": sum(int(line["appended"]) for line in lines),
        "dropped": sum(sum(line["dropped"].values()) for line in lines),
        "lag": lines[-1].get("lag") if lines else None,
        "spark_python_processes": workers,
    }
