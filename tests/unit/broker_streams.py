"""Random record streams for the broker-rules property tests, and the helpers that offer them
alike to the real table and to the reference model (:mod:`tests.unit.broker_reference`)."""

from __future__ import annotations

import random
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from hypothesis import strategies as st

from pidfence.broker_plugin import (
    Authority,
    BatchResult,
    Gap,
    ProducerStateTable,
    Verifier,
)
from pidfence.wire import (
    FLAG_FENCE,
    PidState,
    PidStatus,
    Verdict,
    decode_pf,
    encode_pf,
)
from pidfence.wire.cert import verify_cert
from tests.unit.broker_reference import ReferenceTable


@dataclass
class StreamKnobs:
    """How nasty a generated stream is."""

    pids: int = 4
    records: int = 200
    dup_rate: float = 0.1
    swap_rate: float = 0.05
    bump_rate: float = 0.03
    zombie_rate: float = 0.03
    fence_rate: float = 0.02
    odd_rate: float = 0.05
    ts_step_max: int = 50
    ts_back_rate: float = 0.05
    resend_rate: float = 0.02
    #: Records stamped up to ``skew_ms`` ahead (a producer's clock, or Kafka's 1 h allowance).
    skew_rate: float = 0.0
    skew_ms: int = 0
    #: A producer leaps 2-4 generations (killed after its bumps, before its checkpoint); half the
    #: time it then writes one FENCE per generation from its old one up (``resume``).
    leap_rate: float = 0.0
    #: A run of 1-12 of a producer's records never reaches the log (Kafka lost them).
    loss_rate: float = 0.0
    #: Share of producers whose head the reader never saw (they start at a seq up to 40).
    late_start_rate: float = 0.0


@dataclass
class _Producer:
    pid: int
    generation: int
    next_seq: int = 0
    sent: list[tuple[int, int]] = field(default_factory=list)


