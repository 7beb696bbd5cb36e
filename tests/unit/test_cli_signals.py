"""``pidfence`` stops on SIGINT: when its parent started it with SIGINT ignored, and when the
signal lands inside a delivery callback of confluent-kafka's flush()."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

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


# Flushes one record to a closed port; its failed delivery's callback sends this process SIGINT,
# so the interrupt lands inside the callback, within confluent-kafka's flush().
INTERRUPTED_FLUSH = (
    "import os, signal, sys, confluent_kafka, pidfence.cli as c\n"
    "from pidfence.producer import ProducerConfig\n"
    "from pidfence.producer.sender import Sender\n"
    "def interrupt(err, msg):\n"
    "    os.kill(os.getpid(), signal.SIGINT)\n"
    "    sum(range(10_000))  # bytecode for the handler to run in\n"
    "def flush(client, kafka):\n"
    "    kafka.produce('t', b'x', on_delivery=interrupt)\n"
    "    try:\n"
    "        client.flush(30)\n"
    "    except BaseException as exc:\n"
    "        print(type(exc).__name__, flush=True)\n"
    "conf = {'bootstrap.servers': '127.0.0.1:1', 'message.timeout.ms': 200, 'log_level': 0}\n"
    "if sys.argv[1] == 'cli':\n"
    "    @c.app.command('flush')\n"
    "    def run() -> None:\n"
    "        kafka = confluent_kafka.Producer(conf)\n"
    "        flush(kafka, kafka)\n"
    "    sys.argv[1:] = ['flush']\n"
    "    c.main()\n"
    "else:\n"
    "    config = ProducerConfig('127.0.0.1:1', message_timeout_ms=200)\n"
    "    sender = Sender(config, confluent_kafka.Producer, None, {})\n"
    "    flush(sender, sender.client)\n"
)


@pytest.mark.parametrize("caller", ["cli", "sender"])
def test_a_sigint_inside_a_delivery_callback_stops_a_flush_as_keyboard_interrupt(
    caller: str,
) -> None:
    # Python's default handler makes confluent-kafka (Python < 3.12) lose the interrupt and
    # fail the flush with a SystemError: the CLI installs its own handler, and the Sender,
    # which a library user calls under the default one, reads that SystemError for what it is.
    done = subprocess.run(
        [sys.executable, "-c", INTERRUPTED_FLUSH, caller],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.stdout.strip() == "KeyboardInterrupt", done.stderr[-2000:]
