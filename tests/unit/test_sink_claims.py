"""The output claim (claims.py): one owner, standbys that wait, takeover by epoch."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from pidfence.spark_sink.claims import (
    Claim,
    OutputFenced,
    _gone,
    _pid_space,
    check_epoch,
    claim_output,
    newest_claim,
)
from pidfence.spark_sink.storage import Store


class _Query:
    isActive = True

    def stop(self) -> None:
        self.isActive = False


def test_first_claim_is_epoch_one_and_names_this_process(tmp_path: Path) -> None:
    claim = claim_output(Store.at(str(tmp_path)), lapse=30)
    assert claim is not None and claim.epoch == 1
    found = newest_claim(Store.at(str(tmp_path)))
    assert found is not None
    assert (found.host, found.pid) == (socket.gethostname(), os.getpid())


def test_a_standby_waits_while_the_owner_is_live_and_names_it(tmp_path: Path) -> None:
    store = Store.at(str(tmp_path))
    owner = claim_output(store, lapse=30)
    assert owner is not None
    seen: list[Claim] = []
    stop = threading.Event()

    def on_standby(claim: Claim) -> None:
        seen.append(claim)
        stop.set()  # an operator's Ctrl-C while waiting

    assert claim_output(store, lapse=30, on_standby=on_standby, stop=stop) is None
    assert [c.epoch for c in seen] == [1]
    assert f"process {os.getpid()}" in seen[0].owner()
    check_epoch(store, owner.epoch)  # the owner is not fenced by a standby


def test_a_lapsed_claim_is_taken_over_and_its_owner_fenced(tmp_path: Path) -> None:
    store = Store.at(str(tmp_path))
    owner = claim_output(store, lapse=30)
    assert owner is not None
    ticks = iter(range(0, 1000, 40))
    standby = claim_output(store, lapse=30, clock=lambda: float(next(ticks)))
    assert standby is not None and standby.epoch == 2
    with pytest.raises(OutputFenced, match=f"process {os.getpid()}"):
        check_epoch(store, owner.epoch)
    owner.beat()
    assert owner.fenced is not None
    owner.release()  # a fenced owner never marks the newer claim released
    assert newest_claim(store) == standby.claim


def test_an_owner_paused_through_three_takeovers_is_still_fenced(tmp_path: Path) -> None:
    """Owner 1 pauses; 2, 3 and 4 each take over from a lapsed claim. When 1 wakes, its check
    and its heartbeat fence it. (With only the two newest claims kept, claim 2 was gone by then,
    1 passed its check, its heartbeat re-created claim 1, and it committed beside owner 4.)"""
    store = Store.at(str(tmp_path))
    paused = claim_output(store, lapse=30)
    assert paused is not None
    ticks = iter(range(0, 10_000, 40))
    for epoch in (2, 3, 4):
        taker = claim_output(store, lapse=30, clock=lambda: float(next(ticks)))
        assert taker is not None and taker.epoch == epoch
    with pytest.raises(OutputFenced):
        check_epoch(store, paused.epoch)
    paused.beat()
    assert paused.fenced is not None


def test_a_released_claim_is_taken_over_at_once(tmp_path: Path) -> None:
    store = Store.at(str(tmp_path))
    owner = claim_output(store, lapse=3600)
    assert owner is not None
    owner.release()
    nxt = claim_output(store, lapse=3600)
    assert nxt is not None and nxt.epoch == 2


def test_a_claim_of_a_dead_process_on_this_host_is_taken_over_at_once(tmp_path: Path) -> None:
    store = Store.at(str(tmp_path))
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    when = "2026-01-01T00:00:00+00:00"
    claim = Claim(7, socket.gethostname(), int(dead.stdout), when, space=_pid_space())
    store.put(store.join("_claims", f"{7:020d}.json"), claim.encode())
    nxt = claim_output(store, lapse=3600)
    assert nxt is not None and nxt.epoch == 8


def test_a_pid_of_another_pid_namespace_is_never_judged_gone(tmp_path: Path) -> None:
    """Two containers with host networking share the host name, and each may run its sink as
    pid 1: a claim from another pid namespace (or without one) waits for its lapse."""
    store = Store.at(str(tmp_path))
    for space in ("another-boot:4026531836", ""):
        owner = Claim(1, socket.gethostname(), 1, "2026-01-01T00:00:00+00:00", "r", space=space)
        assert not _gone(owner)
        store.put(store.join("_claims", f"{1:020d}.json"), owner.encode())
        assert _standby_sees(store) == [owner]


def _standby_sees(store: Store) -> list[Claim]:
    """The owners a standby waits for, told once (its wait is then stopped)."""
    stop = threading.Event()
    seen: list[Claim] = []

    def on_standby(claim: Claim) -> None:
        seen.append(claim)
        stop.set()

    assert claim_output(store, lapse=3600, on_standby=on_standby, stop=stop) is None
    return seen


def test_the_owner_renews_while_its_query_runs_and_releases_when_it_stops(
    tmp_path: Path,
) -> None:
    store = Store.at(str(tmp_path))
    owner = claim_output(store, lapse=1.2)
    assert owner is not None
    query = _Query()
    owner.watch(query)
    path = tmp_path / "_claims" / f"{1:020d}.json"
    beats = set()
    while len(beats) < 3:
        beats.add(json.loads(path.read_text())["beat"])
    query.stop()
    owner.release()
    assert json.loads(path.read_text())["released"] is True


def test_a_store_that_blips_does_not_end_the_renewals(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two renewals fail with the store's OSError; the heartbeat goes on, and the claim is
    renewed once the store answers again (a dead heartbeat lets a standby take over a live
    sink)."""
    store = Store.at(str(tmp_path))
    owner = claim_output(store, lapse=0.6)
    assert owner is not None
    failures = [OSError("store unreachable"), OSError("store unreachable")]
    put = Store.put

    def blipping_put(self: Store, path: str, data: bytes) -> None:
        if failures:
            raise failures.pop()
        put(self, path, data)

    monkeypatch.setattr(Store, "put", blipping_put)
    query = _Query()
    owner.watch(query)
    path = tmp_path / "_claims" / f"{1:020d}.json"
    while json.loads(path.read_text())["beat"] < 2:
        pass
    assert not failures
    query.stop()
    owner.release()
    assert json.loads(path.read_text())["released"] is True


