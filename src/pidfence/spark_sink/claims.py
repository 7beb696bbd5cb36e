"""One writer per output: a sink instance claims its output with an epoch (DESIGN §7, round 4).

A claim is a file ``P/_pidfence/_claims/EPOCH.json`` created if absent (the one conditional
write every store offers): ``{"epoch", "host", "pid", "since", "beat", "released"}``. The newest
epoch owns the output. The owner rewrites its own claim every ``lapse / 6`` (a heartbeat) and
marks it released when its query stops. Another instance on the same output waits as a standby:
it takes over, by creating the claim of the next epoch, when the owner's claim has not changed
for ``lapse`` by the standby's own clock (no clocks compared across hosts), was released, or
names a process on this host (same boot and pid namespace) that is gone. Takeover is a
create-if-absent, so of several standbys exactly one wins.

The owner of epoch E is fenced once the claim of E + 1 exists: one existence check, made before
every bookkeeping and Delta commit (:func:`check_epoch`) and at every heartbeat. A fenced sink
stops with :class:`OutputFenced`: exit 3, never 75, since a rerun would only wait as a standby.

Claims are never deleted (one small file per takeover): the check rests on E + 1 staying. When
the two newest alone were kept, an owner paused through three takeovers found E + 1 gone and
committed again beside the newest owner.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from pidfence.spark_sink.errors import SinkError
from pidfence.spark_sink.storage import Store, batch_name

log = logging.getLogger(__name__)

#: The claims' folder, under the sink's own folder. Every claim is kept (see the module).
CLAIMS: Final = "_claims"
#: How often a standby looks at the owner's claim, at most (seconds).
STANDBY_POLL: Final = 2.0
#: The ``run`` of each claim this process holds (or is making): a claim naming this process
#: with another run is a leftover of an earlier query in it.
_HELD: set[str] = set()


class OutputFenced(SinkError):
    """A newer sink instance claimed the output: this one stopped before committing anything
    more. Not retriable: a rerun of the same command waits as a standby."""


@dataclass(frozen=True)
class Claim:
    """One epoch's claim: who (host, process) holds the output since when."""

    epoch: int
    host: str
    pid: int
    since: str
    run: str = ""
    beat: int = 0
    released: bool = False
    #: The boot and pid namespace of ``pid`` (:func:`_pid_space`): a pid means nothing outside.
    space: str = ""

    def owner(self) -> str:
        """``host HOST, process PID, since SINCE (epoch E)``."""
        return f"host {self.host}, process {self.pid}, since {self.since} (epoch {self.epoch})"

    def encode(self) -> bytes:
        """The stored form (JSON)."""
        return json.dumps(asdict(self), sort_keys=True).encode()


def new_tag(epoch: int) -> str:
    """An attempt-unique file tag: ``e{epoch}-`` and 12 random hex digits."""
    return f"e{epoch}-{uuid.uuid4().hex[:12]}"


def tag_epoch(tag: str) -> int | None:
    """The epoch a tag of :func:`new_tag` starts with (None: not such a tag)."""
    head, sep, _ = tag.partition("-")
    return int(head[1:]) if sep and head[:1] == "e" and head[1:].isdigit() else None


def _path(store: Store, epoch: int) -> str:
    return store.join(CLAIMS, batch_name(epoch) + ".json")


def newest_claim(store: Store) -> Claim | None:
    """The newest claim on the output (a listing of one name per takeover: never per batch)."""
    epochs = [int(n[:-5]) for n in store.list(store.join(CLAIMS)) if n[:-5].isdigit()]
    while epochs:
        epoch = max(epochs)
        try:
            return Claim(**json.loads(store.read(_path(store, epoch))))
        except FileNotFoundError:
            epochs.remove(epoch)
    return None


def check_epoch(store: Store, epoch: int) -> None:
    """Raise :class:`OutputFenced` if an instance claimed the output after ``epoch`` (epoch 0:
    a query started without :func:`claim_output`, unfenced)."""
    if epoch and store.exists(_path(store, epoch + 1)):
        newer = newest_claim(store)
        who = newer.owner() if newer else f"epoch {epoch + 1}"
        raise OutputFenced(
            f"{store.root}: another sink instance took this output over ({who}); this one "
            f"(epoch {epoch}) stopped without committing more. Run one sink per --output: stop "
            "the other instance first, or give this one another --output and --checkpoint"
        )


