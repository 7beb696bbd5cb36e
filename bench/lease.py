"""``pidfence bench lease``: lease throughput, latency, server CPU and ZooKeeper writes.

Starts its own one-node ZooKeeper, then for each contender starts lease server processes pinned
to core 0 (``taskset -c 0``) and drives them from load processes pinned to core 1, so the server
has a core of its own (as far as this machine's other work allows). 8 closed-loop clients (one
request in flight each) in 2 load processes. Contenders, side by side in one run:

* 1 server, plain TCP, on asyncio's own loop and on uvloop (when installed);
* 1 server with auth tokens (``hello``) and TLS, on both loops;
* 2 servers on the same ZooKeeper, both on core 0 (clients split between them);
* baseline: 1 server with blocks of 1 pid, i.e. one ZooKeeper compare-and-set per lease;
* a victim's bumps alone, beside one flooder and beside two, and the server's throughput under the
  flood (``_lease_flood.py``).

The lease rows measure what one server serves, so the per-client lease rate is off there (the 8
load clients share one client name: one address, or one token).

Server CPU per lease is read from ``/proc/PID/stat`` of the server processes (user + system), which
other load on the machine does not inflate the way it does wall-clock throughput. ZooKeeper writes
come from each server's ``pidfence_zookeeper_writes_total`` metric.

What the latency tail is made of, per row: leases that waited for a block claim
(``pidfence_leases_waited_total``), the server's garbage-collector pauses
(``pidfence_gc_pause_seconds``), and how long the server and the load processes were runnable but
not running because something else had their core (``/proc/.../schedstat``, the kernel's run-queue
wait): on a shared machine the last is what is left of the tail.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.progress import Progress

from pidfence.benchkit import BenchReport, load_bench
from pidfence.services.ports import free_port
from pidfence.services.zookeeper import ZooKeeperEnsemble

CLIENTS = 8
#: Leases per row: full run, ``--quick``, and the CAS baseline of each (a smoke test shrinks them).
LEASES = 80_000
QUICK_LEASES = 8_000
BASELINE_LEASES = 4_000
QUICK_BASELINE_LEASES = 800
WARMUP_LEASES = CLIENTS * 50
#: The victim's bumps and seconds per flood row, at least: full run, ``--quick``.
FLOOD_BUMPS, FLOOD_S = 300, 10.0
QUICK_FLOOD_BUMPS, QUICK_FLOOD_S = 100, 3.0
LOAD_PROCESSES = 2
SERVER_CORE = 0
CLIENT_CORE = 1
#: Scheduling priority of the server and load processes: other work on a shared machine then
#: takes less of "their" cores (the closest a shared machine gets to a core of its own).
NICE = -10
#: The load processes' code (closed-loop lease clients).
_LOAD = Path(__file__).with_name("_lease_load.py")
_load = load_bench("_lease_load", _LOAD.parent)


# -- load processes ----------------------------------------------------------------------------


def _pinned(core: int) -> list[str]:
    """``nice -n NICE taskset -c CORE`` as far as the machine allows (each part is optional)."""
    prefix: list[str] = []
    if shutil.which("nice") is not None and _may_raise_priority():
        prefix += ["nice", "-n", str(NICE)]
    if shutil.which("taskset") is not None and (os.cpu_count() or 1) > max(
        SERVER_CORE, CLIENT_CORE
    ):
        prefix += ["taskset", "-c", str(core)]
    return prefix


def _may_raise_priority() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


@dataclass(frozen=True)
class Security:
    """What a secured contender's clients need."""

    token_file: str
    ca: str


def _drive(
    addresses: list[str], leases: int, security: Security | None
) -> tuple[float, list[float], float]:
    """CLIENTS clients in LOAD_PROCESSES processes on the client core: elapsed seconds, the
    latencies, and the load processes' run-queue wait (seconds)."""
    per_client = leases // CLIENTS
    per_process = CLIENTS // LOAD_PROCESSES
    code = f"import runpy; runpy.run_path({str(_LOAD)!r})['client_process_main']()"
    procs: list[subprocess.Popen[bytes]] = []
    outs = []
    scratch = Path(tempfile.mkdtemp(prefix="pidfence-bench-load-"))
    try:
        for i in range(LOAD_PROCESSES):
            rotated = addresses[i % len(addresses) :] + addresses[: i % len(addresses)]
            job = {
                "addresses": rotated,
                "clients": per_process,
                "per_client": per_client,
                "token_file": security.token_file if security else None,
                "ca": security.ca if security else None,
                "out": str(scratch / f"load-{i}.json"),
            }
            outs.append(Path(job["out"]))
            argv = [*_pinned(CLIENT_CORE), sys.executable, "-c", code, json.dumps(job)]
            procs.append(subprocess.Popen(argv))
        codes = [p.wait() for p in procs]  # every one, not up to the first failure
        if any(codes):
            raise RuntimeError(f"load processes exited with {codes} (0: fine)")
        results = [json.loads(out.read_text()) for out in outs]
    finally:
        _end(procs)
        shutil.rmtree(scratch, ignore_errors=True)
    elapsed = max(r["end"] for r in results) - min(r["start"] for r in results)
    waited = sum(r["runqueue_s"] for r in results)
    return elapsed, [x for r in results for x in r["latencies"]], waited