def make_stream(rng: random.Random, knobs: StreamKnobs) -> list[tuple[bytes | None, int]]:
    """(pf header or None, ts_ms) records: in order with duplicates, reorders, bumps, zombies."""
    producers = [_Producer(pid=i + 1, generation=rng.randrange(0, 10)) for i in range(knobs.pids)]
    for p in producers:
        if knobs.late_start_rate and rng.random() < knobs.late_start_rate:
            p.next_seq = rng.randrange(1, 41)
    out: list[tuple[bytes | None, int]] = []
    delayed: list[tuple[int, bytes]] = []  # (emit when len(out) reaches, header)
    ts = 1_000
    while len(out) < knobs.records:
        due = [d for d in delayed if d[0] <= len(out)]
        for d in due:
            delayed.remove(d)
            out.append((d[1], ts))
        ts += rng.randrange(0, knobs.ts_step_max + 1)
        stamp = ts - rng.randrange(0, 20) if rng.random() < knobs.ts_back_rate else ts
        if knobs.skew_ms and rng.random() < knobs.skew_rate:
            stamp = ts + rng.randrange(knobs.skew_ms)
        p = rng.choice(producers)
        roll = rng.random()
        if roll < knobs.odd_rate:
            kind = rng.randrange(5)
            if kind == 0:
                out.append((None, stamp))
            elif kind == 1:
                out.append((bytes(rng.randrange(256) for _ in range(rng.randrange(0, 12))), stamp))
            elif kind == 2:
                out.append((encode_pf(0, 0, rng.randrange(5)), stamp))
            elif kind == 3:  # unknown producer mid-stream
                out.append((encode_pf(1000 + rng.randrange(5), 0, rng.randrange(1, 9)), stamp))
            else:  # generation jump by two
                out.append((encode_pf(p.pid, p.generation + 2, p.next_seq), stamp))
            continue
        roll -= knobs.odd_rate
        if roll < knobs.dup_rate and p.sent:
            seq, gen = rng.choice(p.sent[-8:])
            out.append((encode_pf(p.pid, gen, seq), stamp))
            continue
        roll -= knobs.dup_rate
        if roll < knobs.bump_rate:
            p.generation += 1
            continue
        roll -= knobs.bump_rate
        if roll < knobs.zombie_rate and p.generation > 0:
            out.append((encode_pf(p.pid, p.generation - 1, p.next_seq), stamp))
            continue
        roll -= knobs.zombie_rate
        if roll < knobs.fence_rate:
            p.generation += 1
            out.append((encode_pf(p.pid, p.generation, p.next_seq, FLAG_FENCE), stamp))
            continue
        roll -= knobs.fence_rate
        if roll < knobs.resend_rate and p.next_seq:
            # Resume after a crash: a new generation re-sends its last records (pipelined, so
            # they may land in any order) while the old generation's copies may be held.
            p.generation += 1
            back = rng.randrange(1, min(4, p.next_seq) + 1)
            seqs = list(range(p.next_seq - back, p.next_seq))
            rng.shuffle(seqs)
            for seq in seqs:
                out.append((encode_pf(p.pid, p.generation, seq), stamp))
                p.sent.append((seq, p.generation))
            continue
        roll -= knobs.resend_rate
        if roll < knobs.leap_rate:
            old = p.generation
            p.generation += rng.randrange(2, 5)
            if rng.random() < 0.5:
                for g in range(old + 1, p.generation + 1):
                    out.append((encode_pf(p.pid, g, p.next_seq, FLAG_FENCE), stamp))
            continue
        roll -= knobs.leap_rate
        if roll < knobs.loss_rate:
            lost = rng.randrange(1, 13)
            p.sent.extend((p.next_seq + i, p.generation) for i in range(lost))
            p.next_seq += lost
            continue
        roll -= knobs.loss_rate
        if roll < knobs.swap_rate:
            # Pipelining retry: the second record lands first, the first one a little later —
            # sometimes re-sent by a successor generation, which fences the waiting record.
            a, b = p.next_seq, p.next_seq + 1
            out.append((encode_pf(p.pid, p.generation, b), stamp))
            p.sent.append((b, p.generation))
            if rng.random() < 0.3:
                p.generation += 1
            delayed.append((len(out) + rng.randrange(0, 6), encode_pf(p.pid, p.generation, a)))
            p.sent.append((a, p.generation))
            p.next_seq += 2
            continue
        out.append((encode_pf(p.pid, p.generation, p.next_seq), stamp))
        p.sent.append((p.next_seq, p.generation))
        p.next_seq += 1
    return out


# ---- certificates for the signed-generation tests (shared by several test modules)


def good(pid: int, g: int) -> bytes:
    return b"ok:%d:%d" % (pid, g)


