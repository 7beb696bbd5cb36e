"""Simulation tier, issue 13: an attacker who can write to the raw topic forges fences and pids.

The simulated lease server signs every lease, bump and roll (``pidfence.wire.cert``), producers
stamp ``pfc`` as ``IdempotentProducer`` does, and the sink verifies as ``pidfence sink
--lease-public-key`` does. The attacker (:mod:`pidfence.sim.attacker`) reads the topic like any
consumer and writes, on the seeded schedule, FENCE records one generation ahead of live pids and
seq-0 records of fresh pids, without ``pfc`` or with a bad one (its own key, not msgpack, wrong
length, another identity's real cert, a real cert whose lease ended). Judged: every legitimate
event in the output log exactly once (the event-level checker and the upstream count), nothing of
the attacker's appended, and every forged record ``FORGED`` (``forged_sent == forged_caught``).
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pidfence.sim import SimResult, run
from pidfence.sim.attacker import ATTACKS, Forgery
from tests.sim.schedules import SEEDS, assert_clean, explored, judged, knob_space
from tests.sim.test_oracle import ONE_CHAIN

# Every fault but producer crashes (see test_forged_fences_do_not_mislead_the_recovery_scan): lossy,
# duplicating, reordering network, sink restarts rebuilding from snapshots, rollovers and broker
# expiry under short leases, plain records; long enough for leases to end (expired certs).
ATTACKED = {
    "events": 400,
    "partitions": 4,
    "producers": 2,
    "drop_p": 0.2,
    "dup_p": 0.2,
    "reorder": 5,
    "crash_p": 0.0,
    "restart_p": 0.3,
    "plain_p": 0.05,
    "lifetime_ms": 960,
    "checkpoint_every": 6,
    "attack_p": 0.08,
}
ATTACKED_SEEDS = range(8)
REASONS = (
    "missing",
    "malformed",
    "wrong_length",
    "other_identity",
    "expired",
    "unknown_key",
    "other_place",
)


def assert_refused(result: SimResult) -> None:
    """Every attacker record was judged FORGED, and there were some."""
    wrong = [(f, v) for f, v in result.forgeries if v != "FORGED"]
    assert not wrong, f"{result.describe()}\nnot FORGED: {wrong[:5]}"
    assert result.stats["forged_caught"] == result.stats["forged_sent"] > 0, result.describe()


@pytest.fixture(scope="module")
def attacked() -> list[SimResult]:
    """The attacked schedules, run once for the checks below."""
    # Half of them on a LogAppendTime topic, where the attacker also back-dates.
    return [run(seed, **ATTACKED, log_append_time=seed % 2 == 1) for seed in ATTACKED_SEEDS]


def test_every_forgery_is_forged_and_every_event_lands_once(attacked: list[SimResult]) -> None:
    for result in attacked:
        assert_clean(result)
        assert_refused(result)
        assert result.ok
        # Nothing of the attacker's reached the output log.
        assert not [v for v in result.log["value"].to_pylist() if v.startswith(b"attack:")]


def test_every_attack_and_every_reason_happens(attacked: list[SimResult]) -> None:
    sent = {kind: sum(r.stats.get(f"attack_{kind}", 0) for r in attacked) for kind in ATTACKS}
    assert all(sent.values()), sent
    reasons = {
        why: sum(r.stats.get(f"forged_reason_{why}", 0) for r in attacked) for why in REASONS
    }
    assert all(reasons.values()), reasons
    # Every FORGED verdict is counted under a reason (the sink's per-batch line), and the
    # legitimate producers' records never needed one here.
    for result in attacked:
        counted = sum(result.stats.get(f"forged_reason_{why}", 0) for why in (*REASONS, "replayed"))
        assert counted == result.stats["verdict_FORGED"] == result.stats["forged_sent"]
        assert result.stats["forged_legit"] == 0


def _followed(result: SimResult, forgery: Forgery) -> bool:
    """The forged FENCE's pid had records appended on that partition before and after it."""
    rows = zip(
        result.log["pid"].to_pylist(),
        result.log["partition"].to_pylist(),
        result.log["offset"].to_pylist(),
        strict=True,
    )
    offsets = [o for pid, p, o in rows if pid == forgery.pid and p == forgery.partition]
    return any(o < forgery.offset for o in offsets) and any(o > forgery.offset for o in offsets)


def test_forged_fences_hit_live_producers(attacked: list[SimResult]) -> None:
    """The forged FENCEs target live pids one generation ahead, which then go on appending."""
    for result in attacked:
        fences = [f for f, _ in result.forgeries if f.attack.startswith("fence_")]
        live = [f for f in fences if f.attack != "fence_expired"]
        assert live, result.describe()
        assert any(_followed(result, f) for f in live), result.describe()


def test_an_unsigned_fence_several_generations_ahead_is_refused_like_a_resumes_own() -> None:
    """Seeds 144 and 152 of the one-chain world under attack: a forged ``FENCE`` without
    ``pfc`` met a partition the pid had not written since an earlier bump, so it stood two
    generations ahead there. The rules say ``INVALID_GENERATION``, as for the unsigned
    intermediate FENCEs a resume writes; it changes nothing, and the run is clean."""
    for seed in (144, 152):
        result = run(seed, **{**ONE_CHAIN, "attack_p": 0.1})
        assert result.ok, result.describe()
        leaps = [f for f, v in result.forgeries if v == "INVALID_GENERATION"]
        assert [f.attack for f in leaps] == ["fence_none"], result.describe()