def _end(procs: list[subprocess.Popen[bytes]]) -> None:
    """Kill and reap every process of ``procs`` still running (a run that failed or was
    stopped leaves none behind)."""
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# -- servers -----------------------------------------------------------------------------------

_SERVER_CODE = """
import json, sys
from pathlib import Path
from pidfence.pid_allocator.daemon import serve_forever
from pidfence.pid_allocator.settings import LeaseServerSettings
zk, raw = sys.argv[1], json.loads(sys.argv[2])
paths = {"auth_tokens_file", "tls_cert", "tls_key", "ready_file"}
settings = LeaseServerSettings(
    zk_hosts=zk, **{k: Path(v) if k in paths else v for k, v in raw.items()}
)
serve_forever(settings)
"""


@dataclass
class _Server:
    proc: subprocess.Popen[bytes]
    address: str
    metrics_port: int


def _start_server(zk: str, logs: Path, name: str, settings: dict[str, Any]) -> _Server:
    """``serve_forever`` (what ``pidfence lease-server`` runs) pinned to the server core."""
    port, metrics_port = free_port(), free_port()
    ready = logs / f"{name}.ready"
    full = {
        **settings,
        "host": "127.0.0.1",
        "port": port,
        "metrics_port": metrics_port,
        "ready_file": str(ready),
    }
    argv = [*_pinned(SERVER_CORE), sys.executable, "-c", _SERVER_CODE, zk, json.dumps(full)]
    with (logs / f"{name}.log").open("ab") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            raise RuntimeError(
                f"lease server {name} did not start:\n{(logs / f'{name}.log').read_text()}"
            )
        time.sleep(0.05)
    return _Server(proc, ready.read_text().strip(), metrics_port)


def _stop(server: _Server) -> None:
    if server.proc.poll() is None:
        server.proc.send_signal(signal.SIGTERM)
        try:
            server.proc.wait(15)
        except subprocess.TimeoutExpired:
            server.proc.kill()
            server.proc.wait()


#: Figures read from a server's /metrics: bench name -> Prometheus sample name.
_SCRAPED = {
    "zk_writes": "pidfence_zookeeper_writes_total",
    "leases_waited": "pidfence_leases_waited_total",
    "gc_s": "pidfence_gc_pause_seconds_sum",
    "gc_pauses": "pidfence_gc_pause_seconds_count",
    "gc_pauses_under_2ms": 'pidfence_gc_pause_seconds_bucket{le="0.002"}',
}


def _scrape(metrics_port: int) -> dict[str, float]:
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    samples = dict(line.rsplit(" ", 1) for line in text.splitlines() if not line.startswith("#"))
    return {key: float(samples.get(name, 0.0)) for key, name in _SCRAPED.items()}


