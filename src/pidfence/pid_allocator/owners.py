"""Owner checks a server can answer without ZooKeeper (DESIGN.md §5 amended again).

A bump or roll must carry the pid's secret, or (lineage authority, one step) the secret of the pid
that was rolled into it. What a server knows without asking ZooKeeper:

* a "secret" that cannot be one (missing, wrong length, block start 0) belongs to no owner;
* for a live pid it issued itself (in its lease ring), it holds the block and so the salt, and
  it knows whether it issued the pid by a lease (no predecessor: only the pid's own secret
  works) or by a roll (it remembers the predecessor).

Those are refused here, with the same NOT_OWNER reply as always, and never reach ZooKeeper or its
queue. Pids issued by other servers (or by this one before a restart) need their block record and
lineage record: that check runs through the fair ZooKeeper queue in the asking client's own
bucket, so a stream of forged requests for them delays only their sender. Timing may tell a
non-owner that this server issued a pid (pids are in every record's header anyway); never
anything of its state.
"""

from __future__ import annotations

from pidfence.pid_allocator.blocks import BlockSupply
from pidfence.pid_allocator.capability import block_hint, secret_matches
from pidfence.pid_allocator.ring import LeaseRing


class LocalOwners:
    """Local owner checks over a server's ring and blocks.

    Args:
        ring: the server's live leases.
        supply: the blocks it issued from.
    """

    def __init__(self, ring: LeaseRing, supply: BlockSupply) -> None:
        self._ring = ring
        self._supply = supply
        self._predecessors: dict[int, tuple[int, int]] = {}
        self._prune_at = 1024
        self.refused = 0

    def add_successor(self, pid: int, predecessor: int, expire_ms: int, now_ms: int) -> None:
        """``pid`` was issued here by a roll of ``predecessor`` and lives until ``expire_ms``."""
        self._predecessors[pid] = (predecessor, expire_ms)
        if len(self._predecessors) > self._prune_at:
            ended = [p for p, (_, end) in self._predecessors.items() if end <= now_ms]
            for gone in ended:
                del self._predecessors[gone]
            self._prune_at = max(1024, 2 * len(self._predecessors))

    def refuses(self, pid: int, secret: bytes, now_ms: int) -> bool:
        """True when ``secret`` is certainly nobody's who may act on ``pid``; False when it is
        the owner's or only ZooKeeper can tell."""
        hint = block_hint(secret)
        if hint is None:
            self.refused += 1
            return True
        if self._ring.find(pid, now_ms) is None:
            return False  # not a live pid of this server: the lineage record decides
        block = self._supply.issued_block(pid)
        if block is None or secret_matches(secret, block.start, block.salt, pid):
            return False
        known = self._predecessors.get(pid)
        if known is None or hint > known[0]:
            # Issued by a lease (no predecessor's secret can act on it), or the secret names a
            # block that starts above the predecessor, which therefore cannot hold it.
            self.refused += 1
            return True
        return False  # perhaps the predecessor's secret: its block record decides
