"""A server node with its fault hooks, and the cluster base both ZooKeeper and Kafka build on.

The hooks live once, on the node (``kill``, ``restart``, ``pause``, ``resume``, ``log_tail``),
as kazoo's ``testing/common.py`` cluster does with its managed servers; a cluster is a list of
nodes (``cluster[1].kill()``) and keeps ``cluster.kill(1)`` as a shorthand.
"""

from __future__ import annotations

import shutil
import tempfile
from abc import abstractmethod
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Generic, Self, TypeVar

from pidfence.lifecycle import Startable
from pidfence.services.process import ManagedProcess, ServiceFailed, wait_until


class ServerNode(ManagedProcess):
    """One server process that knows when it is ready.

    Args:
        name: ``zookeeper-0``, ``kafka-2`` …
        cmd: the command line.
        log_path: where its output goes.
        ready: a probe that returns True (or raises) once the node serves.
        what: how errors name it, e.g. ``ZooKeeper node 0 (127.0.0.1:2181)``.
        port: the client port.
        env: extra environment variables.
    """

    def __init__(
        self,
        name: str,
        cmd: Sequence[str],
        log_path: Path,
        ready: Callable[[], bool],
        what: str,
        port: int,
        env: dict[str, str] | None = None,
    ) -> None:
        super().__init__(name, cmd, log_path, env=env)
        self.ready = ready
        self.what = what
        self.port = port

    def wait_ready(self, timeout: float = 120.0, interval: float = 0.3) -> None:
        """Block until the probe succeeds; :class:`ServiceFailed` with the log's tail at once
        when the process exits (a server that died at start never becomes ready), else after
        ``timeout``."""

        def probe() -> bool:
            if not self.running:
                raise ServiceFailed(
                    f"{self.what}: {self.name} exited with code {self.exit_code()} before it "
                    f"was ready\n{self.log_tail(20)}"
                )
            return self.ready()

        try:
            wait_until(probe, timeout, self.what, interval=interval)
        except ServiceFailed as exc:
            if self.running:  # not ready in time: the log as it is now
                raise ServiceFailed(f"{exc}\n{self.log_tail(20)}") from None
            raise

    def restart(self, timeout: float = 120.0) -> None:
        """Stop the node if it runs, start it again, and wait until it serves."""
        self.stop()
        self.start()
        self.wait_ready(timeout)


NodeT = TypeVar("NodeT", bound=ManagedProcess)


class ProcessGroup(Startable, Generic[NodeT]):
    """Processes started together, with their data, configs and logs under one run folder.

    Args:
        run_dir: the run folder; None: a temporary one, removed on stop.
        prefix: the temporary folder's name prefix.
    """

    def __init__(self, run_dir: Path | None, prefix: str) -> None:
        self._owns_dir = run_dir is None
        self.run_dir = Path(run_dir or tempfile.mkdtemp(prefix=prefix))
        self.nodes: list[NodeT] = []

    def _started(self, ready: Callable[[], None]) -> Self:
        """Return self once ``ready()`` returns; on :class:`ServiceFailed`, stop and re-raise."""
        try:
            ready()
        except ServiceFailed:
            self.stop()
            raise
        return self

    def pids(self) -> list[int]:
        """Pids of running nodes."""
        return [n.pid for n in self.nodes if n.running and n.pid is not None]

    def _remove_run_dir(self) -> None:
        if self._owns_dir:
            shutil.rmtree(self.run_dir, ignore_errors=True)


class Cluster(ProcessGroup[ServerNode]):
    """Nodes of one service: ``size`` :class:`ServerNode`, numbered from 0.

    A subclass says how to run node ``i`` (:meth:`_node`); :meth:`start` starts them all and
    returns once every one serves.
    """

    #: The nodes' names and logs: ``kafka`` gives ``kafka-0`` logging to ``kafka.log``.
    kind: str

    def __init__(self, size: int, run_dir: Path | None, prefix: str) -> None:
        if not 1 <= size <= 3:
            raise ValueError(f"size must be 1..3, got {size}")
        super().__init__(run_dir, prefix)
        self.size = size

    @abstractmethod
    def _node(self, i: int) -> tuple[list[str], Path, int, str]:
        """Node ``i``'s command line, folder, client port and how errors name it (configured)."""

    @abstractmethod
    def _node_ready(self, i: int) -> bool:
        """Whether node ``i`` serves (a real round trip); may raise while it starts."""

    def start(self, timeout: float = 120.0) -> Self:
        """Start every node; return once each one serves."""
        for i in range(self.size):
            cmd, node_dir, port, what = self._node(i)
            ready = self._probe(i)
            log = node_dir / f"{self.kind}.log"
            self.nodes.append(ServerNode(f"{self.kind}-{i}", cmd, log, ready, what, port))
        for node in self.nodes:
            node.start()
        return self._started(lambda: self._wait_each(timeout))

    def _wait_each(self, timeout: float) -> None:
        for node in self.nodes:
            node.wait_ready(timeout)

    def _probe(self, i: int) -> Callable[[], bool]:
        return lambda: self._node_ready(i)

    def stop(self) -> None:
        """Stop every node (SIGTERM, then SIGKILL) and remove the run folder if we made it."""
        for node in self.nodes:
            node.stop()
        self._remove_run_dir()

    def __getitem__(self, i: int) -> ServerNode:
        return self.nodes[i]

    def __len__(self) -> int:
        return len(self.nodes)

    def __iter__(self) -> Iterator[ServerNode]:
        return iter(self.nodes)

    def wait_all_ready(self, timeout: float = 120.0) -> None:
        """Block until every running node serves."""
        for node in self.nodes:
            if node.running:
                node.wait_ready(timeout)

    def kill(self, i: int) -> None:
        """SIGKILL node ``i`` (a crash)."""
        self.nodes[i].kill()

    def restart(self, i: int, timeout: float = 120.0) -> None:
        """Restart node ``i`` and wait until every running node serves again."""
        self.nodes[i].restart(timeout)
        self.wait_all_ready(timeout)

    def pause(self, i: int) -> None:
        """SIGSTOP node ``i``: sockets stay open, nothing answers."""
        self.nodes[i].pause()

    def resume(self, i: int) -> None:
        """SIGCONT node ``i``."""
        self.nodes[i].resume()

    def log_tail(self, i: int, lines: int = 40) -> str:
        """The end of node ``i``'s log."""
        return self.nodes[i].log_tail(lines)
