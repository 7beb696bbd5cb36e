"""The JVM jars pidfence's embedded services run on, resolved from Maven Central once.

``infra/jvm/pom.xml`` pins Kafka, ZooKeeper, the Spark Kafka connector and Delta Lake for Spark
(``delta``: ``delta-spark`` and ``delta-storage`` only, for ``spark.read.format("delta")``);
``fetch()`` runs Maven once into a git-ignored cache (``.cache/jars`` or ``$PIDFENCE_JAR_CACHE``)
and skips the step when the cache matches the poms. Connector jars that the pyspark wheel already
ships are removed, so Spark never sees two versions of one library.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from pidfence.wire import PidfenceError

COMPONENTS = ("kafka", "zookeeper", "spark-kafka", "delta")
_STAMP = ".complete"
_VERSION_SUFFIX = re.compile(r"-\d[\w.\-]*\.jar$")


class MissingTool(PidfenceError):
    """``java`` or ``mvn`` is not installed."""


class JarsNotFetched(PidfenceError):
    """The jar cache is empty or stale: run ``make setup``."""


def project_root() -> Path:
    """The checkout holding ``infra/jvm/pom.xml`` (cwd or one of its parents, else the source)."""
    for base in (Path.cwd(), *Path.cwd().parents, Path(__file__).resolve().parents[3]):
        if (base / "infra" / "jvm" / "pom.xml").is_file():
            return base
    raise JarsNotFetched("cannot find infra/jvm/pom.xml: run from a pidfence checkout")


def cache_dir() -> Path:
    """Where the jars live: ``$PIDFENCE_JAR_CACHE`` or ``<checkout>/.cache/jars``."""
    env = os.environ.get("PIDFENCE_JAR_CACHE")
    return Path(env) if env else project_root() / ".cache" / "jars"


def _pom_digest(root: Path) -> str:
    digest = hashlib.sha256()
    for pom in sorted((root / "infra" / "jvm").rglob("pom.xml")):
        digest.update(pom.read_bytes())
    return digest.hexdigest()


def require_tool(name: str, hint: str) -> str:
    """Path of an executable, or :class:`MissingTool` saying what to install."""
    path = shutil.which(name)
    if path is None:
        raise MissingTool(f"`{name}` not found on PATH: install {hint}")
    return path


def is_fresh() -> bool:
    """True when the cache holds every component for the current poms."""
    stamp = cache_dir() / _STAMP
    return stamp.is_file() and stamp.read_text().strip() == _pom_digest(project_root())


def fetch(*, force: bool = False, quiet: bool = False) -> Path:
    """Resolve the jars into the cache (once). Returns the cache directory."""
    root = project_root()
    cache = cache_dir()
    if is_fresh() and not force:
        return cache
    require_tool("java", "a Java 17+ runtime (e.g. `apt-get install openjdk-17-jre-headless`)")
    mvn = require_tool("mvn", "Apache Maven 3.8+ (e.g. `apt-get install maven`)")
    for component in COMPONENTS:
        shutil.rmtree(cache / component, ignore_errors=True)
    cache.mkdir(parents=True, exist_ok=True)
    cmd = [
        mvn,
        "-B",
        "-f",
        str(root / "infra" / "jvm" / "pom.xml"),
        "package",
        f"-Djars.dir={cache}",
    ]
    if quiet:
        cmd.insert(1, "-q")
    subprocess.run(cmd, check=True)
    _drop_jars_pyspark_ships(cache / "spark-kafka")
    (cache / _STAMP).write_text(_pom_digest(root) + "\n")
    return cache


def _artifact(jar_name: str) -> str:
    return _VERSION_SUFFIX.sub("", jar_name)


def pyspark_jars_dir() -> Path:
    """The ``jars`` folder of the installed pyspark distribution."""
    import pyspark

    return Path(pyspark.__file__).parent / "jars"


def _drop_jars_pyspark_ships(folder: Path) -> None:
    shipped = {_artifact(p.name) for p in pyspark_jars_dir().glob("*.jar")}
    for jar in folder.glob("*.jar"):
        if _artifact(jar.name) in shipped:
            jar.unlink()


def jars(component: str) -> list[Path]:
    """The jars of one component (``kafka``, ``zookeeper``, ``spark-kafka`` or ``delta``)."""
    if component not in COMPONENTS:
        raise ValueError(f"unknown component {component!r}; expected one of {COMPONENTS}")
    if not is_fresh():
        raise JarsNotFetched(f"jar cache {cache_dir()} is missing or stale: run `make setup`")
    return sorted((cache_dir() / component).glob("*.jar"))


def classpath(component: str) -> str:
    """A Java classpath string for one component."""
    return os.pathsep.join(str(p) for p in jars(component))


def main() -> None:
    """``python -m pidfence.services.jars``: what ``make setup`` runs."""
    try:
        cache = fetch(quiet=True)
    except (MissingTool, JarsNotFetched) as exc:
        print(f"error: {exc}", file=sys.stderr)  # noqa: T201
        raise SystemExit(2) from exc
    except subprocess.CalledProcessError as exc:
        print(f"error: Maven failed ({exc}); rerun with `make setup` to retry", file=sys.stderr)  # noqa: T201
        raise SystemExit(2) from exc
    counts = ", ".join(f"{c}: {len(list((cache / c).glob('*.jar')))} jars" for c in COMPONENTS)
    print(f"jars ready in {cache} ({counts})")  # noqa: T201


if __name__ == "__main__":
    main()
