"""The recovery scan checks ``pfc`` as the verifying sink does (issue 13's scan gap)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pidfence.producer import ProducerCheckpoint, ProducerConfig, Sequencer
from pidfence.producer.errors import ProducerConfigError
from pidfence.producer.recovery import ScanState, scan_keys, scan_state
from pidfence.wire import FLAG_FENCE, PF_HEADER_KEY, encode_pf
from pidfence.wire.cert import CERT_HEADER_KEY

TP = ("t", 0)
PID, GEN = 7, 3


def only_ok(
    pid: int, generation: int, seq: int, flags: int, cert: bytes | None, now_ms: int
) -> str | None:
    """A stand-in for a partition's placed check: b"ok" proves anything, nothing else does."""
    return None if cert == b"ok" else "missing"


def per_partition(topic: str, partition: int) -> Any:
    """The scan's verifier factory: the same stand-in on every partition."""
    return only_ok


def feed(state: ScanState, forged_cert: bytes | None) -> None:
    """Seqs 0..4 of the pid, an attacker's FENCE one generation ahead, then seqs 5..9."""
    for seq in range(5):
        state.note(TP, [(PF_HEADER_KEY, encode_pf(PID, GEN, seq))], 1000)
    forged = [(PF_HEADER_KEY, encode_pf(PID, GEN + 1, 0, FLAG_FENCE))]
    if forged_cert is not None:
        forged.append((CERT_HEADER_KEY, forged_cert))
    state.note(TP, forged, 1000)
    for seq in range(5, 10):
        state.note(TP, [(PF_HEADER_KEY, encode_pf(PID, GEN, seq))], 1000)


@pytest.mark.parametrize("forged_cert", [None, b"signed by someone else"])
def test_a_forged_fence_does_not_fence_the_pids_later_records(forged_cert: bytes | None) -> None:
    state = ScanState({PID}, {PID: {TP: -1}}, {PID: GEN}, verifier=per_partition)
    feed(state, forged_cert)
    assert state.highs[PID][TP] == 9  # what a verifying sink appended


def test_without_a_verifier_the_scan_believes_the_forgery() -> None:
    # Why the option exists: the same topic read trustingly hides seqs 5..9, so a resumer
    # under a successor pid would send those events again.
    state = ScanState({PID}, {PID: {TP: -1}}, {PID: GEN})
    feed(state, None)
    assert state.highs[PID][TP] == 4


def test_a_proven_fence_still_fences() -> None:
    state = ScanState({PID}, {PID: {TP: -1}}, {PID: GEN}, verifier=per_partition)
    feed(state, b"ok")
    assert state.highs[PID][TP] == 4


def test_a_record_stamped_after_the_checkpoints_lease_ended_never_counts() -> None:
    # A topic writer copies the pid's first record of a partition after its lease ended: a
    # sink whose entry expired calls it FORGED. Counted, the resumer's successor would skip the
    # event behind that seq (simulation seed 182 of ONE_CHAIN with an attacker lost one).
    ends = {PID: (GEN, 5_000)}
    late = ScanState({PID}, {PID: {}}, {PID: GEN}, verifier=per_partition, lease_ends=ends)
    late.note(TP, [(PF_HEADER_KEY, encode_pf(PID, GEN, 0)), (CERT_HEADER_KEY, b"ok")], 5_001)
    assert TP not in late.highs[PID]
    # Inside the lease, and at the next generation (a resume's bump), records count.
    live = ScanState({PID}, {PID: {}}, {PID: GEN}, verifier=per_partition, lease_ends=ends)
    live.note(TP, [(PF_HEADER_KEY, encode_pf(PID, GEN, 0)), (CERT_HEADER_KEY, b"ok")], 5_000)
    live.note(TP, [(PF_HEADER_KEY, encode_pf(PID, GEN + 1, 1)), (CERT_HEADER_KEY, b"ok")], 9_000)
    assert live.highs[PID][TP] == 1


def test_the_resumes_scan_allows_records_stamped_late_after_the_lease_end() -> None:
    checkpoint = ProducerCheckpoint(PID, GEN, expire_ms=5_000, next_seq={TP: 2}, taken_ms=1)
    state = scan_state(checkpoint, PID, late_ms=100)
    state.note(TP, [(PF_HEADER_KEY, encode_pf(PID, GEN, 2))], 5_100)
    state.note(TP, [(PF_HEADER_KEY, encode_pf(PID, GEN, 3))], 5_101)
    assert state.highs[PID][TP] == 2


def test_the_scan_counts_a_lease_s_records_until_the_sinks_entry_could_end() -> None:
    """A sink keeps an entry its timestamp skew (1 h) past the lease: a late copy the sink
    still appends counts (or a record of the pid stamped late: librdkafka's message timeout
    with LogAppendTime)."""
    assert ProducerConfig("k:9").scan_late_ms == 3_600_000
    assert ProducerConfig("k:9", sink_timestamp_skew_ms=0).scan_late_ms == 305_000
    long_wait = ProducerConfig("k:9", message_timeout_ms=7_200_000, sink_timestamp_skew_ms=0)
    assert long_wait.scan_late_ms == 7_205_000


