"""``pidfence.jars`` without a JVM: the Ivy request, the cache's reuse and locking, a folder of
jars named by the user, and the Spark components matched to the installed pyspark.

The real resolution (Ivy against a Maven repository, checksums) is in
``tests/integration/test_jars.py``.
"""

from __future__ import annotations

import subprocess
import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pyspark
import pytest

from pidfence import jars
from pidfence.cli.exits import EXIT_UNAVAILABLE, code_of
from pidfence.jars import cache as jar_cache
from pidfence.jars import ivy as jars_ivy
from pidfence.jars.ivy import REPOSITORY_ENV, _proxy_options, ivy_jar, ivy_module
from pidfence.spark_sink import configure, packages

LIB = jars.Module("org.example", "lib", "1.0")


def test_the_ivy_request_names_each_module_and_leaves_out_what_is_provided() -> None:
    modules = (LIB, jars.Module("org.example", "own", "2.0", transitive=False))
    root = ET.fromstring(ivy_module("c", modules, {"scala-library", "slf4j-api"}))  # noqa: S314
    deps = [
        (d.get("org"), d.get("name"), d.get("rev"), d.get("transitive"))
        for d in root.iter("dependency")
    ]
    assert deps == [("org.example", "lib", "1.0", None), ("org.example", "own", "2.0", "false")]
    assert sorted(e.get("module") for e in root.iter("exclude")) == ["scala-library", "slf4j-api"]


class FakeIvy:
    """Stands in for :func:`pidfence.jars.ivy.resolve`: writes one jar per module, slowly."""

    def __init__(self, delay: float = 0.0, fail: bool = False) -> None:
        self.calls = 0
        self.delay = delay
        self.fail = fail

    def __call__(
        self, name: str, modules: tuple[jars.Module, ...], provided: object, into: Path, cache: Path
    ) -> None:
        self.calls += 1
        time.sleep(self.delay)
        into.mkdir()
        for m in modules:
            (into / f"{m.artifact}-{m.version}.jar").write_bytes(b"jar")
        (into / "notes.txt").write_text("not a jar")
        if self.fail:
            raise jars.FetchFailed("no network")


