"""``pidfence bench lease``: lease throughput, latency and ZooKeeper writes.

Starts its own one-node ZooKeeper, then for each contender starts ``pidfence lease-server``
processes and drives them with 8 concurrent closed-loop clients (asyncio, one request in flight
per client) spread over two load processes. Contenders, side by side in one run:

* 1 server, blocks of 100 pids (the design);
* 2 servers on the same ZooKeeper, blocks of 100 (clients split between them);
* baseline: 1 server with blocks of 1 pid, i.e. one ZooKeeper compare-and-set per lease.

ZooKeeper writes come from each server's ``pidfence_zookeeper_writes_total`` metric (a claim is one
multi transaction: the versioned set of ``pid_block`` plus the block record).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import msgpack
from rich.progress import Progress

from pidfence.benchkit import BenchReport
from pidfence.services.lease_server import spawn_lease_server
from pidfence.services.ports import free_port
from pidfence.services.zookeeper import ZooKeeperEnsemble

CLIENTS = 8
LOAD_PROCESSES = 2


async def _client(address: str, count: int, latencies: list[float]) -> None:
    host, port = address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        for i in range(count):
            body = msgpack.packb({"v": 1, "op": "lease", "id": i, "partitions": []})
            started = time.perf_counter()
            writer.write(struct.pack(">I", len(body)) + body)
            (length,) = struct.unpack(">I", await reader.readexactly(4))
            reply = msgpack.unpackb(await reader.readexactly(length))
            latencies.append(time.perf_counter() - started)
            if reply["error"] is not None:
                raise RuntimeError(f"lease failed: {reply}")
    finally:
        writer.close()
        await writer.wait_closed()


async def _clients(addresses: list[str], clients: int, per_client: int) -> list[float]:
    latencies: list[float] = []
    await asyncio.gather(
        *(_client(addresses[i % len(addresses)], per_client, latencies) for i in range(clients))
    )
    return latencies


def client_process_main() -> None:
    """Entry of one load process: ``ADDRS CLIENTS PER_CLIENT`` in, latencies (JSON) out."""
    addresses, clients, per_client = sys.argv[1].split(","), int(sys.argv[2]), int(sys.argv[3])
    started = time.time()
    latencies = asyncio.run(_clients(addresses, clients, per_client))
    sys.stdout.write(json.dumps({"start": started, "end": time.time(), "latencies": latencies}))


def _drive(addresses: list[str], leases: int) -> tuple[float, list[float]]:
    """8 clients in LOAD_PROCESSES processes, so the load generator is not the bottleneck."""
    per_client = leases // CLIENTS
    per_process = CLIENTS // LOAD_PROCESSES
    code = f"import runpy; runpy.run_path({__file__!r})['client_process_main']()"
    procs = []
    for i in range(LOAD_PROCESSES):
        rotated = addresses[i % len(addresses) :] + addresses[: i % len(addresses)]
        argv = [sys.executable, "-c", code, ",".join(rotated), str(per_process), str(per_client)]
        procs.append(subprocess.Popen(argv, stdout=subprocess.PIPE))
    results = [json.loads(p.communicate()[0] or b"null") for p in procs]
    if any(p.returncode for p in procs):
        raise RuntimeError("a load process failed")
    elapsed = max(r["end"] for r in results) - min(r["start"] for r in results)
    return elapsed, [x for r in results for x in r["latencies"]]


def _zk_writes(metrics_port: int) -> float:
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    for line in text.splitlines():
        if line.startswith("pidfence_zookeeper_writes_total "):
            return float(line.split()[1])
    return 0.0


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _chroot(hosts: str) -> str:
    from kazoo.client import KazooClient

    path = f"/bench-{uuid.uuid4().hex[:8]}"
    client = KazooClient(hosts=hosts)
    client.start(timeout=30)
    client.ensure_path(path)
    client.stop()
    client.close()
    return hosts + path


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _contender(
    name: str, zk_hosts: str, servers: int, block_size: int, leases: int
) -> dict[str, Any]:
    chroot = _chroot(zk_hosts)
    ports = [free_port() for _ in range(servers)]
    logs = Path(tempfile.mkdtemp(prefix="pidfence-bench-lease-"))
    handles = [
        spawn_lease_server(chroot, logs, f"lease-{i}", block_size=block_size, metrics_port=p)
        for i, p in enumerate(ports)
    ]
    try:
        addresses = [h.address for h in handles]
        _drive(addresses, CLIENTS * 20)  # warm-up: connections, first claims
        before = sum(_zk_writes(p) for p in ports)
        cpu_before = sum(_cpu_s(h.pid) for h in handles)
        elapsed, latencies = _drive(addresses, leases)
        cpu = sum(_cpu_s(h.pid) for h in handles) - cpu_before
        writes = sum(_zk_writes(p) for p in ports) - before
    finally:
        for handle in handles:
            handle.stop()
    done = len(latencies)
    return {
        "contender": name,
        "servers": servers,
        "clients": CLIENTS,
        "block_size": block_size,
        "leases": done,
        "leases_per_s": done / elapsed,
        "leases_per_s_per_server": done / elapsed / servers,
        "p50_ms": _percentile(latencies, 0.50) * 1000,
        "p99_ms": _percentile(latencies, 0.99) * 1000,
        "zk_writes_per_1000": writes * 1000 / done,
        "server_cpu_us_per_lease": cpu * 1e6 / done,
    }


def run(quick: bool, progress: Progress) -> BenchReport:
    """Measure the contenders; ``quick`` uses fewer leases."""
    leases = 8_000 if quick else 80_000
    baseline_leases = 800 if quick else 4_000
    plan = [
        ("blocks of 100, 1 server", 1, 100, leases),
        ("blocks of 100, 2 servers", 2, 100, leases),
        ("baseline: CAS per lease, 1 server", 1, 1, baseline_leases),
    ]
    logging.getLogger("kazoo").setLevel(logging.CRITICAL)  # readiness probes log refusals
    task = progress.add_task("lease bench", total=len(plan))
    rows = []
    with ZooKeeperEnsemble(1) as zk:
        for name, servers, block_size, count in plan:
            progress.update(task, description=name)
            rows.append(_contender(name, zk.hosts, servers, block_size, count))
            progress.advance(task)
    return BenchReport(
        title="PID lease server: 8 concurrent clients",
        columns=[
            "contender",
            "servers",
            "leases",
            "leases_per_s",
            "leases_per_s_per_server",
            "p50_ms",
            "p99_ms",
            "zk_writes_per_1000",
            "server_cpu_us_per_lease",
        ],
        rows=rows,
        notes=[
            "Targets: >= 10,000 leases/s per server, p99 < 5 ms, <= 10 ZooKeeper writes per "
            "1000 leases (block size 100).",
            "Clients: 2 load processes x 4 asyncio clients, one request in flight each; servers "
            "are separate `pidfence lease-server` processes; all share the machine's 2 cores "
            "with ZooKeeper.",
            "server_cpu_us_per_lease: CPU the server process spent per lease; 1e6 / it is what "
            "one core could serve if clients were elsewhere.",
            "A ZooKeeper write here is one transaction (a claim's multi: versioned set of "
            "pid_block + create of the block record).",
        ],
        params={"clients": CLIENTS, "leases": leases, "baseline_leases": baseline_leases},
    )
