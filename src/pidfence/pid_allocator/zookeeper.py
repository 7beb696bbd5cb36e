"""The ZooKeeper coordinator: pid blocks and generations by compare-and-set (kazoo).

Layout under ``root`` (default ``/pidfence``, inside whatever chroot the hosts string names):

* ``pid_block``: msgpack ``{"next": N}``, the first unclaimed pid. A claim is ONE multi
  transaction: set ``pid_block`` at the version read (compare-and-set) and create the block
  record ``blocks/<start>`` holding the claimer's id, a random token, claim time, lifetime, issue
  window and generation salt. An ambiguous claim (connection lost around the commit) is settled
  by re-reading ``blocks/<start>``: our token there means it landed; anything else means it did
  not.
* ``generations/<pid>``: the pid's lineage record (``LineageRecord``), created on its first bump
  or by the roll that made it, then moved by versioned set. A roll is ONE multi transaction:
  versioned set (or create) of the retired pid's record plus the creation of its successor's.
  Every create is in a multi with a check that the pid's block record exists, so nothing about
  a pid is written once garbage collection deleted its block (and only then its record). The
  token in each record settles ambiguous writes and makes client retries idempotent.

Lookups read one znode by name (``blocks/<start>`` with the start carried in the pid's secret,
``generations/<pid>``) and never list a directory; only garbage collection lists. A read whose
answer is given without a write (a refusal, ``describe``) follows a ZooKeeper ``sync``: the
server a session reads from may lag a write another lease server made through the leader. With
``auth=(user, password)`` every znode is created with a digest ACL for that identity alone, so
only lease servers can read block salts or change any record.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

import msgpack

from pidfence.pid_allocator.coordinator import (
    Ambiguous,
    Block,
    BlockRequest,
    Conflict,
    LineageRecord,
    RollWrite,
)
from pidfence.pid_allocator.errors import LeaseServiceUnavailable
from pidfence.pid_allocator.settings import ZK_OP_TIMEOUT_S, ZK_ROOT, ZK_SESSION_TIMEOUT_S
from pidfence.reachability import REFUSED_GRACE_S, refused_everywhere, zookeeper_servers

log = logging.getLogger(__name__)

_CAS_ATTEMPTS = 64
#: Garbage collection's reads in flight at once.
_GC_READS = 256


class ZkCoordinator:
    """Coordinator on a ZooKeeper ensemble.

    Args:
        hosts: kazoo connect string, optionally with a chroot (``"h1:2181,h2:2181/app"``).
        root: znode folder of pidfence's state.
        session_timeout_s: ZooKeeper session timeout.
        op_timeout_s: longest wait for one ZooKeeper answer before reporting UNAVAILABLE.
        client: an already built ``KazooClient`` (tests); started here if not yet.
        auth: ``(user, password)`` for ZooKeeper digest auth; znodes get an ACL for it alone.
    """

    def __init__(
        self,
        hosts: str,
        *,
        root: str = ZK_ROOT,
        session_timeout_s: float = ZK_SESSION_TIMEOUT_S,
        op_timeout_s: float = ZK_OP_TIMEOUT_S,
        client: Any = None,
        auth: tuple[str, str] | None = None,
    ) -> None:
        from kazoo.client import KazooClient
        from kazoo.retry import KazooRetry
        from kazoo.security import make_digest_acl

        self.hosts = hosts
        self.root = root.rstrip("/")
        self.op_timeout_s = op_timeout_s
        self._block_path = f"{self.root}/pid_block"
        self._blocks_path = f"{self.root}/blocks"
        self._gens_path = f"{self.root}/generations"
        #: Write transactions sent (a claim's multi counts once, as ZooKeeper logs one txn).
        self.writes = 0
        #: ZooKeeper calls that failed with a connection error or timeout.
        self.errors = 0
        self._connected = threading.Event()
        self._state = "LOST"
        self._closing = False
        self._cache: dict[int, Block] = {}
        self._cache_lock = threading.Lock()
        secured: dict[str, Any] = {}
        if auth is not None:
            user, password = auth
            secured = {
                "auth_data": [("digest", f"{user}:{password}")],
                "default_acl": [make_digest_acl(user, password, all=True)],
            }
        self._owns_client = client is None
        self._zk = client or KazooClient(
            hosts=hosts,
            timeout=session_timeout_s,
            connection_retry=KazooRetry(max_tries=-1, delay=0.05, max_delay=1.0),
            **secured,
        )
        self._zk.add_listener(self._on_state)

    # -- connection -----------------------------------------------------------------------------

    def start(self, timeout_s: float = 15.0) -> ZkCoordinator:
        """Connect and create the layout; raise ``LeaseServiceUnavailable`` if ZooKeeper is down."""
        from kazoo.exceptions import AuthFailedError, NoAuthError, NodeExistsError

        try:
            if self._owns_client and refused_everywhere(zookeeper_servers(self.hosts)):
                # Nothing listens at any address: say so after the grace rather than at kazoo's
                # session timeout.
                raise ConnectionRefusedError(
                    f"every server refused the connection for {REFUSED_GRACE_S:g} s"
                )
            self._zk.start(timeout=timeout_s)
            for path in (self._blocks_path, self._gens_path):
                self._zk.ensure_path(path)
            with contextlib.suppress(NodeExistsError):
                self._zk.create(self._block_path, msgpack.packb({"next": 1}))
        except (NoAuthError, AuthFailedError) as exc:
            self._zk.stop()
            raise LeaseServiceUnavailable(
                f"ZooKeeper at {self.hosts} denied this server access to {self.root} "
                f"({type(exc).__name__}: an authentication problem): its znodes have an ACL for "
                "other credentials; run with the lease servers' --zk-auth-file (USER:PASSWORD)"
            ) from exc
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

    def close(self) -> None:
        """Stop the kazoo client."""
        self._closing = True
        self._zk.stop()
        self._zk.close()

    def _wait(self, async_result: Any) -> Any:
        return async_result.get(timeout=self.op_timeout_s)

    def _unavailable(self, what: str, exc: BaseException) -> LeaseServiceUnavailable:
        self.errors += 1
        return LeaseServiceUnavailable(
            f"ZooKeeper unreachable during {what} ({type(exc).__name__}); retry shortly"
        )

    def _get(self, path: str, what: str) -> tuple[bytes, Any] | None:
        """(data, stat) of the znode at ``path``, None when there is none.

        Raises:
            LeaseServiceUnavailable: ZooKeeper did not answer (``what`` names the read).
        """
        from kazoo.exceptions import NoNodeError

        try:
            data, stat = self._wait(self._zk.get_async(path))
        except NoNodeError:
            return None
        except Exception as exc:
            raise self._unavailable(what, exc) from exc
        return data, stat

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
            block = request.placed(start)
            txn = self._zk.transaction()
            txn.set_data(self._block_path, msgpack.packb({"next": block.end}), version=stat.version)
            txn.create(self._record_path(start), block.encode())
            self.writes += 1
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
        self.errors += 1
        log.warning("ambiguous block claim at %d (%r); re-reading", block.start, cause)
        self._await_connection("a block claim")
        found = self._get(self._record_path(block.start), "claim re-read")
        return found is not None and Block.decode(found[0]).token == block.token

    def _record_path(self, start: int) -> str:
        return f"{self._blocks_path}/{start:019d}"

    def _remember(self, block: Block) -> None:
        with self._cache_lock:
            self._cache[block.start] = block

    def _forget(self, start: int) -> None:
        with self._cache_lock:
            self._cache.pop(start, None)

    def block_at(self, start: int) -> Block | None:
        """The block record starting at ``start`` (cached; block records never change)."""
        with self._cache_lock:
            block = self._cache.get(start)
        if block is not None:
            return block
        found = self._get(self._record_path(start), "block lookup")
        if found is None:
            return None
        block = Block.decode(found[0])
        self._remember(block)
        return block

    # -- lineage records ------------------------------------------------------------------------

    def _lineage_path(self, pid: int) -> str:
        return f"{self._gens_path}/{pid}"

    def read_lineage(self, pid: int) -> tuple[LineageRecord, int] | None:
        """(record, version) of ``generations/<pid>``."""
        if not self.connected:
            raise LeaseServiceUnavailable(f"ZooKeeper {self._state}; bumps and rolls need it")
        found = self._get(self._lineage_path(pid), "lineage read")
        if found is None:
            return None
        data, stat = found
        return LineageRecord.decode(data), int(stat.version)

    def sync(self) -> None:
        """ZooKeeper ``sync``: the reads that follow see every write the leader acknowledged
        before it (a follower's own view may lag)."""
        if not self.connected:
            raise LeaseServiceUnavailable(f"ZooKeeper {self._state}; retry shortly")
        try:
            self._wait(self._zk.sync_async(self._gens_path))
        except Exception as exc:
            raise self._unavailable("sync", exc) from exc

    def _ambiguous(self, what: str, exc: BaseException) -> Ambiguous:
        self.errors += 1
        log.warning("ambiguous %s (%r); re-reading", what, exc)
        self._await_connection(what)
        return Ambiguous(what)

    def write_lineage(self, pid: int, record: LineageRecord, version: int | None) -> None:
        """Compare-and-set ``generations/<pid>``, or create it (a multi with its block's check)."""
        from kazoo.exceptions import BadVersionError, NoNodeError

        if version is None:
            txn = self._zk.transaction()
            self._commit(txn, f"write of pid {pid}", [self._create(txn, pid, record)])
            return
        self.writes += 1
        try:
            self._wait(self._zk.set_async(self._lineage_path(pid), record.encode(), version))
        except (BadVersionError, NoNodeError) as exc:
            raise Conflict(str(exc)) from exc
        except Exception as exc:
            raise self._ambiguous(f"write of pid {pid}", exc) from exc

    def write_roll(self, roll: RollWrite) -> None:
        """One multi: retire ``roll.pid`` (versioned, or created) and create its successor's."""
        pid, record, version = roll.pid, roll.record, roll.version
        txn = self._zk.transaction()
        checked = []
        if version is None:
            checked.append(self._create(txn, pid, record))
        else:
            txn.set_data(self._lineage_path(pid), record.encode(), version=version)
        checked.append(self._create(txn, roll.successor, roll.successor_record))
        self._commit(txn, f"roll of pid {pid}", checked)

    def _create(self, txn: Any, pid: int, record: LineageRecord) -> int:
        """Add the creation of ``pid``'s record to ``txn``, only while its block record exists
        (once garbage collection deleted it, nothing about its pids is written again, however
        late a paused server sends this); the block start checked."""
        txn.check(self._record_path(record.block), -1)
        txn.create(self._lineage_path(pid), record.encode())
        return record.block

    def _commit(self, txn: Any, what: str, blocks: list[int]) -> None:
        from kazoo.exceptions import NoNodeError

        self.writes += 1
        try:
            results = self._wait(txn.commit_async())
        except Exception as exc:
            raise self._ambiguous(what, exc) from exc
        failures = [r for r in results if isinstance(r, Exception)]
        if failures:
            if any(isinstance(r, NoNodeError) for r in failures):
                for start in blocks:  # collected: the re-read must see it gone
                    self._forget(start)
            raise Conflict(f"{what} lost a race: {failures[0]!r}")

    # -- garbage collection ---------------------------------------------------------------------

    def collect_garbage(self, now_ms: int, retention_ms: int) -> int:
        """Delete block records, then lineage records, that no request can be granted about any
        more (``forgotten_at``); each at the version read, so a record written meanwhile stays.
        A record outlives its block's record (no create lands without the block)."""
        if not self.connected:
            return 0
        blocks, live = self._collect(
            self._blocks_path, lambda data: Block.decode(data).forgotten_at(retention_ms), now_ms
        )
        for child in blocks:
            self._forget(int(child))
        kept = {int(child) for child in live}

        def record_forgotten(data: bytes) -> int:
            record = LineageRecord.decode(data)
            block = self.block_at(record.block) if record.block in kept else None
            return record.forgotten_at(block, retention_ms)

        records, _ = self._collect(self._gens_path, record_forgotten, now_ms)
        return len(blocks) + len(records)

    def _read_all(
        self, folder: str, children: list[str]
    ) -> Iterator[tuple[str, str, tuple[bytes, Any] | None]]:
        """(child, path, (data, stat) or None) of each child, read ``_GC_READS`` at a time: one
        round trip per batch, not per record."""
        from kazoo.exceptions import NoNodeError

        for at in range(0, len(children), _GC_READS):
            batch = [(c, f"{folder}/{c}") for c in children[at : at + _GC_READS]]
            reads = [self._zk.get_async(path) for _, path in batch]
            for (child, path), read in zip(batch, reads, strict=True):
                try:
                    data, stat = self._wait(read)
                except NoNodeError:
                    yield child, path, None
                    continue
                except Exception as exc:
                    raise self._unavailable("garbage collection", exc) from exc
                yield child, path, (data, stat)

    def _collect(
        self, folder: str, forgotten_at: Callable[[bytes], int], now_ms: int
    ) -> tuple[list[str], list[str]]:
        """Delete the children of ``folder`` whose ``forgotten_at(data)`` is past: the names of
        those deleted, and of those kept."""
        from kazoo.exceptions import BadVersionError, NoNodeError

        try:
            children = self._wait(self._zk.get_children_async(folder))
        except Exception as exc:
            raise self._unavailable("garbage collection", exc) from exc
        deleted: list[str] = []
        kept: list[str] = []
        for child, path, found in self._read_all(folder, children):
            if found is None:
                continue
            data, stat = found
            try:
                if forgotten_at(data) > now_ms:
                    kept.append(child)
                    continue
            except (KeyError, ValueError, TypeError):
                log.warning("garbage collection skips unreadable %s", path)
                kept.append(child)
                continue
            try:
                self._wait(self._zk.delete_async(path, version=stat.version))
            except (NoNodeError, BadVersionError):
                continue
            except Exception as exc:
                raise self._unavailable("garbage collection", exc) from exc
            self.writes += 1
            deleted.append(child)
        return deleted, kept