class FakeVerifier:
    """Accepts exactly ``good(pid, g)``; counts calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []

    def __call__(
        self, pid: int, g: int, s: int, flags: int, cert: bytes | None, now_ms: int
    ) -> str | None:
        self.calls.append((pid, g))
        if cert is None:
            return "missing"
        return None if cert == good(pid, g) else "other_identity"


def cert_verifier(keys: Sequence[Ed25519PublicKey], missing: str = "missing") -> Verifier:
    """A broker verifier that checks real lease certificates against ``keys``; a record without
    one is refused with the reason ``missing``."""

    def verifier(pid: int, g: int, s: int, f: int, cert: bytes | None, now_ms: int) -> str | None:
        if cert is None:
            return missing
        check = verify_cert(cert, keys, pid, g, now_ms)
        return None if check.ok else check.reason

    return verifier


def with_certs(
    rng: random.Random, stream: list[tuple[bytes | None, int]], forge: float
) -> list[bytes | None]:
    """A certificate per record: mostly valid for its header, sometimes absent or wrong."""
    certs: list[bytes | None] = []
    for header, _ in stream:
        try:
            pf = decode_pf(header) if header is not None else None
        except ValueError:
            pf = None
        roll = rng.random()
        if pf is None or roll < forge / 2:
            certs.append(None)
        elif roll < forge:
            certs.append(good(pf.pid, pf.generation + 1))
        else:
            certs.append(good(pf.pid, pf.generation))
    return certs


Stream = list[tuple[bytes | None, int]]


def twin_tables(
    args: tuple[int, int, int],
    *,
    signed: bool = False,
    resolve_gaps: bool = False,
    authority: Authority | None = None,
) -> tuple[ProducerStateTable, ReferenceTable]:
    """The real table and the reference model with the same settings, for :func:`offer_alike`.

    Args:
        args: capacity, lifetime (ms) and reorder window, as :data:`table_args` draws them.
        signed: give each its own :class:`FakeVerifier`.
        resolve_gaps: turn gap resolution on in both.
        authority: the lease authority both ask (see :func:`fixed_authority`).
    """
    capacity, lifetime, window = args
    table = ProducerStateTable(
        capacity,
        lifetime,
        window,
        verifier=FakeVerifier() if signed else None,
        resolve_gaps=resolve_gaps,
        authority=authority,
    )
    ref = ReferenceTable(
        capacity, lifetime, window, FakeVerifier() if signed else None, resolve_gaps, authority
    )
    return table, ref


def fixed_authority(answers: dict[int, tuple[int, int] | None]) -> Authority:
    """An authority that answers ``pid -> (generation, lease end)`` (None or absent: unknown)."""

    def authority(pid: int) -> PidStatus:
        found = answers.get(pid)
        if found is None:
            return PidStatus.unknown(pid)
        return PidStatus(pid, PidState.LIVE, *found)

    return authority


#: What an authority answers about the streams' pids (1..6 and the odd 1000..1004): a generation
#: near theirs, and a lease end inside or past the streams' time span.
authority_answers = st.dictionaries(
    st.sampled_from([*range(1, 7), *range(1000, 1005)]),
    st.none() | st.tuples(st.integers(0, 14), st.integers(0, 30_000)),
    max_size=11,
)


def offer_alike(
    table: ProducerStateTable,
    ref: ReferenceTable,
    stream: Stream,
    certs: list[bytes | None] | None = None,
    opens: Collection[int] = (),
    where: str = "",
) -> list[list[tuple[Any, Verdict]]]:
    """Offer every record of ``stream`` (``ref=i``, with ``certs[i]`` when given) to ``table``
    and to the reference model, asserting they decide alike; return each record's decisions.

    A horizon is opened on both just before each record index in ``opens``; ``where`` prefixes
    the failure message (e.g. the seed).
    """
    decided: list[list[tuple[Any, Verdict]]] = []
    for i, (header, ts) in enumerate(stream):
        if i in opens:
            table.open_horizon(ts)
            ref.open_horizon(ts)
        cert = None if certs is None else certs[i]
        got = [(d.ref, d.verdict) for d in table.offer_header(header, ts, i, cert)]
        assert got == ref.offer_header(header, ts, i, cert), f"{where}record {i}"
        decided.append(got)
    return decided


def offer_one_by_one(
    table: ProducerStateTable, stream: Stream, opens: Collection[int] = ()
) -> tuple[dict[int, Verdict], list[int]]:
    """Offer every record of ``stream`` to ``table`` alone (``ref=i``), opening the horizon just
    before each record index in ``opens``: each record's final verdict, and the refs in the
    order they went to the log (``APPENDED`` and ``NON_IDEMPOTENT`` both do)."""
    final: dict[int, Verdict] = {}
    log: list[int] = []
    for i, (header, ts) in enumerate(stream):
        if i in opens:
            table.open_horizon(ts)
        for d in table.offer_header(header, ts, ref=i):
            final[d.ref] = d.verdict
            if d.verdict.appended:
                log.append(d.ref)
    return final, log


def note_batch(result: BatchResult, start: int, final: dict[int, Verdict], log: list[int]) -> None:
    """Note a batch of the stream's records from index ``start`` on (``refs`` = their indexes)
    as :func:`offer_one_by_one` reports records: each decided record's verdict (held records
    it released included) into ``final``, the refs it sent to the log, in order, onto ``log``."""
    for d in result.released:
        final[d.ref] = d.verdict
    for row, verdict in enumerate(result.verdicts()):
        final[start + row] = verdict
    for idx in result.log_order.tolist():
        log.append(start + idx if idx >= 0 else result.released[-idx - 1].ref)


def flush_alike(table: ProducerStateTable, ref: ReferenceTable, stream: Stream) -> None:
    """Flush both just past the stream's last record: they release alike and keep the same
    (generation, highwater) per live pid."""
    end = stream[-1][1] + 1 if stream else 0
    assert [(d.ref, d.verdict) for d in table.flush(end)] == ref.flush(end)
    live = {p: table.get(p)[:2] for p in table.entries}  # type: ignore[index]
    assert live == {p: tuple(e[:2]) for p, e in ref.entries.items()}
    holes = {p: {s for a, b in table.open_holes(p) for s in range(a, b + 1)} for p in live}
    assert holes == {p: e[4] for p, e in ref.entries.items()}


def knobs_strategy_of(
    pids: int, records: int, odd_rate: float, **more: st.SearchStrategy[Any]
) -> st.SearchStrategy[StreamKnobs]:
    """:class:`StreamKnobs` with up to ``pids`` producers, ``records`` records and the usual
    fault rates; ``more`` draws further knobs."""
    return st.builds(
        StreamKnobs,
        pids=st.integers(1, pids),
        records=st.integers(0, records),
        dup_rate=st.floats(0, 0.3),
        swap_rate=st.floats(0, 0.2),
        bump_rate=st.floats(0, 0.1),
        zombie_rate=st.floats(0, 0.1),
        fence_rate=st.floats(0, 0.1),
        odd_rate=st.floats(0, odd_rate),
        ts_step_max=st.integers(0, 80),
        ts_back_rate=st.floats(0, 0.2),
        resend_rate=st.floats(0, 0.1),
        **more,
    )


#: (capacity, lifetime, reorder window)
table_args = st.tuples(st.integers(1, 8), st.integers(1, 3000), st.integers(0, 4))


def batched_streams(
    knobs: st.SearchStrategy[StreamKnobs], shortest: int = 0
) -> tuple[st.SearchStrategy[Any], ...]:
    """What a batch-path property draws first: a stream (its seed and ``knobs``), the table's
    :data:`table_args`, and the sizes of the batches :func:`batches` cuts the stream into (at
    least ``shortest``: 0 allows an empty batch)."""
    return (
        st.integers(0, 2**32),
        knobs,
        table_args,
        st.lists(st.integers(shortest, 60), max_size=8),
    )


def batches(stream: Stream, cuts: Sequence[int]) -> Iterator[tuple[int, int, list[Any], list[int]]]:
    """``stream`` cut into batches of the sizes ``cuts``, the rest in a last one: each batch's
    (start, end, headers, stamps)."""
    start = 0
    for size in [*cuts, len(stream)]:
        chunk = stream[start : start + size]
        end = start + len(chunk)
        yield start, end, [h for h, _ in chunk], [t for _, t in chunk]
        start = end


def restored(snapshot: bytes | None, args: tuple[int, int, int]) -> ProducerStateTable:
    """The table ``snapshot`` restores (None: a new one of ``args``, capacity, lifetime and
    window)."""
    return ProducerStateTable(*args) if snapshot is None else ProducerStateTable.restore(snapshot)


def decide_alike_after(
    live: ProducerStateTable,
    rebuilt: ProducerStateTable,
    more: Stream,
    certs: Sequence[bytes | None] | None = None,
) -> None:
    """``live`` and ``rebuilt`` decide every record of ``more`` (after the live clock) alike."""
    base = live.clock if live.clock > -(2**62) else 0
    for i, (header, ts) in enumerate(more):
        cert = None if certs is None else certs[i]
        a = live.offer_header(header, base + ts, 10_000 + i, cert)
        b = rebuilt.offer_header(header, base + ts, 10_000 + i, cert)
        assert a == b, f"record {i} after the rebuild"


def gap_tuples(gaps: Sequence[Gap]) -> list[tuple[Any, ...]]:
    """The table's gaps as the reference model lists them."""
    return [(g.pid, g.generation, g.first, g.last, g.ref, g.kind) for g in gaps]
