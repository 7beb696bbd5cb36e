"""A light base (issue 37): the producer and the lease server import no Spark, Arrow or plotting,
and a command that needs a missing extra names it (exit 3)."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata

import pytest
from typer.testing import CliRunner

from pidfence.cli import app, extras
from pidfence.cli.exits import EXIT_UNAVAILABLE

HEAVY = ("pyspark", "pyarrow", "numpy", "pandas", "polars", "deltalake", "matplotlib")


@pytest.mark.parametrize("module", ["pidfence.producer", "pidfence.pid_allocator", "pidfence.cli"])
def test_the_base_imports_nothing_of_the_extras(module: str) -> None:
    # A fresh interpreter: this one has imported everything already.
    code = f"import sys, {module}; print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip() == "[]"


def test_extras_are_read_from_the_installed_metadata() -> None:
    assert {"pyarrow", "deltalake"} <= set(extras._requirements("verify"))
    sink = set(extras._requirements("sink"))
    assert {"pyspark", "pyarrow", "deltalake", "polars"} <= sink  # pidfence[verify] followed
    assert "matplotlib" not in sink
    assert {"matplotlib", "pyspark"} <= set(extras._requirements("demo"))
    assert extras.missing("sink") == []  # the development venv has every extra


def test_a_missing_distribution_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    real = metadata.distribution

    def distribution(name: str) -> metadata.Distribution:
        if name in ("pyspark", "polars"):
            raise metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(extras.metadata, "distribution", distribution)
    assert extras.missing("sink") == ["pyspark", "polars"]
    result = CliRunner().invoke(app, ["sink", "--bootstrap", "x:1", "--topic", "t"])
    assert result.exit_code == EXIT_UNAVAILABLE
    assert "needs the `sink` extra (pyspark, polars not installed)" in result.output
    assert "pip install 'pidfence[sink]'" in result.output
    result = CliRunner().invoke(app, ["demo"])
    assert result.exit_code == EXIT_UNAVAILABLE
    assert "pip install 'pidfence[demo]'" in result.output
