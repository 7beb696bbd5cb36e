"""Issue 11: the sink's state is a function of its committed output (no Spark; the writer's
``write``/``commit`` are driven directly, as Spark's driver and tasks would).

Lost or damaged state files, re-runs of committed batches, skewed clocks and a second query on the
same path change nothing of what the sink commits.
"""

from __future__ import annotations

import random
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pidfence.broker_plugin import CorruptSnapshot, ProducerStateTable
from pidfence.spark_sink import fold as fold_mod
from pidfence.spark_sink import positions as positions_mod
from pidfence.spark_sink import read_log, read_rejects
from pidfence.spark_sink import writer as writer_mod
from pidfence.spark_sink.delta.table import OWN_DIR
from pidfence.spark_sink.errors import CommittedBatchMismatch, OutputOwnedError
from pidfence.spark_sink.options import SinkOptions
from pidfence.spark_sink.output import Output
from pidfence.spark_sink.state import load_state
from pidfence.spark_sink.storage import Store
from pidfence.spark_sink.writer import PidfenceStreamWriter, SinkCommitMessage
from pidfence.wire import FLAG_FENCE, encode_pf
from tests.unit.broker_streams import StreamKnobs, make_stream
from tests.unit.test_sink_process import Record, kafka_rows

QUERY_A = "aaaaaaaa-0000-query-a"
QUERY_B = "bbbbbbbb-1111-query-b"
MINUTE = 60_000


def options(path: Path, **extra: str) -> SinkOptions:
    return SinkOptions.parse({"path": str(path), "compactEvery": "2", **extra})


@contextmanager
def task(batch: int, query: str = QUERY_A) -> Iterator[None]:
    with mock.patch.object(writer_mod, "_task_context", lambda: (batch, 0, query)):
        yield


def write(
    w: PidfenceStreamWriter, batch: int, rows: pa.Table, query: str = QUERY_A
) -> SinkCommitMessage:
    with task(batch, query):
        return w.write(iter(rows.to_batches(max_chunksize=13)))


def run_batch(w: PidfenceStreamWriter, batch: int, records: list[Record]) -> None:
    w.commit([write(w, batch, kafka_rows(records))], batch)


def output(path: Path) -> tuple[pa.Table, pa.Table]:
    return read_log(str(path)), read_rejects(str(path))


def live_state(path: Path, opts: SinkOptions, batch: int) -> ProducerStateTable:
    return load_state(Output(opts.path, opts.rejects_path, QUERY_A), "t", 0, batch, opts).table


def damage(path: Path, mode: str, rng: random.Random) -> None:
    """Lose or break the newest state files of partition t~0."""
    folder = path / OWN_DIR / "_state" / "t~0"
    files = sorted(folder.iterdir()) if folder.exists() else []
    if not files:
        return
    if mode == "all":
        for f in files:
            f.unlink()
    elif mode == "newest":
        for f in files[-rng.randrange(1, len(files) + 1) :]:
            f.unlink()
    else:
        f = files[-1]
        f.write_bytes(f.read_bytes()[:-5] + b"xxxxx")


@contextmanager
def calls_of(obj: Any, name: str) -> Iterator[list[int]]:
    """The first argument of every call of ``obj.name`` while the block runs (it still runs)."""
    seen: list[int] = []
    real = getattr(obj, name)

    def counted(first: int, *rest: Any) -> Any:
        seen.append(first)
        return real(first, *rest)

    with mock.patch.object(obj, name, side_effect=counted):
        yield seen


