"""The flood rows of ``pidfence bench lease`` (issue 36, "Nobody slows anybody").

One ``pidfence lease-server`` with auth tokens on the server core. A victim (this process) bumps
its own pid one request at a time, as a resume does: alone, then beside one flooder, then beside
two. A flooder is another token holder that opens 8 connections, leases 32 pids on each and keeps
every one of them bumping, pipelined, as fast as the server answers, a refusal sent again at once
(the hostile client of ``tests/fixtures/hostile.py``, mode ``flood`` with ``pids``, run as a
process of its own on the load core). Per row: the victim's bump latency and errors, and the
server's total throughput (bumps granted to everyone per second, from ``pidfence_bumps_total``)
and RATE_LIMITED answers over the row. A row lasts ``bumps`` victim bumps and at least
``min_s`` seconds (the victim bumps on meanwhile), so its throughput is the flood's sustained one
rather than a flooder's first burst.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import msgpack

CONNECTIONS = 8
PIDS = 32
_HOSTILE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "hostile.py"
_LENGTH_BYTES = 4


class _Victim:
    """A blocking lease-protocol client: one request, then its reply."""

    def __init__(self, address: str, token: str) -> None:
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=60)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.next_id = 0
        assert self.call("hello", token=token)["error"] is None

    def call(self, op: str, **fields: Any) -> dict[str, Any]:
        self.next_id += 1
        body = msgpack.packb({"v": 1, "op": op, "id": self.next_id, **fields})
        self.sock.sendall(len(body).to_bytes(_LENGTH_BYTES, "big") + body)
        length = int.from_bytes(self._exactly(_LENGTH_BYTES), "big")
        reply: dict[str, Any] = msgpack.unpackb(self._exactly(length), raw=False)
        return reply

    def _exactly(self, n: int) -> bytes:
        data = bytearray()
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                raise ConnectionError("the lease server closed the victim's connection")
            data += chunk
        return bytes(data)


class _Flooder:
    """``hostile_main`` in a process of its own, pinned to the load core."""

    def __init__(self, bench: Any, address: str, token: str, scratch: Path, name: str) -> None:
        self.ready = scratch / f"{name}.ready"
        self.stop_file = scratch / f"{name}.stop"
        self.out = scratch / f"{name}.json"
        job = {
            "mode": "flood",
            "address": address,
            "token": token,
            "connections": CONNECTIONS,
            "pids": PIDS,
            "ready": str(self.ready),
            "stop": str(self.stop_file),
            "out": str(self.out),
        }
        code = f"import runpy, sys; runpy.run_path({str(_HOSTILE)!r})['hostile_main']()"
        argv = [*bench._pinned(bench.CLIENT_CORE), sys.executable, "-c", code, json.dumps(job)]
        self.proc = subprocess.Popen(argv)
        deadline = time.monotonic() + 120
        while not self.ready.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"flooder {name} did not get going")
            time.sleep(0.05)

    def stop(self) -> dict[str, Any]:
        self.stop_file.touch()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        counts: dict[str, Any] = json.loads(self.out.read_text())
        return counts


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
    server = bench._start_server(bench._chroot(zk_hosts), scratch, "flooded", settings)
    tokens = {name: Path(pki.token_files[name]).read_text().strip() for name in pki.token_files}
    flooders: list[_Flooder] = []
    rows = []
    try:
        victim = _Victim(server.address, tokens["victim"])
        lease = victim.call("lease")
        for count in (0, 1, 2):
            if count:
                name = f"flood{count}"
                flooders.append(_Flooder(bench, server.address, tokens[name], scratch, name))
                time.sleep(1)  # its bumps are under way
            before = _counters(bench, server)
            started = time.perf_counter()
            waits, errors = [], 0
            while len(waits) < bumps or time.perf_counter() - started < min_s:
                sent = time.perf_counter()
                reply = victim.call(
                    "bump", pid=lease["pid"], generation=lease["generation"], secret=lease["secret"]
                )
                waits.append(time.perf_counter() - sent)
                if reply["error"] is None:
                    lease["generation"] = reply["generation"]
                else:
                    errors += 1
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
            if flooder.proc.poll() is None:
                flooder.proc.kill()
                flooder.proc.wait()
        bench._stop(server)
    for row in rows:
        row["flood_counts"] = flood_counts[: row["flooders"]]
    return rows
