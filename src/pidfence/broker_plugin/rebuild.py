"""Re-deriving a partition's state from a snapshot and the committed records after it.

State is a function of the committed output (DESIGN §4 amended): replaying every record a batch
decided (appended, rejected and held), in Kafka-offset order and with the same batch cuts, from an
older snapshot (or from nothing) gives exactly the live table. Certificates are not stored with the
output; the replay takes the committed verdicts as their proof instead: one committed as
``INVALID_GENERATION`` or ``UNVERIFIED`` replays without a certificate (so a leap of several
generations is refused again), every other record carries a proof that passes (it was proven, or
needed no proof, when it was decided). A ``FORGED`` verdict is decided on arrival and changes no
state, so a replay also refuses such a record up front: one refused before the rules (a per-record
MAC that did not verify) is refused again without the secret or the record's bytes.

What the lease authority answered during a batch (adoption, DESIGN §4 amended a third time) is
recorded with the batch and handed to its replay (:func:`recorded_authority`), with the rules'
settings it ran under, so a rebuild decides what the live run decided whatever the authority
says today or the sink's options now are.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final, Unpack

from pidfence.broker_plugin.entry import Authority, SettingOverrides, check_overrides
from pidfence.broker_plugin.errors import CorruptSnapshot
from pidfence.broker_plugin.table import ProducerStateTable
from pidfence.wire import PidStatus, Verdict

#: The certificate a replay hands the table for a record that was committed as ``FORGED``.
REPLAYED_FORGERY: Final = b"\x00pidfence-replayed-forgery"
#: The certificate a replay hands the table for a record the live run did not refuse for want of
#: proof (any verdict but ``FORGED`` and ``INVALID_GENERATION``).
REPLAYED_PROOF: Final = b"\x00pidfence-replayed-proof"
_WITHOUT_PROOF: Final = frozenset({Verdict.INVALID_GENERATION, Verdict.UNVERIFIED})


def replay_cert(verdict: str | Verdict | None) -> bytes | None:
    """The certificate that makes a replay re-decide a record as its committed ``verdict`` did.

    ``None`` (verdict unknown) replays without a certificate: right for a run without signing,
    where a leap of several generations is ``INVALID_GENERATION`` and nothing else needs proof.
    A record committed as ``UNVERIFIED`` replays without one too (adoption refuses it again).
    """
    if verdict is None or verdict in _WITHOUT_PROOF:
        return None
    return REPLAYED_FORGERY if verdict == Verdict.FORGED else REPLAYED_PROOF


def replay_verifier(
    pid: int, generation: int, seq: int, flags: int, cert: bytes | None, now_ms: int
) -> str | None:
    """The verifier of a replay: a committed ``FORGED`` record fails again, nothing else does.

    (A committed ``INVALID_GENERATION`` record carries no certificate, so the table refuses its
    leap again without asking.)
    """
    del pid, generation, seq, flags, now_ms
    return "replayed" if cert == REPLAYED_FORGERY else None


#: The settings a batch records and its replay runs under (each a :class:`RulesKernel` attribute).
RECORDED_RULES: Final = ("lifetime_ms", "reorder_window", "grace_ms", "resolve_gaps")


def rules_of(table: ProducerStateTable) -> dict[str, Any]:
    """The settings of ``table`` that a batch records (:data:`RECORDED_RULES`)."""
    return {name: getattr(table, name) for name in RECORDED_RULES}


def recorded_authority(answers: Mapping[int, PidStatus]) -> Authority:
    """The authority of a replay: the answers the live run recorded.

    Asking about a pid without a recorded answer raises :class:`CorruptSnapshot`: the live run
    decided the batch without asking about it, so the recorded batch does not match its replay.
    """

    def authority(pid: int) -> PidStatus:
        found = answers.get(pid)
        if found is None:
            raise CorruptSnapshot(f"the batch recorded no authority answer for pid {pid}")
        return found

    return authority


def replay_batch(
    table: ProducerStateTable,
    headers: Sequence[bytes | None],
    ts_ms: Sequence[int],
    verdicts: Sequence[str | Verdict],
    refs: Sequence[Any] | None = None,
    flush: bool = False,
    horizon_ms: int | None = None,
    answers: Mapping[int, PidStatus] | None = None,
    rules: Mapping[str, Any] | None = None,
    signed: bool = True,
) -> None:
    """Replay one committed batch of one partition (its records in Kafka-offset order).

    Args:
        table: the state before the batch (updated in place).
        headers: each record's ``pf`` header value.
        ts_ms: each record's timestamp.
        verdicts: each record's committed final verdict (only ``FORGED``,
            ``INVALID_GENERATION`` and the rest apart matter, see :func:`replay_cert`).
        refs: what the live run passed as refs (held records keep them).
        flush: the live run closed the reorder window at the end of this batch.
        horizon_ms: the live run opened an adoption horizon at this time before the batch
            (:meth:`~pidfence.broker_plugin.ProducerStateTable.open_horizon`).
        answers: what the authority answered during the batch, by pid (None: the batch ran
            without an authority).
        rules: the settings the batch ran under (:data:`RECORDED_RULES`; they stay on the table
            after the call), or None to keep the table's.
        signed: the live run verified certificates: each record replays with the proof its
            verdict stands for (:func:`replay_cert`). False: a run without signing, replayed
            without a verifier.
    """
    for name, value in (rules or {}).items():
        if name not in RECORDED_RULES:
            raise CorruptSnapshot(f"a batch recorded an unknown rules setting {name!r}")
        setattr(table, name, value)
    if horizon_ms is not None:
        table.open_horizon(horizon_ms)
    certs = [replay_cert(v) for v in verdicts]
    forged = [v == Verdict.FORGED for v in verdicts]
    # An unsigned run's records needed no proof: under a verifier, one replayed without a
    # certificate would be UNVERIFIED where the run judged it (and end no wait it ended).
    live, table.verifier = table.verifier, replay_verifier if signed else None
    asked, table.authority = (
        table.authority,
        None if answers is None else recorded_authority(answers),
    )
    try:
        table.offer_batch(
            list(headers), list(ts_ms), list(refs) if refs is not None else None, certs, forged
        )
        if flush:
            table.flush(table.clock)
    finally:
        table.verifier = live
        table.authority = asked
        table.forged.clear()
        table.gaps.clear()


def rebuild(
    snapshot: bytes | None,
    records: Iterable[tuple[Any, ...]],
    authority: Authority | None = None,
    **settings: Unpack[SettingOverrides],
) -> ProducerStateTable:
    """State after replaying ``records`` in order.

    Args:
        snapshot: bytes from :meth:`ProducerStateTable.snapshot`, or ``None`` to start empty
            (then ``capacity`` and ``lifetime_ms`` are required).
        records: every record decided after the snapshot, in the order it was decided (Kafka
            offset order): ``(pf header bytes or None, ts_ms)`` or ``(header, ts_ms, verdict)``
            (a record committed as ``FORGED`` fails certificate verification again; see
            :func:`replay_cert`). Records of a signed run need their verdicts: without one a
            record replays without a certificate, so a leap of several generations that the live
            run accepted on its certificate would be refused.
        authority: the answers the live run got from the lease authority (e.g.
            :func:`recorded_authority`), or None when it ran without one.
        **settings: the table's settings (:class:`~pidfence.broker_plugin.entry.SettingOverrides`):
            without a snapshot, ``reorder_window`` defaults to 5, ``grace_ms`` to 0 and
            ``resolve_gaps`` to off; with one, those given override the snapshot's.

    Raises:
        CorruptSnapshot: the snapshot is damaged (fall back to an older one or a full replay).
    """
    check_overrides(settings)
    if snapshot is None:
        capacity, lifetime_ms = settings.get("capacity"), settings.get("lifetime_ms")
        if capacity is None or lifetime_ms is None:
            raise ValueError("rebuild without a snapshot needs capacity and lifetime_ms")
        reorder_window, grace_ms = settings.get("reorder_window"), settings.get("grace_ms")
        table = ProducerStateTable(
            capacity,
            lifetime_ms,
            5 if reorder_window is None else reorder_window,
            0 if grace_ms is None else grace_ms,
            resolve_gaps=bool(settings.get("resolve_gaps")),
        )
    else:
        table = ProducerStateTable.restore(snapshot, **settings)
    table.verifier = replay_verifier
    table.authority = authority
    for i, record in enumerate(records):
        header, ts_ms = record[0], record[1]
        verdict = record[2] if len(record) > 2 else None
        if verdict == Verdict.FORGED:
            continue  # decided on arrival, no state change (see the module docstring)
        table.offer_header(header, ts_ms, ref=i, cert=replay_cert(verdict))
    table.verifier = None
    table.authority = None
    table.forged.clear()
    table.gaps.clear()
    return table
