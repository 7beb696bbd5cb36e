"""``StampLoop``: the one stamping loop of ``produce_many``.

Records to lanes the session made ready (nothing to skip, no extra header until the session's
``deadline_ns``) are stamped inline, in runs of at most :data:`RUN` records per hold of the
producer's lock; any other record goes the driver's general path, then the loop goes on.
:meth:`pidfence.producer.IdempotentProducer.produce` runs the loop's body for one record, written
out (entering the loop costs a single record about 350 ns more Python).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from threading import local

import confluent_kafka

from pidfence.producer.lock import Empty, ProducerLock
from pidfence.producer.sender import QueueFull, Sender, refused
from pidfence.producer.sequencer import U16X
from pidfence.producer.session import ProducerSession
from pidfence.wire import PF_HEADER_KEY

#: Records ``produce_many`` stamps per hold of the lock (other threads get their turns).
RUN = 256


@dataclass(slots=True)
class StampLoop:
    """Stamps a batch of records in order, each record one step under the producer's lock.

    Attributes:
        session: the producer's session (``live`` sequencer, ``deadline_ns``).
        lock: the producer's lock.
        progress: per thread, ``done``: values of its current batch handled so far.
        sender: the Kafka client (``client.produce``, ``wait_for_room``, ``tracking``).
        pick: the partitioner's pick for records without a partition.
        one: the driver's general path for one record (``SessionDriver.one``).
        now_ns: the clock in ns, on the session's ``deadline_ns`` base.
        max_size: ``message_max_bytes``: key + value above it take the general path (which
            raises ``ValueTooLarge``).
    """

    session: ProducerSession
    lock: ProducerLock
    progress: local
    sender: Sender
    pick: Callable[[str, bytes | None, int], int]
    one: Callable[..., int]
    now_ns: Callable[[], int]
    max_size: int

    def run(
        self,
        topic: str,
        values: Sequence[bytes | str | None],
        keys: Sequence[bytes | str | None] | None,
        partition: int | None,
        event_ids: Sequence[str | None] | None,
    ) -> None:
        """Send ``values`` in order (``keys``, ``event_ids``: None or one per value); the
        calling thread's ``progress.done`` counts the values handled, also when it raises."""
        session, progress, sender = self.session, self.progress, self.sender
        kafka_produce, now_ns, max_size = sender.client.produce, self.now_ns, self.max_size
        pick, inline = self.pick, not sender.tracking
        lock = self.lock
        take, give = lock.take, lock.give
        count = len(values)
        fixed_partition = -1 if partition is None else partition
        retry: int | None = None  # where values[i] goes after a full queue
        i = 0
        try:
            while i < count:
                try:
                    try:
                        take()
                        mine = True
                    except Empty:
                        mine = lock.wait()
                    try:
                        picked = partition if retry is None else retry
                        seq = session.live
                        lanes = None if seq is None or not inline else seq.ready.get(topic)
                        # The one partition's lane, or None: the records pick theirs.
                        own = None if lanes is None or partition is None else lanes.get(partition)
                        if (
                            seq is not None
                            and lanes is not None
                            and retry is None
                            and (partition is None or own)
                        ):
                            fixed, prefix16, header = seq.fixed, seq.prefix16, seq.header
                            pid, mac, deadline = seq.pid, seq.mac_hasher, session.deadline_ns
                            end = min(count, i + RUN)
                            for i in range(i, end):  # noqa: B020 - the run resumes at i
                                value = values[i]
                                key = None if keys is None else keys[i]
                                if type(value) is not bytes or now_ns() >= deadline:
                                    break
                                if key is None:
                                    if len(value) > max_size:
                                        break
                                elif type(key) is not bytes or len(key) + len(value) > max_size:
                                    break
                                if own is None:
                                    q = pick(topic, key, pid)
                                    cell = lanes.get(q)
                                    if cell is None:
                                        picked = q
                                        break
                                else:
                                    q, cell = fixed_partition, own
                                n = cell[0]
                                if n < 256:
                                    pf = fixed[n]
                                elif n < 0x10000:
                                    pf = prefix16 + U16X(n)
                                else:
                                    pf = header(n)
                                cell[0] = n + 1
                                wire = (
                                    [(PF_HEADER_KEY, pf)]
                                    if mac is None
                                    else seq.with_mac(topic, q, n, pf, key, value)
                                )
                                try:
                                    kafka_produce(topic, value, key, partition=q, headers=wire)
                                except BufferError:
                                    cell[0] = n
                                    raise QueueFull(q) from None
                                except confluent_kafka.KafkaException as exc:
                                    cell[0] = n
                                    raise refused(exc, topic, q) from exc
                                except BaseException:
                                    cell[0] = n
                                    raise
                            else:
                                i = end
                                continue
                        progress.done = i
                        key = None if keys is None else keys[i]
                        event = None if event_ids is None else event_ids[i]
                        retry = None
                        # An unkeyed record's partition picked here is its sticky pick.
                        sticky = partition is None and key is None and picked is not None
                        lock.marked(
                            self.one, topic, values[i], key, picked, None, None, event, sticky
                        )
                        i += 1
                    finally:
                        if mine:
                            give(None)
                except QueueFull as full:
                    retry = full.partition
                    sender.wait_for_room()
        except BaseException:
            progress.done = i
            raise
        progress.done = count
