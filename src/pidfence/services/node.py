"""A server node with its fault hooks, and the cluster base both ZooKeeper and Kafka build on.

The hooks live once, on the node (``kill``, ``restart``, ``pause``, ``resume``, ``log_tail``),
as kazoo's ``testing/common.py`` cluster does with its managed servers; a cluster is a list of
nodes (``cluster[1].kill()``) and keeps ``cluster.kill(1)`` as a shorthand.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from pidfence.services.process import ManagedProcess, wait_until


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
        """Block until the probe succeeds; ServiceFailed (with the log tail) after ``timeout``."""
        wait_until(self.ready, timeout, self.what, interval=interval, tail=self.log_tail(20))

    def restart(self, timeout: float = 120.0) -> None:
        """Stop the node if it runs, start it again, and wait until it serves."""
        self.stop()
        self.start()
        self.wait_ready(timeout)


class Cluster:
    """Nodes of one service. Subclasses fill :attr:`nodes` in ``start()``."""

    nodes: list[ServerNode]

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

    def pids(self) -> list[int]:
        """Pids of running nodes."""
        return [n.pid for n in self.nodes if n.running and n.pid is not None]
