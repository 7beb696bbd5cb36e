"""Shared by the lease-service unit tests: lease services on one in-memory store and one manual
clock (the servers of one cluster), async tests without a plugin, and a fake ZooKeeper client
that keeps ZooKeeper's rules.

:class:`FakeKazoo` is what ``ZkCoordinator`` sees of ``KazooClient``, with ZooKeeper's semantics
where the lease rules depend on them: a versioned ``set`` or ``delete`` fails with
``BadVersionError`` on any other version, and version -1 is unconditional (kazoo's default,
``set(path, value, version=-1)``); a multi applies all its operations or none, answering
``RolledBackError`` for the operations before the failing one and ``RuntimeInconsistency`` after
it. Faults are queued per write.
"""

from __future__ import annotations

import asyncio
import functools
import random
import threading
from collections.abc import Callable, Coroutine, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ParamSpec

from kazoo.exceptions import (
    BadVersionError,
    ConnectionLoss,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    RolledBackError,
    RuntimeInconsistency,
)

from pidfence.pid_allocator import (
    Coordinator,
    LeaseServerSettings,
    LeaseServerThread,
    LeaseService,
    MemoryCoordinator,
)
from pidfence.testing import ManualClock

P = ParamSpec("P")

#: ZooKeeper's "any version" (kazoo's default for set and delete).
ANY_VERSION = -1


def asynchronous(test: Callable[P, Coroutine[Any, Any, None]]) -> Callable[P, None]:
    """Run an ``async def`` test in a fresh event loop (its fixtures stay as they are)."""

    @functools.wraps(test)
    def run(*args: P.args, **kwargs: P.kwargs) -> None:
        asyncio.run(test(*args, **kwargs))

    return run


@dataclass
class LeaseServers:
    """Lease services that share one store and one clock, as the servers of one cluster do.

    Attributes:
        executor: the services' thread pool for store calls.
        store: the coordinator (by default in memory; its fault hooks are the tests' faults).
        clock: epoch milliseconds, moved by the test.
    """

    executor: ThreadPoolExecutor
    store: Coordinator = field(default_factory=MemoryCoordinator)
    clock: ManualClock[int] = field(default_factory=lambda: ManualClock(1_000_000))

    def service(self, seed: int | None = None, **settings: Any) -> LeaseService:
        """A new server: blocks of 10 pids and 1 s leases unless ``settings`` say otherwise.

        Without ``seed`` each gets its own random source: equal seeds would give equal
        idempotency tokens.
        """
        config = LeaseServerSettings(**{"block_size": 10, "lifetime_ms": 1000, **settings})
        rng = random.Random() if seed is None else random.Random(seed)
        return LeaseService(self.store, self.executor, config, clock=self.clock, rng=rng)


@dataclass
class Stat:
    """The part of a znode's stat the coordinator reads."""

    version: int


class Done:
    """A kazoo async result that is already settled."""

    def __init__(self, value: Any = None, error: BaseException | None = None) -> None:
        self.value, self.error = value, error

    def get(self, timeout: float | None = None) -> Any:
        del timeout
        if self.error is not None:
            raise self.error
        return self.value


class FakeKazoo:
    """Enough of ``KazooClient`` for ``ZkCoordinator``, with ZooKeeper's version rules.

    Attributes:
        nodes: path -> (data, version).
        faults: per upcoming write: ``lost-after`` (applied, then ``ConnectionLoss``),
            ``lost-before`` (not applied, ``ConnectionLoss``), or ``race`` (another server's
            claim moves ``pid_block`` on first).
    """

    def __init__(self) -> None:
        self.nodes: dict[str, tuple[bytes, int]] = {}
        self.listeners: list[Any] = []
        self.faults: list[str] = []

    def add_listener(self, listener: Any) -> None:
        self.listeners.append(listener)

    def start(self, timeout: float) -> None:
        del timeout

    def stop(self) -> None: ...

    def close(self) -> None: ...

    def ensure_path(self, path: str) -> None:
        self.nodes.setdefault(path, (b"", 0))

    def create(self, path: str, value: bytes) -> None:
        if path in self.nodes:
            raise NodeExistsError
        self.nodes[path] = (value, 0)

    def sync_async(self, path: str) -> Done:
        """One server's view: every read is up to date, so a sync has nothing to do."""
        del path
        return Done(None)

    def get_async(self, path: str) -> Done:
        if path not in self.nodes:
            return Done(error=NoNodeError())
        data, version = self.nodes[path]
        return Done((data, Stat(version)))

    def get_children_async(self, path: str) -> Done:
        prefix = path + "/"
        return Done([p[len(prefix) :] for p in self.nodes if p.startswith(prefix)])

    def _write(self, apply: Callable[[], Any]) -> Done:
        fault = self.faults.pop(0) if self.faults else ""
        if fault == "lost-before":
            return Done(error=ConnectionLoss())
        try:
            result = apply()
        except (BadVersionError, NodeExistsError, NoNodeError, NotEmptyError) as exc:
            return Done(error=exc)
        if fault == "lost-after":
            return Done(error=ConnectionLoss())
        return Done(result)

    def _check(self, path: str, version: int) -> int:
        if path not in self.nodes:
            raise NoNodeError
        held = self.nodes[path][1]
        if version not in (ANY_VERSION, held):
            raise BadVersionError
        return held

    def _set(self, path: str, value: bytes, version: int) -> Stat:
        held = self._check(path, version)
        self.nodes[path] = (value, held + 1)
        return Stat(held + 1)

    def _delete(self, path: str, version: int) -> bool:
        self._check(path, version)
        if any(p.startswith(path + "/") for p in self.nodes):
            raise NotEmptyError
        del self.nodes[path]
        return True

    def set_async(self, path: str, value: bytes, version: int = ANY_VERSION) -> Done:
        return self._write(lambda: self._set(path, value, version))

    def create_async(self, path: str, value: bytes) -> Done:
        def apply() -> str:
            self.create(path, value)
            return path

        return self._write(apply)

    def delete_async(self, path: str, version: int = ANY_VERSION) -> Done:
        return self._write(lambda: self._delete(path, version))

    def transaction(self) -> FakeTxn:
        return FakeTxn(self)


