"""pidfence as its users install it (issue 37): the built wheel in a clean virtualenv, in a folder
outside the checkout, with a fresh home and an empty cache.

The base install (no extra) leases pids, serves ``pidfence lease-server`` and produces through it
with none of pyspark, pyarrow, matplotlib or polars installed, and names the extra a command needs.
Then ``pidfence[sink]`` runs ``pidfence sink --available-now`` against the session's Kafka and
writes the Delta table, fetching Spark's Kafka connector from Maven Central into the fresh cache
itself (the first-use path), and ``pidfence verify`` finds every produced record in it once.

pip installs the same versions the development venv has (a constraints file from its
``pip freeze``), from pip's own cache: the test checks pidfence's packaging, not PyPI's speed.
Sizes of the installs are measured by hand for the README (pip there compiles, as by default).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pidfence.jars import CACHE_ENV
from pidfence.services.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
#: What the base install must not bring (the issue's list, and what those pull in).
HEAVY = ("pyspark", "pyarrow", "matplotlib", "polars", "pandas", "deltalake", "numpy")
RECORDS = 2000
VERIFY = ("verify", "--ledger", "ledger.jsonl", "--output", "out")
#: ``python -c WITHOUT_SPARK ARGS``: ``pidfence ARGS`` as if only the ``verify`` extra were
#: installed (importing what ``sink`` adds fails as a missing module does).
WITHOUT_SPARK = """
import sys

class Absent:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ("pyspark", "polars", "pandas"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)

sys.meta_path.insert(0, Absent())
from pidfence.cli import main
sys.argv[0] = "pidfence"
main()
"""

pytestmark = pytest.mark.slow


@dataclass
class User:
    """A clean venv, a fresh home and a working folder outside the checkout."""

    venv: Path
    home: Path
    work: Path
    env: dict[str, str]
    constraints: Path

    def run(self, *args: str, timeout: float = 600, **env: str) -> subprocess.CompletedProcess[str]:
        """Run a command of the venv (``pidfence``, ``python``, ``pip``) in the working folder."""
        exe = self.venv / "bin" / args[0]
        return subprocess.run(
            [str(exe), *args[1:]],
            cwd=self.work,
            env={**self.env, **env},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def pip_install(self, requirement: str) -> None:
        # --no-compile: what a run imports is compiled then, the rest (most of pyspark) never.
        constraints = ("-c", str(self.constraints))
        done = self.run("pip", "install", "--quiet", "--no-compile", *constraints, requirement)
        assert done.returncode == 0, done.stderr[-3000:]

    def installed(self) -> set[str]:
        """Names of the distributions in the venv."""
        done = self.run(
            "python",
            "-c",
            "import importlib.metadata as m;"
            "print('\\n'.join(d.metadata['Name'].lower() for d in m.distributions()))",
        )
        return set(done.stdout.split())


def _pip_cache() -> str:
    done = subprocess.run(
        [sys.executable, "-m", "pip", "cache", "dir"], capture_output=True, text=True, check=False
    )
    return done.stdout.strip()


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel, as a release builds it (``python -m build --wheel``)."""
    dist = tmp_path_factory.mktemp("dist")
    built = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(dist), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    (found,) = dist.glob("pidfence-*.whl")
    return found


@pytest.fixture(scope="module")
def user(tmp_path_factory: pytest.TempPathFactory) -> Iterator[User]:
    base = tmp_path_factory.mktemp("user")
    home, work = base / "home", base / "work"
    home.mkdir()
    work.mkdir()
    # Nothing of this checkout's set-up leaks in: no jar cache, run dir or Python path of ours.
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PIDFENCE_", "PYTHON", "VIRTUAL_ENV", "PYSPARK_", "SPARK_HOME"))
    }
    if "PIDFENCE_JVM_OPTIONS" in os.environ:  # the suite's JVM settings (C1 only): speed only
        env["PIDFENCE_JVM_OPTIONS"] = os.environ["PIDFENCE_JVM_OPTIONS"]
    env.update(HOME=str(home), XDG_CACHE_HOME=str(home / ".cache"), PIP_CACHE_DIR=_pip_cache())
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    frozen = subprocess.run(
        [sys.executable, "-m", "pip", "freeze", "--exclude-editable"],
        capture_output=True,
        text=True,
        check=True,
    )
    constraints = base / "constraints.txt"
    constraints.write_text(frozen.stdout)
    yield User(venv, home, work, env, constraints)


