"""``pidfence services``: a ZooKeeper ensemble and a Kafka cluster (and, with ``s3``, a SeaweedFS
object store) that outlive the command.

:class:`Services` starts the servers, records them in ``<run dir>/state.json`` (pids with their
``/proc`` start times, ports, connect strings) and leaves them running. A later process loads that
file to report status or to stop them. Stopping signals only the recorded pids, and only while each
pid still belongs to the process that was recorded (same start time), so a pid the kernel has since
reused for something else is never signalled.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pidfence.jars import user_cache
from pidfence.services.kafka import KafkaCluster
from pidfence.services.node import Cluster, ServerNode
from pidfence.services.ports import free_port
from pidfence.services.seaweedfs import SeaweedFS
from pidfence.services.zookeeper import ZooKeeperEnsemble
from pidfence.wire import PidfenceError

STATE_FILE = "state.json"
STATE_VERSION = 1
#: Sub-folders of the run dir that :meth:`Services.down` removes with the state file.
_OWNED_DIRS = ("zookeeper", "kafka", "s3")
#: The signals that would end this process while a failed ``up`` stops what it started.
_HELD_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

_log = logging.getLogger(__name__)


class ServicesError(PidfenceError):
    """A ``pidfence services`` request cannot be carried out (already up, not up, bad node)."""


class ServicesAlreadyUp(ServicesError):
    """The run dir records services that are all still running (``state`` says which)."""

    def __init__(self, state: ServicesState) -> None:
        super().__init__(f"services already up in {state.run_dir}")
        self.state = state


class ServicesPartlyDown(ServicesError):
    """The run dir records services of which some have died (``dead`` names them)."""

    def __init__(self, state: ServicesState, dead: list[NodeRecord]) -> None:
        names = ", ".join(f"{n.name} (pid {n.pid}, log {n.log})" for n in dead)
        super().__init__(
            f"services in {state.run_dir} are partly down: {names} not running; "
            "run `pidfence services down`, then `pidfence services up`"
        )
        self.state = state
        self.dead = dead


def default_run_dir() -> Path:
    """``$PIDFENCE_RUN_DIR``, else ``services`` in the user's pidfence cache (the same folder
    from wherever ``pidfence services`` runs)."""
    env = os.environ.get("PIDFENCE_RUN_DIR")
    return Path(env) if env else user_cache() / "services"


def proc_start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (``/proc/PID/stat`` field 22).

    None when no such process exists or it has exited (a zombie counts as exited).
    """
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
            stat = handle.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and ")"; the fields resume after the last ")".
    fields = stat.rsplit(")", 1)[-1].split()
    if fields[0] == "Z":
        return None
    return int(fields[19])


def same_process(pid: int, start_time: int) -> bool:
    """True while ``pid`` is alive and is still the process that started at ``start_time``."""
    return proc_start_time(pid) == start_time


@dataclass
class NodeRecord:
    """One recorded server process."""

    name: str
    pid: int
    start_time: int
    port: int
    log: str


