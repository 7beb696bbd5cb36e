"""Class-data-sharing archives: JVMs that start from a snapshot of the classes they load.

A Spark driver loads about 20,000 classes from some 250 jars before it runs a query; parsing and
verifying them is most of its start-up (about 5 of 10 CPU seconds on the 2-core machine). The JDK
can record the classes an application loaded into an archive when it exits
(``-XX:ArchiveClassesAtExit``) and map that archive into later runs (``-XX:SharedArchiveFile``):
JEP 350, dynamic CDS. ``make setup`` records one archive per application pidfence starts
(ZooKeeper, Kafka, the Spark driver) by running a small pipeline once
(:mod:`pidfence.services.class_archive_record`); every later JVM of that application maps it.

An archive is named after a digest of the JDK and the application's classpath, so new jars or a
new JDK simply find no archive (and ``make setup`` records a fresh one). The JVM validates the
archive itself too; if it does not match, the JVM starts as it would without one, and the options
here keep that fallback quiet. ``PIDFENCE_CLASS_ARCHIVE=off`` starts every JVM without an archive.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
from pathlib import Path

from pidfence.jars import cache_dir, java

#: ``off``: no archive; ``record``: write one at the JVM's exit (what ``make setup`` runs).
CLASS_ARCHIVE_ENV = "PIDFENCE_CLASS_ARCHIVE"

#: A mismatched archive (new jars, another JDK) is a silent fallback, not a line on the console.
_QUIET = ("-Xlog:cds=off", "-Xlog:cds+dynamic=off")


def archive_dir() -> Path:
    """Where the archives live: ``cds`` beside the jar cache."""
    return cache_dir() / "cds"


@functools.cache
def _jdk_identity() -> str:
    """The JDK's real path and build time: another JDK needs another archive."""
    found = shutil.which(java()) or java()
    real = Path(found).resolve()
    try:
        stamp = real.stat().st_mtime_ns
    except OSError:
        stamp = 0
    return f"{real}@{stamp}"


def archive_path(application: str, classpath: str) -> Path:
    """The archive of ``application`` run on ``classpath`` by this JDK (it may not exist)."""
    digest = hashlib.sha256(f"{_jdk_identity()}\n{classpath}".encode()).hexdigest()[:16]
    return archive_dir() / f"{application}-{digest}.jsa"


def recording_path(archive: Path) -> Path:
    """Where a recording JVM writes before the recorder moves it to ``archive``."""
    return archive.with_suffix(".recording")


def archive_options(application: str, classpath: str) -> list[str]:
    """JVM options that map the application's archive, or record it in ``record`` mode.

    Empty when there is no archive yet: the JVM starts as usual, from the JDK's own archive (an
    option naming a missing file would switch that off too).
    """
    mode = os.environ.get(CLASS_ARCHIVE_ENV, "")
    if mode == "off":
        return []
    archive = archive_path(application, classpath)
    if mode == "record":
        return [f"-XX:ArchiveClassesAtExit={recording_path(archive)}", *_QUIET]
    if archive.is_file():
        return [f"-XX:SharedArchiveFile={archive}", *_QUIET]
    return []