def records_of(stream: list[tuple[bytes | None, int]]) -> list[Record]:
    return [(i, header, ts) for i, (header, ts) in enumerate(stream)]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.integers(0, 2**32),
    st.lists(st.integers(1, 70), min_size=2, max_size=7),
    st.integers(0, 6),
    st.sampled_from(["all", "newest", "corrupt"]),
    st.booleans(),
    st.integers(200, 3000),
)
def test_lost_state_files_change_nothing(
    seed: int, cuts: list[int], at: int, mode: str, flush: bool, lifetime: int
) -> None:
    """Two outputs read the same stream; one loses state files between two batches. Logs,
    rejects and the state after every later batch are identical (DESIGN §4 amended)."""
    knobs = StreamKnobs(
        pids=5,
        records=sum(cuts) + 40,
        dup_rate=0.15,
        swap_rate=0.1,
        bump_rate=0.05,
        zombie_rate=0.05,
        fence_rate=0.04,
        odd_rate=0.1,
        ts_step_max=40,
        ts_back_rate=0.1,
        resend_rate=0.05,
        skew_rate=0.05,
        skew_ms=2000,
    )
    rng = random.Random(seed)
    recs = records_of(make_stream(rng, knobs))
    extra = {
        "lifetime": str(lifetime),
        "timestampSkew": "0",
        "reorderWindow": "3",
        "capacity": "4",
        "flushHeld": str(flush).lower(),
    }
    with tempfile.TemporaryDirectory() as tmp:
        a, b = Path(tmp) / "a", Path(tmp) / "b"
        wa, wb = (
            PidfenceStreamWriter(options(a, **extra)),
            PidfenceStreamWriter(options(b, **extra)),
        )
        start = 0
        bounds = [*cuts, len(recs)]
        for batch, size in enumerate(bounds):
            chunk = recs[start : start + size]
            start += size
            if batch == at:
                damage(b, mode, rng)
            run_batch(wa, batch, chunk)
            run_batch(wb, batch, chunk)
            assert live_state(b, wb.options, batch + 1) == live_state(a, wa.options, batch + 1)
            if start >= len(recs):
                break
        log_a, rej_a = output(a)
        log_b, rej_b = output(b)
        assert log_b.equals(log_a)
        assert rej_b.equals(rej_a)


def test_a_record_held_across_the_cut_survives_losing_every_state_file(tmp_path: Path) -> None:
    opts = {"reorderWindow": "3", "lifetime": "1000000"}
    a, b = tmp_path / "a", tmp_path / "b"
    wa, wb = PidfenceStreamWriter(options(a, **opts)), PidfenceStreamWriter(options(b, **opts))
    first: list[Record] = [(0, encode_pf(1, 0, 0), 1), (1, encode_pf(1, 0, 2), 2)]
    second: list[Record] = [(2, encode_pf(1, 0, 1), 3)]
    for w in (wa, wb):
        run_batch(w, 0, first)
    damage(b, "all", random.Random(0))
    for w in (wa, wb):
        run_batch(w, 1, second)
    assert read_log(str(b))["offset"].to_pylist() == [0, 2, 1]
    assert output(b)[0].equals(output(a)[0])


def test_a_store_timeout_reading_state_fails_the_task_instead_of_rebuilding(
    tmp_path: Path,
) -> None:
    """A timeout is not a lost file: the task fails (Spark retries it) rather than walking the
    partition's whole history to rebuild its state."""
    opts = options(tmp_path)
    w = PidfenceStreamWriter(opts)
    run_batch(w, 0, [(0, encode_pf(1, 0, 0), 1), (1, encode_pf(1, 0, 1), 2)])
    read = Store.read

    def timing_out(self: Store, path: str) -> bytes:
        if "/_state/" in path:
            raise TimeoutError("the store did not answer")
        return read(self, path)

    with (
        mock.patch.object(Store, "read", timing_out),
        mock.patch("pidfence.spark_sink.state._rebuild") as rebuild,
        pytest.raises(TimeoutError),
    ):
        live_state(tmp_path, opts, 1)
    rebuild.assert_not_called()


def test_a_skewed_header_less_record_does_not_expire_the_live_producer(tmp_path: Path) -> None:
    # Issue 11 finding 3: lifetime 30 min, a header-less record 40 min ahead (Kafka accepts up to
    # 1 h by default), then the live producer's next records: all appended.
    w = PidfenceStreamWriter(options(tmp_path, lifetime="30m"))
    t0 = 1_700_000_000_000
    run_batch(w, 0, [(0, encode_pf(9, 1, 0), t0), (1, None, t0 + 40 * MINUTE)])
    run_batch(
        w, 1, [(2, encode_pf(9, 1, 1), t0 + MINUTE), (3, encode_pf(9, 1, 2), t0 + 2 * MINUTE)]
    )
    assert read_log(str(tmp_path))["offset"].to_pylist() == [0, 1, 2, 3]
    assert read_rejects(str(tmp_path)).num_rows == 0


def _files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def test_a_committed_batch_re_run_with_other_options_writes_nothing(tmp_path: Path) -> None:
    recs = records_of(make_stream(random.Random(5), StreamKnobs(pids=6, records=120)))
    w = PidfenceStreamWriter(options(tmp_path, capacity="6"))
    run_batch(w, 0, recs[:60])
    run_batch(w, 1, recs[60:])
    before = _files(tmp_path)
    # Spark re-runs batch 1 (driver died after the manifest) with capacity lowered to 1.
    rerun = PidfenceStreamWriter(options(tmp_path, capacity="1"))
    message = write(rerun, 1, kafka_rows(recs[60:]))
    assert message.committed and {p.rows_in for p in message.parts} == {60}
    rerun.commit([message], 1)
    assert _files(tmp_path) == before
    # The same batch id with Kafka offsets past its manifest's fails loudly and writes nothing.
    with pytest.raises(CommittedBatchMismatch, match="re-ran it"):
        write(rerun, 1, kafka_rows([(o + 1, h, t) for o, h, t in recs[60:]]))
    assert _files(tmp_path) == before


