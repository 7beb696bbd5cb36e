"""Signed generations in the broker rules (DESIGN §3 amended): the ``FORGED`` verdict.

A record that would create an entry, move ``gE`` or wait under the next generation needs a
certificate the verifier accepts; a forged one is refused and changes nothing. Verification runs
once per (pid, generation): afterwards the entry itself proves the generation.
"""

from __future__ import annotations

import random
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pidfence.broker_plugin import ProducerStateTable
from pidfence.wire import FLAG_FENCE, Verdict, encode_pf
from pidfence.wire.cert import encode_cert
from tests.unit import broker_streams as streams
from tests.unit.test_broker_properties import knobs_strategy

V = Verdict
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def table_with(verifier: Any, window: int = 3) -> ProducerStateTable:
    return ProducerStateTable(
        capacity=4, lifetime_ms=10_000, reorder_window=window, verifier=verifier
    )


def decide(
    t: ProducerStateTable,
    pid: int,
    g: int,
    s: int,
    cert: bytes | None = None,
    flags: int = 0,
    ts: int = 0,
    ref: Any = "r",
) -> list[tuple[Any, Verdict]]:
    return [(d.ref, d.verdict) for d in t.offer(pid, g, s, ts, flags, ref, cert)]


@pytest.mark.parametrize(
    ("flags", "seq", "verdict"), [(0, 0, V.APPENDED), (FLAG_FENCE, 4, V.FENCE)]
)
def test_a_new_entry_needs_a_certificate(flags: int, seq: int, verdict: Verdict) -> None:
    t = table_with(streams.FakeVerifier())
    before = t.state()
    assert decide(t, 1, 3, seq, None, flags, ts=50) == [("r", V.FORGED)]
    assert decide(t, 1, 3, seq, streams.good(1, 4), flags, ts=60) == [("r", V.FORGED)]
    assert t.state() == before  # nothing changed, not even the clock
    assert t.forged == {"missing": 1, "other_identity": 1}
    assert decide(t, 1, 3, seq, streams.good(1, 3), flags) == [("r", verdict)]


def test_moving_the_generation_needs_a_certificate_once() -> None:
    v = streams.FakeVerifier()
    t = table_with(v)
    decide(t, 1, 3, 0, streams.good(1, 3))
    decide(t, 1, 3, 1)  # same generation: no verification
    assert v.calls == [(1, 3)]
    before = t.state()
    assert decide(t, 1, 4, 0, None, FLAG_FENCE) == [("r", V.FORGED)]  # forged FENCE
    assert decide(t, 1, 4, 2) == [("r", V.FORGED)]  # forged next-generation append
    assert decide(t, 1, 4, 4) == [("r", V.FORGED)]  # forged next-generation hold
    assert decide(t, 1, 4, 1) == [("r", V.DUPLICATE)]  # a duplicate changes nothing anyway
    assert t.state() == before
    assert decide(t, 1, 3, 2) == [("r", V.APPENDED)]  # the real producer is not fenced
    v.calls.clear()
    assert decide(t, 1, 4, 3, None, FLAG_FENCE) == [("r", V.FORGED)]
    assert decide(t, 1, 4, 3, streams.good(1, 4), FLAG_FENCE) == [("r", V.FENCE)]
    assert decide(t, 1, 4, 3) == [("r", V.APPENDED)]  # gE = 4 now: no certificate needed
    assert decide(t, 1, 3, 4) == [("r", V.FENCED)]
    assert v.calls == [(1, 4), (1, 4)]


def test_a_proven_held_record_proves_its_siblings() -> None:
    t = table_with(streams.FakeVerifier())
    decide(t, 1, 3, 0, streams.good(1, 3))
    assert decide(t, 1, 4, 2, streams.good(1, 4), ref="s2") == [("s2", V.BUFFERED)]
    assert decide(t, 1, 4, 3, None, ref="s3") == [("s3", V.BUFFERED)]
    assert decide(t, 1, 4, 1, None, ref="s1") == [
        ("s1", V.APPENDED),
        ("s2", V.APPENDED),
        ("s3", V.APPENDED),
    ]
    assert t.get(1)[:2] == (4, 3)  # type: ignore[index]


