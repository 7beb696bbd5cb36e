"""Which JVM options map (or record) an application's class archive."""

from __future__ import annotations

from pathlib import Path

import pytest

from pidfence.services import class_archive
from pidfence.services.class_archive import (
    CLASS_ARCHIVE_ENV,
    archive_options,
    archive_path,
    recording_path,
)


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PIDFENCE_JAR_CACHE", str(tmp_path))
    monkeypatch.delenv(CLASS_ARCHIVE_ENV, raising=False)
    return tmp_path


def test_no_archive_yet_adds_no_option() -> None:
    # A -XX:SharedArchiveFile naming a missing file would switch off the JDK's own archive too.
    assert archive_options("kafka", "/jars/a.jar") == []


def test_a_recorded_archive_is_mapped_quietly() -> None:
    archive = archive_path("kafka", "/jars/a.jar")
    archive.parent.mkdir(parents=True)
    archive.write_bytes(b"jsa")
    options = archive_options("kafka", "/jars/a.jar")
    assert options[0] == f"-XX:SharedArchiveFile={archive}"
    assert "-Xlog:cds=off" in options and "-Xlog:cds+dynamic=off" in options


def test_another_classpath_or_application_finds_no_archive() -> None:
    archive = archive_path("kafka", "/jars/a.jar")
    archive.parent.mkdir(parents=True)
    archive.write_bytes(b"jsa")
    assert archive_path("kafka", "/jars/b.jar") != archive
    assert archive_options("kafka", "/jars/b.jar") == []
    assert archive_options("zookeeper", "/jars/a.jar") == []


def test_off_ignores_an_archive(monkeypatch: pytest.MonkeyPatch) -> None:
    archive = archive_path("spark", "x")
    archive.parent.mkdir(parents=True)
    archive.write_bytes(b"jsa")
    monkeypatch.setenv(CLASS_ARCHIVE_ENV, "off")
    assert archive_options("spark", "x") == []


def test_record_writes_beside_the_archive_for_the_recorder_to_publish(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(CLASS_ARCHIVE_ENV, "record")
    archive = archive_path("spark", "x")
    assert archive_options("spark", "x")[0] == f"-XX:ArchiveClassesAtExit={recording_path(archive)}"
    assert recording_path(archive) != archive and recording_path(archive).parent == archive.parent


def test_the_archive_name_carries_the_jdk(monkeypatch: pytest.MonkeyPatch) -> None:
    before = archive_path("kafka", "/jars/a.jar")
    class_archive._jdk_identity.cache_clear()
    monkeypatch.setattr(class_archive, "java", lambda: "/nonexistent/other-jdk/bin/java")
    try:
        assert archive_path("kafka", "/jars/a.jar") != before
    finally:
        class_archive._jdk_identity.cache_clear()


def test_a_driver_with_the_s3a_jars_first_has_an_archive_of_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The JVM maps an archive only onto the class path it was recorded with; an s3:// run puts
    # the S3A jars first (spark.driver.extraClassPath), so the local run's archive never maps.
    from pidfence.services import spark

    monkeypatch.setattr(spark, "connector_jars", lambda folder=None: "/jars/kafka.jar")
    local = spark.driver_classpath_identity()
    s3 = spark.driver_classpath_identity("/jars/hadoop-aws.jar:/jars/bundle.jar")
    assert spark.driver_classpath_identity("") == local
    assert archive_path("spark", s3) != archive_path("spark", local)