@dataclass
class ServicesState:
    """What ``state.json`` holds."""

    run_dir: str
    zookeeper: str
    kafka: str
    nodes: list[NodeRecord] = field(default_factory=list)
    version: int = STATE_VERSION
    created_at: str = ""
    #: The AWS environment of the S3 store (``services up --s3``), else empty.
    s3: dict[str, str] = field(default_factory=dict)
    #: ``127.0.0.1:PORT`` kept free for a lease server the user starts (``services env``'s
    #: ``PIDFENCE_LEASE``): the same in every shell until ``services down``.
    lease: str = ""

    def pids(self) -> dict[str, int]:
        """Node name to pid."""
        return {n.name: n.pid for n in self.nodes}

    def dead(self) -> list[NodeRecord]:
        """The recorded nodes that are no longer running."""
        return [n for n in self.nodes if not same_process(n.pid, n.start_time)]

    def status(self) -> dict[str, Any]:
        """The ``status --json`` document: connect strings, run dir, pids and which are alive."""
        return {
            "zookeeper": self.zookeeper,
            "kafka": self.kafka,
            "run_dir": self.run_dir,
            "pids": self.pids(),
            "alive": {n.name: same_process(n.pid, n.start_time) for n in self.nodes},
            "s3": self.s3,
            "lease": self.lease,
        }

    def to_json(self) -> str:
        """Serialise to the file format."""
        return json.dumps(asdict(self), indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> ServicesState:
        """Parse the file format; :class:`ServicesError` on anything unexpected."""
        try:
            raw = json.loads(text)
            if raw.get("version") != STATE_VERSION:
                raise ServicesError(f"state file version {raw.get('version')!r} is not supported")
            nodes = [NodeRecord(**n) for n in raw["nodes"]]
            return cls(
                run_dir=raw["run_dir"],
                zookeeper=raw["zookeeper"],
                kafka=raw["kafka"],
                nodes=nodes,
                created_at=raw.get("created_at", ""),
                s3=dict(raw.get("s3") or {}),
                lease=str(raw.get("lease") or ""),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ServicesError(f"unreadable services state: {exc}") from exc


def read_state(run_dir: Path) -> ServicesState | None:
    """The state recorded in ``run_dir``, or None when nothing is recorded there."""
    path = run_dir / STATE_FILE
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    return ServicesState.from_json(text)


def write_state(run_dir: Path, state: ServicesState) -> Path:
    """Write ``state.json`` atomically (a reader never sees half a file)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / STATE_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(state.to_json())
    tmp.replace(path)
    return path


def stop_recorded(nodes: list[NodeRecord], timeout: float = 20.0) -> list[str]:
    """SIGTERM every recorded process still alive, SIGKILL the ones left after ``timeout``.

    A pid is signalled only while its start time matches the record. Returns the names of the
    nodes that were signalled.
    """
    live = [n for n in nodes if same_process(n.pid, n.start_time)]
    for node in live:
        _signal(node, signal.SIGCONT)  # a paused process cannot act on SIGTERM
        _signal(node, signal.SIGTERM)
    if not _wait_gone(live, timeout):
        for node in live:
            _signal(node, signal.SIGKILL)
        _wait_gone(live, 10.0)
    return [n.name for n in live]


def _signal(node: NodeRecord, sig: int) -> None:
    if same_process(node.pid, node.start_time):
        with contextlib.suppress(ProcessLookupError):
            os.kill(node.pid, sig)


def _wait_gone(nodes: list[NodeRecord], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if not any(same_process(n.pid, n.start_time) for n in nodes):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Within: :data:`_HELD_SIGNALS` are ignored, and the previous handlers come back after. In
    another thread it changes nothing (Python runs signal handlers in the main thread only, and
    only the main thread may set them)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in _HELD_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)


def remove_state(run_dir: Path) -> None:
    """Remove ``state.json`` and the server folders this module created under ``run_dir``."""
    (run_dir / STATE_FILE).unlink(missing_ok=True)
    for name in _OWNED_DIRS:
        shutil.rmtree(run_dir / name, ignore_errors=True)
    with contextlib.suppress(OSError):
        run_dir.rmdir()  # only when nothing else lives there


class Services:
    """A ZooKeeper ensemble and a Kafka KRaft cluster on 127.0.0.1, recorded in a run dir.

    Args:
        zookeeper: ZooKeeper nodes (1..3).
        kafka: Kafka nodes (1..3), each broker and controller.
        run_dir: data, logs and ``state.json`` (default: :func:`default_run_dir`).
        s3: also a SeaweedFS S3 store (:class:`~pidfence.services.seaweedfs.SeaweedFS`).

    Example:
        >>> with Services(zookeeper=3, kafka=3) as stack:  # doctest: +SKIP
        ...     stack.kill("kafka-1")
        ...     stack.restart("kafka-1")
    """

    def __init__(
        self, zookeeper: int = 1, kafka: int = 1, run_dir: Path | None = None, s3: bool = False
    ) -> None:
        for what, n in (("zookeeper", zookeeper), ("kafka", kafka)):
            if not 1 <= n <= 3:
                raise ValueError(f"{what} nodes must be 1..3, got {n}")
        self.run_dir = Path(run_dir) if run_dir is not None else default_run_dir()
        self.zk = ZooKeeperEnsemble(zookeeper, run_dir=self.run_dir / "zookeeper")
        self.kafka = KafkaCluster(kafka, run_dir=self.run_dir / "kafka")
        self.s3 = SeaweedFS(run_dir=self.run_dir / "s3") if s3 else None

    @property
    def zk_hosts(self) -> str:
        """ZooKeeper connect string."""
        return self.zk.hosts

    @property
    def bootstrap(self) -> str:
        """Kafka ``bootstrap.servers``."""
        return self.kafka.bootstrap

    def up(self, timeout: float = 180.0) -> ServicesState:
        """Start both services, wait until ready, record them; they keep running after we exit.

        Whatever ends the start early (a server that fails, Ctrl-C, any exception) stops every
        server started so far, the store included, by pid, before it propagates: the servers run
        in sessions of their own, so nothing else would stop them.

        Raises:
            ServicesAlreadyUp: the run dir records services that all still run (nothing started).
            ServicesPartlyDown: some recorded services still run, others died (nothing started).
            ServiceFailed: a server did not become ready (whatever started is stopped again).
        """
        existing = read_state(self.run_dir)
        if existing is not None:
            dead = existing.dead()
            if not dead:
                raise ServicesAlreadyUp(existing)
            if len(dead) < len(existing.nodes):
                raise ServicesPartlyDown(existing, dead)
            remove_state(self.run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        try:
            for cluster in self._clusters():
                cluster.start(timeout)
            return self.record()
        except BaseException:
            self._stop_started()
            raise

    def _clusters(self) -> list[Cluster]:
        """The services in start order: ZooKeeper, Kafka, then the store."""
        return [self.zk, self.kafka, *([self.s3] if self.s3 is not None else [])]

    def _stop_started(self) -> None:
        """Stop every node a failed or interrupted :meth:`up` started (the store and Kafka
        first), each by its own process handle; a stop that fails does not keep the others
        running. SIGINT, SIGTERM and SIGHUP are ignored until it is done: a second Ctrl-C here
        would leave the rest running."""
        with _signals_held():
            for cluster in reversed(self._clusters()):
                try:
                    cluster.stop()
                except Exception as exc:  # noqa: BLE001 - keep stopping the others
                    _log.warning("stopping %s failed: %s", cluster.kind, exc)

    def record(self) -> ServicesState:
        """Write the current pids and ports to ``state.json`` and return the state (the lease
        server's address kept from the state it replaces, else a free port)."""
        previous = read_state(self.run_dir)
        lease = previous.lease if previous is not None else ""
        nodes: list[NodeRecord] = []
        for node, port in self._nodes_with_ports():
            pid = node.pid
            start = proc_start_time(pid) if pid is not None and node.running else None
            if pid is not None and start is not None:
                nodes.append(NodeRecord(node.name, pid, start, port, str(node.log_path)))
        state = ServicesState(
            run_dir=str(self.run_dir.resolve()),
            zookeeper=self.zk_hosts,
            kafka=self.bootstrap,
            nodes=nodes,
            created_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            s3=self.s3.environment() if self.s3 is not None else {},
            lease=lease or f"127.0.0.1:{free_port()}",
        )
        write_state(self.run_dir, state)
        return state

    def _nodes_with_ports(self) -> list[tuple[ServerNode, int]]:
        return [(n, n.port) for n in self._nodes()]

    def _nodes(self) -> list[ServerNode]:
        s3 = self.s3.nodes if self.s3 is not None else []
        return [*self.zk.nodes, *self.kafka.nodes, *s3]

    def node(self, name: str) -> ServerNode:
        """The node called ``zookeeper-N`` or ``kafka-N`` (its fault hooks live on it)."""
        for node in self._nodes():
            if node.name == name:
                return node
        kind = name.rpartition("-")[0]
        if kind not in ("zookeeper", "kafka", "seaweedfs"):
            raise ServicesError(
                f"unknown node {name!r}: expected zookeeper-N, kafka-N or seaweedfs-0"
            )
        raise ServicesError(f"no node {name!r} (started: {', '.join(self.node_names())})")

    def node_names(self) -> list[str]:
        """Names of every node started, e.g. ``zookeeper-0``, ``kafka-2``."""
        return [n.name for n, _ in self._nodes_with_ports()]

    def kill(self, node: str) -> None:
        """SIGKILL one node (``zookeeper-N`` or ``kafka-N``): a crash."""
        self.node(node).kill()

    def restart(self, node: str, timeout: float = 120.0) -> None:
        """Start a node again (stopping it first if it runs), wait until ready, re-record pids."""
        self.node(node).restart(timeout)
        if node.startswith("kafka"):
            self.kafka.wait_all_ready(timeout)
        self.record()

    def pause(self, node: str) -> None:
        """SIGSTOP one node: it keeps its sockets but answers nothing."""
        self.node(node).pause()

    def resume(self, node: str) -> None:
        """SIGCONT a node paused by :meth:`pause`."""
        self.node(node).resume()

    def log_tail(self, node: str, lines: int = 40) -> str:
        """The end of one node's log."""
        return self.node(node).log_tail(lines)

    def down(self) -> None:
        """Stop every node (the store and Kafka first), then remove the run state."""
        if self.s3 is not None:
            self.s3.stop()
        self.kafka.stop()
        self.zk.stop()
        state = read_state(self.run_dir)
        if state is not None:
            # Nodes restarted by another process are known only to the state file.
            stop_recorded(state.nodes)
        remove_state(self.run_dir)

    def __enter__(self) -> Services:
        self.up()
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()


def status(run_dir: Path | None = None) -> ServicesState | None:
    """The services recorded in ``run_dir`` (default run dir if None), or None."""
    return read_state(run_dir or default_run_dir())


def down(run_dir: Path | None = None, timeout: float = 20.0) -> list[str]:
    """Stop the services recorded in ``run_dir`` by pid and remove the run state.

    Returns:
        Names of the nodes that were still running and were signalled.
    """
    run_dir = run_dir or default_run_dir()
    state = read_state(run_dir)
    stopped = stop_recorded(state.nodes, timeout) if state is not None else []
    remove_state(run_dir)
    return stopped