class FakeTxn:
    """A multi: every operation or none."""

    def __init__(self, zk: FakeKazoo) -> None:
        self.zk = zk
        self.ops: list[tuple[str, str, bytes, int]] = []

    def set_data(self, path: str, value: bytes, version: int = ANY_VERSION) -> None:
        self.ops.append(("set", path, value, version))

    def create(self, path: str, value: bytes) -> None:
        self.ops.append(("create", path, value, ANY_VERSION))

    def check(self, path: str, version: int) -> None:
        self.ops.append(("check", path, b"", version))

    def commit_async(self) -> Done:
        zk = self.zk
        if zk.faults and zk.faults[0] == "race":
            zk.faults.pop(0)
            data, version = zk.nodes["/pidfence/pid_block"]
            zk.nodes["/pidfence/pid_block"] = (data, version + 1)  # someone else's claim

        def apply() -> list[Any]:
            snapshot = dict(zk.nodes)
            results: list[Any] = []
            for at, (kind, path, value, version) in enumerate(self.ops):
                try:
                    if kind == "set":
                        results.append(zk._set(path, value, version))
                    elif kind == "check":
                        zk._check(path, version)
                        results.append(True)
                    else:
                        zk.create(path, value)
                        results.append(path)
                except (BadVersionError, NodeExistsError, NoNodeError) as exc:
                    zk.nodes = snapshot
                    after = len(self.ops) - at - 1
                    return [RolledBackError()] * at + [exc] + [RuntimeInconsistency()] * after
            return results

        return zk._write(apply)


class Turns:
    """Runs operations in threads, one store call at a time, in an order a test chooses.

    Each operation runs in a thread of its own; every call it makes through :meth:`step` waits
    until :meth:`run`'s ``choose`` picks it among the operations waiting at a call. So a test
    decides every interleaving, e.g. two bumps that both read before either writes, or a
    collection between one's read and its write. Calls from other threads run at once.
    """

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._waiting: dict[str, str] = {}
        self._running: set[str] = set()
        self._turn: str | None = None
        #: ``"operation: call"`` in the order the calls ran.
        self.trace: list[str] = []

    def step(self, what: str, call: Callable[[], Any]) -> Any:
        """Make ``call`` (named ``what``) when this operation's turn comes."""
        me = threading.current_thread().name
        with self._cv:
            if me not in self._running:
                return call()  # not one of the operations: set-up or checks
            self._running.discard(me)
            self._waiting[me] = what
            self._cv.notify_all()
            self._cv.wait_for(lambda: self._turn == me)
            del self._waiting[me]
            self._running.add(me)
        try:
            return call()
        finally:
            with self._cv:
                self.trace.append(f"{me}: {what}")
                self._turn = None
                self._cv.notify_all()

    def run(
        self, operations: dict[str, Callable[[], Any]], choose: Callable[[list[str]], str]
    ) -> dict[str, Any]:
        """Run ``operations`` (name -> callable) to their ends; ``choose`` picks, from the names
        waiting at a call (sorted), the one to go next. Returns each one's result or exception.
        """
        results: dict[str, Any] = {}

        def body(name: str, operation: Callable[[], Any]) -> None:
            try:
                results[name] = operation()
            except Exception as exc:  # noqa: BLE001 - the test judges it
                results[name] = exc
            finally:
                with self._cv:
                    self._running.discard(name)
                    self._cv.notify_all()

        with self._cv:
            self._running.update(operations)
        threads = [
            threading.Thread(target=body, args=item, name=item[0], daemon=True)
            for item in operations.items()
        ]
        for thread in threads:
            thread.start()
        while True:
            with self._cv:
                settled = self._cv.wait_for(
                    lambda: not self._running and self._turn is None, timeout=30
                )
                assert settled, f"an operation hung: {sorted(self._running)}"
                if not self._waiting:
                    break
                self._turn = choose(sorted(self._waiting))
                self._cv.notify_all()
        for thread in threads:
            thread.join(30)
        return results


class Stepped:
    """``target`` with the calls named in ``steps`` made through ``turns`` (one step each);
    ``transaction()`` returns a stepped transaction whose ``commit_async`` is the step."""

    def __init__(self, target: Any, turns: Turns, steps: frozenset[str]) -> None:
        self._target, self._turns, self._steps = target, turns, steps

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._target, name)
        if name == "transaction":
            return lambda: Stepped(found(), self._turns, frozenset({"commit_async"}))
        if name not in self._steps:
            return found

        def stepped(*args: Any, **kwargs: Any) -> Any:
            return self._turns.step(name, lambda: found(*args, **kwargs))

        return stepped


def token_server(tmp_path: Path, tokens: Mapping[str, str], **options: Any) -> LeaseServerThread:
    """A started lease server on the in-memory store that admits ``tokens`` (client name to
    token, written to a 0600 tokens file under ``tmp_path``), with ``options``."""
    path = tmp_path / "tokens"
    path.write_text("".join(f"{name} {token}\n" for name, token in tokens.items()))
    path.chmod(0o600)
    return LeaseServerThread(
        None, coordinator=MemoryCoordinator(), auth_tokens_file=path, **options
    ).start()