def _wait_serving(user: User, address: str, server: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert server.poll() is None, "the lease server exited"
        if (
            user.run("pidfence", "lease-server", "--health", address, "--timeout", "2").returncode
            == 0
        ):
            return
        time.sleep(0.5)
    pytest.fail(f"pidfence lease-server did not answer on {address}")


def test_the_wheel_as_users_install_it(
    wheel: Path, user: User, kafka: Any, zk_chroot: str, new_topic: Any
) -> None:
    user.pip_install(str(wheel))
    assert not set(HEAVY) & user.installed()
    imported = user.run(
        "python",
        "-c",
        "import sys, pidfence.producer, pidfence.pid_allocator, pidfence.cli;"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))",
    )
    assert imported.returncode == 0, imported.stderr
    assert imported.stdout.strip() == "[]"

    # The lease server and a producer through it, from the base install.
    address = f"127.0.0.1:{free_port()}"
    topic = new_topic(partitions=2)
    server = subprocess.Popen(
        [str(user.venv / "bin" / "pidfence"), "lease-server", "--zk", zk_chroot],
        cwd=user.work,
        env={**user.env, "PIDFENCE_LEASE_SERVER_LISTEN": address},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_serving(user, address, server)
        produced = user.run(
            "pidfence",
            "produce",
            "--bootstrap",
            kafka.bootstrap,
            "--lease-server",
            address,
            "--topic",
            topic,
            "--count",
            str(RECORDS),
            "--ledger",
            "ledger.jsonl",
        )
        assert produced.returncode == 0, produced.stderr[-3000:]
    finally:
        server.terminate()
        server.wait(30)

    # `pidfence services` from the wheel, outside any checkout. The jars come from the suite's
    # cache: fetching them is tests/integration/test_jars.py's part (and the sink's, below).
    services = {"PIDFENCE_JAR_CACHE": os.environ[CACHE_ENV], "PIDFENCE_RUN_DIR": "services"}
    try:
        up = user.run("pidfence", "services", "up", **services)
        assert up.returncode == 0, up.stdout[-2000:] + up.stderr[-2000:]
        assert user.run("pidfence", "services", "status", **services).returncode == 0
    finally:
        down = user.run("pidfence", "services", "down", **services)
    assert down.returncode == 0, down.stderr

    # A command that needs an extra names it, exit 3.
    sink_args = ["--bootstrap", kafka.bootstrap, "--topic", topic, "--output", "out"]
    sink_args += ["--checkpoint", "checkpoint", "--available-now", "--master", "local[1]"]
    refused = user.run("pidfence", "sink", *sink_args)
    assert refused.returncode == 3, refused.stderr
    assert "pip install 'pidfence[sink]'" in refused.stderr
    refused = user.run("pidfence", *VERIFY)
    assert refused.returncode == 3, refused.stderr
    assert "pip install 'pidfence[verify]'" in refused.stderr

    # The sink extra: the jars come from Maven Central into the fresh cache on first use.
    user.pip_install(f"{wheel}[sink]")
    assert {"pyspark", "pyarrow", "deltalake"} <= user.installed()
    assert not {"matplotlib"} & user.installed()
    ran = user.run("pidfence", "sink", *sink_args, timeout=900)
    assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-3000:]
    assert "fetching org.apache.spark:spark-sql-kafka-0-10_" in ran.stderr
    jars = user.home / ".cache" / "pidfence" / "jars"
    assert list(jars.glob("spark-sql-kafka-0-10_*/spark-sql-kafka-0-10_*.jar")), ran.stderr
    assert (user.work / "out" / "_delta_log").is_dir()
    # The checker needs the `verify` extra only: pyspark, polars and pandas made unimportable.
    checked = user.run("python", "-c", WITHOUT_SPARK, *VERIFY, "--json")
    assert checked.returncode == 0, checked.stdout[-3000:] + checked.stderr[-2000:]
    totals = json.loads(checked.stdout)["totals"]
    assert (totals["ledger"], totals["log"]) == (RECORDS, RECORDS), totals

    # Offline afterwards: a repository nobody serves is never asked.
    offline = user.run(
        "pidfence", "jars", "spark-kafka", PIDFENCE_MAVEN_REPOSITORY="http://127.0.0.1:9/"
    )
    assert offline.returncode == 0, offline.stderr
    assert "fetching" not in offline.stderr
