"""Apache Ivy, run standalone, turns Maven coordinates into a folder of jars.

Spark resolves ``--packages`` with Ivy; pidfence does the same outside any JVM of its own:
``java -jar ivy.jar -ivy ivy.xml -retrieve ...`` downloads each module and its dependencies from a
Maven repository (Maven Central unless ``$PIDFENCE_MAVEN_REPOSITORY`` names a mirror), checks every
file against the repository's SHA-1 (MD5 where it has none; a mismatch fails the download) and
copies the jars into one folder. The Ivy jar itself comes from the same repository, once, checked
against the SHA-256 pinned here. No Maven, no build file, no checkout.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit
from xml.sax.saxutils import quoteattr

from pidfence.jars.errors import FetchFailed, MissingTool

CENTRAL = "https://repo1.maven.org/maven2"
#: A Maven repository to use instead of Maven Central: a mirror, a proxy or a ``file://`` folder.
REPOSITORY_ENV = "PIDFENCE_MAVEN_REPOSITORY"
IVY_VERSION = "2.5.3"
#: ``org.apache.ivy:ivy:2.5.3`` (its SHA-1 on Maven Central is 163b4d6b33...; pyspark ships the
#: same jar).
IVY_SHA256 = "9502aa5aabf0b1484924a13ef4b5d24f121f7f91aab6768f11cc9d0906c0803b"
RESOLVE_TIMEOUT_S = 900.0
FIX = (
    "check the network (a proxy: HTTPS_PROXY), or set PIDFENCE_MAVEN_REPOSITORY to a Maven "
    "mirror you can reach; without a network, copy a jar cache that has them "
    "(PIDFENCE_JAR_CACHE) or give `pidfence sink --jars DIR`"
)
_SETTINGS = """<ivysettings>
  <property name="ivy.checksums" value="sha1,md5"/>
  <property name="ivy.maven.lookup.sources" value="false"/>
  <property name="ivy.maven.lookup.javadoc" value="false"/>
  <settings defaultResolver="repository"/>
  <resolvers><ibiblio name="repository" m2compatible="true" root={root}/></resolvers>
</ivysettings>
"""


@dataclass(frozen=True)
class Module:
    """A Maven module by its coordinates; ``transitive=False`` takes its own jar only."""

    group: str
    artifact: str
    version: str
    transitive: bool = True

    def __str__(self) -> str:
        return f"{self.group}:{self.artifact}:{self.version}"

    def url(self, repository: str) -> str:
        """Where the module's jar is in a Maven repository."""
        folder = "/".join((*self.group.split("."), self.artifact, self.version))
        return f"{repository.rstrip('/')}/{folder}/{self.artifact}-{self.version}.jar"


def repository() -> str:
    """The Maven repository jars come from: ``$PIDFENCE_MAVEN_REPOSITORY`` or Maven Central."""
    return os.environ.get(REPOSITORY_ENV) or CENTRAL


def java() -> str:
    """The ``java`` executable (``$JAVA_HOME/bin/java`` first)."""
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").exists():
        return str(Path(home) / "bin" / "java")
    return "java"


def require_java() -> str:
    """The path of ``java``, or :class:`MissingTool` saying what to install."""
    found = shutil.which(java())
    if found is None:
        raise MissingTool(
            "`java` not found (on PATH or in $JAVA_HOME): install a Java 17+ runtime, e.g. "
            "`apt-get install openjdk-17-jre-headless`"
        )
    return found


def ivy_module(name: str, modules: Iterable[Module], provided: Iterable[str]) -> str:
    """The ``ivy.xml`` of a component: its modules, minus the artifacts already ``provided``
    (pyspark's own jars, so that Spark never sees two versions of one library)."""
    lines = [
        '<ivy-module version="2.0">',
        f'<info organisation="pidfence" module={quoteattr(name)}/>',
        "<dependencies>",
    ]
    for m in modules:
        transitive = "" if m.transitive else ' transitive="false"'
        lines.append(
            f"<dependency org={quoteattr(m.group)} name={quoteattr(m.artifact)} "
            f'rev={quoteattr(m.version)} conf="default->default"{transitive}/>'
        )
    lines += [f"<exclude module={quoteattr(a)}/>" for a in sorted(set(provided))]
    return "\n".join([*lines, "</dependencies>", "</ivy-module>", ""])


def ivy_jar(cache: Path) -> Path:
    """Ivy's own jar in ``cache``, downloaded once and checked against :data:`IVY_SHA256`."""
    path = cache / f"ivy-{IVY_VERSION}.jar"
    if path.is_file():
        return path
    url = Module("org.apache.ivy", "ivy", IVY_VERSION).url(repository())
    try:
        with urllib.request.urlopen(url, timeout=60) as response:  # noqa: S310 - http(s)/file
            data = response.read()
    except ValueError as exc:  # not a URL: the repository setting is wrong
        raise FetchFailed(
            f"{REPOSITORY_ENV}={repository()} is not a repository URL ({exc}): use "
            "https://HOST/PATH or file:///PATH"
        ) from exc
    except OSError as exc:
        raise FetchFailed(f"cannot download Apache Ivy from {url} ({exc}); {FIX}") from exc
    if hashlib.sha256(data).hexdigest() != IVY_SHA256:
        raise FetchFailed(
            f"{url} is not the Ivy {IVY_VERSION} jar pidfence pins (SHA-256 differs); nothing "
            f"was used. The repository or a proxy altered it: {FIX}"
        )
    cache.mkdir(parents=True, exist_ok=True)
    handle, partial = tempfile.mkstemp(prefix=f".{path.name}.", dir=cache)
    with os.fdopen(handle, "wb") as out:
        out.write(data)
    Path(partial).replace(path)  # whole or absent for another process or thread
    return path


