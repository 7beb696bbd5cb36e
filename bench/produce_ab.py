"""A/B of the producer's CPU per record between two checkouts (``bench/produce.py``'s settings).

Run with the project's venv from any checkout::

    .venv/bin/python bench/produce_ab.py A=/path/to/old/src B=/path/to/new/src [--rounds 6]

One ZooKeeper-free Kafka broker is started for the run. Every round runs each contender once,
in a fresh process whose ``PYTHONPATH`` puts that checkout's ``src`` first, the order reversed
every other round: the header-only floor (confluent-kafka + idempotence + one constant 12-byte
header, as ``bench/produce.py``'s row 3), then ``IdempotentProducer`` with its defaults and with
``success_reports=False`` under each checkout. Each process leases from a lease server thread of
its own (an in-memory coordinator, idle while it sends), primes its connection, then sends
``--records`` 100-byte values to explicit partitions ``i % 4`` with ``acks=all`` and
``linger.ms=5``; the CPU time of the process (Python and librdkafka threads) from the first
``produce`` until ``flush()`` returned is its figure; beside it, the CPU time of the producing
thread alone over its ``produce`` loop (``time.thread_time``: what a change to the per-record
Python path moves, without librdkafka's threads, whose CPU grows with wall time on a loaded
machine). Prints best and median per contender and the ratio to the floor of each, and writes
them as JSON with ``--out``.

``--count MODE N`` runs one loop of ``N`` records against an in-memory client instead, for
instruction counts: ``floor`` (the header-only loop), ``floor_reports`` (plus a Python report per
record), ``ours`` and ``ours_no_reports`` (``IdempotentProducer.produce``). Count it with
``PYTHONHASHSEED=0 valgrind --tool=callgrind --collect-atstart=no --toggle-collect=builtin_eval``
at two sizes; the difference over the difference in records is instructions per record. It
prints the loop's CPU time per record too.

``--paired`` loads the checkouts side by side in this process (each copied under its own package
name) and runs their ``produce`` alternately, ``--rounds`` times ``--records``: CPU time of the
producing thread per record, on the in-memory client and on a real ``confluent_kafka.Producer``
with no broker. Paired runs in one process resolve a few percent on a loaded machine, where
separate processes against a broker swing by ±15% (bench/results/produce_threads.md)::

    .venv/bin/python bench/produce_ab.py main=../main/src branch=src --paired \
        --records 20000 --rounds 60
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

PARTITIONS = 4
VALUE_SIZE = 100
LINGER_MS = 5
CONSTANT_HEADER = b"\x95\x01\xcd\x01\x00\xce\x12\x34\x56\x78\x05\x00"
MODES = ("header", "ours", "ours_no_reports")


def _values(records: int) -> list[bytes]:
    return [(f"{i:012d}".encode() * 9)[:VALUE_SIZE] for i in range(records)]


def _worker(mode: str, bootstrap: str, topic: str, records: int) -> dict[str, float]:
    """One contender in this process: returns wall and CPU seconds of its timed part."""
    import confluent_kafka

    from pidfence.pid_allocator import LeaseClient, LeaseServerThread, MemoryCoordinator
    from pidfence.producer import IdempotentProducer, ProducerConfig

    values = _values(records)
    server = LeaseServerThread(None, coordinator=MemoryCoordinator()).start()
    try:
        if mode == "header":
            conf = {
                "bootstrap.servers": bootstrap,
                "acks": "all",
                "linger.ms": LINGER_MS,
                "enable.idempotence": True,
            }
            kafka = confluent_kafka.Producer(conf)
            kafka.produce(topic, b"prime", partition=0)
            kafka.flush(60)
            produce, poll = kafka.produce, kafka.poll
            wall, cpu, loop = time.perf_counter(), time.process_time(), time.thread_time()
            for i, value in enumerate(values):
                while True:
                    try:
                        produce(
                            topic,
                            value,
                            partition=i % PARTITIONS,
                            headers=[("pf", CONSTANT_HEADER)],
                        )
                        break
                    except BufferError:
                        poll(0.05)
            loop = time.thread_time() - loop
            left = kafka.flush(120)
        else:
            config = ProducerConfig(bootstrap, linger_ms=LINGER_MS, success_reports=mode == "ours")
            with LeaseClient(server.address) as client:
                producer = IdempotentProducer(config, client)
                producer.produce(topic, b"prime", partition=0)
                producer.flush(60)
                acked = producer.acked
                produce_one = producer.produce
                wall, cpu, loop = time.perf_counter(), time.process_time(), time.thread_time()
                for i, value in enumerate(values):
                    produce_one(topic, value, partition=i % PARTITIONS)
                loop = time.thread_time() - loop
                left = producer.flush(120)
                wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
                got = producer.acked - acked
                producer.close()
            _all_acknowledged(left, got if mode == "ours" else records, records)
            return {"wall": wall, "cpu": cpu, "loop": loop}
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        _all_acknowledged(left, records, records)
        return {"wall": wall, "cpu": cpu, "loop": loop}
    finally:
        server.stop()


class _Msg:
    def __init__(self, topic: str, partition: int) -> None:
        self._t, self._p = topic, partition

    def topic(self) -> str:
        return self._t

    def partition(self) -> int:
        return self._p


class _NullKafka:
    """An in-memory client: keeps each record's callback, ``flush`` reports them all."""

    def __init__(self, conf: dict[str, Any]) -> None:
        self.conf = conf
        self.pending: list[tuple[str, int, Any]] = []
        self.only_errors = bool(conf.get("delivery.report.only.error"))

    def produce(
        self,
        topic: str,
        value: Any,
        key: Any = None,
        partition: int = -1,
        headers: Any = None,
        on_delivery: Any = None,
    ) -> None:
        self.pending.append((topic, partition, on_delivery))

    def poll(self, timeout: float = 0) -> int:
        served, self.pending = self.pending, []
        default = self.conf["on_delivery"]
        for topic, partition, callback in served:
            if callback is not None or not self.only_errors:
                (callback or default)(None, _Msg(topic, partition))
        return len(served)

    def flush(self, timeout: float = -1) -> int:
        self.poll()
        return 0

    def __len__(self) -> int:
        return len(self.pending)

    def list_topics(self, topic: str, timeout: float = -1) -> Any:
        parts = {p: object() for p in range(PARTITIONS)}
        return SimpleNamespace(topics={topic: SimpleNamespace(error=None, partitions=parts)})


