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
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
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