def _proxy_options() -> list[str]:
    """Java ignores ``HTTPS_PROXY``/``HTTP_PROXY``/``NO_PROXY``; pass them as its system
    properties. A proxy's ``user:password@`` becomes ``http.proxyUser``/``http.proxyPassword``,
    which Ivy's authenticator answers a proxy's challenge with (Basic included, which the JDK
    refuses for HTTPS tunnels unless told otherwise). They hold a secret: :func:`resolve`
    hands them to Java in an argument file only its user can read, never on the command line."""
    options = []
    for scheme in ("https", "http"):
        name = f"{scheme.upper()}_PROXY"
        value = os.environ.get(f"{scheme}_proxy") or os.environ.get(name)
        if not value:
            continue
        proxy = urlsplit(value if "://" in value else f"http://{value}")
        try:
            port = proxy.port or (443 if proxy.scheme == "https" else 80)
        except ValueError as exc:
            raise FetchFailed(f"{name}={value} is not a proxy URL ({exc})") from exc
        if proxy.hostname:
            options += [f"-D{scheme}.proxyHost={proxy.hostname}", f"-D{scheme}.proxyPort={port}"]
        if proxy.hostname and proxy.username is not None and not any("User=" in o for o in options):
            user, password = unquote(proxy.username), unquote(proxy.password or "")
            options += [f"-D{p}.proxyUser={user}" for p in ("http", "https")]
            options += [f"-D{p}.proxyPassword={password}" for p in ("http", "https")]
            options.append("-Djdk.http.auth.tunneling.disabledSchemes=")
    if hosts := os.environ.get("no_proxy") or os.environ.get("NO_PROXY"):
        # curl's ``a.com,.b.com`` is Java's ``a.com|*.b.com``.
        names = [h.strip() for h in hosts.split(",") if h.strip()]
        java_names = "|".join(f"*{h}" if h.startswith(".") else h for h in names)
        options.append(f"-Dhttp.nonProxyHosts={java_names}")
    return options


def _argument_file(path: Path, options: list[str]) -> Path:
    """``options`` in a Java argument file (``java @FILE``) that only this user can read."""
    quoted = ('"' + o.replace("\\", "\\\\").replace('"', '\\"') + '"' for o in options)
    path.touch(mode=0o600)
    path.write_text("\n".join(quoted) + "\n")
    return path


def _reason(output: str) -> str:
    """The lines of Ivy's output that say what failed."""
    keys = ("not found", "FAILED", "invalid", "Exception", "refused", "timed out")
    found = [line.strip(" \t:") for line in output.splitlines() if any(k in line for k in keys)]
    return "; ".join(dict.fromkeys(found)) or output.strip()[-500:] or "Ivy failed"


def resolve(
    name: str, modules: Iterable[Module], provided: Iterable[str], into: Path, cache: Path
) -> None:
    """Download ``modules`` and their dependencies into the folder ``into`` (it must not exist).

    Ivy's own cache is a scratch folder, removed afterwards: the folder of jars is the cache.
    """
    exe = require_java()
    jar = ivy_jar(cache)
    with tempfile.TemporaryDirectory(prefix="ivy-", dir=cache) as scratch:
        work = Path(scratch)
        (work / "ivy.xml").write_text(ivy_module(name, modules, provided))
        root = quoteattr(repository().rstrip("/") + "/")
        (work / "settings.xml").write_text(_SETTINGS.format(root=root))
        cmd = [
            exe,
            # A resolver lives seconds: C1 and the serial collector cost it ~20% less CPU.
            "-XX:TieredStopAtLevel=1",
            "-XX:+UseSerialGC",
            f"@{_argument_file(work / 'proxy.args', _proxy_options())}",
            "-Dsun.net.client.defaultConnectTimeout=30000",
            "-Dsun.net.client.defaultReadTimeout=120000",
            "-jar",
            str(jar),
            "-settings",
            str(work / "settings.xml"),
            "-cache",
            str(work / "cache"),
            "-ivy",
            str(work / "ivy.xml"),
            "-confs",
            "default",
            "-retrieve",
            f"{into}/[artifact]-[revision](-[classifier]).[ext]",
            "-warn",
        ]
        try:
            done = subprocess.run(
                cmd, capture_output=True, text=True, timeout=RESOLVE_TIMEOUT_S, check=False
            )
        except subprocess.TimeoutExpired as exc:
            raise FetchFailed(
                f"{name}: no answer from {repository()} in {RESOLVE_TIMEOUT_S:.0f} s; {FIX}"
            ) from exc
    if done.returncode != 0 or not into.is_dir():
        reason = _reason(done.stdout + done.stderr)
        raise FetchFailed(f"{name} could not be fetched from {repository()}: {reason}; {FIX}")
