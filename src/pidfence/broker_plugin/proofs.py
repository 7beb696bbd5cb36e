"""Proofs of generations under signing: the kernel's certificate checks (DESIGN §3 amended).

A mixin of :class:`~pidfence.broker_plugin.rules.RulesKernel`: it reads the kernel's
``verifier``, ``clock``, ``held`` and ``forged``, and asks the authority where a horizon hid the
proof (:meth:`~pidfence.broker_plugin.adoption.Adoption.vouches`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pidfence.broker_plugin.entry import Held, Verifier
from pidfence.wire import FLAG_FENCE, Verdict


class Proofs:
    """Whether a record proves (pid, generation); failures are counted by reason."""

    verifier: Verifier | None
    clock: int
    held: dict[int, dict[int, Held]]
    forged: dict[str, int]

    if TYPE_CHECKING:  # provided by the adoption mixin

        def vouches(self, pid: int, g: int, ts: int) -> bool: ...
        def covered(self, pid: int, g: int) -> bool: ...

    def certified(self, pid: int, g: int, s: int, flags: int, cert: bytes | None, ts: int) -> bool:
        """Whether (pid, g) is proven by ``cert`` (always, without a verifier); counts failures.

        Expiry is judged at ``max(clock, ts)``: a record cannot make a stale certificate fresh
        by carrying an old timestamp.
        """
        if self.verifier is None:
            return True
        reason = self.verifier(pid, g, s, flags, cert, max(self.clock, ts))
        if reason is None:
            return True
        self.forged[reason] = self.forged.get(reason, 0) + 1
        return False

    def proven(self, pid: int, g: int, s: int, flags: int, cert: bytes | None, ts: int) -> bool:
        """Whether the next generation ``g`` of ``pid`` may move ``gE`` (or be held).

        Held records of the next generation were proven when they were held (their release moves
        ``gE``), so one of them proves its siblings: the ``pfc`` rides only on the first record
        the producer sent under a generation, which need not be the first to arrive.
        """
        held = self.held.get(pid)
        if held is not None and any(h.generation == g for h in held.values()):
            return True
        if self.covered(pid, g):
            return True  # a waiting record being adopted: it proved itself when it waited
        # A FENCE carries its certificate: it is never vouched for.
        vouchable = self.verifier is not None and cert is None and not flags & FLAG_FENCE
        if vouchable and self.vouches(pid, g, ts):
            return True
        return self.certified(pid, g, s, flags, cert, ts)

    def leap(
        self, pid: int, g: int, s: int, flags: int, cert: bytes | None, ts: int
    ) -> Verdict | None:
        """Whether a record of generation ``g > gE + 1`` may be judged as ``gE + 1``.

        Returns None when it may: a verifier is set and the generation is proven (by a held
        record of the same generation, or by ``cert``). Otherwise the verdict:
        ``INVALID_GENERATION`` without a verifier or without a certificate (the rule of DESIGN
        §4), ``FORGED`` when a certificate is there and the verifier refuses it. Inside a
        horizon, a generation the authority names as granted may leap without proof.
        """
        signed_fence = self.verifier is not None and flags & FLAG_FENCE
        if self.covered(pid, g) or (cert is None and not signed_fence and self.vouches(pid, g, ts)):
            return None
        if self.verifier is None:
            return Verdict.INVALID_GENERATION
        held = self.held.get(pid)
        if held is not None and any(h.generation == g for h in held.values()):
            return None
        if cert is None:
            return Verdict.INVALID_GENERATION
        return None if self.certified(pid, g, s, flags, cert, ts) else Verdict.FORGED