@pytest.fixture
def ivy(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> FakeIvy:
    monkeypatch.setenv(jars.CACHE_ENV, str(tmp_path / "cache"))
    fake = FakeIvy()
    monkeypatch.setattr(jar_cache, "resolve", fake)
    return fake


def test_a_component_is_fetched_once_and_used_offline_afterwards(ivy: FakeIvy) -> None:
    lines: list[str] = []
    component = jars.Component("lib-1.0", (LIB,))
    first = jars.fetch(component, lines.append)
    assert [p.name for p in first] == ["lib-1.0.jar"]  # jars only
    assert first[0].parent == jars.cache_dir() / "lib-1.0"
    assert lines[0].startswith("fetching org.example:lib:1.0 with dependencies from ")
    assert lines[1].startswith("lib-1.0: 1 jars")
    assert jars.fetch(component, lines.append) == first
    assert ivy.calls == 1 and len(lines) == 2


def test_another_request_or_a_damaged_folder_is_fetched_again(ivy: FakeIvy) -> None:
    jars.fetch(jars.Component("lib", (LIB,)))
    jars.fetch(jars.Component("lib", (jars.Module("org.example", "lib", "1.1"),)))
    assert ivy.calls == 2  # same folder name, another request: not the old jars
    (jar,) = jars.fetch(jars.Component("lib", (jars.Module("org.example", "lib", "1.1"),)))
    assert ivy.calls == 2
    jar.write_bytes(b"ja")  # truncated
    jars.fetch(jars.Component("lib", (jars.Module("org.example", "lib", "1.1"),)))
    assert ivy.calls == 3


def test_a_failed_fetch_leaves_nothing_half_done(ivy: FakeIvy) -> None:
    ivy.fail = True
    with pytest.raises(jars.FetchFailed):
        jars.fetch(jars.Component("lib-1.0", (LIB,)))
    assert [p.name for p in jars.cache_dir().iterdir()] == [".lib-1.0.lock"]
    ivy.fail = False
    assert jars.fetch(jars.Component("lib-1.0", (LIB,)))


def test_processes_starting_side_by_side_fetch_once(ivy: FakeIvy) -> None:
    ivy.delay = 0.3
    results: list[list[Path]] = []
    threads = [
        threading.Thread(target=lambda: results.append(jars.fetch(jars.Component("lib", (LIB,)))))
        for _ in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert ivy.calls == 1
    assert len(results) == 3 and all(r == results[0] for r in results)


def test_the_cache_is_the_users_unless_told(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv(jars.CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert jars.cache_dir() == tmp_path / "pidfence" / "jars"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert jars.cache_dir() == tmp_path / "home" / ".cache" / "pidfence" / "jars"


def test_spark_components_match_the_installed_pyspark() -> None:
    spark, scala = jars.spark_versions()
    assert spark == pyspark.__version__
    assert packages() == f"org.apache.spark:spark-sql-kafka-0-10_{scala}:{spark}"
    component = jars.COMPONENTS["spark-kafka"]()
    assert component.name == f"spark-sql-kafka-0-10_{scala}-{spark}"
    assert {"spark-core_" + scala, "scala-library", "hadoop-client-runtime"} <= component.provided
    assert "kafka-clients" not in component.provided
    # what a Spark dependency matched to pyspark's own (hadoop-aws to its Hadoop) reads
    assert jars.pyspark_artifacts()[f"spark-core_{scala}"] == spark
    hadoop = jars.pyspark_artifacts()["hadoop-client-api"]
    assert (jars.pyspark_jars_dir() / f"hadoop-client-api-{hadoop}.jar").is_file()


@pytest.mark.parametrize(
    ("jar", "artifact"),
    [
        ("kafka-clients-3.9.2.jar", "kafka-clients"),
        ("spark-core_2.13-4.2.0.jar", "spark-core_2.13"),
        ("spark-sql-kafka-0-10_2.13-4.2.0.jar", "spark-sql-kafka-0-10_2.13"),
        ("guava-33.4.0-jre.jar", "guava"),
        (
            "netty-transport-native-epoll-4.1.118.Final-linux-x86_64.jar",
            "netty-transport-native-epoll",
        ),
    ],
)
def test_a_jar_name_gives_its_whole_artifact_id(jar: str, artifact: str) -> None:
    assert jars.artifact_of(jar) == artifact


def test_delta_is_the_release_built_for_the_installed_spark() -> None:
    # delta-spark 4.4.x is built against Spark 4.2 (4.2.x/4.3.x: Spark 4.1, 4.0.x: Spark 4.0).
    delta = jars.COMPONENTS["delta"]()
    if not pyspark.__version__.startswith("4.2."):
        pytest.skip(f"pyspark {pyspark.__version__}: this test pins the Spark 4.2 mapping")
    assert delta.name == "delta-spark_2.13-4.4.0"
    assert [(str(m), m.transitive) for m in delta.modules] == [
        ("io.delta:delta-spark_2.13:4.4.0", False),
        ("io.delta:delta-storage:4.4.0", False),
    ]


def test_a_folder_of_jars_must_hold_the_matching_connector(tmp_path: Path) -> None:
    spark, scala = jars.spark_versions()
    (tmp_path / "kafka-clients-3.9.2.jar").write_bytes(b"jar")
    with pytest.raises(jars.JarsMissing, match=f"spark-sql-kafka-0-10_{scala}-{spark}.jar"):
        jars.connector_jars(tmp_path)
    (tmp_path / f"spark-sql-kafka-0-10_{scala}-{spark}.jar").write_bytes(b"jar")
    (tmp_path / "scala-library-2.13.0.jar").write_bytes(b"jar")  # pyspark ships its own
    names = [p.name for p in jars.connector_jars(tmp_path)]
    assert names == ["kafka-clients-3.9.2.jar", f"spark-sql-kafka-0-10_{scala}-{spark}.jar"]


def test_the_folder_may_come_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(jars.JARS_ENV, str(tmp_path))
    with pytest.raises(jars.JarsMissing, match=str(tmp_path)):
        jars.connector_jars()


def test_no_jar_error_asks_for_a_retry() -> None:
    # A rerun meets the same missing java, network or jar: exit 3, never 75.
    for error in (jars.MissingTool, jars.FetchFailed, jars.JarsMissing):
        assert code_of(error("x")) == EXIT_UNAVAILABLE


class Builder:
    """What :func:`configure` uses of ``SparkSession.Builder``."""

    def __init__(self, **options: str) -> None:
        self._options = dict(options)

    def config(self, key: str, value: str) -> Builder:
        self._options[key] = value
        return self


def test_configure_adds_the_connector_and_keeps_the_users_jars(tmp_path: Path) -> None:
    spark, scala = jars.spark_versions()
    connector = tmp_path / f"spark-sql-kafka-0-10_{scala}-{spark}.jar"
    connector.write_bytes(b"jar")
    builder = configure(Builder(**{"spark.jars": "/opt/mine.jar"}), jars=tmp_path)
    assert builder._options["spark.jars"] == f"/opt/mine.jar,{connector}"
    assert configure(Builder(), jars=tmp_path)._options["spark.jars"] == str(connector)


def test_a_hand_edited_manifest_is_fetched_again(ivy: FakeIvy) -> None:
    (jar,) = jars.fetch(jars.Component("lib", (LIB,)))
    (jar.parent / jar_cache.MANIFEST).write_text("[]")  # valid JSON, not the cache's object
    jars.fetch(jars.Component("lib", (LIB,)))
    assert ivy.calls == 2


def test_an_unwritable_cache_names_the_setting(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv(jars.CACHE_ENV, str(blocker / "cache"))  # under a file: never a folder
    with pytest.raises(jars.FetchFailed, match=jars.CACHE_ENV) as caught:
        jars.fetch(jars.Component("lib", (LIB,)))
    assert code_of(caught.value) == EXIT_UNAVAILABLE


def test_proxies_reach_java_with_their_ports_and_exceptions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTPS_PROXY", "https://proxy.example")
    monkeypatch.setenv("NO_PROXY", "mirror.local,.corp.example")
    assert _proxy_options() == [
        "-Dhttps.proxyHost=proxy.example",
        "-Dhttps.proxyPort=443",
        "-Dhttp.nonProxyHosts=mirror.local|*.corp.example",
    ]
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:80a")
    with pytest.raises(jars.FetchFailed, match=r"HTTPS_PROXY=http://proxy\.example:80a"):
        _proxy_options()


def test_proxy_credentials_reach_ivy_in_a_file_only_its_user_reads(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name in ("http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTPS_PROXY", "http://me%40corp:p%40ss%22w@proxy.example:3128")
    options = _proxy_options()
    assert "-Dhttp.proxyUser=me@corp" in options  # what Ivy's authenticator reads
    assert '-Dhttp.proxyPassword=p@ss"w' in options
    assert "-Djdk.http.auth.tunneling.disabledSchemes=" in options  # Basic through a tunnel
    seen: list[list[str]] = []

    def java(cmd: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        seen.append(cmd)
        argfile = Path(next(a for a in cmd if a.startswith("@"))[1:])
        assert argfile.stat().st_mode & 0o077 == 0
        assert '"-Dhttp.proxyPassword=p@ss\\"w"' in argfile.read_text()
        return subprocess.CompletedProcess(cmd, 1, "", "FAILED: stop here")

    monkeypatch.setattr(subprocess, "run", java)
    monkeypatch.setattr(jars_ivy, "ivy_jar", lambda cache: tmp_path / "ivy.jar")
    with pytest.raises(jars.FetchFailed):
        jars_ivy.resolve("lib", [LIB], [], tmp_path / "into", tmp_path)
    assert seen and not any("p@ss" in arg for arg in seen[0])  # never on the command line


def test_a_repository_that_is_no_url_names_the_setting(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(REPOSITORY_ENV, "repo.example/maven2")
    with pytest.raises(jars.FetchFailed, match=rf"{REPOSITORY_ENV}=repo\.example/maven2"):
        ivy_jar(tmp_path)
