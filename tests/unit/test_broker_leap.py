"""Signed leaps: a record several generations ahead (``g > gE + 1``) with a valid certificate.

A producer killed after its bumps and before its checkpoint resumes several generations ahead and
writes one ``FENCE`` per generation from its checkpoint's up; only the newest has a certificate.
With a verifier, a record whose generation is proven is judged as if it were ``gE + 1`` (the lease
server issued it, and generations only grow, so every older one stays fenced); without a verifier
or a certificate it stays ``INVALID_GENERATION``; a certificate the verifier refuses is ``FORGED``.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

from pidfence.broker_plugin import ProducerStateTable, rebuild, replay_batch
from pidfence.wire import FLAG_FENCE, Verdict, decode_pf, encode_pf
from pidfence.wire.cert import encode_cert
from tests.unit.broker_streams import (
    FakeVerifier,
    StreamKnobs,
    cert_verifier,
    good,
    make_stream,
    offer_alike,
    twin_tables,
    with_certs,
)
from tests.unit.test_broker_forged import decide, table_with

V = Verdict


def started(verifier: Any = None, g: int = 3, high: int = 4) -> ProducerStateTable:
    """pid 1 at generation ``g`` with ``high + 1`` records appended."""
    t = table_with(verifier) if verifier is not None else ProducerStateTable(4, 10_000, 3)
    for s in range(high + 1):
        assert decide(t, 1, g, s, good(1, g) if s == 0 else None)[0][1] is V.APPENDED
    return t


def resume(t: ProducerStateTable, old: int, new: int, seq: int) -> list[Verdict]:
    """What ``resume`` writes: a FENCE per generation, only the newest one signed."""
    return [
        decide(t, 1, g, seq, good(1, g) if g == new else None, FLAG_FENCE)[0][1]
        for g in range(old + 1, new + 1)
    ]


def test_a_signed_fence_several_generations_ahead_is_accepted() -> None:
    t = started(FakeVerifier())
    # g=4 is gE + 1 without a certificate: FORGED as before; g=5 carries none: INVALID_GENERATION.
    assert resume(t, 3, 7, 5) == [V.FORGED, V.INVALID_GENERATION, V.INVALID_GENERATION, V.FENCE]
    assert t.get(1) == (7, 4, 0)
    # The heir's records need no certificate now: gE itself is the proof.
    assert decide(t, 1, 7, 5) == [("r", V.APPENDED)]
    assert decide(t, 1, 7, 6) == [("r", V.APPENDED)]
    assert t.get(1) == (7, 6, 0)


def test_a_signed_data_record_several_generations_ahead_follows_the_seq_rules() -> None:
    t = started(FakeVerifier())
    assert decide(t, 1, 6, 2, good(1, 6)) == [("r", V.DUPLICATE)]  # rejected: no state change
    assert t.get(1) == (3, 4, 0)
    assert decide(t, 1, 6, 5, good(1, 6)) == [("r", V.APPENDED)]
    assert t.get(1) == (6, 5, 0)


def test_a_held_leap_proves_its_unsigned_siblings() -> None:
    t = started(FakeVerifier())
    # The signed first record of generation 6 arrives after its successors (pipelining).
    assert decide(t, 1, 6, 7, good(1, 6), ref="a") == [("a", V.BUFFERED)]
    assert decide(t, 1, 6, 6, ref="b") == [("b", V.BUFFERED)]  # proven by the held sibling
    assert decide(t, 1, 5, 8, good(1, 5), ref="z") == [("z", V.BUFFERED)]  # generation 5 proven
    assert decide(t, 1, 6, 5, ref="c") == [
        ("c", V.APPENDED),
        ("b", V.APPENDED),
        ("a", V.APPENDED),
        ("z", V.FENCED),
    ]
    assert t.get(1) == (6, 7, 0)


@pytest.mark.parametrize("cert", [None, b"anything", b"ok:1:7"])
def test_without_a_verifier_a_leap_is_still_invalid_generation(cert: bytes | None) -> None:
    t = started()
    assert decide(t, 1, 7, 5, cert, FLAG_FENCE) == [("r", V.INVALID_GENERATION)]
    assert decide(t, 1, 7, 5, cert) == [("r", V.INVALID_GENERATION)]
    assert t.get(1) == (3, 4, 0)


def test_with_a_verifier_an_unsigned_leap_is_still_invalid_generation() -> None:
    verifier = FakeVerifier()
    t = started(verifier)
    calls = len(verifier.calls)
    assert decide(t, 1, 7, 5, None, FLAG_FENCE) == [("r", V.INVALID_GENERATION)]
    assert decide(t, 1, 7, 5) == [("r", V.INVALID_GENERATION)]
    assert t.get(1) == (3, 4, 0)
    assert len(verifier.calls) == calls and t.forged == {}


@pytest.mark.parametrize("zombie_gen", [0, 3, 4, 5, 6])
@pytest.mark.parametrize("flags", [0, FLAG_FENCE])
def test_every_older_generation_is_fenced_after_a_leap(zombie_gen: int, flags: int) -> None:
    t = started(FakeVerifier())
    assert resume(t, 3, 7, 5)[-1] is V.FENCE
    # Even a zombie holding a valid certificate for its own generation is fenced.
    for cert in (None, good(1, zombie_gen)):
        for seq in (4, 5, 9):
            assert decide(t, 1, zombie_gen, seq, cert, flags) == [("r", V.FENCED)]
    assert t.get(1) == (7, 4, 0)


@pytest.mark.parametrize(
    "cert",
    [
        good(1, 6),  # the previous generation's certificate
        good(2, 7),  # another pid's
        good(1, 8),  # a newer generation's
        b"forged",
    ],
)
@pytest.mark.parametrize("flags", [0, FLAG_FENCE])
def test_a_forged_certificate_for_a_far_generation_is_forged(cert: bytes, flags: int) -> None:
    t = started(FakeVerifier())
    for seq in (2, 5, 6):
        assert decide(t, 1, 7, seq, cert, flags) == [("r", V.FORGED)]
    assert t.get(1) == (3, 4, 0) and t.held_count == 0
    assert t.forged == {"other_identity": 3}
    # The generation stays open to its real owner.
    assert decide(t, 1, 7, 5, good(1, 7), flags)[0][1] is (V.FENCE if flags else V.APPENDED)


def test_real_ed25519_certificates_for_a_leap() -> None:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key, rogue = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    keys = [key.public_key()]

    t = table_with(cert_verifier(keys, missing="malformed"))
    assert decide(t, 7, 1, 0, encode_cert(key, 7, 1, 10_000), ts=5)[0][1] is V.APPENDED
    assert decide(t, 7, 5, 1, encode_cert(rogue, 7, 5, 10_000), FLAG_FENCE)[0][1] is V.FORGED
    assert decide(t, 7, 5, 1, encode_cert(key, 7, 5, 4), FLAG_FENCE)[0][1] is V.FORGED  # expired
    assert decide(t, 7, 5, 1, encode_cert(key, 7, 4, 10_000), FLAG_FENCE)[0][1] is V.FORGED
    assert t.get(7) == (1, 0, 5)
    assert decide(t, 7, 5, 1, encode_cert(key, 7, 5, 10_000), FLAG_FENCE)[0][1] is V.FENCE
    assert decide(t, 7, 4, 1)[0][1] is V.FENCED
    assert t.get(7) == (5, 0, 5)


def _resume_stream() -> tuple[list[bytes | None], list[int], list[bytes | None]]:
    """Producer 1 writes, is killed after bumping 3 -> 7, resumes; a zombie of 5 writes too."""
    headers: list[bytes | None] = [encode_pf(1, 3, s) for s in range(5)]
    certs: list[bytes | None] = [good(1, 3), None, None, None, None]
    for g in range(4, 8):
        headers.append(encode_pf(1, g, 5, FLAG_FENCE))
        certs.append(good(1, g) if g == 7 else None)
    headers += [encode_pf(1, 7, 5), encode_pf(1, 5, 6), encode_pf(1, 7, 7), encode_pf(1, 7, 6)]
    certs += [None, good(1, 5), None, None]
    return headers, list(range(len(headers))), certs


def test_resume_batch_equals_per_record_and_replays_identically() -> None:
    headers, stamps, certs = _resume_stream()
    one = ProducerStateTable(4, 10_000, 3, verifier=FakeVerifier())
    verdicts = [
        one.offer_header(h, t, i, c)[0].verdict
        for i, (h, t, c) in enumerate(zip(headers, stamps, certs, strict=True))
    ]
    batched = ProducerStateTable(4, 10_000, 3, verifier=FakeVerifier())
    res = batched.offer_batch(headers, np.array(stamps), list(range(len(headers))), certs)
    got = res.verdicts()
    expected = [V.APPENDED] * 5 + [V.FORGED, V.INVALID_GENERATION, V.INVALID_GENERATION, V.FENCE]
    expected += [V.APPENDED, V.FENCED, V.BUFFERED, V.APPENDED]
    assert verdicts == expected
    assert batched.get(1) == (7, 7, 0)
    assert got[:11] == expected[:11] and got[11] is V.APPENDED  # released by row 12
    one_t = ProducerStateTable(4, 10_000, 3, verifier=FakeVerifier())
    for i, (h, t, c) in enumerate(zip(headers, stamps, certs, strict=True)):
        one_t.offer_header(h, t, i, c)
    assert batched == one_t
    # State is a function of the committed output: replay with the committed verdicts.
    replayed = ProducerStateTable(4, 10_000, 3)
    replay_batch(replayed, headers, stamps, [v.value for v in got], list(range(len(headers))))
    assert replayed == batched
    assert (
        rebuild(
            None,
            list(zip(headers, stamps, got, strict=True)),
            capacity=4,
            lifetime_ms=10_000,
            reorder_window=3,
        )
        == batched
    )
    # Without verdicts a replay cannot know a leap was signed: it decides as an unsigned run.
    unsigned = rebuild(None, [(headers[0], 0), (headers[8], 1)], capacity=4, lifetime_ms=10_000)
    assert unsigned.get(1) == (3, 0, 0)


def _leaps(stream: list[tuple[bytes | None, int]], certs: list[bytes | None]) -> int:
    """How many records of the stream moved their pid's generation by more than one."""
    t = ProducerStateTable(4, 10**9, 3, verifier=FakeVerifier())
    n = 0
    for i, ((h, ts), c) in enumerate(zip(stream, certs, strict=True)):
        pid = decode_pf(h).pid if h is not None else 0
        before = t.get(pid)
        t.offer_header(h, ts, i, c)
        after = t.get(pid)
        if before is not None and after is not None and after[0] > before[0] + 1:
            n += 1
    return n