def _pid_space() -> str:
    """This boot's id and this process's pid namespace: containers that share a host name (host
    networking) have pids of their own, and each may be pid 1."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        return f"{boot}:{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:
        return ""  # no /proc: never judged gone by pid, only by its lapse


def _gone(claim: Claim) -> bool:
    """The claim names a process of this host, boot and pid namespace that no longer holds it."""
    if claim.host != socket.gethostname() or not claim.space or claim.space != _pid_space():
        return False
    if claim.pid == os.getpid():
        return claim.run not in _HELD
    try:
        os.kill(claim.pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


class OutputClaim:
    """The claim this instance holds; :meth:`watch` keeps it alive while a query runs."""

    def __init__(self, store: Store, claim: Claim, lapse: float) -> None:
        self.store = store
        self.claim = claim
        self.lapse = lapse
        #: Set when a newer epoch fenced this one.
        self.fenced: OutputFenced | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def epoch(self) -> int:
        """This instance's epoch."""
        return self.claim.epoch

    def beat(self) -> None:
        """Renew the claim, unless a newer epoch fenced it (then :attr:`fenced` is set)."""
        try:
            check_epoch(self.store, self.epoch)
        except OutputFenced as exc:
            self.fenced = exc
            return
        self.claim = Claim(**{**asdict(self.claim), "beat": self.claim.beat + 1})
        self.store.put(_path(self.store, self.epoch), self.claim.encode())

    def watch(self, query: Any) -> None:
        """Renew the claim every ``lapse / 6`` in a daemon thread while the streaming ``query``
        is active, then release it; stop the query if a newer epoch fences this one."""

        def run() -> None:
            while not self._stop.wait(self.lapse / 6):
                try:
                    if not query.isActive:
                        self.release()
                        return
                    self.beat()
                except OSError as exc:
                    # A store that blips must not end the renewals: the next beat tries again.
                    # Safety does not rest on them (every commit checks the next epoch first);
                    # only an outage longer than the lapse lets a standby take over.
                    log.warning("the claim on the output was not renewed (retrying): %s", exc)
                    continue
                if self.fenced is not None:
                    query.stop()
                    return

        self._thread = threading.Thread(target=run, name="pidfence-claim", daemon=True)
        self._thread.start()

    def release(self) -> None:
        """Stop renewing and mark the claim released: a standby takes over at once."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        if self.claim.run not in _HELD:
            return  # released already
        _HELD.discard(self.claim.run)
        if self.fenced is None and not self.store.exists(_path(self.store, self.epoch + 1)):
            released = Claim(**{**asdict(self.claim), "released": True})
            self.store.put(_path(self.store, self.epoch), released.encode())


def claim_output(
    store: Store,
    lapse: float,
    on_standby: Callable[[Claim], None] = lambda claim: None,
    stop: threading.Event | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> OutputClaim | None:
    """Claim the output for this process, waiting as a standby while another instance holds it.

    Args:
        store: the sink's own folder (``P/_pidfence``).
        lapse: seconds without a heartbeat after which an owner's claim has lapsed.
        on_standby: called once with the owner's claim when this instance starts waiting.
        stop: set it to give up waiting (then None is returned).
        clock: monotonic seconds (tests).
    """
    stop = stop or threading.Event()
    seen: tuple[bytes, float] | None = None
    told = False
    while True:
        try:
            current = newest_claim(store)
        except OSError as exc:  # a store that blips: the standby waits on, taking nothing over
            log.warning("could not read the output's claims (retrying): %s", exc)
            if stop.wait(STANDBY_POLL):
                return None
            continue
        epoch = 0 if current is None else current.epoch
        if current is not None and not current.released and not _gone(current):
            raw = current.encode()
            if seen is None or seen[0] != raw:
                seen = (raw, clock())
            if clock() - seen[1] < lapse:
                if not told:
                    on_standby(current)
                    told = True
                if stop.wait(min(STANDBY_POLL, lapse / 6)):
                    return None
                continue
        mine = Claim(
            epoch + 1,
            socket.gethostname(),
            os.getpid(),
            datetime.now(UTC).isoformat(timespec="seconds"),
            uuid.uuid4().hex[:12],
            space=_pid_space(),
        )
        _HELD.add(mine.run)  # before the claim is visible: a twin in this process sees it live
        try:
            if store.put_if_absent(_path(store, mine.epoch), mine.encode()):
                return OutputClaim(store, mine, lapse)
        except OSError as exc:  # maybe written: the next look finds it, from a gone run
            log.warning("the claim on the output was not taken (retrying): %s", exc)
        _HELD.discard(mine.run)
        seen = None  # another standby won this epoch: watch the new owner


__all__ = [
    "Claim",
    "OutputClaim",
    "OutputFenced",
    "check_epoch",
    "claim_output",
    "new_tag",
    "newest_claim",
    "tag_epoch",
]