def test_twins_claiming_at_once_one_owns_the_other_waits(tmp_path: Path) -> None:
    store = Store.at(str(tmp_path))
    barrier = threading.Barrier(2)
    stop = threading.Event()
    got: list[int | None] = []

    def twin() -> None:
        barrier.wait()
        claim = claim_output(store, lapse=30, on_standby=lambda c: stop.set(), stop=stop)
        got.append(None if claim is None else claim.epoch)

    threads = [threading.Thread(target=twin) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)  # fsyncs on a disk a soak keeps busy can take long
    assert sorted(got, key=str) == [1, None]


def test_a_listing_survives_its_folder_coming_and_going(tmp_path: Path) -> None:
    """Twins starting on a new output: one lists the claims while the other creates their
    folder. Arrow's listing failed in that instant ("Cannot list directory", errno 2: about one
    listing in 70 here while another thread makes and removes the folder)."""
    store = Store.at(str(tmp_path))
    folder = tmp_path / "_claims"
    done = threading.Event()

    def come_and_go() -> None:
        while not done.is_set():
            folder.mkdir()
            folder.rmdir()

    churn = threading.Thread(target=come_and_go)
    churn.start()
    try:
        for _ in range(20_000):
            assert store.list(str(folder)) == []
    finally:
        done.set()
        churn.join()


def test_a_store_that_blips_while_claiming_is_waited_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A listing and a create that fail with the store's OSError are retried: the instance
    claims the output once the store answers (it ended the run with exit 3 before)."""
    store = Store.at(str(tmp_path))
    failures = {"list": [OSError("store unreachable")], "put": [OSError("timed out")]}
    real_list, real_put = Store.list, Store.put_if_absent

    def blipping_list(self: Store, path: str) -> list[str]:
        if failures["list"]:
            raise failures["list"].pop()
        return real_list(self, path)

    def blipping_put(self: Store, path: str, data: bytes) -> bool:
        if failures["put"]:
            raise failures["put"].pop()
        return real_put(self, path, data)

    monkeypatch.setattr(Store, "list", blipping_list)
    monkeypatch.setattr(Store, "put_if_absent", blipping_put)
    monkeypatch.setattr("pidfence.spark_sink.claims.STANDBY_POLL", 0.01)
    claim = claim_output(store, lapse=30)
    assert claim is not None and claim.epoch == 1
    assert failures == {"list": [], "put": []}