def test_a_committed_batch_re_run_after_retention_trimmed_its_head_writes_nothing(
    tmp_path: Path,
) -> None:
    """Batch 1 committed, the driver died before Spark's commit log said so, and Kafka's
    retention deleted the head of its range meanwhile: with --allow-data-loss Spark re-runs it
    over what is left. That failed every rerun with CommittedBatchMismatch (exit 3, "the
    checkpoint does not belong to this output path"): no way on but a new output."""
    recs = records_of(make_stream(random.Random(5), StreamKnobs(pids=6, records=120)))
    w = PidfenceStreamWriter(options(tmp_path))
    run_batch(w, 0, recs[:60])
    run_batch(w, 1, recs[60:])
    before, rows = _files(tmp_path), output(tmp_path)
    message = write(w, 1, kafka_rows(recs[75:]))
    assert message.committed and {p.rows_in for p in message.parts} == {60}
    w.commit([message], 1)
    assert _files(tmp_path) == before and output(tmp_path) == rows


def test_a_reader_of_history_sees_every_batch_though_the_sink_folds_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Output.manifests (read_written, read_gaps, verify's data files) listed the segments,
    then the live manifests: batches a fold moved in between were in neither, and were skipped
    without a word. Folds here every 8 batches (INDEX_EVERY) instead of every 64."""
    for module in (writer_mod, positions_mod, fold_mod):
        monkeypatch.setattr(module, "INDEX_EVERY", 8)
    w = PidfenceStreamWriter(options(tmp_path, retainBatches="2"))
    for batch in range(16):  # the fold at 8 folded 0-5
        run_batch(w, batch, [(batch, encode_pf(7, 0, batch), 1_000 + batch)])
    reader = Output.reading(str(tmp_path)).manifests()
    seen = [next(reader).batch]  # part-way through the segments
    run_batch(w, 16, [(16, encode_pf(7, 0, 16), 1_016)])  # folds 6-13
    seen += [m.batch for m in reader]
    assert seen == list(range(16))  # every batch committed before the read began, in order
    assert [m.batch for m in Output.reading(str(tmp_path)).manifests()] == list(range(17))


def test_a_crashed_attempt_is_never_visible_and_its_files_are_cleaned(tmp_path: Path) -> None:
    recs = records_of(make_stream(random.Random(6), StreamKnobs(pids=3, records=80)))
    w = PidfenceStreamWriter(options(tmp_path))
    run_batch(w, 0, recs[:40])
    visible = output(tmp_path)
    dead = write(w, 1, kafka_rows(recs[40:]))  # attempt dies before the manifest
    assert output(tmp_path)[0].equals(visible[0])
    run_batch(w, 1, recs[40:])  # the re-run commits under its own file names
    names = {p.name for p in (tmp_path / "data" / QUERY_A / f"{1:020d}").iterdir()}
    assert len(names) == 1 and dead.tag is not None and dead.tag not in next(iter(names))


def test_a_failed_attempts_full_snapshot_never_costs_the_committed_chain(tmp_path: Path) -> None:
    """An attempt that rebuilt its state (and so wrote a full snapshot) then died leaves that
    snapshot behind; the committed chain's base stays, so losing the newest state later replays
    a few batches, not the output's whole history."""
    from pidfence.spark_sink import state as state_mod

    recs = records_of(make_stream(random.Random(3), StreamKnobs(pids=3, records=200)))
    w = PidfenceStreamWriter(options(tmp_path))  # a full snapshot every third batch
    for batch in range(4):
        run_batch(w, batch, recs[batch * 20 : batch * 20 + 20])
    chunk = kafka_rows(recs[80:100])
    real = state_mod._restore_chain
    with mock.patch.object(state_mod, "_restore_chain", side_effect=CorruptSnapshot("lost")):
        write(w, 4, chunk)  # rebuilt, so a full snapshot; dies before its manifest
    with mock.patch.object(state_mod, "_restore_chain", side_effect=real):
        w.commit([write(w, 4, chunk)], 4)  # the re-run continues the committed chain
    for batch in range(5, 8):
        run_batch(w, batch, recs[batch * 20 : batch * 20 + 20])
    folder = tmp_path / OWN_DIR / "_state" / "t~0"
    newest_full = max(folder.glob("*.full"))
    newest_full.unlink()
    out = Output(w.options.path, w.options.rejects_path, QUERY_A)
    with calls_of(out, "read_decided") as replayed:
        rebuilt = load_state(out, "t", 0, 8, w.options)
    assert replayed and min(replayed) >= 4, replayed  # from the older committed chain's end
    assert rebuilt.table == live_state(tmp_path, w.options, 8)


def test_a_rebuild_reads_the_history_only_back_to_an_intact_chain(tmp_path: Path) -> None:
    recs = records_of(make_stream(random.Random(4), StreamKnobs(pids=3, records=240)))
    w = PidfenceStreamWriter(options(tmp_path))
    for batch in range(12):
        run_batch(w, batch, recs[batch * 20 : batch * 20 + 20])
    folder = tmp_path / OWN_DIR / "_state" / "t~0"
    max(folder.glob("*.full")).unlink()
    out = Output(w.options.path, w.options.rejects_path, QUERY_A)
    with calls_of(out, "committed") as read:
        rebuilt = load_state(out, "t", 0, 12, w.options)
    assert read and min(read) >= 6, read  # not every manifest back to batch 0
    assert rebuilt.table == live_state(tmp_path, w.options, 12)


def test_a_second_query_on_the_path_fails_at_start_and_deletes_nothing(tmp_path: Path) -> None:
    # Issue 11 finding 6: the second query's start-up cleanup deleted the first one's batch.
    recs = records_of(make_stream(random.Random(7), StreamKnobs(pids=3, records=60)))
    a = PidfenceStreamWriter(options(tmp_path), query_id=QUERY_A)
    run_batch(a, 0, recs[:30])
    in_flight = write(a, 1, kafka_rows(recs[30:]))  # A's batch 1 is being written
    staged = _files(tmp_path)
    with pytest.raises(OutputOwnedError, match="belongs to streaming query"):
        PidfenceStreamWriter(options(tmp_path), query_id=QUERY_B)
    with pytest.raises(OutputOwnedError):
        write(a, 2, kafka_rows(recs[30:]), query=QUERY_B)  # its tasks are refused too
    assert _files(tmp_path) == staged
    a.commit([in_flight], 1)
    assert read_log(str(tmp_path)).num_rows > 0
    # A restart of the same query takes over and cleans only its own unfinished batch.
    PidfenceStreamWriter(options(tmp_path), query_id=QUERY_A)


def test_manifest_index_gives_the_same_positions_as_the_manifests(tmp_path: Path) -> None:
    from pidfence.spark_sink.positions import INDEX_EVERY

    recs = records_of(make_stream(random.Random(8), StreamKnobs(pids=3, records=400)))
    w = PidfenceStreamWriter(options(tmp_path))
    two = [(o, h, t) for o, h, t in recs]
    for batch in range(INDEX_EVERY + 5):
        chunk = two[batch * 3 : batch * 3 + 3]
        if batch % 7 == 3:
            w.commit([write(w, batch, kafka_rows(chunk, "t", 1))], batch)  # t~0 idle
        else:
            run_batch(w, batch, chunk)
    layout = Output(str(tmp_path), str(tmp_path / "_rejects"), QUERY_A)
    index = tmp_path / OWN_DIR / "_manifests" / "_index"
    assert (index / "latest").read_text() == str(INDEX_EVERY)
    indexed = layout.positions(INDEX_EVERY + 4)
    (index / "latest").unlink()
    positions_mod._KNOWN.clear()  # this process's positions: found again from the manifests
    assert layout.positions(INDEX_EVERY + 4) == indexed


def test_an_index_pointer_moved_back_costs_no_walk_from_batch_zero(tmp_path: Path) -> None:
    """``latest`` is replaced, not compared-and-set: an instance stalled since batch 0's index
    may point it back after the owner deleted that index (it keeps two). Positions then come
    from the index of the batch's own period, not from every manifest since batch 0."""
    from pidfence.spark_sink.positions import INDEX_EVERY

    recs = records_of(make_stream(random.Random(9), StreamKnobs(pids=2, records=300)))
    w = PidfenceStreamWriter(options(tmp_path))
    last = 2 * INDEX_EVERY + 8
    for batch in range(last + 1):
        run_batch(w, batch, recs[batch * 2 : batch * 2 + 2])
    index = tmp_path / OWN_DIR / "_manifests" / "_index"
    assert not (index / f"{0:020d}.json").exists()  # the owner keeps two indexes
    out = Output(w.options.path, w.options.rejects_path, QUERY_A)
    expected = out.positions(last)
    (index / "latest").write_text("0")  # the stalled instance's late write
    positions_mod._KNOWN.clear()
    with calls_of(out, "committed") as read:
        assert out.positions(last) == expected
    assert len(read) <= INDEX_EVERY, read


def test_signed_generations_through_the_sink(tmp_path: Path) -> None:
    """Issue 13: an attacker's FENCE for a live pid (no pfc, pfc of another key) and fresh pids
    (same two ways) are FORGED; every record of the legit producer is appended in order."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    from pidfence.wire.cert import encode_cert, generate_keypair, load_private_key
    from pidfence.wire.statement import encode_placed_pfc

    old_priv, old_pub = generate_keypair(tmp_path / "keys-old")
    priv, pub = generate_keypair(tmp_path / "keys")
    key = load_private_key(priv)
    rogue = Ed25519PrivateKey.generate()
    producer = Ed25519PrivateKey.generate()
    raw = producer.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    t0 = 1_700_000_000_000
    expire = t0 + 3_600_000

    def pfc(signer: Ed25519PrivateKey, pid: int, gen: int, seq: int, flags: int = 0) -> bytes:
        """A placed pfc for (pid, gen) whose certificate ``signer`` signed."""
        cert = encode_cert(signer, pid, gen, expire, producer_key=raw)
        return encode_placed_pfc(cert, producer, "t", 0, pid, gen, seq, flags)

    live = [encode_pf(5, 2, s) for s in range(6)]
    replayed = encode_placed_pfc(  # generation 2's certificate on a generation 3 FENCE
        encode_cert(key, 5, 2, expire, producer_key=raw), producer, "t", 0, 5, 3, 4, FLAG_FENCE
    )
    recs: list[tuple[int, bytes | None, int, bytes | None]] = [
        (0, live[0], t0, pfc(key, 5, 2, 0)),
        (1, live[1], t0 + 1, None),
        (2, encode_pf(5, 3, 2, FLAG_FENCE), t0 + 2, None),  # forged FENCE, no pfc
        (3, live[2], t0 + 3, None),
        (4, encode_pf(5, 3, 3, FLAG_FENCE), t0 + 4, pfc(rogue, 5, 3, 3, FLAG_FENCE)),
        (5, live[3], t0 + 5, None),
        (6, encode_pf(77, 0, 0), t0 + 6, None),  # fresh pid, no pfc
        (7, encode_pf(78, 0, 0), t0 + 7, pfc(rogue, 78, 0, 0)),
        (8, live[4], t0 + 8, None),
        (9, encode_pf(5, 3, 4, FLAG_FENCE), t0 + 9, replayed),
        (10, live[5], t0 + 10, None),
    ]
    rows = kafka_rows([(o, h, t) for o, h, t, _ in recs])
    headers = [
        [{"key": "pf", "value": h}] + ([{"key": "pfc", "value": c}] if c is not None else [])
        for _, h, _, c in recs
    ]
    rows = rows.set_column(
        rows.schema.get_field_index("headers"),
        "headers",
        pa.array(headers, rows.schema.field("headers").type),
    )
    # Two keys, as during a rotation.
    out = tmp_path / "out"
    w = PidfenceStreamWriter(options(out, leasePublicKey=f"{old_pub},{pub}"))
    w.commit([write(w, 0, rows.slice(0, 5))], 0)
    w.commit([write(w, 1, rows.slice(5))], 1)
    log = read_log(str(out))
    assert log["offset"].to_pylist() == [0, 1, 3, 5, 8, 10]
    assert log["seq"].to_pylist() == list(range(6))
    rej = read_rejects(str(out))
    assert rej["offset"].to_pylist() == [2, 4, 6, 7, 9]
    assert set(rej["verdict"].to_pylist()) == {"FORGED"}
    manifests = [Output(str(out), str(out / "_rejects"), QUERY_A).committed(b) for b in (0, 1)]
    forged: dict[str, Any] = {}
    for m in manifests:
        assert m is not None
        for reason, n in m.parts[0].forged.items():
            forged[reason] = forged.get(reason, 0) + n
    assert forged == {"missing": 2, "unknown_key": 2, "other_identity": 1}
    del old_priv
