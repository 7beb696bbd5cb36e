"""The ``pidfence`` command. Each subcommand lives in its own module and only parses arguments;
the logic belongs to the package the command is named after."""

from __future__ import annotations

import signal

import typer

from pidfence.cli import (
    bench,
    copy,
    demo,
    jars,
    keys,
    lease,
    produce,
    services,
    sink,
    topic,
    verify,
)

app = typer.Typer(
    name="pidfence",
    no_args_is_help=True,
    add_completion=False,
    help="Exactly-once Kafka pipelines: PID leases, idempotent producers, a deduplicating sink.",
)


@app.callback()
def _root() -> None:
    """Exactly-once Kafka pipelines: PID leases, idempotent producers, a deduplicating sink."""


for _module in (services, topic, jars, lease, keys, produce, copy, sink, verify, demo, bench):
    _module.register(app)


def main() -> None:
    """Console-script entry point."""
    # A shell without job control starts `cmd &` with SIGINT ignored, and the children inherit
    # that; but SIGINT is how a supervisor (the demo, the soak, a user) asks a producer or a sink
    # to flush, save its state and exit. Python only installs its handler when SIGINT is not
    # ignored at start, so do it here: ignored SIGINT would leave them running until SIGKILL.
    # Python's own handler is not used either: it sets KeyboardInterrupt without an instance,
    # which confluent-kafka (on Python < 3.12) loses when it lands inside a delivery callback,
    # and flush() then fails with a SystemError instead of stopping.
    if signal.getsignal(signal.SIGINT) in (signal.SIG_IGN, signal.default_int_handler):
        signal.signal(signal.SIGINT, _interrupt)
    app()


def _interrupt(signum: int, frame: object) -> None:
    """SIGINT: raise KeyboardInterrupt from Python, as an instance."""
    raise KeyboardInterrupt