class _Lease:
    """A lease client that hands out one day-long lease (no thread, no server)."""

    def lease(self, partitions: Any = (), *, key: bytes | None = None) -> Any:
        expire_ms = time.time_ns() // 1_000_000 + 86_400_000
        return SimpleNamespace(
            pid=7,
            generation=0,
            sequence=0,
            expire_ms=expire_ms,
            secret=b"s",
            cert=None,
            mac_key=None,
        )


#: The counted loops: the floor's (with and without success reports) and the producer's.
_LOOPS = {
    "floor": "for i, value in enumerate(values):\n"
    "    kafka.produce('t', value, partition=i % 4, headers=[('pf', HEADER)])\n"
    "    if i % 1000 == 999: kafka.poll()\n"
    "kafka.poll()\n",
    "ours": "for i, value in enumerate(values):\n"
    "    produce('t', value, partition=i % 4)\n"
    "    if i % 1000 == 999: kafka.poll()\n"
    "kafka.poll()\n",
}


def _all_acknowledged(left: int, counted: int, records: int) -> None:
    """Raise unless ``flush`` left no record and ``counted`` of the ``records`` were reported."""
    if left or counted != records:
        raise RuntimeError(f"{left} records not acknowledged, {counted} of {records} counted")


def _count(mode: str, records: int) -> None:
    """One loop of ``records`` against :class:`_NullKafka`, run by ``eval`` so that
    ``valgrind --tool=callgrind --collect-atstart=no --toggle-collect=builtin_eval`` counts
    only it (``mode``: floor, floor_reports, ours, ours_no_reports)."""
    from pidfence.producer import IdempotentProducer, ProducerConfig

    values = _values(records)
    config = ProducerConfig("127.0.0.1:9", success_reports=mode != "ours_no_reports")
    producer = IdempotentProducer(config, _Lease(), producer_factory=_NullKafka)
    for p in range(PARTITIONS):
        producer.produce("t", b"prime", partition=p)
    producer.flush()
    kafka = producer._sender.client if hasattr(producer, "_sender") else producer._producer
    kafka.only_errors = mode in ("floor", "ours_no_reports")
    code = compile(_LOOPS[mode.split("_", maxsplit=1)[0]], mode, "exec")
    names = {"kafka": kafka, "values": values, "HEADER": CONSTANT_HEADER}
    loop = time.thread_time()
    eval(code, {**names, "produce": producer.produce})  # noqa: S307 - our own loop
    loop = time.thread_time() - loop
    if mode == "ours":
        _all_acknowledged(0, producer.acked - PARTITIONS, records)
    print(json.dumps({"mode": mode, "loop_ns_per_record": loop * 1e9 / records}))


