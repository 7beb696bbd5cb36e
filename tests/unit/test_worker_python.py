"""Spark's Python workers import the installed, compiled pyspark, not Spark's source-only zips."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from pidfence.services.spark import _zips_spark_prepends, worker_python, worker_python_script


def test_the_worker_python_drops_sparks_zips_and_keeps_the_rest_of_the_path() -> None:
    zips = _zips_spark_prepends()
    assert zips[0].endswith("/pyspark.zip") and len(zips) == 2
    path = ":".join([*zips, "/elsewhere", "/site/extra.zip"])
    shown = subprocess.run(
        [
            worker_python(),
            "-c",
            "import os, pyspark; print(os.environ['PYTHONPATH']); print(pyspark.__file__)",
        ],
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert shown[0] == "/elsewhere:/site/extra.zip"
    assert ".zip" not in shown[1] and shown[1].endswith("pyspark/__init__.py")


def test_the_script_runs_its_exec_line_with_the_arguments(tmp_path: Path) -> None:
    script = tmp_path / "python"
    script.write_text(worker_python_script('exec printf "%s|" "$@"'))
    script.chmod(0o755)
    out = subprocess.run(
        [str(script), "-m", "pyspark.daemon", "a b"],
        env={"PYTHONPATH": ""},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out == "-m|pyspark.daemon|a b|"
