"""The jar cache: each component resolved once into a folder of its own, then used offline.

The cache is ``$PIDFENCE_JAR_CACHE``, else ``$XDG_CACHE_HOME/pidfence/jars`` (``~/.cache/...``).
A component's folder is named by what it holds (``kafka_2.13-4.1.1``) and carries a manifest of
its jars and of the exact request that produced them: a folder with a matching manifest is used
as it is, with no network; another request (a new pyspark, a changed module list) resolves a new
one. A folder is published whole (resolved beside it, then renamed), under a lock, so processes
starting side by side fetch once and never see half a folder.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from pidfence.jars.errors import FetchFailed
from pidfence.jars.ivy import Module, ivy_module, repository, resolve

#: Where the jars go (a folder copied from a machine that has them works offline).
CACHE_ENV = "PIDFENCE_JAR_CACHE"
MANIFEST = "pidfence-jars.json"


@dataclass(frozen=True)
class Component:
    """Modules resolved together into one folder of jars.

    Args:
        name: the folder's name, e.g. ``kafka_2.13-4.1.1``.
        modules: what to resolve, with their dependencies (unless a module says otherwise).
        provided: artifact names already on the classpath where the jars are used (pyspark's
            own jars for Spark's components): left out of the resolution.
    """

    name: str
    modules: tuple[Module, ...]
    provided: frozenset[str] = frozenset()

    def request(self) -> str:
        """What Ivy is asked: the manifest records its digest."""
        return ivy_module(self.name, self.modules, self.provided)


def user_cache() -> Path:
    """pidfence's folder in the user's cache: ``$XDG_CACHE_HOME/pidfence`` or
    ``~/.cache/pidfence``."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pidfence"


def cache_dir() -> Path:
    """``$PIDFENCE_JAR_CACHE``, else ``jars`` in :func:`user_cache`."""
    if env := os.environ.get(CACHE_ENV):
        return Path(env)
    return user_cache() / "jars"


def _note(line: str) -> None:
    sys.stderr.write(f"pidfence: {line}\n")
    sys.stderr.flush()


def _digest(component: Component) -> str:
    return hashlib.sha256(component.request().encode()).hexdigest()


def cached(component: Component) -> list[Path] | None:
    """The component's jars when its folder is complete for this request, else None."""
    try:
        manifest = json.loads((cache_dir() / component.name / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict) or manifest.get("request") != _digest(component):
        return None  # not this request's, or edited by hand: fetched again
    folder = cache_dir() / component.name
    jars = [folder / name for name in manifest.get("jars", {})]
    sizes = manifest.get("jars", {})
    if not all(p.is_file() and p.stat().st_size == sizes[p.name] for p in jars):
        return None
    return sorted(jars)


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = path.open("a")
    except OSError as exc:
        raise FetchFailed(
            f"the jar cache {path.parent} cannot be written ({exc}); set {CACHE_ENV} to a "
            "writable folder"
        ) from exc
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def fetch(component: Component, progress: Callable[[str], None] = _note) -> list[Path]:
    """The component's jars: from the cache, else resolved into it first (with a progress line
    before and after). Raises :class:`~pidfence.jars.errors.JarsError` subclasses naming the fix.
    """
    if (found := cached(component)) is not None:
        return found
    cache = cache_dir()
    folder = cache / component.name
    with _locked(cache / f".{component.name}.lock"):
        if (found := cached(component)) is not None:  # fetched while this process waited
            return found
        modules = ", ".join(str(m) for m in component.modules)
        more = len(component.modules) - 1
        named = f"{component.modules[0]}{f' and {more} more' if more else ''}"
        progress(f"fetching {named} with dependencies from {repository()} into {folder} (once)")
        started = time.monotonic()
        partial = cache / f".{component.name}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        try:
            resolve(component.name, component.modules, component.provided, partial, cache)
            jars = {p.name: p.stat().st_size for p in sorted(partial.glob("*.jar"))}
            for other in [p for p in partial.iterdir() if p.name not in jars]:
                other.unlink()  # only jars are used; Ivy retrieves whatever a module publishes
            manifest = {"request": _digest(component), "modules": modules, "jars": jars}
            (partial / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
            shutil.rmtree(folder, ignore_errors=True)  # one made for another request
            partial.rename(folder)
        finally:
            shutil.rmtree(partial, ignore_errors=True)
        size = sum(jars.values()) / 2**20
        took = time.monotonic() - started
        progress(f"{component.name}: {len(jars)} jars, {size:.0f} MB, in {took:.0f} s")
    found = cached(component)
    assert found is not None  # noqa: S101 - just published under the lock
    return found
