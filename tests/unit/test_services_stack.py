"""State-file logic of ``pidfence services`` (no server is started, no process is signalled)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pidfence.cli import app
from pidfence.services import stack

#: Above the largest pid_max Linux allows (2**22), so no process can ever have this pid.
NO_SUCH_PID = 2**22 + 1


def _state(run_dir: Path, nodes: list[stack.NodeRecord]) -> stack.ServicesState:
    return stack.ServicesState(
        run_dir=str(run_dir),
        zookeeper="127.0.0.1:2181,127.0.0.1:2182",
        kafka="127.0.0.1:9092",
        nodes=nodes,
        created_at="2026-01-01T00:00:00Z",
    )


def _dead(name: str, port: int = 1) -> stack.NodeRecord:
    return stack.NodeRecord(name, NO_SUCH_PID, 12345, port, f"/tmp/{name}.log")


def test_state_round_trips(tmp_path: Path) -> None:
    state = _state(tmp_path, [_dead("zookeeper-0", 2181), _dead("kafka-0", 9092)])
    path = stack.write_state(tmp_path, state)
    assert path == tmp_path / stack.STATE_FILE
    assert not list(tmp_path.glob("*.tmp"))
    assert stack.read_state(tmp_path) == state
    assert json.loads(path.read_text())["version"] == 1


def test_missing_state_is_none(tmp_path: Path) -> None:
    assert stack.read_state(tmp_path) is None
    assert stack.status(tmp_path) is None


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        "[]",
        '{"version": 2}',
        '{"version": 1, "run_dir": "x"}',
        '{"version": 1, "run_dir": "x", "zookeeper": "", "kafka": "", "nodes": [{"pid": 1}]}',
    ],
)
def test_unreadable_state_is_an_error(tmp_path: Path, text: str) -> None:
    (tmp_path / stack.STATE_FILE).write_text(text)
    with pytest.raises(stack.ServicesError):
        stack.read_state(tmp_path)


def test_status_document(tmp_path: Path) -> None:
    doc = _state(tmp_path, [_dead("zookeeper-0"), _dead("kafka-0")]).status()
    assert doc["zookeeper"] == "127.0.0.1:2181,127.0.0.1:2182"
    assert doc["kafka"] == "127.0.0.1:9092"
    assert doc["run_dir"] == str(tmp_path)
    assert doc["pids"] == {"zookeeper-0": NO_SUCH_PID, "kafka-0": NO_SUCH_PID}
    assert doc["alive"] == {"zookeeper-0": False, "kafka-0": False}


def test_start_time_identifies_a_process() -> None:
    me = os.getpid()
    start = stack.proc_start_time(me)
    assert isinstance(start, int)
    assert stack.same_process(me, start)
    assert not stack.same_process(me, start + 1)
    assert stack.proc_start_time(NO_SUCH_PID) is None


def test_a_reused_pid_is_never_signalled() -> None:
    me = os.getpid()
    start = stack.proc_start_time(me)
    assert start is not None
    # Our own pid with another start time: a recorded server whose pid the kernel gave to us.
    impostor = stack.NodeRecord("kafka-0", me, start + 1, 9092, "/tmp/x.log")
    assert stack.stop_recorded([impostor, _dead("zookeeper-0")], timeout=0.1) == []


def test_down_removes_state_of_dead_services(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    for sub in ("zookeeper", "kafka"):
        (run_dir / sub / "data").mkdir(parents=True)
    stack.write_state(run_dir, _state(run_dir, [_dead("zookeeper-0"), _dead("kafka-0")]))
    (tmp_path / "keep").write_text("not ours")
    assert stack.down(run_dir, timeout=0.1) == []
    assert not run_dir.exists()
    assert (tmp_path / "keep").exists()


def test_down_keeps_foreign_files(tmp_path: Path) -> None:
    stack.write_state(tmp_path, _state(tmp_path, [_dead("kafka-0")]))
    (tmp_path / "notes.txt").write_text("user file")
    stack.down(tmp_path, timeout=0.1)
    assert not (tmp_path / stack.STATE_FILE).exists()
    assert (tmp_path / "notes.txt").exists()


def test_default_run_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PIDFENCE_RUN_DIR", str(tmp_path / "x"))
    assert stack.default_run_dir() == tmp_path / "x"
    monkeypatch.delenv("PIDFENCE_RUN_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    # the same folder from wherever the command runs, in or outside a checkout
    assert stack.default_run_dir() == tmp_path / "cache" / "pidfence" / "services"


def test_node_names_are_checked(tmp_path: Path) -> None:
    services = stack.Services(zookeeper=1, kafka=1, run_dir=tmp_path)
    for bad in ("spark-0", "kafka", "kafka-x", "zookeeper-5"):
        with pytest.raises(stack.ServicesError):
            services.kill(bad)
    with pytest.raises(ValueError, match=r"1\.\.3"):
        stack.Services(zookeeper=4)


def _me(name: str) -> stack.NodeRecord:
    start = stack.proc_start_time(os.getpid())
    assert start is not None
    return stack.NodeRecord(name, os.getpid(), start, 1, "")


def test_up_with_live_services_starts_nothing_and_says_already_up(tmp_path: Path) -> None:
    stack.write_state(tmp_path, _state(tmp_path, [_me("zookeeper-0"), _me("kafka-0")]))
    with pytest.raises(stack.ServicesAlreadyUp) as caught:
        stack.Services(run_dir=tmp_path).up()
    assert caught.value.state.pids() == {"zookeeper-0": os.getpid(), "kafka-0": os.getpid()}


def test_up_with_a_dead_node_names_it(tmp_path: Path) -> None:
    stack.write_state(tmp_path, _state(tmp_path, [_me("zookeeper-0"), _dead("kafka-0")]))
    with pytest.raises(stack.ServicesPartlyDown, match="kafka-0") as caught:
        stack.Services(run_dir=tmp_path).up()
    assert [n.name for n in caught.value.dead] == ["kafka-0"]


def test_cli_up_when_already_up_exits_0_with_status(tmp_path: Path) -> None:
    stack.write_state(tmp_path, _state(tmp_path, [_me("zookeeper-0"), _me("kafka-0")]))
    result = CliRunner().invoke(app, ["services", "up", "--run-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("already up")
    assert "kafka-0" in result.stdout and "zookeeper-0" in result.stdout


def test_cli_up_when_already_up_with_another_shape_exits_3(tmp_path: Path) -> None:
    stack.write_state(tmp_path, _state(tmp_path, [_me("zookeeper-0"), _me("kafka-0")]))
    result = CliRunner().invoke(app, ["services", "up", "--kafka", "3", "--run-dir", str(tmp_path)])
    assert result.exit_code == 3
    assert "1 ZooKeeper and 1 Kafka" in result.stderr


def test_cli_up_with_a_dead_node_exits_3_naming_it(tmp_path: Path) -> None:
    stack.write_state(tmp_path, _state(tmp_path, [_me("zookeeper-0"), _dead("kafka-0")]))
    result = CliRunner().invoke(app, ["services", "up", "--run-dir", str(tmp_path)])
    assert result.exit_code == 3
    assert "kafka-0" in result.stderr and "partly down" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_cli_status(tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["services", "status", "--json", "--run-dir", str(tmp_path)])
    assert result.exit_code == 3
    assert "no services recorded" in result.stderr
    assert json.loads(result.stdout) == {"zookeeper": None, "kafka": None, "alive": {}}
    stack.write_state(tmp_path, _state(tmp_path, [_me("zookeeper-0"), _dead("kafka-0")]))
    result = runner.invoke(app, ["services", "status", "--json", "--run-dir", str(tmp_path)])
    assert result.exit_code == 3, result.output
    doc = json.loads(result.stdout)
    assert doc["kafka"] == "127.0.0.1:9092"
    assert doc["pids"] == {"zookeeper-0": os.getpid(), "kafka-0": NO_SUCH_PID}
    assert doc["alive"] == {"zookeeper-0": True, "kafka-0": False}
    assert result.stderr.strip() == (
        f"pidfence services status: error: not running: kafka-0 (pid {NO_SUCH_PID}, "
        "log /tmp/kafka-0.log)"
    )
    result = runner.invoke(app, ["services", "status", "--run-dir", str(tmp_path)])
    assert result.exit_code == 3
    assert "DEAD" in result.stdout
    stack.write_state(tmp_path, _state(tmp_path, [_me("zookeeper-0"), _me("kafka-0")]))
    result = runner.invoke(app, ["services", "status", "--run-dir", str(tmp_path)])
    assert result.exit_code == 0
    assert "kafka-0" in result.stdout


def test_cli_env_exports_the_addresses(tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["services", "env", "--run-dir", str(tmp_path)])
    assert result.exit_code == 3 and "no services recorded" in result.stderr
    stack.write_state(tmp_path, _state(tmp_path, [_me("zookeeper-0"), _me("kafka-0")]))
    result = runner.invoke(app, ["services", "env", "--run-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[:2] == [
        "export PIDFENCE_BOOTSTRAP=127.0.0.1:9092",
        f"export PIDFENCE_ZK={_state(tmp_path, []).zookeeper}",
    ]
    assert lines[2].startswith("export PIDFENCE_LEASE=127.0.0.1:")
    live = _state(tmp_path, [_me("zookeeper-0"), _me("kafka-0")])
    live.lease = "127.0.0.1:7071"
    stack.write_state(tmp_path, live)
    for _ in range(2):  # a new shell exports the same address for the lease server
        result = runner.invoke(app, ["services", "env", "--run-dir", str(tmp_path)])
        assert result.stdout.splitlines()[2] == "export PIDFENCE_LEASE=127.0.0.1:7071"
    stack.write_state(tmp_path, _state(tmp_path, [_me("zookeeper-0"), _dead("kafka-0")]))
    result = runner.invoke(app, ["services", "env", "--run-dir", str(tmp_path)])
    assert result.exit_code == 3 and result.stdout == ""


def test_cli_rejects_bad_sizes() -> None:
    result = CliRunner().invoke(app, ["services", "up", "--kafka", "4"])
    assert result.exit_code == 2


def test_the_lease_address_is_kept_while_the_services_are_recorded(tmp_path: Path) -> None:
    services = stack.Services(run_dir=tmp_path)
    first = services.record().lease
    assert first.startswith("127.0.0.1:")
    assert services.record().lease == first  # a restart records again: the same address
    recorded = stack.read_state(tmp_path)
    assert recorded is not None and recorded.lease == first
    stack.remove_state(tmp_path)
    assert stack.Services(run_dir=tmp_path).record().lease.startswith("127.0.0.1:")
