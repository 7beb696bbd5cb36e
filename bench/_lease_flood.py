"""The flood rows of ``pidfence bench lease`` (issue 36, "Nobody slows anybody").

One ``pidfence lease-server`` with auth tokens on the server core. A victim (this process) bumps
its own pid one request at a time, as a resume does: alone, then beside one flooder, then beside
two. A flooder is another token holder that opens 8 connections, leases 32 pids on each and keeps
every one of them bumping, pipelined, as fast as the server answers, a refusal sent again at once
(``tests/fixtures/lease_clients.py``'s ``HostileProcess``, mode ``flood`` with ``pids``, on the
load core; the victim is its ``RawLease``). Per row: the victim's bump latency and errors, and the
server's total throughput (bumps granted to everyone per second, from ``pidfence_bumps_total``)
and RATE_LIMITED answers over the row. A row lasts ``bumps`` victim bumps and at least
``min_s`` seconds (the victim bumps on meanwhile), so its throughput is the flood's sustained one
rather than a flooder's first burst.
"""

from __future__ import annotations

import shutil
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from pidfence.benchkit import load_bench

CONNECTIONS = 8
PIDS = 32
_clients = load_bench("lease_clients", Path(__file__).resolve().parents[1] / "tests" / "fixtures")


def _counters(bench: Any, server: Any) -> tuple[float, float, float]:
    """Bumps granted, RATE_LIMITED answers, server CPU seconds."""
    url = f"http://127.0.0.1:{server.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    samples = dict(line.rsplit(" ", 1) for line in text.splitlines() if not line.startswith("#"))
    refused = samples.get('pidfence_request_errors_total{code="RATE_LIMITED"}', "0")
    bumps = float(samples.get("pidfence_bumps_total", "0"))
    return bumps, float(refused), bench._cpu_s(server.proc.pid)


def flood_rows(
    bench: Any, zk_hosts: str, pki: Any, bumps: int, min_s: float, loop: str
) -> list[dict[str, Any]]:
    """The victim's rows: alone, beside 1 and beside 2 flooders, each ``bumps`` bumps and
    ``min_s`` seconds at least (``bench`` is ``lease.py``, whose server and process helpers these
    rows use)."""
    scratch = Path(tempfile.mkdtemp(prefix="pidfence-bench-flood-"))
    settings = {"block_size": 100, "event_loop": loop, "auth_tokens_file": str(pki.tokens_file)}
    tokens = {name: Path(pki.token_files[name]).read_text().strip() for name in pki.token_files}
    flooders: list[Any] = []
    rows = []
    server = victim = None
    try:
        server = bench._start_server(bench._chroot(zk_hosts), scratch, "flooded", settings)
        victim = _clients.RawLease(server.address, timeout=60)
        hello = victim.call("hello", token=tokens["victim"])
        if hello["error"] is not None:
            raise RuntimeError(f"the victim's hello was refused: {hello}")
        lease = victim.call("lease")
        for count in (0, 1, 2):
            if count:
                name = f"flood{count}"
                flooder = _clients.HostileProcess(
                    "flood",
                    scratch,
                    name,
                    launcher=bench._pinned(bench.CLIENT_CORE),
                    address=server.address,
                    token=tokens[name],
                    connections=CONNECTIONS,
                    pids=PIDS,
                )
                flooders.append(flooder)
                flooder.wait_ready(120)
                time.sleep(1)  # its bumps are under way
            before = _counters(bench, server)
            started = time.perf_counter()
            waits, errors = [], 0
            while len(waits) < bumps or time.perf_counter() - started < min_s:
                waited, reply = victim.bump(lease)
                waits.append(waited)
                errors += reply["error"] is not None
            elapsed = time.perf_counter() - started
            after = _counters(bench, server)
            rows.append(
                {
                    "contender": f"victim bumps, {count} flooder{'s' if count != 1 else ''}",
                    "flooders": count,
                    "bumps": len(waits),
                    "p50_ms": bench._percentile(waits, 0.50) * 1000,
                    "p99_ms": bench._percentile(waits, 0.99) * 1000,
                    "max_ms": max(waits) * 1000,
                    "victim_errors": errors,
                    "bumps_per_s": (after[0] - before[0]) / elapsed,
                    "rate_limited": int(after[1] - before[1]),
                    "server_cpu_s": after[2] - before[2],
                }
            )
        flood_counts = [flooder.stop() for flooder in flooders]
    finally:
        for flooder in flooders:
            flooder.kill()
        if victim is not None:
            victim.close()
        if server is not None:
            bench._stop(server)
        shutil.rmtree(scratch, ignore_errors=True)
    for row in rows:
        row["flood_counts"] = flood_counts[: row["flooders"]]
    return rows