def test_a_forged_resend_does_not_fence_a_waiting_record() -> None:
    t = table_with(streams.FakeVerifier())
    decide(t, 1, 3, 0, streams.good(1, 3))
    assert decide(t, 1, 3, 2, ref="real s2") == [("real s2", V.BUFFERED)]
    assert decide(t, 1, 4, 2, b"junk", ref="forged s2") == [("forged s2", V.FORGED)]
    assert decide(t, 1, 3, 1, ref="s1") == [("s1", V.APPENDED), ("real s2", V.APPENDED)]


def test_real_ed25519_certificates() -> None:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key, other = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    keys = [other.public_key(), key.public_key()]  # key rotation: either key is accepted

    t = table_with(streams.cert_verifier(keys))
    assert decide(t, 7, 1, 0, encode_cert(key, 7, 1, 10_000), ts=5)[0][1] is V.APPENDED
    rogue = Ed25519PrivateKey.generate()
    assert decide(t, 7, 2, 0, encode_cert(rogue, 7, 2, 10_000), FLAG_FENCE)[0][1] is V.FORGED
    assert decide(t, 7, 2, 0, encode_cert(key, 7, 2, 4), FLAG_FENCE)[0][1] is V.FORGED
    assert decide(t, 7, 2, 0, encode_cert(key, 8, 2, 10_000), FLAG_FENCE)[0][1] is V.FORGED
    assert decide(t, 7, 2, 0, b"\xc1", FLAG_FENCE)[0][1] is V.FORGED
    short = msgpack.packb([1, 7, 2, 10_000])
    assert decide(t, 7, 2, 0, short, FLAG_FENCE)[0][1] is V.FORGED
    assert decide(t, 7, 2, 0, encode_cert(other, 7, 2, 10_000), FLAG_FENCE)[0][1] is V.FENCE
    assert t.forged == {
        "unknown_key": 1,
        "expired": 1,
        "other_identity": 1,
        "malformed": 1,
        "wrong_length": 1,
    }


@SETTINGS
@given(
    st.integers(0, 2**32),
    knobs_strategy,
    streams.table_args,
    st.floats(0, 1),
    st.lists(st.integers(1, 60), max_size=8),
)
def test_forged_cases_match_the_reference_and_the_batch_path(
    seed: int, knobs: streams.StreamKnobs, args: Any, forge: float, cuts: list[int]
) -> None:
    capacity, lifetime, window = args
    rng = random.Random(seed)
    stream = streams.make_stream(rng, knobs)
    certs = streams.with_certs(rng, stream, forge)
    one, ref = streams.twin_tables(args, signed=True)
    final: dict[int, Verdict] = {}
    log: list[int] = []
    for got in streams.offer_alike(one, ref, stream, certs):
        for r, v in got:
            final[r] = v
            if v.appended:
                log.append(r)
    batched = ProducerStateTable(capacity, lifetime, window, verifier=streams.FakeVerifier())
    b_final: dict[int, Verdict] = {}
    b_log: list[int] = []
    for lo, hi, headers, stamps in streams.batches(stream, cuts):
        res = batched.offer_batch(
            headers, np.array(stamps, np.int64), list(range(lo, hi)), certs[lo:hi]
        )
        for d in res.released:
            b_final[d.ref] = d.verdict
        for row, v in enumerate(res.verdicts()):
            b_final[lo + row] = v
        b_log += [lo + i if i >= 0 else res.released[-i - 1].ref for i in res.log_order.tolist()]
    assert b_final == final and b_log == log
    assert batched == one
    assert batched.forged == one.forged


def test_fresh_pid_of_a_signed_stream_takes_the_exact_path_and_still_appends() -> None:
    t = table_with(streams.FakeVerifier())
    headers = [encode_pf(5, 2, s) for s in range(100)]
    certs = [streams.good(5, 2)] + [None] * 99
    res = t.offer_batch(headers, np.arange(100), None, certs)
    assert res.verdicts() == [V.APPENDED] * 100
