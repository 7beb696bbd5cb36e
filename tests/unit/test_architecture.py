"""The architecture as ``make lint`` checks it, held by ``make test`` (what CI runs) too.

The import-linter contracts in pyproject.toml: the layers (wire; rules, leases, ledger; producer,
sink; checker; services; sim; testing; demo; cli, each importing only below itself) and no
import circle among the modules of any package. No module in ``src/`` over 500 formatted lines
(``ruff format`` decides the layout; a module that grows past that is split along a seam), and
at most five ``fmt: skip``/``fmt: off`` in ``src/``, each with its reason. Every module is on
the map in docs/architecture.md.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "pidfence"
ROOT = SRC.parents[1]


def test_import_contracts_are_kept() -> None:
    # In a process of its own: import-linter configures logging (dictConfig disables every
    # logger that exists), which would silence the loggers of the tests that follow.
    config = str(ROOT / "pyproject.toml")
    code = (
        "import sys; from importlinter.cli import lint_imports; "
        f"sys.exit(lint_imports(config_filename={config!r}, no_cache=True, no_logo=True))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_no_module_is_over_500_lines() -> None:
    long = {
        str(path.relative_to(SRC)): n
        for path in SRC.rglob("*.py")
        if (n := len(path.read_text().splitlines())) > 500
    }
    assert long == {}


def test_layout_is_left_to_the_formatter() -> None:
    skips = [
        f"{path.relative_to(SRC)}:{n}"
        for path in SRC.rglob("*.py")
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if "fmt: skip" in line or "fmt: off" in line
    ]
    assert len(skips) <= 5, skips


def test_the_map_names_every_module() -> None:
    """docs/architecture.md is the newcomer's map: a module missing from it is a room nobody
    was told about (named in backticks, as ``name.py``, ``name.Thing`` or ``pkg/name``)."""
    page = (ROOT / "docs" / "architecture.md").read_text()
    unnamed = [
        str(path.relative_to(SRC))
        for path in SRC.rglob("*.py")
        if path.stem not in ("__init__", "__main__")
        and not re.search(rf"`(?:[\w.]+[./])?{path.stem}(?:\.py`|[.`/])", page)
    ]
    assert unnamed == []
