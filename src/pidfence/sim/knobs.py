"""The knobs of one simulated schedule."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal, get_args

#: Deliberately broken pieces, to prove the simulation finds what they break: broker rules
#: (``accept_stale_generation``, ``accept_old_seq``, ``drop_fence``), the lease server's rollover
#: (``fresh_rollover``), the sink's certificate check (``no_verify``) and a resume's recovery scan
#: (``trusting_scan``).
Mutation = Literal[
    "accept_stale_generation",
    "accept_old_seq",
    "drop_fence",
    "fresh_rollover",
    "no_verify",
    "trusting_scan",
]
#: Every value of :data:`Mutation`.
MUTATIONS: tuple[str, ...] = get_args(Mutation)


@dataclass(frozen=True, slots=True)
class Knobs:
    """What a schedule may do; probabilities are per opportunity.

    Attributes:
        events: upstream events per producer chain.
        partitions: partitions of the one simulated topic.
        producers: independent producer chains (each with its own upstream and checkpoints).
        drop_p: a send is lost on the way (the producer retries it later).
        dup_p: Kafka writes a record but the ack is lost (the retry writes it again).
        reorder: the network may deliver any in-flight record whose seq is less than
            ``reorder`` past the oldest unacknowledged seq of its partition (at most the sink's
            ``reorder_window`` + 1, so the broker can hold every record that overtakes); nothing
            overtakes a pid's first record on a partition unless ``cold_reorder``. 1 models
            librdkafka's idempotence, the producer's default: a session's records land in
            order, a dead process's in-flight records as a prefix, and the sink resolves gaps
            (its default).
            Above 1 models a client without it, which can leave a hole its resumer fills later:
            the sink then keeps the proposal's rules (``resolveGaps=false``, docs/gaps.md).
        crash_p: per step, the active producer instance crashes and is resumed from its
            checkpoint (generation bump + FENCE on every partition in the checkpoint).
        zombie_p: a crashed instance keeps running for a few sends (a zombie).
        pause_p: a zombie is first paused (SIGSTOP) for up to two lifetimes, so it may wake past
            its rollover point or its lease end (its in-flight records wait with it).
        zombie_saves: a zombie keeps storing its periodic checkpoints where its chain keeps
            them (one state file for every instance, as ``pidfence copy --state`` and
            ``pidfence produce --state`` have), every ``checkpoint_every`` of its sends and after
            its last one. ``checkpoint()`` must refuse a replaced instance (``ProducerFenced``):
            a zombie's stored position covers records the sink ``FENCED``, and the next resume
            from it would never send their events again.
        down_p: a crashed chain restarts only up to two lifetimes later, so its checkpoint may
            have expired (resume rolls it through the lineage).
        double_p: a second resumer of the same checkpoint starts later (two resumers of one
            checkpoint: the later one fences the first through the lineage, or is refused).
        restart_p: per sink batch and partition, the sink restarts and rebuilds the
            partition's state as the real sink does when its newest state file is lost: an older
            state file, then the committed batches after it replayed from their decisions.
        plain_p: per step, a non-idempotent (no ``pf`` header) record is written.
        lease_down_p: per step, the lease servers become unreachable for up to a quarter of a
            lease lifetime: rollovers are retried inside the old lease, a process whose lease
            ends first exits (``LeaseExpired``) and is resumed, restarts wait (outages draw
            from their own random stream).
        kafka_lose_p: Kafka acknowledges a record and never stores it (an unclean leader
            election, an ``acks=1`` failover); the sink must report the hole as a gap and go on
            (needs ``reorder=1``: gaps are resolved only for in-order sessions).
        log_append_time: the topic's timestamps are the broker's append time
            (``message.timestamp.type=LogAppendTime``, as pidfence creates raw topics); off:
            each record keeps the timestamp its writer set (CreateTime). The attacker's
            back-dated forgery is drawn only with it (CreateTime lets a writer back-date).
        record_mac: the per-record mode (``--record-mac-secret``): the lease server hands each
            lease a MAC key, the producer tags every record (``pfm``), the sink refuses a
            record whose MAC does not verify; the attacker then also injects data records at a
            live pid's next seq inside its generation (``inject_*``), which only the MAC stops.
        attack_p: per step, an attacker with write access to the topic writes one forged record
            (:mod:`pidfence.sim.attacker`): a FENCE one generation ahead of a live pid or a fresh
            pid with seq 0, without ``pfc`` or with a bad one. The lease server always signs and
            the sink verifies (DESIGN §3 amended), so every forgery must be ``FORGED`` (or
            ``INVALID_GENERATION``, one without ``pfc`` several generations ahead).
        lifetime_ms: lease lifetime under the fake clock (rollover at 23/24 of it).
        step_ms: fake clock advance per step.
        checkpoint_every: sends between checkpoints (each checkpoint flushes first).
        batch_every: steps between sink batches.
        fence_all: a resumed producer FENCEs every partition of the topic, not only the
            checkpoint's. With False, a pid that wrote to a partition after its checkpoint and then
            crashed twice leaves that partition two generations behind, and DESIGN §4's
            ``g > gE + 1 -> INVALID_GENERATION`` drops all its later records. True is what
            ``IdempotentProducer.resume`` does; tests/sim shows False failing on seed 0.
        cold_reorder: let records overtake a pid's first record on a partition (exposes the
            ``UNKNOWN_PID`` hole of DESIGN §4; off by default, as librdkafka's idempotence and
            the producer keep that order).
        timeout_p: per step, the active process's oldest in-flight records of one partition time
            out in librdkafka's queue and are never written (its INTRODUCTION.md, "Message
            timeout considerations"): the records behind them are, leaving a hole; the process's
            next flush raises ``DeliveryFailed``, it exits and is resumed from its checkpoint
            (whose re-sends fill the hole).
        sink_start: steps before the sink's first batch (a sink started late).
        sink_latest: the sink's first batch starts at the end of the log
            (``startingOffsets=latest``): it never reads what came before, and adopts the
            producers it meets there through the authority (needs ``reorder=1``).
        trim_p: per step, retention deletes each partition's head up to the records the
            producers' resumes may still scan (a checkpoint's time): a sink behind it continues
            past the gap (``--allow-data-loss``) and adopts through the authority; zombies whose
            FENCE was deleted write beyond its horizon (needs ``reorder=1``).
        resend_p: per step, a copy of a record whose lease has ended is written again (a stuck
            retry, a replay tool): it must never be appended.
        authority: the sink asks the lease servers before it adopts (``--lease-server``);
            without, it adopts nothing (``UNKNOWN_PID``).
        mutation: a deliberately broken piece, or None. A broken broker rule, patched into
            the real rules for the schedule (:func:`pidfence.sim.broken_rules.broken_rules`):
            ``accept_stale_generation``, ``accept_old_seq``, ``drop_fence``. Or
            ``fresh_rollover``: the lease server's ``roll`` leases an unrelated pid, the rollover
            before DESIGN §9; ``no_verify``: the sink runs without ``leasePublicKey``, so nothing
            checks ``pfc``; ``trusting_scan``: a resume's recovery scan believes every header, as
            ``IdempotentProducer`` without ``lease_public_keys`` does.
    """

    events: int = 60
    partitions: int = 2
    producers: int = 1
    drop_p: float = 0.1
    dup_p: float = 0.1
    reorder: int = 3
    crash_p: float = 0.03
    zombie_p: float = 0.5
    pause_p: float = 0.3
    down_p: float = 0.1
    double_p: float = 0.1
    restart_p: float = 0.1
    plain_p: float = 0.02
    attack_p: float = 0.0
    lease_down_p: float = 0.0
    kafka_lose_p: float = 0.0
    timeout_p: float = 0.0
    sink_start: int = 0
    sink_latest: bool = False
    trim_p: float = 0.0
    resend_p: float = 0.0
    authority: bool = True
    log_append_time: bool = False
    record_mac: bool = False
    lifetime_ms: int = 2400
    step_ms: int = 10
    checkpoint_every: int = 8
    batch_every: int = 3
    fence_all: bool = True
    cold_reorder: bool = False
    zombie_saves: bool = False
    mutation: Mutation | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.reorder <= 6:
            raise ValueError(
                f"reorder must be in 1..6 (the sink's reorder window 5, + 1), got {self.reorder}"
            )
        if self.lifetime_ms < 24 * self.step_ms * 4:
            raise ValueError("lifetime_ms must be at least 96 steps so a rollover margin exists")
        for name in (
            "drop_p",
            "dup_p",
            "crash_p",
            "zombie_p",
            "pause_p",
            "down_p",
            "double_p",
            "restart_p",
            "plain_p",
            "attack_p",
            "lease_down_p",
            "kafka_lose_p",
            "timeout_p",
            "trim_p",
            "resend_p",
        ):
            value = getattr(self, name)
            if not 0.0 <= value <= (0.9 if name in ("drop_p", "lease_down_p") else 1.0):
                raise ValueError(
                    f"{name} must be a probability (drop_p, lease_down_p <= 0.9), got {value}"
                )
        for name in (
            "events",
            "partitions",
            "producers",
            "checkpoint_every",
            "batch_every",
            "step_ms",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.kafka_lose_p and self.reorder != 1:
            raise ValueError(
                "kafka_lose_p needs reorder=1: a sink resolves the gap a lost record leaves only "
                "when sessions deliver in order (a reordering client pairs with resolveGaps=false)"
            )
        if (self.trim_p or self.sink_latest) and self.reorder != 1:
            raise ValueError(
                "trim_p and sink_latest need reorder=1: adoption takes a producer's first record "
                "after a horizon for its next one only when sessions deliver in order"
            )
        if self.sink_start < 0:
            raise ValueError("sink_start must be >= 0")
        if self.mutation is not None and self.mutation not in MUTATIONS:
            # A typo would otherwise run the real rules and "prove" nothing.
            raise ValueError(
                f"mutation must be one of {list(MUTATIONS)} or None, not {self.mutation!r}"
            )

    def to_dict(self) -> dict[str, Any]:
        """The knobs as keyword arguments of :func:`pidfence.sim.run`."""
        return asdict(self)
