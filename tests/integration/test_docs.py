"""Every example in README.md and docs/*.md runs as written (issue 43).

One test per page. Its ``python`` and shell blocks run in page order, the shell blocks in one
shell session (each block a ``bash -e`` step in the page's fresh working folder, starting from the
variables the previous one left; every assignment is exported) and the Python blocks in one
interpreter. The shell's exported variables reach the Python blocks. The services a
page starts itself (the README's quickstart runs ``pidfence services up``) live in a run folder
of the test's own and are stopped after the page, with every process its blocks left running;
other pages get the session's Kafka and ZooKeeper and a lease server as ``$PIDFENCE_BOOTSTRAP``,
``$PIDFENCE_ZK`` and ``$PIDFENCE_LEASE``, as ``eval "$(pidfence services env)"`` exports them.

A block that cannot run carries ``<!-- not run: REASON -->`` right above its fence
(tests/fixtures/doc_blocks.py); a fence without a language fails the page. A failure names the
page, the block's line, the output's tail and the marker to add when the block truly cannot run.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
from pathlib import Path
from typing import IO, Any, Final

import pytest

from tests.fixtures.doc_blocks import HOW_TO_MARK, Block, UnmarkedBlock, blocks

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]

ROOT: Final = Path(__file__).resolve().parents[2]
PAGES: Final = [Path("README.md"), *sorted(p.relative_to(ROOT) for p in ROOT.glob("docs/*.md"))]
#: Pages that start their own services (the rest get the session's).
OWN_SERVICES: Final = frozenset({Path("README.md")})
BLOCK_TIMEOUT_S: Final = 600.0
#: One Python interpreter per page: runs each block file it is sent (as the page's own lines,
#: so a traceback names the page's line), in one namespace, and answers on fd ``argv[1]``.
_PYTHON: Final = r"""
import json, os, sys, traceback
answer = os.fdopen(int(sys.argv[1]), "w")
space = {"__name__": "__main__"}
for line in sys.stdin:
    job = json.loads(line)
    os.environ.clear()
    os.environ.update(job["env"])
    os.chdir(job["cwd"])
    try:
        exec(compile("\n" * job["line"] + job["text"], job["page"], "exec"), space)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush(); sys.stderr.flush()
    answer.write(f"{code}\n"); answer.flush()
"""


class PageSession:
    """The shell and the interpreter of one page, in ``work``, logging to ``log``."""

    def __init__(self, work: Path, env: dict[str, str]) -> None:
        self.work = work
        self.log_path = work.parent / "output.log"
        self.log: IO[str] = self.log_path.open("w")
        self.state = work.parent / "shell.env"
        self.env_file = work.parent / "env.bin"
        self.env = env
        self.groups: list[int] = []
        self.python: subprocess.Popen[str] | None = None
        self.answers: IO[str] | None = None

    def run(self, block: Block) -> int:
        """Run one block; its exit code."""
        self.log.write(f"\n===== {block.where} ({block.language})\n")
        self.log.flush()
        if block.runner == "shell":
            return self._shell(block)
        return self._python(block)

    def _shell(self, block: Block) -> int:
        script = self.work.parent / f"block-{block.line}.sh"
        script.write_text(block.text)
        steps = (
            f'set -a; [ -f "{self.state}" ] && . "{self.state}"; cd "{self.work}"; '
            f'. "{script}"; export -p > "{self.state}"; env -0 > "{self.env_file}"'
        )
        proc = subprocess.Popen(
            ["bash", "-e", "-o", "pipefail", "-c", steps],
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.groups.append(proc.pid)
        code = proc.wait(BLOCK_TIMEOUT_S)
        if code == 0 and self.env_file.exists():
            pairs = self.env_file.read_bytes().split(b"\0")
            self.env = dict(p.decode().split("=", 1) for p in pairs if b"=" in p)
        return code

    def _python(self, block: Block) -> int:
        if self.python is None:
            read, write = os.pipe()
            self.python = subprocess.Popen(
                [sys.executable, "-u", "-c", _PYTHON, str(write)],
                env=self.env,
                stdin=subprocess.PIPE,
                stdout=self.log,
                stderr=subprocess.STDOUT,
                text=True,
                pass_fds=(write,),
                start_new_session=True,
                cwd=self.work,
            )
            os.close(write)
            self.answers = os.fdopen(read)
            self.groups.append(self.python.pid)
        assert self.python.stdin is not None and self.answers is not None
        job = {
            "env": self.env,
            "cwd": str(self.work),
            "line": block.line,
            "page": str(block.page),
            "text": block.text,
        }
        self.python.stdin.write(json.dumps(job) + "\n")
        self.python.stdin.flush()
        ready, _, _ = select.select([self.answers], [], [], BLOCK_TIMEOUT_S)
        answer = self.answers.readline() if ready else ""
        return int(answer) if answer.strip() else 124

    def tail(self, lines: int = 25) -> str:
        """The last lines of the page's output."""
        self.log.flush()
        return "\n".join(self.log_path.read_text().splitlines()[-lines:])

    def close(self) -> None:
        """Stop every process the page's blocks left running."""
        if self.python is not None and self.python.stdin is not None:
            self.python.stdin.close()
        run_dir = self.env.get("PIDFENCE_RUN_DIR")
        if run_dir and (Path(run_dir) / "state.json").exists():
            subprocess.run(
                [sys.executable, "-m", "pidfence.cli", "services", "down", "--run-dir", run_dir],
                env=self.env,
                stdout=self.log,
                stderr=subprocess.STDOUT,
                timeout=120,
                check=False,
            )
        for group in self.groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, signal.SIGKILL)
        self.log.close()


@pytest.fixture(params=PAGES, ids=str)
def page(request: pytest.FixtureRequest) -> Path:
    """A page, relative to the checkout."""
    found: Path = request.param
    return found


@pytest.fixture
def page_env(page: Path, request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, str]:
    """The environment a page's blocks start from: this venv first on PATH, a run folder of
    its own, and for pages that do not start services, the session's addresses."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PIDFENCE_RUN_DIR"] = str(tmp_path / "services")
    for name in ("PIDFENCE_LEASE_TOKEN_FILE", "PIDFENCE_LEASE_TOKEN", "PIDFENCE_LEASE_TLS_CA"):
        env.pop(name, None)
    if page not in OWN_SERVICES and any(b.runner for b in blocks(ROOT, page)):
        kafka: Any = request.getfixturevalue("kafka")
        zookeeper: Any = request.getfixturevalue("zookeeper")
        env["PIDFENCE_BOOTSTRAP"] = kafka.bootstrap
        env["PIDFENCE_ZK"] = zookeeper.hosts
        env["PIDFENCE_LEASE"] = request.getfixturevalue("lease_server").address
    return env


def test_every_block_of_the_page_runs(page: Path, page_env: dict[str, str], tmp_path: Path) -> None:
    try:
        found = blocks(ROOT, page)
    except UnmarkedBlock as exc:
        pytest.fail(str(exc), pytrace=False)
    work = tmp_path / "work"
    work.mkdir()
    session = PageSession(work, page_env)
    try:
        for block in found:
            if block.runner is None:
                continue
            code = session.run(block)
            if code != 0:
                pytest.fail(
                    f"{block.where}: this ```{block.language} block failed (exit {code}); "
                    f"blocks before it on the page ran first, in {work}. Fix the example; "
                    f"if it truly cannot run here, put {HOW_TO_MARK} on the line above its "
                    f"fence.\n--- output (tail) ---\n{session.tail()}",
                    pytrace=False,
                )
    finally:
        session.close()
