"""``ProducerStateTable``: the public face of one partition's broker-side rules (DESIGN §4).

The rules and the state live in :class:`~pidfence.broker_plugin.rules.RulesKernel`; this class
adds the calls users make: one record (:meth:`offer`, :meth:`offer_header`), many records
(:meth:`offer_batch`, see :mod:`~pidfence.broker_plugin.batch`), closing the reorder window
(:meth:`flush`), snapshots and their restore (:mod:`~pidfence.broker_plugin.snapshot`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Unpack

from pidfence.broker_plugin.decision import Decision
from pidfence.broker_plugin.entry import Emit, SettingOverrides, as_int_fields, as_timestamp
from pidfence.broker_plugin.rules import RulesKernel
from pidfence.broker_plugin.snapshot import delta_snapshot, full_snapshot, restore_chain
from pidfence.wire import MalformedHeader, Verdict, decode_pf_fields, valid_fields

if TYPE_CHECKING:  # the batch path needs numpy and pyarrow; a producer's recovery does not
    from pidfence.broker_plugin.batch import BatchResult


class ProducerStateTable(RulesKernel):
    """The broker-side rules for one (topic, partition).

    Constructed with the settings of :class:`~pidfence.broker_plugin.rules.RulesKernel`
    (``capacity``, ``lifetime_ms``, ``reorder_window``, ``grace_ms``, ``verifier``,
    ``resolve_gaps``, ``authority``), which documents each. See also :meth:`open_horizon`
    (adoption).
    """

    def __len__(self) -> int:
        """Number of live producer entries."""
        return len(self.entries)

    def get(self, pid: int) -> tuple[int, int, int] | None:
        """``(generation, highwater, first_seen_ms)`` of a live pid, else ``None``."""
        entry = self.entries.get(pid)
        if entry is None:
            return None
        return entry.generation, entry.highwater, entry.first_seen

    @property
    def held_count(self) -> int:
        """Records currently held: for reordering, or waiting on the authority."""
        return sum(1 for _ in self.waiting())

    def open_holes(self, pid: int) -> list[tuple[int, int]]:
        """The open holes of a live pid: ``(first, last)`` seq ranges a gap skipped."""
        entry = self.entries.get(pid)
        return [] if entry is None or entry.holes is None else [(a, b) for a, b in entry.holes]

    def offer(
        self,
        pid: int,
        generation: int,
        seq: int,
        ts_ms: int,
        flags: int = 0,
        ref: Any = None,
        cert: bytes | None = None,
    ) -> list[Decision]:
        """Decide one record (DESIGN §4).

        Returns the decisions this call made, in log order: this record's verdict (``BUFFERED``
        when held), held records it released, then held records of entries its timestamp expired.
        ``cert`` is the record's ``pfc`` header value (only read when a verifier is set).
        """
        ts_ms = as_timestamp(ts_ms)
        out: list[Emit] = []
        if not valid_fields(pid, generation, seq, flags):
            # numpy and other integral types are fine; anything else is MALFORMED.
            pid, generation, seq, flags = as_int_fields(pid, generation, seq, flags)
        if valid_fields(pid, generation, seq, flags):
            self.decide(pid, generation, seq, flags, ts_ms, ref, out, None, cert)
        else:
            out.append((ref, Verdict.MALFORMED, None))
        return [Decision(r, v) for r, v, _ in out]

    def offer_header(
        self, header: bytes | None, ts_ms: int, ref: Any = None, cert: bytes | None = None
    ) -> list[Decision]:
        """Decide one record from its raw ``pf`` header value (``None`` when absent)."""
        if header is not None:
            try:
                pid, generation, seq, flags = decode_pf_fields(header)
            except MalformedHeader:
                return [Decision(ref, Verdict.MALFORMED)]
            return self.offer(pid, generation, seq, ts_ms, flags, ref, cert)
        out: list[Emit] = [(ref, Verdict.NON_IDEMPOTENT, None)]
        self.advance(as_timestamp(ts_ms), out)
        return [Decision(r, v) for r, v, _ in out]

    def flush(self, ts_ms: int) -> list[Decision]:
        """Close the reorder window: every held record becomes ``OUT_OF_ORDER``.

        ``ts_ms`` moves the clock first (pass :attr:`clock` to close the window without it).
        """
        out: list[Emit] = []
        self.advance(as_timestamp(ts_ms), out)
        self.flush_held(out)
        return [Decision(r, v) for r, v, _ in out]

    def offer_batch(
        self,
        headers: Any,
        ts_ms: Any,
        refs: Any = None,
        certs: Any = None,
        forged: Any = None,
        forged_reason: str = "mac",
    ) -> BatchResult:
        """Decide many records at once; same decisions as :meth:`offer_header` one by one.

        See :func:`pidfence.broker_plugin.batch.offer_batch` for the arguments and result.
        """
        from pidfence.broker_plugin.batch import offer_batch

        return offer_batch(self, headers, ts_ms, refs, certs, forged, forged_reason)

    def snapshot(self) -> bytes:
        """Full state as bytes (msgpack, versioned, CRC-checked)."""
        return full_snapshot(self)

    def snapshot_delta(self) -> bytes:
        """Only what changed since the previous :meth:`snapshot` or :meth:`snapshot_delta`."""
        return delta_snapshot(self)

    @classmethod
    def restore(cls, data: bytes, **overrides: Unpack[SettingOverrides]) -> ProducerStateTable:
        """Rebuild a table from :meth:`snapshot` bytes; ``CorruptSnapshot`` on any damage.

        Keyword arguments (:class:`~pidfence.broker_plugin.entry.SettingOverrides`) override the
        snapshot's settings (a capacity smaller than the live entries is refused).
        """
        return cls.restore_chain(data, (), **overrides)

    @classmethod
    def restore_chain(
        cls, full: bytes, deltas: Iterable[bytes], **overrides: Unpack[SettingOverrides]
    ) -> ProducerStateTable:
        """Rebuild a table from a full snapshot and the deltas taken after it, in order."""
        return restore_chain(cls, full, list(deltas), **overrides)

    def state(self) -> tuple[Any, ...]:
        """A canonical, comparable view of the whole state (for tests and equality)."""
        ring = tuple(
            (pid, serial, e.generation, e.highwater, e.first_seen, repr(e.holes))
            for pid, serial in self.ring
            for e in (self.entries[pid],)
        )
        held = tuple(
            sorted(
                (pid, h.seq, h.generation, h.flags, h.ts_ms, h.arrival, repr(h.ref))
                for pid, by_seq in self.held.items()
                for h in by_seq.values()
            )
        )
        pending = tuple(
            (
                pid,
                w.generation,
                w.expire_ms,
                *(
                    (h.seq, h.generation, h.flags, h.ts_ms, h.arrival, repr(h.ref))
                    for h in w.records
                ),
            )
            for pid, w in sorted(self.pending.items())
        )
        return (
            self.capacity,
            self.lifetime_ms,
            self.reorder_window,
            self.grace_ms,
            self.resolve_gaps,
            self.clock,
            self.horizon,
            self.next_serial,
            self.next_arrival,
            ring,
            held,
            pending,
            tuple(sorted(self.unconfirmed)),
            tuple(sorted(self.stale)),
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ProducerStateTable):
            return NotImplemented
        return self.state() == other.state()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (
            f"ProducerStateTable(capacity={self.capacity}, lifetime_ms={self.lifetime_ms}, "
            f"reorder_window={self.reorder_window}, live={len(self.entries)}, "
            f"held={self.held_count}, clock={self.clock})"
        )
