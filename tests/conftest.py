"""Suite-wide wiring: tier markers from folders, and the fixture plugins of each component."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from pidfence.services.process import JVM_OPTIONS_ENV

# Property tests claim correctness, not speed: on a loaded machine (two xdist workers beside
# JVMs) hypothesis's timing checks would fail a correct test. Speed is measured in bench/.
settings.register_profile("pidfence", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("pidfence")

# Every JVM of the suite (ZooKeeper, Kafka, Spark drivers of the session and of `pidfence sink`
# runs, executors) lives minutes on small data: C1 only and the serial collector halve their CPU
# (tests/README.md), and the suite is CPU-bound on two cores. Set before any fixture starts one;
# child processes inherit it. A run may choose other options by setting the variable itself.
os.environ.setdefault(JVM_OPTIONS_ENV, "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")

pytest_plugins = [
    "tests.fixtures.services",
    "tests.fixtures.network",
    "tests.fixtures.lease",
    "tests.fixtures.parallel",
    "tests.fixtures.store",
]

_TIERS = {"integration": "integration", "chaos": "chaos", "sim": "sim"}
_SPARK_LOCAL_DIRS = "SPARK_LOCAL_DIRS"
_JVM_TMPDIR = "-Djava.io.tmpdir"


@pytest.hookimpl(trylast=True)  # after pytest's own tmp_path set-up
def pytest_configure(config: pytest.Config) -> None:
    """Spark's scratch folders and every JVM's temp files go inside this run's temp folder: a
    JVM the suite kills on purpose never deletes its own (Spark's folders, about 10 MB each, 186
    left in /tmp by a day of runs; Kafka's extracted native libraries, about 500 a day), and
    pytest keeps only the last three runs' folders. Child processes inherit the variables."""
    base = Path(config._tmp_path_factory.getbasetemp())  # type: ignore[attr-defined]
    if _SPARK_LOCAL_DIRS not in os.environ:
        scratch = base / "spark-local"
        scratch.mkdir(parents=True, exist_ok=True)
        os.environ[_SPARK_LOCAL_DIRS] = str(scratch)
    if _JVM_TMPDIR not in os.environ[JVM_OPTIONS_ENV]:
        jvm_tmp = base / "jvm-tmp"
        jvm_tmp.mkdir(parents=True, exist_ok=True)
        os.environ[JVM_OPTIONS_ENV] += f" {_JVM_TMPDIR}={jvm_tmp}"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test with its tier, taken from the folder it lives in."""
    del config
    for item in items:
        parts = Path(str(item.fspath)).parts
        for folder, marker in _TIERS.items():
            if folder in parts:
                item.add_marker(getattr(pytest.mark, marker))


#: Longer bytes values get a short id instead of their escaped text (see below).
_LONG_BYTES = 48


def pytest_make_parametrize_id(config: pytest.Config, val: object, argname: str) -> str | None:
    """A bytes parameter longer than ``_LONG_BYTES`` gets the id ``ARGNAME-NB`` (N its length).

    pytest-xdist runs a test on a worker by its id, and every worker must collect the same ids:
    a value with random bytes (a signature made at import) would get a new id in each process.
    """
    del config
    if isinstance(val, bytes) and len(val) > _LONG_BYTES:
        return f"{argname}-{len(val)}B"
    return None


@pytest.fixture(autouse=True)
def _root_logger_as_found() -> Iterator[None]:
    """Give the root logger back as the test found it (handlers and level).

    A command run in-process (typer's ``CliRunner``) may configure logging for a whole process:
    ``pidfence lease-server`` puts a ``StreamHandler`` on the runner's stderr, which closes when
    the run ends, and sets the root level to INFO. Left in place, every later record goes to a
    closed stream: py4j's "Closing down clientserver connection", logged from a ``__del__`` at
    interpreter exit, then printed a "--- Logging error ---" traceback after the summary.
    """
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in root.handlers:
        if handler not in handlers:
            handler.close()
    root.handlers[:] = handlers
    root.setLevel(level)
