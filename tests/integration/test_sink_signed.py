"""Issue 13 through the sink on real Kafka and Spark: forged fences and forged pids are refused.

The topic holds a legit producer's records (its first record of the generation carries a valid
``pfc``, as ``IdempotentProducer`` stamps it), interleaved with an attacker's: a FENCE for the live
pid one generation ahead without ``pfc`` and with a ``pfc`` signed by another key, and fresh pids
the same two ways. With ``leasePublicKey`` (two keys: a rotation) every attacker record is
``FORGED`` and every legit record is appended in order; losing every state file between the two
runs changes nothing (state stays a function of the committed output with verification on).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from pidfence.spark_sink import read_log, read_rejects, run_sink
from pidfence.spark_sink.batch_report import summarise
from pidfence.wire import FLAG_FENCE, encode_pf
from pidfence.wire.cert import encode_cert, generate_keypair, load_private_key
from pidfence.wire.statement import encode_placed_pfc
from tests.integration.conftest import produce_labelled
from tests.integration.test_sink import own_root

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]


def raw(key: Ed25519PrivateKey) -> bytes:
    """A private key's raw public key (what a version 2 certificate names)."""
    return key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def send(bootstrap: str, topic: str, recs: list[tuple[str, bytes, bytes | None]]) -> None:
    """Produce (label, pf, pfc or None) to partition 0, now, in order."""
    headers = [[("pf", pf), *([("pfc", pfc)] if pfc is not None else [])] for _, pf, pfc in recs]
    produce_labelled(bootstrap, topic, [(r[0], h, 0) for r, h in zip(recs, headers, strict=True)])


def test_forged_fences_and_pids_are_refused_and_the_live_producer_is_untouched(
    spark: Any, kafka: Any, new_topic: Any, tmp_path: Path
) -> None:
    topic = new_topic(partitions=1)
    _, old_pub = generate_keypair(tmp_path / "old")
    priv, pub = generate_keypair(tmp_path / "current")
    key = load_private_key(priv)
    rogue = Ed25519PrivateKey.generate()
    expire = int(time.time() * 1000) + 3_600_000
    pid, gen = 4242, 7
    producer = Ed25519PrivateKey.generate()

    def placed(server: Any, pid: int, g: int, seq: int, flags: int = 0) -> bytes:
        """A placed pfc on partition 0, as IdempotentProducer stamps it, under ``server``."""
        cert = encode_cert(server, pid, g, expire, producer_key=raw(producer))
        return encode_placed_pfc(cert, producer, topic, 0, pid, g, seq, flags)

    legit = [encode_pf(pid, gen, s) for s in range(8)]
    first_run = [
        ("l0", legit[0], placed(key, pid, gen, 0)),
        ("l1", legit[1], None),
        ("fence-no-pfc", encode_pf(pid, gen + 1, 2, FLAG_FENCE), None),
        ("l2", legit[2], None),
        (
            "fence-rogue",
            encode_pf(pid, gen + 1, 3, FLAG_FENCE),
            placed(rogue, pid, gen + 1, 3, FLAG_FENCE),
        ),
        ("l3", legit[3], None),
    ]
    second_run = [
        ("fresh-no-pfc", encode_pf(9001, 0, 0), None),
        ("l4", legit[4], None),
        ("fresh-rogue", encode_pf(9002, 0, 0), placed(rogue, 9002, 0, 0)),
        ("l5", legit[5], None),
        (
            "fresh-rogue-fence",
            encode_pf(9003, 0, 0, FLAG_FENCE),
            placed(rogue, 9003, 0, 0, FLAG_FENCE),
        ),
        ("l6", legit[6], None),
        ("next-gen-rogue", encode_pf(pid, gen + 1, 7), placed(rogue, pid, gen + 1, 7)),
        ("l7", legit[7], None),
    ]
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    options = {"leasePublicKey": f"{old_pub},{pub}"}
    send(kafka.bootstrap, topic, first_run)
    run_sink(spark, kafka.bootstrap, topic, str(out), str(ckpt), sink_options=options)
    state_files = [f for f in (own_root(out) / "_state").rglob("*") if f.is_file()]
    assert state_files
    for f in state_files:
        f.unlink()
    send(kafka.bootstrap, topic, second_run)
    run_sink(spark, kafka.bootstrap, topic, str(out), str(ckpt), sink_options=options)

    log = read_log(str(out))
    assert [v.decode() for v in log.column("value").to_pylist()] == [f"l{i}" for i in range(8)]
    assert log.column("seq").to_pylist() == list(range(8))
    assert set(log.column("generation").to_pylist()) == {gen}
    rejects = read_rejects(str(out))
    assert {
        v.decode(): verdict
        for v, verdict in zip(
            rejects["value"].to_pylist(), rejects["verdict"].to_pylist(), strict=True
        )
    } == {
        "fence-no-pfc": "FORGED",
        "fence-rogue": "FORGED",
        "fresh-no-pfc": "FORGED",
        "fresh-rogue": "FORGED",
        "fresh-rogue-fence": "FORGED",
        "next-gen-rogue": "FORGED",
    }
    # The committed manifests count the reasons (the CLI's batch line prints them).
    assert summarise(str(out)).forged == {"missing": 2, "unknown_key": 4}
