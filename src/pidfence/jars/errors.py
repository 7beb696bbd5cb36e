"""Why jars could not be had; each message names the fix."""

from __future__ import annotations

from pidfence.wire import PidfenceError


class JarsError(PidfenceError):
    """Root of the jar errors; none is retriable: a rerun meets the cause until it is fixed."""


class MissingTool(JarsError):
    """``java`` is not installed."""


class FetchFailed(JarsError):
    """The Maven repository did not deliver a module, or a download failed its checksum."""


class JarsMissing(JarsError):
    """A folder of jars lacks one that is needed, or pyspark (which the Spark jars match) is
    not installed."""


__all__ = ["FetchFailed", "JarsError", "JarsMissing", "MissingTool"]