def _scrape_all(servers: list[_Server]) -> dict[str, float]:
    """Summed over the servers: the metrics above, CPU and run-queue wait (seconds)."""
    total = dict.fromkeys([*_SCRAPED, "cpu_s", "runqueue_s"], 0.0)
    for server in servers:
        for key, value in _scrape(server.metrics_port).items():
            total[key] += value
        total["cpu_s"] += _cpu_s(server.proc.pid)
        total["runqueue_s"] += _load.runqueue_s(server.proc.pid)
    return total


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process, all its threads (Linux /proc)."""
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


@dataclass(frozen=True)
class Contender:
    """One row of the table."""

    name: str
    servers: int
    block_size: int
    loop: str
    secure: bool
    leases: int


def _contender(c: Contender, zk_hosts: str, pki: Any) -> dict[str, Any]:
    chroot = _chroot(zk_hosts)
    logs = Path(tempfile.mkdtemp(prefix="pidfence-bench-lease-"))
    settings: dict[str, Any] = {"block_size": c.block_size, "event_loop": c.loop, "lease_rate": 0}
    if c.block_size == 1:
        settings["max_claim_blocks"] = 1  # the baseline: one compare-and-set per lease
    security = None
    if c.secure:
        settings |= {
            "auth_tokens_file": str(pki.tokens_file),
            "tls_cert": str(pki.server_cert),
            "tls_key": str(pki.server_key),
        }
        security = Security(str(pki.token_files["producer"]), str(pki.ca))
    servers: list[_Server] = []
    try:
        for i in range(c.servers):
            servers.append(_start_server(chroot, logs, f"lease-{i}", settings))
        addresses = [s.address for s in servers]
        _drive(addresses, WARMUP_LEASES, security)  # warm-up: connections, first claims
        before = _scrape_all(servers)
        elapsed, latencies, client_waited = _drive(addresses, c.leases, security)
        after = _scrape_all(servers)
        run = {key: after[key] - before[key] for key in after}
    finally:
        for server in servers:
            _stop(server)
        shutil.rmtree(logs, ignore_errors=True)  # a start failure's log went into its error
    done = len(latencies)
    return {
        "contender": c.name,
        "loop": c.loop,
        "security": "auth+TLS" if c.secure else "plain",
        "servers": c.servers,
        "clients": CLIENTS,
        "block_size": c.block_size,
        "leases": done,
        "leases_per_s": done / elapsed,
        "leases_per_s_per_server": done / elapsed / c.servers,
        "p50_ms": _percentile(latencies, 0.50) * 1000,
        "p99_ms": _percentile(latencies, 0.99) * 1000,
        "zk_writes_per_1000": run["zk_writes"] * 1000 / done,
        "server_cpu_us_per_lease": run["cpu_s"] * 1e6 / done,
        "leases_waited": int(run["leases_waited"]),
        "server_gc_ms": run["gc_s"] * 1000,
        "server_gc_pauses_over_2ms": int(run["gc_pauses"] - run["gc_pauses_under_2ms"]),
        "server_runqueue_ms": run["runqueue_s"] * 1000,
        "client_runqueue_ms": client_waited * 1000,
    }


def _plan(quick: bool) -> list[Contender]:
    from pidfence.pid_allocator.loops import uvloop_installed

    leases = QUICK_LEASES if quick else LEASES
    baseline = QUICK_BASELINE_LEASES if quick else BASELINE_LEASES
    loops = ["asyncio", "uvloop"] if uvloop_installed() else ["asyncio"]
    best = loops[-1]
    plan = [Contender(f"1 server, plain, {loop}", 1, 100, loop, False, leases) for loop in loops]
    plan += [Contender(f"1 server, auth+TLS, {loop}", 1, 100, loop, True, leases) for loop in loops]
    plan.append(Contender(f"2 servers, plain, {best}", 2, 100, best, False, leases))
    plan.append(Contender(f"baseline: CAS per lease, {best}", 1, 1, best, False, baseline))
    return plan


def _ratios(rows: list[dict[str, Any]]) -> dict[str, float]:
    """auth+TLS over plain, per loop: throughput and CPU per lease."""
    out: dict[str, float] = {}
    for loop in ("asyncio", "uvloop"):
        plain = [
            r
            for r in rows
            if r["loop"] == loop
            and r["servers"] == 1
            and r["block_size"] == 100
            and r["security"] == "plain"
        ]
        secure = [r for r in rows if r["loop"] == loop and r["security"] == "auth+TLS"]
        if plain and secure:
            out[f"{loop}_secure_throughput_ratio"] = (
                secure[0]["leases_per_s"] / plain[0]["leases_per_s"]
            )
            # CPU is read from /proc in clock ticks: a quick run's server can spend less than one.
            if secure[0]["server_cpu_us_per_lease"] > 0:
                out[f"{loop}_secure_capacity_ratio"] = (
                    plain[0]["server_cpu_us_per_lease"] / secure[0]["server_cpu_us_per_lease"]
                )
    return out


def run(quick: bool, progress: Progress) -> BenchReport:
    """Measure the contenders; ``quick`` uses fewer leases."""
    from pidfence.pid_allocator.loops import uvloop_installed
    from pidfence.services.lease_server import make_lease_pki

    plan = _plan(quick)
    logging.getLogger("kazoo").setLevel(logging.CRITICAL)  # readiness probes log refusals
    task = progress.add_task("lease bench", total=len(plan) + 1)
    rows = []
    clients = ("producer", "victim", "flood1", "flood2")
    flood = load_bench("_lease_flood", Path(__file__).parent)
    load_before = os.getloadavg()
    # The CA's and the server's private keys and the tokens: removed however the run ends.
    with (
        tempfile.TemporaryDirectory(prefix="pidfence-bench-pki-") as keys,
        ZooKeeperEnsemble(1) as zk,
    ):
        pki = make_lease_pki(Path(keys), clients=clients)
        for contender in plan:
            progress.update(task, description=contender.name)
            rows.append(_contender(contender, zk.hosts, pki))
            progress.advance(task)
        progress.update(task, description="a victim's bumps beside flooders")
        best = "uvloop" if uvloop_installed() else "asyncio"
        bumps, seconds = (QUICK_FLOOD_BUMPS, QUICK_FLOOD_S) if quick else (FLOOD_BUMPS, FLOOD_S)
        rows += flood.flood_rows(sys.modules[__name__], zk.hosts, pki, bumps, seconds, best)
        progress.advance(task)
    load_after = os.getloadavg()
    ratios = _ratios(rows[: len(plan)])
    pinned = "taskset" in _pinned(SERVER_CORE)
    niced = "nice" in _pinned(SERVER_CORE)
    return BenchReport(
        title="PID lease server on its own core: 8 closed-loop clients on the other core",
        columns=[
            "contender",
            "leases",
            "leases_per_s",
            "leases_per_s_per_server",
            "p50_ms",
            "p99_ms",
            "zk_writes_per_1000",
            "server_cpu_us_per_lease",
            "leases_waited",
            "server_gc_ms",
            "server_runqueue_ms",
            "client_runqueue_ms",
            "bumps_per_s",
            "rate_limited",
            "victim_errors",
        ],
        rows=rows,
        notes=[
            "Targets: >= 10,000 leases/s per server, p99 < 5 ms, auth+TLS >= 0.8x of plain, "
            "<= 10 ZooKeeper writes per 1000 leases (block size 100).",
            (
                f"Servers pinned to core {SERVER_CORE}, the 2 load processes (4 protocol clients "
                f"each, uvloop when installed) to core {CLIENT_CORE} with taskset"
                + (f", all at nice {NICE}." if niced else ".")
                if pinned
                else "taskset or a second core missing: nothing pinned."
            ),
            "server_cpu_us_per_lease: user+system CPU of the server processes (/proc) per lease; "
            "1e6 / it is what one free core serves. Throughput depends on what else the machine "
            "runs; this figure much less.",
            f"Load average (1 min) before the run {load_before[0]:.2f}, after {load_after[0]:.2f} "
            f"on {os.cpu_count()} cores.",
            "auth+TLS / plain: "
            + ", ".join(f"{k} {v:.2f}" for k, v in ratios.items())
            + " (capacity ratio = plain CPU per lease / secured CPU per lease).",
            "A ZooKeeper write here is one transaction (a claim's multi: versioned set of "
            "pid_block + create of the block record); a busy server claims several blocks' "
            "worth of pids in one.",
            "Tail attribution per row, over the measured leases: leases_waited = leases that "
            "found no held pid and waited for a block claim; server_gc_ms = the server's "
            "garbage-collector pauses (all requests in flight wait); server_runqueue_ms / "
            "client_runqueue_ms = time the server / load processes were runnable but another "
            "process had their core (kernel schedstat).",
            "victim rows: one auth server; p50/p99 are the victim's bump latency (one bump at a "
            "time), bumps_per_s is every client's granted bumps per second over the row, "
            "rate_limited the RATE_LIMITED answers (flooders only). A flooder: 8 connections x "
            "32 pids, each pid bumped again as soon as answered, refusals re-sent at once.",
        ],
        params={
            "clients": CLIENTS,
            "load_processes": LOAD_PROCESSES,
            "leases": plan[0].leases,
            "baseline_leases": plan[-1].leases,
            "uvloop_installed": uvloop_installed(),
            "pinned": pinned,
            "nice": NICE if niced else 0,
            "loadavg_before": load_before,
            "loadavg_after": load_after,
            **ratios,
        },
    ).check(_victim_refused(rows), "the victim was never refused")


def _victim_refused(rows: list[dict[str, Any]]) -> list[str]:
    """The flood rows whose victim got an error: a client one request at a time must never be
    refused, however hard others flood (issue 36)."""
    return [
        f"{row['contender']}: {row['victim_errors']} of the victim's {row['bumps']} bumps refused"
        for row in rows
        if row.get("victim_errors")
    ]