def test_librdkafkas_alias_of_the_message_timeout_is_refused_in_extra() -> None:
    """``delivery.timeout.ms`` through ``extra=`` overrode ``message_timeout_ms``: records could
    land later than the scan and the rollover margin allow for."""
    with pytest.raises(ProducerConfigError, match=r"delivery\.timeout\.ms"):
        ProducerConfig("k:9", extra={"delivery.timeout.ms": 600_000})


def test_config_takes_one_path_or_several_and_reports_a_bad_key_on_resume(
    tmp_path: Path,
) -> None:
    one = ProducerConfig("127.0.0.1:9", lease_public_keys="a.pub")  # type: ignore[arg-type]
    assert one.lease_public_keys == ("a.pub",)
    two = ProducerConfig("127.0.0.1:9", lease_public_keys=["a.pub", "b.pub"])  # type: ignore[arg-type]
    assert two.lease_public_keys == ("a.pub", "b.pub")
    from tests.unit.producer_kit import Rig

    bad = tmp_path / "bad.pub"
    bad.write_text("not a key")
    rig = Rig()
    first = rig.producer()
    first.produce("t", b"a", partition=0)
    first.flush()
    checkpoint = first.checkpoint()
    rig.config = ProducerConfig("127.0.0.1:9", lease_public_keys=(str(bad),))
    with pytest.raises(ProducerConfigError, match="lease_public_keys"):
        rig.resume(checkpoint)


def _first_records(state: ScanState) -> None:
    """Seqs 0..2 of the checkpoint's generation, none carrying a certificate."""
    for seq in range(3):
        state.note(TP, [(PF_HEADER_KEY, encode_pf(PID, GEN, seq))], 1000)


def test_after_a_fresh_leases_checkpoint_a_first_record_must_prove_itself() -> None:
    # Nothing FENCEd the partition: a verifying sink holds no entry there, so an uncertified
    # record at seq 0 (an injection) is FORGED and must not count as the pid's own.
    state = ScanState({PID}, {PID: {}}, {PID: GEN}, verifier=per_partition)
    _first_records(state)
    assert state.highs[PID].get(TP, -1) == -1


def test_where_the_checkpoint_fenced_the_sink_holds_an_entry_and_no_proof_is_asked() -> None:
    # The resume's FENCE of this generation landed there before the checkpoint: the sink
    # appends the pid's records without a certificate, and so must the scan (else the resumer
    # sends them again under another pid: a duplicate).
    state = ScanState({PID}, {PID: {}}, {PID: GEN}, verifier=per_partition, fenced={TP: GEN})
    _first_records(state)
    assert state.highs[PID][TP] == 2


def test_a_fence_of_an_older_generation_does_not_count() -> None:
    state = ScanState({PID}, {PID: {}}, {PID: GEN}, verifier=per_partition, fenced={TP: GEN - 1})
    _first_records(state)
    assert state.highs[PID].get(TP, -1) == -1


def test_a_first_record_past_a_head_that_never_reached_kafka_does_not_count() -> None:
    # A fresh pid's seq 0 timed out in librdkafka's queue; seqs 1..2 landed. A sink that read
    # the partition from before the pid started calls them UNKNOWN_PID, so counted, they made
    # the successor skip events nobody appended (simulation seed 114 lost 2).
    # Seqs 1..7: more than the reorder window behind the missing seq 0.
    state = ScanState({PID}, {PID: {}}, {PID: GEN})
    for seq in range(1, 8):
        state.note(TP, [(PF_HEADER_KEY, encode_pf(PID, GEN, seq))], 1000)
    assert state.highs[PID].get(TP, -1) == -1
    # Where retention deleted the partition's head since the checkpoint, seq 0 may be what
    # went, read by the sink before (or the sink adopted the pid beyond a horizon): they count,
    # past a hole at seq 0 (gap resolution), which the successor fills.
    trimmed = ScanState({PID}, {PID: {}}, {PID: GEN})
    trimmed.head_deleted(TP)
    for seq in range(1, 8):
        trimmed.note(TP, [(PF_HEADER_KEY, encode_pf(PID, GEN, seq))], 1000)
    assert trimmed.highs[PID][TP] == 7
    assert trimmed.holes[PID][TP] == [(0, 0)]


def test_a_resume_checks_each_pids_records_with_that_pids_mac_key() -> None:
    checkpoint = ProducerCheckpoint(5, 2, 99, {TP: 3}, mac_key=b"5" * 32)
    rolled = Sequencer(9, 0, 99)
    rolled.mac_key, rolled.prior_mac_key = b"9" * 32, b"7" * 32
    # The resume rolled past pid 7 (a successor of pid 5 whose lease had ended).
    assert scan_keys(checkpoint, rolled, followed=7) == {5: b"5" * 32, 7: b"7" * 32, 9: b"9" * 32}
    # Without a followed pid, the key of the roll's answer is the checkpoint's pid's.
    assert scan_keys(checkpoint, rolled) == {5: b"5" * 32, 9: b"9" * 32}
