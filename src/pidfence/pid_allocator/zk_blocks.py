"""The ZooKeeper coordinator: pid blocks and generations by compare-and-set (kazoo).

Layout under ``root`` (default ``/pidfence``, inside whatever chroot the hosts string names):

* ``pid_block``: msgpack ``{"next": N}``, the first unclaimed pid. A claim is ONE multi
  transaction: set ``pid_block`` at the version read (compare-and-set) and create the block
  record ``blocks/<start>`` holding the claimer's id, a random token, claim time, lifetime, issue
  window and generation salt. An ambiguous claim (connection lost around the commit) is settled
  by re-reading ``blocks/<start>``: our token there means it landed; anything else means it did
  not.
* ``generations/<pid>``: created on the pid's first bump (leases write nothing per pid), then
  moved by versioned set. Data ``{"g": generation, "e": expire_ms, "t": token}``; the token settles
  ambiguous bumps and makes client retries idempotent.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import threading
from typing import Any

import msgpack

from pidfence.pid_allocator.bumps import next_generation
from pidfence.pid_allocator.coordinator import (
    Block,
    BlockRequest,
    decode_generation,
    encode_generation,
)
from pidfence.pid_allocator.errors import LeaseServiceUnavailable, StaleGeneration

log = logging.getLogger(__name__)

_CAS_ATTEMPTS = 64


class ZkCoordinator:
    """Coordinator on a ZooKeeper ensemble.

    Args:
        hosts: kazoo connect string, optionally with a chroot (``"h1:2181,h2:2181/app"``).
        root: znode folder of pidfence's state.
        session_timeout_s: ZooKeeper session timeout.
        op_timeout_s: longest wait for one ZooKeeper answer before reporting UNAVAILABLE.
        client: an already built ``KazooClient`` (tests); started here if not yet.
    """

    def __init__(
        self,
        hosts: str,
        *,
        root: str = "/pidfence",
        session_timeout_s: float = 10.0,
        op_timeout_s: float = 5.0,
        client: Any = None,
    ) -> None:
        from kazoo.client import KazooClient
        from kazoo.retry import KazooRetry

        self.hosts = hosts
        self.root = root.rstrip("/")
        self.op_timeout_s = op_timeout_s
        self._block_path = f"{self.root}/pid_block"
        self._blocks_path = f"{self.root}/blocks"
        self._gens_path = f"{self.root}/generations"
        self._writes = 0
        self._errors = 0
        self._connected = threading.Event()
        self._state = "LOST"
        self._closing = False
        self._starts: list[int] = []
        self._cache: dict[int, Block] = {}
        self._cache_lock = threading.Lock()
        self._zk = client or KazooClient(
            hosts=hosts,
            timeout=session_timeout_s,
            connection_retry=KazooRetry(max_tries=-1, delay=0.05, max_delay=1.0),
        )
        self._zk.add_listener(self._on_state)

    # -- connection -----------------------------------------------------------------------------

    def start(self, timeout_s: float = 15.0) -> ZkCoordinator:
        """Connect and create the layout; raise ``LeaseServiceUnavailable`` if ZooKeeper is down."""
        from kazoo.exceptions import NodeExistsError

        try:
            self._zk.start(timeout=timeout_s)
            for path in (self._blocks_path, self._gens_path):
                self._zk.ensure_path(path)
            with contextlib.suppress(NodeExistsError):
                self._zk.create(self._block_path, msgpack.packb({"next": 1}))
        except Exception as exc:
            self._zk.stop()
            raise LeaseServiceUnavailable(
                f"cannot reach ZooKeeper at {self.hosts} ({exc!r}); start it or fix --zk"
            ) from exc
        self._on_state("CONNECTED")
        return self

    def _on_state(self, state: str) -> None:
        self._state = str(state)
        if self._state == "CONNECTED":
            self._connected.set()
        else:
            self._connected.clear()
            if self._closing:
                return
            log.warning("zookeeper %s", self._state, extra={"zk_state": self._state})

    @property
    def connected(self) -> bool:
        """True only in kazoo's CONNECTED state."""
        return self._connected.is_set()

    @property
    def state(self) -> str:
        """kazoo's last state: CONNECTED, SUSPENDED or LOST."""
        return self._state

    @property
    def writes(self) -> int:
        """Write transactions sent (a claim's multi counts once, as ZooKeeper logs one txn)."""
        return self._writes

    @property
    def errors(self) -> int:
        """ZooKeeper calls that failed with a connection error or timeout."""
        return self._errors

    def close(self) -> None:
        """Stop the kazoo client."""
        self._closing = True
        self._zk.stop()
        self._zk.close()

    def _wait(self, async_result: Any) -> Any:
        return async_result.get(timeout=self.op_timeout_s)

    def _unavailable(self, what: str, exc: BaseException) -> LeaseServiceUnavailable:
        self._errors += 1
        return LeaseServiceUnavailable(
            f"ZooKeeper unreachable during {what} ({type(exc).__name__}); retry shortly"
        )

    def _await_connection(self, what: str) -> None:
        if not self._connected.wait(self.op_timeout_s):
            raise LeaseServiceUnavailable(
                f"ZooKeeper still unreachable ({self._state}) while settling {what}; retry"
            )

    # -- blocks ---------------------------------------------------------------------------------

    def claim_block(self, request: BlockRequest) -> Block:
        """Claim the next block by compare-and-set on ``pid_block``."""
        from kazoo.exceptions import BadVersionError, NoNodeError

        if not self.connected:
            raise LeaseServiceUnavailable(f"ZooKeeper {self._state}; cannot claim a pid block")
        for _ in range(_CAS_ATTEMPTS):
            try:
                data, stat = self._wait(self._zk.get_async(self._block_path))
            except Exception as exc:
                raise self._unavailable("block read", exc) from exc
            start = int(msgpack.unpackb(data)["next"])
            block = Block(
                start,
                start + request.size,
                request.owner,
                request.token,
                request.claimed_ms,
                request.lifetime_ms,
                request.ttl_ms,
                request.salt,
            )
            txn = self._zk.transaction()
            txn.set_data(self._block_path, msgpack.packb({"next": block.end}), version=stat.version)
            txn.create(self._record_path(start), block.encode())
            self._writes += 1
            try:
                results = self._wait(txn.commit_async())
            except Exception as exc:  # noqa: BLE001 - ambiguous: settle by re-reading
                if self._claim_landed(block, exc):
                    self._remember(block)
                    return block
                continue
            if any(isinstance(r, BadVersionError) for r in results):
                continue  # another server claimed this block first
            failures = [r for r in results if isinstance(r, Exception)]
            if failures:
                if any(isinstance(r, NoNodeError) for r in failures):
                    raise LeaseServiceUnavailable(
                        f"{self._block_path} vanished; restart the server"
                    )
                continue
            self._remember(block)
            return block
        raise LeaseServiceUnavailable(f"pid block contention: {_CAS_ATTEMPTS} failed claims; retry")

    def _claim_landed(self, block: Block, cause: BaseException) -> bool:
        from kazoo.exceptions import NoNodeError

        self._errors += 1
        log.warning("ambiguous block claim at %d (%r); re-reading", block.start, cause)
        self._await_connection("a block claim")
        try:
            data, _ = self._wait(self._zk.get_async(self._record_path(block.start)))
        except NoNodeError:
            return False
        except Exception as exc:
            raise self._unavailable("claim re-read", exc) from exc
        return Block.decode(data).token == block.token

    def _record_path(self, start: int) -> str:
        return f"{self._blocks_path}/{start:019d}"

    def _remember(self, block: Block) -> None:
        with self._cache_lock:
            if block.start not in self._cache:
                bisect.insort(self._starts, block.start)
            self._cache[block.start] = block

    def find_block(self, pid: int) -> Block | None:
        """The block record holding ``pid`` (cached; block records never change)."""
        from kazoo.exceptions import NoNodeError

        found = self._cached_start(pid)
        if found is None:
            try:
                children = self._wait(self._zk.get_children_async(self._blocks_path))
            except Exception as exc:
                raise self._unavailable("block lookup", exc) from exc
            starts = sorted(int(c) for c in children if c.isdigit())
            i = bisect.bisect_right(starts, pid) - 1
            if i < 0:
                return None
            found = starts[i]
        with self._cache_lock:
            block = self._cache.get(found)
        if block is None:
            try:
                data, _ = self._wait(self._zk.get_async(self._record_path(found)))
            except NoNodeError:
                return None
            except Exception as exc:
                raise self._unavailable("block lookup", exc) from exc
            block = Block.decode(data)
            self._remember(block)
        return block if pid in block else None

    def _cached_start(self, pid: int) -> int | None:
        with self._cache_lock:
            i = bisect.bisect_right(self._starts, pid) - 1
            if i < 0:
                return None
            block = self._cache[self._starts[i]]
            return block.start if pid in block else None

    # -- generations ----------------------------------------------------------------------------

    def bump_generation(
        self, pid: int, generation: int, initial: int, expire_ms: int, token: str, now_ms: int
    ) -> tuple[int, int]:
        """Compare-and-set ``generations/<pid>`` from ``generation`` to ``generation + 1``."""
        from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

        if not self.connected:
            raise LeaseServiceUnavailable(f"ZooKeeper {self._state}; bumps need it, retry")
        path = f"{self._gens_path}/{pid}"
        for _ in range(_CAS_ATTEMPTS):
            try:
                data, stat = self._wait(self._zk.get_async(path))
                current, expire, stored_token = decode_generation(data)
                version: int | None = stat.version
            except NoNodeError:
                current, expire, stored_token, version = initial, expire_ms, "", None
            except Exception as exc:
                raise self._unavailable("generation read", exc) from exc
            try:
                new = next_generation(pid, generation, current, expire, now_ms)
            except StaleGeneration:
                if stored_token == token and current == generation + 1:
                    return current, expire  # our earlier (ambiguous or retried) bump landed
                raise
            payload = encode_generation(new, expire, token)
            self._writes += 1
            try:
                if version is None:
                    self._wait(self._zk.create_async(path, payload))
                else:
                    self._wait(self._zk.set_async(path, payload, version=version))
            except (BadVersionError, NodeExistsError):
                continue  # lost the race; the re-read decides (normally STALE_GENERATION)
            except Exception as exc:  # noqa: BLE001 - ambiguous: re-read, the token tells
                self._errors += 1
                log.warning("ambiguous bump of pid %d (%r); re-reading", pid, exc)
                self._await_connection("a generation bump")
                continue
            return new, expire
        raise LeaseServiceUnavailable(f"generation contention on pid {pid}; retry")
