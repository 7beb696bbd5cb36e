"""An attacker process with write access to the raw topic (issue 13): forged fences and pids.

``python -m pidfence.demo.attacker --bootstrap HOST:PORT --topic T --report FILE`` reads the topic
as any consumer could, finds the live pids (their newest ``pfc`` certificate has not expired) and,
for each partition a live pid has written, writes a ``FENCE`` one generation ahead of it:

* ``fence_none``: without ``pfc``;
* ``fence_foreign``: with a ``pfc`` placed on it whose certificate a key the attacker
  generated signed;
* ``fence_garbage``: with a ``pfc`` that is not msgpack;
* ``fence_short``: with a placed ``pfc`` whose certificate has the wrong length;
* ``fence_stolen``: with the pid's own real ``pfc`` (of its current generation, not the next).

Then it writes the first records of pids no lease server issued, on every partition:
``fresh_none`` (seq 0, no ``pfc``) and ``fresh_foreign`` (seq 0, a ``pfc`` placed and certified
by its own key). Replays of a real ``pfc`` on other partitions and topics are covered by
``tests/integration/test_sink_binding.py`` and the simulation's attacker.

With signing on (the sink has ``leasePublicKey``) every one is ``FORGED``; without it the FENCEs
fence the real producer and the fresh pids' records are appended. The report (JSON lines) says
where each forgery landed and the ``FORGED`` reason the sink should count for it.
"""

from __future__ import annotations

import argparse
import functools
import json
import secrets
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import confluent_kafka
import msgpack
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from pidfence.wire import FLAG_FENCE, PF_HEADER_KEY, MalformedHeader, decode_pf, encode_pf
from pidfence.wire.cert import CERT_HEADER_KEY, encode_cert
from pidfence.wire.statement import decode_pfc, encode_placed_pfc

#: The reason the sink counts for each kind of forgery.
EXPECTED_REASON = {
    "fence_none": "missing",
    "fence_foreign": "unknown_key",
    "fence_garbage": "malformed",
    "fence_short": "wrong_length",
    "fence_stolen": "other_identity",
    "fresh_none": "missing",
    "fresh_foreign": "unknown_key",
}
#: Attacker pids start here (far from any block a lease server hands out in a demo).
FRESH_PID_BASE = 1 << 60


@dataclass(frozen=True)
class Forgery:
    """One forged record as Kafka acknowledged it."""

    kind: str
    partition: int
    offset: int
    pid: int
    generation: int
    reason: str


@dataclass
class _Seen:
    generation: int = -1
    seq: int = -1
    cert: bytes | None = None
    expire_ms: int = 0


class AttackFailed(RuntimeError):
    """Kafka refused a forged record, or the topic could not be read."""


def read_topic(bootstrap: str, topic: str, timeout_s: float = 30.0) -> dict[tuple[int, int], _Seen]:
    """Per (pid, partition): the newest generation, highest seq and newest cert in the topic."""
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"pidfence-attacker-{secrets.token_hex(4)}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    seen: dict[tuple[int, int], _Seen] = {}
    try:
        meta = consumer.list_topics(topic, timeout=timeout_s).topics[topic]
        if meta.error is not None:
            raise AttackFailed(f"topic {topic}: {meta.error}")
        ends: dict[int, int] = {}
        for p in meta.partitions:
            _, high = consumer.get_watermark_offsets(
                confluent_kafka.TopicPartition(topic, p), timeout=timeout_s
            )
            if high > 0:
                ends[p] = high
        consumer.assign([confluent_kafka.TopicPartition(topic, p, 0) for p in ends])
        deadline = time.monotonic() + timeout_s
        while ends:
            if time.monotonic() > deadline:
                raise AttackFailed(f"reading {topic} did not finish in {timeout_s}s")
            msg: Any = consumer.poll(1.0)
            if msg is None or msg.error() is not None:
                continue
            got: int = msg.partition()
            _note(seen, got, list(msg.headers() or []))
            if msg.offset() + 1 >= ends.get(got, 0):
                ends.pop(got, None)
    finally:
        consumer.close()
    return seen


def _note(seen: dict[tuple[int, int], _Seen], partition: int, headers: list[Any]) -> None:
    values = dict(headers)
    header = values.get(PF_HEADER_KEY)
    if header is None:
        return
    try:
        pf = decode_pf(header)
    except MalformedHeader:
        return
    entry = seen.setdefault((pf.pid, partition), _Seen())
    entry.seq = max(entry.seq, pf.seq)
    if pf.generation >= entry.generation:
        entry.generation = pf.generation
        cert = values.get(CERT_HEADER_KEY)
        expire = _cert_expiry(cert) if cert is not None else None
        if expire is not None:
            entry.expire_ms, entry.cert = expire, cert


def _cert_expiry(pfc: bytes) -> int | None:
    """The lease end a ``pfc`` claims; None when it is not a lease cert (another forgery)."""
    parts = decode_pfc(pfc)
    if parts is None:
        return None
    try:
        fields = msgpack.unpackb(parts.cert)
    except Exception:  # noqa: BLE001 - msgpack raises many types for bad bytes
        return None
    if isinstance(fields, list) and len(fields) in (5, 6) and type(fields[3]) is int:
        return fields[3]
    return None


