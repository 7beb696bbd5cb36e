"""The load processes of ``pidfence bench lease`` (``lease.py`` starts them): closed-loop lease
clients, one request in flight each, ``hello`` first when given a token; each process writes its
latencies and its own run-queue wait to the job's file."""

from __future__ import annotations

import asyncio
import json
import ssl
import struct
import sys
import time
from pathlib import Path
from typing import cast

import msgpack

_LENGTH = struct.Struct(">I")
_LEASE = msgpack.packb({"v": 1, "op": "lease", "id": 1, "partitions": []})
_LEASE_FRAME = _LENGTH.pack(len(_LEASE)) + _LEASE


class _LoadClient(asyncio.Protocol):
    """One closed-loop client: ``hello`` when given a token, then ``count`` leases back to back."""

    def __init__(self, count: int, token: str | None, latencies: list[float]) -> None:
        self.left = count
        self.token = token
        self.latencies = latencies
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.transport: asyncio.Transport | None = None
        self.buffer = b""
        self.started = 0.0
        self.greeting = token is not None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        if self.token is not None:
            hello = msgpack.packb({"v": 1, "op": "hello", "id": 0, "token": self.token})
            self.transport.write(_LENGTH.pack(len(hello)) + hello)
        else:
            self._next()

    def _next(self) -> None:
        assert self.transport is not None
        if self.left == 0:
            self.done.set_result(None)
            self.transport.close()
            return
        self.left -= 1
        self.started = time.perf_counter()
        self.transport.write(_LEASE_FRAME)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while len(self.buffer) >= 4:
            (length,) = _LENGTH.unpack_from(self.buffer)
            if len(self.buffer) < 4 + length:
                return
            reply = msgpack.unpackb(self.buffer[4 : 4 + length])
            self.buffer = self.buffer[4 + length :]
            if reply["error"] is not None:
                self.done.set_exception(RuntimeError(f"request failed: {reply}"))
                return
            if self.greeting:
                self.greeting = False
            else:
                self.latencies.append(time.perf_counter() - self.started)
            self._next()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_exception(ConnectionError(f"connection lost: {exc}"))


async def _clients(
    addresses: list[str], clients: int, per_client: int, token: str | None, ca: str | None
) -> list[float]:
    loop = asyncio.get_running_loop()
    tls = None if ca is None else ssl.create_default_context(cafile=ca)
    latencies: list[float] = []
    protocols = []
    for i in range(clients):
        host, port = addresses[i % len(addresses)].rsplit(":", 1)
        _, protocol = await loop.create_connection(
            lambda: _LoadClient(per_client, token, latencies), host, int(port), ssl=tls
        )
        protocols.append(protocol)
    await asyncio.gather(*(p.done for p in protocols))
    return latencies


def runqueue_s(pid: int | str) -> float:
    """Seconds the threads of a process waited for a CPU while runnable (Linux schedstat)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[1])
        except (OSError, IndexError, ValueError):
            continue  # a thread that ended meanwhile, or no schedstat on this kernel
    return total / 1e9


def client_process_main() -> None:
    """Entry of one load process: a JSON job on argv, latencies (JSON) to the job's file."""
    job = json.loads(sys.argv[1])
    token = None
    if job["token_file"]:
        token = Path(job["token_file"]).read_text().strip()
    try:
        import uvloop

        factory = uvloop.new_event_loop
    except ImportError:
        factory = asyncio.new_event_loop
    started = time.time()
    waited = runqueue_s("self")
    with asyncio.Runner(loop_factory=factory) as runner:
        latencies = runner.run(
            _clients(job["addresses"], job["clients"], job["per_client"], token, job["ca"])
        )
    waited = runqueue_s("self") - waited
    # A file, not stdout: an event loop may leave stdout non-blocking and cut a long write.
    Path(job["out"]).write_text(
        json.dumps(
            {"start": started, "end": time.time(), "latencies": latencies, "runqueue_s": waited}
        )
    )