def _run(src: str | None, mode: str, bootstrap: str, topic: str, records: int) -> dict[str, float]:
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = src
    argv = [sys.executable, __file__, "--worker", mode, bootstrap, topic, str(records)]
    out = subprocess.run(argv, env=env, check=True, capture_output=True, text=True).stdout
    result: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return result


def _as_package(src: str, name: str, into: Path) -> None:
    """Copy ``src/pidfence`` to ``into/name`` with its imports renamed, so two checkouts load
    side by side in one process."""
    shutil.copytree(Path(src) / "pidfence", into / name, ignore=shutil.ignore_patterns("*.pyc"))
    for path in (into / name).rglob("*.py"):
        text = path.read_text()
        text = re.sub(r"\bpidfence\.", f"{name}.", text)
        path.write_text(text.replace("from pidfence import", f"from {name} import"))


def _paired(checkouts: dict[str, str], records: int, rounds: int) -> list[dict[str, Any]]:
    """Each checkout's ``produce`` in this process, alternately, ``rounds`` runs of ``records``
    each: CPU time of this thread per record, on the in-memory client and on a real
    ``confluent_kafka.Producer`` with no broker (records queue in librdkafka, purged after each
    run). Returns one row per (client, success reports, checkout)."""
    import importlib

    import confluent_kafka

    values = _values(records)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="produce-ab-") as tmp:
        sys.path.insert(0, tmp)
        names = {label: f"pidfence_ab{i}" for i, label in enumerate(checkouts)}
        for label, src in checkouts.items():
            _as_package(src, names[label], Path(tmp))
        for client in ("memory", "librdkafka"):
            for reports in (True, False):
                producers = {}
                for label, name in names.items():
                    producer_mod = importlib.import_module(f"{name}.producer")
                    queue = {"queue.buffering.max.messages": 1_000_000}
                    config = producer_mod.ProducerConfig(
                        "127.0.0.1:9", success_reports=reports, extra=queue
                    )
                    factory = _NullKafka if client == "memory" else confluent_kafka.Producer
                    producer = producer_mod.IdempotentProducer(
                        config, _Lease(), producer_factory=factory
                    )
                    producer._partitioner.counts["t"] = PARTITIONS  # no broker to ask
                    for p in range(PARTITIONS):
                        producer.produce("t", b"prime", partition=p)
                    producers[label] = producer
                runs: dict[str, list[float]] = {label: [] for label in producers}
                for r in range(rounds):
                    for label in list(producers)[:: 1 if r % 2 == 0 else -1]:
                        producer = producers[label]
                        kafka = producer._sender.client
                        loop = time.thread_time()
                        for i, value in enumerate(values):
                            producer.produce("t", value, partition=i % PARTITIONS)
                        runs[label].append((time.thread_time() - loop) * 1e9 / records)
                        if client == "memory":
                            kafka.poll()
                        else:
                            kafka.purge()
                            kafka.poll(0)
                        producer._sender.delivery.take_error()  # the purge's reports
                for label, ns in runs.items():
                    rows.append(
                        {
                            "client": client,
                            "success_reports": reports,
                            "checkout": label,
                            "ns_min": min(ns),
                            "ns_median": statistics.median(ns),
                            "ns_rounds": ns,
                        }
                    )
                first = next(iter(runs.values()))
                for label, ns in list(runs.items())[1:]:
                    paired = statistics.median(b / a for a, b in zip(first, ns, strict=True))
                    print(
                        f"{client:10s} reports={reports!s:5s} {label}: "
                        f"{min(ns) - min(first):+.0f} ns min, "
                        f"{statistics.median(ns) - statistics.median(first):+.0f} ns median, "
                        f"paired median ratio {paired:.3f}"
                    )
        sys.path.remove(tmp)
    return rows