def test_without_verification_the_attacker_is_caught() -> None:
    """Mutation ``no_verify`` (sink without ``leasePublicKey``): the same attacks do harm, and
    the judges see it: forged FENCEs fence the real producers (``event_lost``) and fresh pids'
    records are appended (the upstream comparison fails)."""
    results = [run(seed, **ATTACKED, mutation="no_verify") for seed in ATTACKED_SEEDS]
    assert all(not r.ok for r in results), [r.report.summary() for r in results]
    assert all(r.stats.get("verdict_FORGED", 0) == 0 for r in results)
    lost = [r for r in results if r.report.findings["event_lost"].count > 0]
    assert lost, [r.report.summary() for r in results]
    assert all(not r.report.ok for r in lost)
    appended = [
        r for r in results if any(v.startswith(b"attack:") for v in r.log["value"].to_pylist())
    ]
    assert appended and all(not r.exactly_once for r in appended)


#: The simulation's schedules without crashes, zombies, pauses or lease outages, with attacks.
ATTACK_KNOBS = knob_space(
    without=("crash_p", "zombie_p", "pause_p", "down_p", "double_p"),
    events=st.integers(1, 200),
    drop_p=st.sampled_from([0.0, 0.2, 0.5]),
    dup_p=st.sampled_from([0.0, 0.2, 0.5]),
    lifetime_ms=st.sampled_from([1_920, 3_000, 10**8]),
    attack_p=st.sampled_from([0.02, 0.1, 0.5]),
    crash_p=st.just(0.0),
)


@explored(60)
@given(seed=SEEDS, knobs=ATTACK_KNOBS)
def test_every_attacked_schedule_is_exactly_once(seed: int, knobs: dict[str, Any]) -> None:
    result = judged(seed, **knobs)
    assert_clean(result)
    wrong = [(f, v) for f, v in result.forgeries if v != "FORGED"]
    assert not wrong, f"{result.describe()}\nnot FORGED: {wrong[:5]}"


# --- with producer crashes: the sink and the producers' recovery scan refuse every forgery -----

CRASHING = {
    "events": 150,
    "partitions": 3,
    "producers": 2,
    "crash_p": 0.05,
    "zombie_p": 0.5,
    "pause_p": 0.3,
    "restart_p": 0.3,
    "lifetime_ms": 960,
    "dup_p": 0.1,
    "drop_p": 0.1,
    "reorder": 4,
    "attack_p": 0.05,
}


def test_sink_refuses_every_forgery_under_crashes_and_zombies() -> None:
    for seed in range(8):
        result = run(seed, **CRASHING)
        assert_refused(result)
        assert not [v for v in result.log["value"].to_pylist() if v.startswith(b"attack:")]


@pytest.mark.parametrize("seed", range(8))
def test_forged_fences_do_not_mislead_the_recovery_scan(seed: int) -> None:
    # A resumer's recovery scan checks pfc as the sink does (ProducerConfig.lease_public_keys):
    # a forged FENCE in the scanned range no longer makes it believe its predecessor's later
    # records were fenced, so its successor pid re-sends nothing twice.
    result = run(seed, **CRASHING)
    assert_refused(result)
    assert_clean(result)


@pytest.mark.parametrize("seed", [3, 7])
def test_a_trusting_recovery_scan_is_caught(seed: int) -> None:
    # The mutation: the scan believes every header (the producer before the fix, or one
    # without lease_public_keys). On these seeds a forged FENCE misleads it and an event is
    # appended twice under the successor pid; the event-level checker sees it.
    result = run(seed, **CRASHING, mutation="trusting_scan")
    assert_refused(result)  # the sink still refuses every forgery
    assert result.report.findings["event_duplicate"].count > 0, result.describe()


# --- the sink's memoized certificate check answers as verify_cert does ------------------------


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(
    pid=st.integers(1, 5),
    generation=st.integers(0, 3),
    cert_pid=st.integers(1, 5),
    cert_generation=st.integers(0, 3),
    expire_ms=st.integers(0, 100),
    times=st.lists(st.integers(-10, 200), min_size=1, max_size=6),
    foreign=st.booleans(),
)
def test_memoized_placed_check_matches_verify_cert(
    pid: int,
    generation: int,
    cert_pid: int,
    cert_generation: int,
    expire_ms: int,
    times: list[int],
    foreign: bool,
) -> None:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    from pidfence.wire.cert import encode_cert, verify_cert
    from pidfence.wire.statement import PlacedCheck, encode_placed_pfc

    keys = [Ed25519PrivateKey.from_private_bytes(bytes([i]) * 32) for i in (1, 2)]
    signer = keys[1] if foreign else keys[0]
    producer = Ed25519PrivateKey.from_private_bytes(bytes([3]) * 32)
    raw = producer.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    # The certificate's own answer, memoized across times.
    cert = encode_cert(signer, cert_pid, cert_generation, expire_ms, producer_key=raw)
    pfc = encode_placed_pfc(cert, producer, "sim", 0, pid, generation, 0, 0)
    public = [keys[0].public_key()]
    verify = PlacedCheck(public).for_partition("sim", 0)
    for now in times:
        direct = verify_cert(cert, public, pid, generation, now)
        assert verify(pid, generation, 0, 0, pfc, now) == (None if direct.ok else direct.reason)
    assert verify(pid, generation, 0, 0, None, 0) == "missing"
    assert verify(pid, generation, 0, 0, cert, 0) == "malformed"  # a certificate on its own