def test_the_property_streams_exercise_signed_leaps() -> None:
    """The generator behind the batch-equality and committed-output property tests (with
    ``leap_rate``) produces accepted leaps, unsigned refused leaps and forged ones; and on such
    streams the batch path, the reference model and a replay of the committed output agree."""
    total_leaps = 0
    seen: set[Verdict] = set()
    for seed in range(40):
        rng = random.Random(seed)
        knobs = StreamKnobs(pids=3, records=150, leap_rate=0.1, odd_rate=0.0)
        stream = make_stream(rng, knobs)
        certs = with_certs(rng, stream, 0.3)
        total_leaps += _leaps(stream, certs)
        one, ref = twin_tables((4, 10**9, 3), signed=True)
        for got in offer_alike(one, ref, stream, certs, where=f"seed {seed} "):
            seen.update(v for _, v in got)
        batched = ProducerStateTable(4, 10**9, 3, verifier=FakeVerifier())
        replayed = ProducerStateTable(4, 10**9, 3)
        for lo in range(0, len(stream), 37):
            part = stream[lo : lo + 37]
            headers, stamps = [h for h, _ in part], [t for _, t in part]
            refs = list(range(lo, lo + len(part)))
            stamp_arr = np.array(stamps, np.int64)
            res = batched.offer_batch(headers, stamp_arr, refs, certs[lo : lo + 37])
            replay_batch(replayed, headers, stamps, [v.value for v in res.verdicts()], refs)
        assert batched == one, f"seed {seed}"
        assert replayed == batched, f"seed {seed}"
    assert total_leaps > 10
    assert {V.INVALID_GENERATION, V.FORGED, V.FENCE, V.FENCED} <= seen
