"""``pidfence.jars`` with the real Ivy against a Maven repository on disk (no network): transitive
resolution, checksums that refuse a changed file, the pinned Ivy jar, offline reuse, and the exit
codes of ``pidfence jars`` and ``pidfence sink --jars`` (3 with the fix named, never 75).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pidfence import jars
from pidfence.jars.ivy import IVY_VERSION

POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>org.example</groupId><artifactId>{artifact}</artifactId><version>{version}</version>
  <dependencies>{dependencies}</dependencies>
</project>
"""
DEPENDENCY = (
    "<dependency><groupId>org.example</groupId><artifactId>{artifact}</artifactId>"
    "<version>{version}</version></dependency>"
)


def _publish(repo: Path, artifact: str, version: str, deps: dict[str, str]) -> Path:
    """A module in Maven's layout, with the SHA-1 files Maven Central has beside each file."""
    folder = repo / "org" / "example" / artifact / version
    folder.mkdir(parents=True)
    dependencies = "".join(DEPENDENCY.format(artifact=a, version=v) for a, v in deps.items())
    pom = POM.format(artifact=artifact, version=version, dependencies=dependencies)
    files = {f"{artifact}-{version}.pom": pom.encode(), f"{artifact}-{version}.jar": b"PK jar"}
    for name, data in files.items():
        (folder / name).write_bytes(data)
        (folder / f"{name}.sha1").write_text(hashlib.sha1(data).hexdigest())  # noqa: S324
    return folder / f"{artifact}-{version}.jar"


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``org.example:lib:1.0`` (depending on ``dep:2.0``) and Ivy, in a ``file://`` repository."""
    root = tmp_path / "repo"
    _publish(root, "lib", "1.0", {"dep": "2.0"})
    _publish(root, "dep", "2.0", {})
    ivy = root / "org" / "apache" / "ivy" / "ivy" / IVY_VERSION
    ivy.mkdir(parents=True)
    shutil.copy(jars.pyspark_jars_dir() / f"ivy-{IVY_VERSION}.jar", ivy)  # the same jar
    monkeypatch.setenv(jars.REPOSITORY_ENV, root.as_uri())
    monkeypatch.setenv(jars.CACHE_ENV, str(tmp_path / "cache"))
    return root


LIB = jars.Component("lib-1.0", (jars.Module("org.example", "lib", "1.0"),))


def test_coordinates_in_verified_jars_out_then_offline(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lines: list[str] = []
    got = jars.fetch(LIB, lines.append)
    assert [p.name for p in got] == ["dep-2.0.jar", "lib-1.0.jar"]
    assert len(lines) == 2
    monkeypatch.setenv(jars.REPOSITORY_ENV, (repo.parent / "gone").as_uri())
    assert jars.fetch(LIB, lines.append) == got  # no repository asked
    assert len(lines) == 2


def test_a_file_that_fails_its_checksum_is_refused(repo: Path) -> None:
    _publish(repo, "bad", "1.0", {}).write_bytes(b"PK changed on the way")
    with pytest.raises(jars.FetchFailed, match="invalid sha1") as failed:
        jars.fetch(jars.Component("bad-1.0", (jars.Module("org.example", "bad", "1.0"),)))
    assert "PIDFENCE_MAVEN_REPOSITORY" in str(failed.value)  # the fix is named
    assert not (jars.cache_dir() / "bad-1.0").exists()


def test_an_ivy_jar_that_is_not_the_pinned_one_is_refused(repo: Path) -> None:
    (repo / "org" / "apache" / "ivy" / "ivy" / IVY_VERSION / f"ivy-{IVY_VERSION}.jar").write_bytes(
        b"PK not ivy"
    )
    with pytest.raises(jars.FetchFailed, match="SHA-256"):
        jars.fetch(LIB)
    assert not list(jars.cache_dir().glob("ivy-*.jar"))


def test_a_module_the_repository_lacks_is_named(repo: Path) -> None:
    del repo
    missing = jars.Component("x", (jars.Module("org.example", "nowhere", "9.9"),))
    with pytest.raises(jars.FetchFailed, match=r"org\.example#nowhere;9\.9"):
        jars.fetch(missing)


def _pidfence(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "from pidfence.cli import main; main()", *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_no_java_is_exit_3_naming_it(tmp_path: Path) -> None:
    no_java = {"PATH": str(tmp_path), "JAVA_HOME": "", jars.CACHE_ENV: str(tmp_path / "c")}
    done = _pidfence("jars", "kafka", **no_java)
    assert done.returncode == 3, done.stderr
    assert "`java` not found" in done.stderr and "Java 17" in done.stderr


def test_jars_copies_the_connector_for_a_machine_without_network(tmp_path: Path) -> None:
    done = _pidfence("jars", "--to", str(tmp_path / "offline"))
    assert done.returncode == 0, done.stderr
    spark, scala = jars.spark_versions()
    assert (tmp_path / "offline" / f"spark-sql-kafka-0-10_{scala}-{spark}.jar").is_file()
    assert jars.connector_jars(tmp_path / "offline")  # what `pidfence sink --jars` takes
    printed = _pidfence("jars", "--packages")
    assert printed.stdout.strip() == f"org.apache.spark:spark-sql-kafka-0-10_{scala}:{spark}"


def test_sink_with_a_folder_lacking_the_connector_is_exit_3(
    kafka: Any, new_topic: Any, tmp_path: Path
) -> None:
    (tmp_path / "jars").mkdir()
    done = _pidfence(
        "sink",
        "--bootstrap",
        kafka.bootstrap,
        "--topic",
        new_topic(),
        "--output",
        str(tmp_path / "out"),
        "--checkpoint",
        str(tmp_path / "ckpt"),
        "--available-now",
        PIDFENCE_JARS=str(tmp_path / "jars"),
    )
    assert done.returncode == 3, done.stderr
    assert "has no spark-sql-kafka-0-10_" in done.stderr
    assert "pidfence jars spark-kafka --to" in done.stderr
