"""A real ZooKeeper ensemble (1 to 3 nodes) on 127.0.0.1, from the Maven Central jars."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Self

from pidfence.jars import classpath, java
from pidfence.services.class_archive import archive_options
from pidfence.services.node import Cluster
from pidfence.services.ports import free_port
from pidfence.services.process import jvm_options


class ZooKeeperEnsemble(Cluster):
    """``size`` ZooKeeper servers in one ensemble, each a JVM process we started.

    Args:
        size: 1 (standalone) to 3 nodes.
        run_dir: where data, configs and logs go (a temporary folder by default, removed on stop).
        tick_ms: ZooKeeper's tick; small so sessions expire and elections finish quickly.
    """

    kind = "zookeeper"

    def __init__(self, size: int = 1, run_dir: Path | None = None, tick_ms: int = 500) -> None:
        super().__init__(size, run_dir, "pidfence-zk-")
        self.tick_ms = tick_ms
        self.client_ports = [free_port() for _ in range(size)]
        self._peer_ports = [(free_port(), free_port()) for _ in range(size)]

    @property
    def hosts(self) -> str:
        """The kazoo/ZooKeeper connect string of every node."""
        return ",".join(f"127.0.0.1:{p}" for p in self.client_ports)

    def node_hosts(self, i: int) -> str:
        """The connect string of node ``i`` alone."""
        return f"127.0.0.1:{self.client_ports[i]}"

    def _configure(self, i: int) -> Path:
        node_dir = self.run_dir / f"zk{i}"
        data = node_dir / "data"
        data.mkdir(parents=True, exist_ok=True)
        (data / "myid").write_text(f"{i + 1}\n")
        lines = [
            f"tickTime={self.tick_ms}",
            "initLimit=20",
            "syncLimit=10",
            f"dataDir={data}",
            f"clientPort={self.client_ports[i]}",
            "clientPortAddress=127.0.0.1",
            "admin.enableServer=false",
            "4lw.commands.whitelist=ruok,stat,srvr,mntr",
            "maxClientCnxns=0",
        ]
        if self.size > 1:
            for j, (peer, election) in enumerate(self._peer_ports):
                lines.append(f"server.{j + 1}=127.0.0.1:{peer}:{election}")
        cfg = node_dir / "zoo.cfg"
        cfg.write_text("\n".join(lines) + "\n")
        return cfg

    def start(self, timeout: float = 90.0) -> Self:
        """Start every node; return once each one serves a write and a read."""
        return super().start(timeout)

    def _node(self, i: int) -> tuple[list[str], Path, int, str]:
        cfg = self._configure(i)
        jars = classpath("zookeeper")
        cmd = [
            java(),
            "-Xmx256m",
            *jvm_options(("-XX:+UseSerialGC",)),
            *archive_options("zookeeper", jars),
            "-Dorg.slf4j.simpleLogger.defaultLogLevel=info",
            "-Dorg.slf4j.simpleLogger.showDateTime=true",
            "-Dzookeeper.jmx.log4j.disable=true",
            "-cp",
            jars,
            "org.apache.zookeeper.server.quorum.QuorumPeerMain",
            str(cfg),
        ]
        what = f"ZooKeeper node {i} ({self.node_hosts(i)})"
        return cmd, cfg.parent, self.client_ports[i], what

    def _node_ready(self, i: int) -> bool:
        return _round_trip(self.node_hosts(i))

    def wait_ready(self, i: int, timeout: float = 60.0) -> None:
        """Block until node ``i`` answers a znode write and read."""
        self.nodes[i].wait_ready(timeout)


#: Readiness probes fail by design until a node is up; their connection errors are not news.
_PROBE_LOG = logging.getLogger("pidfence.services.zookeeper.probe")
_PROBE_LOG.setLevel(logging.CRITICAL)


def new_chroot(hosts: str, prefix: str = "/pidfence-test") -> str:
    """Create a fresh, uniquely named znode under ``prefix``; return ``hosts`` chrooted to it.

    Tests and benches use it so each gets a ZooKeeper namespace of its own.
    """
    import uuid

    from kazoo.client import KazooClient

    path = f"{prefix.rstrip('/')}/{uuid.uuid4().hex[:10]}"
    client = KazooClient(hosts=hosts)
    client.start(timeout=30)
    try:
        client.ensure_path(path)
    finally:
        client.stop()
        client.close()
    return hosts + path


def drop_chroot(chrooted: str) -> None:
    """Delete the namespace :func:`new_chroot` made, and everything in it (a clean-up)."""
    from kazoo.client import KazooClient

    hosts, _, path = chrooted.partition("/")
    client = KazooClient(hosts=hosts)
    try:
        client.start(timeout=30)
        client.delete(f"/{path}", recursive=True)
    except Exception as exc:  # noqa: BLE001 - best effort: znodes left are not a failure
        log = logging.getLogger(__name__)
        log.warning("ZooKeeper namespace /%s was not deleted: %s", path, exc)
    finally:
        client.stop()
        client.close()


def _round_trip(hosts: str) -> bool:
    from kazoo.client import KazooClient

    client = KazooClient(hosts=hosts, timeout=3.0, connection_retry=None, logger=_PROBE_LOG)
    try:
        client.start(timeout=3.0)
        client.ensure_path("/pidfence-ready")
        client.set("/pidfence-ready", b"ok")
        data, _ = client.get("/pidfence-ready")
        return bool(data == b"ok")
    finally:
        client.stop()
        client.close()
