"""The demo's ``--out``: what it may reset, the marker it leaves, services a ``--keep-running``
run left alive, and where its PKI goes (never the README quickstart's ``out/pki``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pidfence.demo import DemoConfig
from pidfence.demo.record import MARKER, DemoPaths, OutRefused, OutUnusable


def test_a_new_or_empty_out_is_used_and_marked(tmp_path: Path) -> None:
    for out in (tmp_path / "new", tmp_path):
        paths = DemoPaths(out)
        paths.check_usable()
        paths.reset()
        assert (out / MARKER).exists()
        assert (out / "ledgers").is_dir() and (out / "logs").is_dir()


def test_an_out_holding_what_the_demo_would_delete_but_no_marker_is_refused(
    tmp_path: Path,
) -> None:
    (tmp_path / "output").mkdir()
    (tmp_path / "src").mkdir()
    with pytest.raises(OutRefused, match="output"):
        DemoPaths(tmp_path).check_usable()
    assert (tmp_path / "output").is_dir()


def test_other_files_in_out_are_kept_and_a_marked_out_is_reset(tmp_path: Path) -> None:
    (tmp_path / "pki").mkdir()  # the README quickstart's
    (tmp_path / "ledger.jsonl").write_text("{}\n")
    paths = DemoPaths(tmp_path)
    paths.check_usable()  # nothing the demo would delete: usable
    paths.reset()
    (tmp_path / "logs" / "old.log").write_text("x")
    paths.check_usable()  # marked now
    paths.reset()
    assert not (tmp_path / "logs" / "old.log").exists()
    assert (tmp_path / "pki").is_dir() and (tmp_path / "ledger.jsonl").exists()


def test_out_that_is_a_file_is_unusable(tmp_path: Path) -> None:
    (tmp_path / "out").write_text("")
    with pytest.raises(OutUnusable):
        DemoPaths(tmp_path / "out").check_usable()
    with pytest.raises(OutUnusable):
        DemoPaths(tmp_path / "out" / "below").check_usable()


def _services(out: Path, pids: dict[str, int]) -> None:
    (out / MARKER).write_text("")
    (out / "services.json").write_text(json.dumps({"pids": pids}))


def test_services_a_keep_running_run_left_alive_refuse_the_next_run(tmp_path: Path) -> None:
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        _services(tmp_path, {"lease-0": alive.pid})
        with pytest.raises(OutRefused, match=f"kill {alive.pid}"):
            DemoPaths(tmp_path).check_usable()
    finally:
        alive.kill()
        alive.wait()
    DemoPaths(tmp_path).check_usable()  # gone now: usable


def test_reset_removes_services_json(tmp_path: Path) -> None:
    _services(tmp_path, {"lease-0": 2**22 + 12345})  # no such pid
    paths = DemoPaths(tmp_path)
    paths.check_usable()
    paths.reset()
    assert not (tmp_path / "services.json").exists()


def test_the_demo_pki_goes_under_the_run_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pidfence.demo import start

    made: list[Path] = []

    class Pki:
        token_files = {"producer": tmp_path / "token"}
        ca = tmp_path / "ca.pem"

        def server_options(self) -> dict[str, Any]:
            return {}

    def make_lease_pki(folder: Path) -> Pki:
        made.append(folder)
        return Pki()

    monkeypatch.setattr(start, "make_lease_pki", make_lease_pki)
    monkeypatch.setattr(start, "two_lease_servers", lambda *a, **k: [])
    cleanups: list[Any] = []
    paths = DemoPaths(tmp_path / "out")
    try:
        start._start_lease_servers(DemoConfig(out=paths.out), paths, "zk:1", cleanups, {})
    finally:
        for step in reversed(cleanups):
            step()
    assert made == [tmp_path / "out" / "run" / "pki"]
    assert paths.pki == paths.run / "pki"