def main() -> None:
    """Parse the arguments and run the A/B (or a worker, or the instruction count)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkouts", nargs="*", help="LABEL=path/to/src (two or more)")
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--out", help="write the figures as JSON here")
    parser.add_argument("--worker", nargs=4, help=argparse.SUPPRESS)
    parser.add_argument("--count", nargs=2, metavar=("MODE", "RECORDS"), help=argparse.SUPPRESS)
    parser.add_argument(
        "--paired", action="store_true", help="the checkouts side by side in this process"
    )
    args = parser.parse_args()
    if args.paired:
        checkouts = dict(item.split("=", 1) for item in args.checkouts)
        rows = _paired(checkouts, args.records, args.rounds)
        if args.out:
            Path(args.out).write_text(json.dumps({"paired": rows}, indent=2))
        return
    if args.worker:
        mode, bootstrap, topic, records = args.worker
        print(json.dumps(_worker(mode, bootstrap, topic, int(records))))
        return
    if args.count is not None:
        _count(args.count[0], int(args.count[1]))
        return
    from pidfence.services import KafkaCluster, ZooKeeperEnsemble, create_topic

    checkouts = dict(item.split("=", 1) for item in args.checkouts)
    contenders = [("header-only", None, "header")] + [
        (f"{label} {mode}", src, mode) for label, src in checkouts.items() for mode in MODES[1:]
    ]
    cpus: dict[str, list[float]] = {name: [] for name, _, _ in contenders}
    loops: dict[str, list[float]] = {name: [] for name, _, _ in contenders}
    load = [os.getloadavg()[0]]
    with ZooKeeperEnsemble(1) as zk, KafkaCluster(1) as kafka:
        del zk  # the broker needs it; the lease servers are in memory
        bootstrap = kafka.bootstrap
        warm = create_topic(bootstrap, f"warm-{uuid.uuid4().hex[:6]}", PARTITIONS)
        for _, src, mode in contenders:
            _run(src, mode, bootstrap, warm, args.records // 10)
        for r in range(args.rounds):
            order = contenders if r % 2 == 0 else contenders[::-1]
            for name, src, mode in order:
                topic = create_topic(bootstrap, f"ab-{uuid.uuid4().hex[:8]}", PARTITIONS)
                ran = _run(src, mode, bootstrap, topic, args.records)
                cpus[name].append(ran["cpu"])
                loops[name].append(ran["loop"])
            load.append(os.getloadavg()[0])
            print(f"round {r + 1}: load {load[-1]:.1f}", file=sys.stderr)
    floor_best = min(cpus["header-only"])
    floor_median = statistics.median(cpus["header-only"])
    rows = []
    for name, _, _ in contenders:
        best, median = min(cpus[name]), statistics.median(cpus[name])
        rows.append(
            {
                "contender": name,
                "cpu_us_best": best * 1e6 / args.records,
                "cpu_us_median": median * 1e6 / args.records,
                "vs_floor_best": best / floor_best,
                "vs_floor_median": median / floor_median,
                "cpu_us_rounds": [c * 1e6 / args.records for c in cpus[name]],
                "loop_us_best": min(loops[name]) * 1e6 / args.records,
                "loop_us_median": statistics.median(loops[name]) * 1e6 / args.records,
                "loop_us_rounds": [c * 1e6 / args.records for c in loops[name]],
            }
        )
        row = rows[-1]
        print(
            f"{name:28s} best {row['cpu_us_best']:.2f} us ({row['vs_floor_best']:.2f}x)  "
            f"median {row['cpu_us_median']:.2f} us ({row['vs_floor_median']:.2f}x)  "
            f"loop thread best {row['loop_us_best']:.2f} median {row['loop_us_median']:.2f} us"
        )
    if args.out:
        report = {
            "records": args.records,
            "rounds": args.rounds,
            "checkouts": checkouts,
            "load_1min": load,
            "rows": rows,
        }
        with open(args.out, "w") as out:
            json.dump(report, out, indent=2)


if __name__ == "__main__":
    main()