def forgeries(
    seen: dict[tuple[int, int], _Seen],
    partitions: Sequence[int],
    key: Ed25519PrivateKey,
    now_ms: int,
    fresh_pid: int,
    topic: str = "",
) -> list[tuple[str, int, int, int, list[tuple[str, bytes]], bytes]]:
    """What to write: ``(kind, partition, pid, generation, headers, value)`` per forgery."""
    out: list[tuple[str, int, int, int, list[tuple[str, bytes]], bytes]] = []
    expire = now_ms + 3_600_000
    mine = key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)

    def placed(cert: bytes, p: int, pid: int, g: int, seq: int, flags: int) -> bytes:
        """A ``pfc`` the attacker places itself (its own key signs the statement)."""
        return encode_placed_pfc(cert, key, topic, p, pid, g, seq, flags)

    live = sorted((k, s) for k, s in seen.items() if s.cert is not None and s.expire_ms > now_ms)
    for (pid, p), s in live:
        g = s.generation + 1
        seq = s.seq + 1
        pf = encode_pf(pid, g, seq, FLAG_FENCE)
        certs = {
            "fence_none": None,
            "fence_foreign": placed(encode_cert(key, pid, g, expire, mine), p, pid, g, seq, 1),
            "fence_garbage": b"\xc1" + secrets.token_bytes(16),
            "fence_short": placed(msgpack.packb([1, pid, g, expire]), p, pid, g, seq, 1),
            "fence_stolen": s.cert,
        }
        for kind, cert in certs.items():
            headers = [(PF_HEADER_KEY, pf)] + ([(CERT_HEADER_KEY, cert)] if cert else [])
            out.append((kind, p, pid, g, headers, b""))
    for p in partitions:
        for kind in ("fresh_none", "fresh_foreign"):
            pid, g = fresh_pid, 7
            fresh_pid += 1
            headers = [(PF_HEADER_KEY, encode_pf(pid, g, 0))]
            if kind == "fresh_foreign":
                cert = encode_cert(key, pid, g, expire, mine)
                headers.append((CERT_HEADER_KEY, placed(cert, p, pid, g, 0, 0)))
            out.append((kind, p, pid, g, headers, f"attack:{kind}:{p}".encode()))
    return out


def attack(bootstrap: str, topic: str, timeout_s: float = 30.0) -> list[Forgery]:
    """Read ``topic``, write every forgery, wait for Kafka's acknowledgements.

    Raises:
        AttackFailed: the topic could not be read or a write was refused.
    """
    seen = read_topic(bootstrap, topic, timeout_s)
    admin = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": "unused"})
    try:
        partitions = sorted(admin.list_topics(topic, timeout=timeout_s).topics[topic].partitions)
    finally:
        admin.close()
    key = Ed25519PrivateKey.generate()
    plan = forgeries(seen, partitions, key, int(time.time() * 1000), FRESH_PID_BASE, topic)
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": False}
    )
    done: list[Forgery] = []
    errors: list[str] = []

    def delivered(kind: str, pid: int, g: int, err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(f"{kind}: {err}")
            return
        reason = EXPECTED_REASON[kind]
        done.append(Forgery(kind, msg.partition(), msg.offset(), pid, g, reason))

    for kind, p, pid, g, headers, value in plan:
        wire: list[tuple[str, str | bytes | None]] = list(headers)
        producer.produce(
            topic,
            value,
            partition=p,
            headers=wire,
            on_delivery=functools.partial(delivered, kind, pid, g),
        )
        # One at a time: the forgeries land in the order planned, each acknowledged.
        producer.flush(timeout_s)
    left = producer.flush(timeout_s)
    if left or errors:
        raise AttackFailed(f"{left} forgeries unacknowledged; errors: {errors}")
    return done


def main(argv: list[str] | None = None) -> int:
    """Run one attack; write the report; exit 0 when every forgery was written."""
    parser = argparse.ArgumentParser(prog="python -m pidfence.demo.attacker", description=__doc__)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--report", type=Path, required=True, help="JSON lines, one per forgery")
    parser.add_argument("--timeout", type=float, default=30.0)
    args = parser.parse_args(argv)
    try:
        done = attack(args.bootstrap, args.topic, args.timeout)
    except (AttackFailed, confluent_kafka.KafkaException) as exc:
        sys.stderr.write(f"attacker: {exc}\n")
        return 1
    with args.report.open("w") as out:
        for forgery in done:
            out.write(json.dumps(asdict(forgery)) + "\n")
    live = len({f.pid for f in done if f.kind.startswith("fence_")})
    sys.stdout.write(f"attacker: wrote {len(done)} forgeries ({live} live pid(s) targeted)\n")
    return 0


def read_report(path: Path) -> list[Forgery]:
    """The forgeries a run wrote (its ``--report``)."""
    return [Forgery(**json.loads(line)) for line in path.read_text().splitlines() if line]


if __name__ == "__main__":
    sys.exit(main())
