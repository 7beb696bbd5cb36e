"""``pidfence`` stops on SIGINT even when its parent started it with SIGINT ignored."""

from __future__ import annotations

import signal
import subprocess
import sys

# A command run by the CLI's own main(): says it is running, then waits.
WAIT = (
    "import time, pidfence.cli as c\n"
    "@c.app.command('wait-forever')\n"
    "def wait() -> None:\n"
    "    print('ready', flush=True)\n"
    "    time.sleep(600)\n"
    "c.main()\n"
)


def test_sigint_stops_the_cli_even_when_inherited_ignored() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", WAIT, "wait-forever"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        # What `cmd &` in a non-interactive shell does to its children.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),  # noqa: PLW1509
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"ready\n"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) != 0  # KeyboardInterrupt, not still running
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
