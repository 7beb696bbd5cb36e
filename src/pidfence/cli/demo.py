"""`pidfence demo`: the main job (what `make demo` runs)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal, NoReturn

import typer


def register(app: typer.Typer) -> None:
    """Add this module's command(s) to the `pidfence` app."""
    app.command("demo")(demo)


def demo(
    records: Annotated[int, typer.Option(help="Records per producer.")] = 5000,
    producers: Annotated[int, typer.Option(help="Producer processes on the raw topic.")] = 4,
    partitions: Annotated[int, typer.Option(help="Partitions of the raw topic.")] = 4,
    faults: Annotated[
        str,
        typer.Option(
            help="all, none, or a list of kill,zombie,resend,rollover,copier,lease-zombie,net "
            "(net: seeded network faults through toxiproxy; all,net: everything)."
        ),
    ] = "all",
    out: Annotated[
        Path,
        typer.Option(
            help="Report, ledgers, logs and output log go here; each run resets the demo's "
            "folders in it. Refused when it holds such folders without the demo's marker."
        ),
    ] = Path("out"),
    keep_running: Annotated[
        bool,
        typer.Option(
            help="Leave the services this run started running: the lease servers, the ZooKeeper "
            "and Kafka it started (not those of --bootstrap/--zk), the S3 store (--store s3) and "
            "toxiproxy (net); OUT/services.json lists them."
        ),
    ] = False,
    copier_records: Annotated[
        int,
        typer.Option(
            help="Records copied by `pidfence copy` (0: no copier; the copier fault needs > 0)."
        ),
    ] = 2000,
    lease_lifetime: Annotated[
        float,
        typer.Option(
            help="Lease lifetime in seconds when a short-lease fault is on (rollover, "
            "lease-zombie, net; else 24 h)."
        ),
    ] = 20.0,
    produce_seconds: Annotated[
        float,
        typer.Option(
            help="Target producing time: sets the producers' rate when a paced fault is on "
            "(kill, zombie, rollover, lease-zombie, net); else they run unthrottled."
        ),
    ] = 26.0,
    bootstrap: Annotated[
        str | None,
        typer.Option(help="Use this Kafka instead of starting one (topics get a unique suffix)."),
    ] = None,
    zk_hosts: Annotated[
        str | None, typer.Option("--zk", help="Use this ZooKeeper instead of starting one.")
    ] = None,
    seed: Annotated[
        int | None,
        typer.Option(help="Seed of the network faults (net); the same seed replays them."),
    ] = None,
    store: Annotated[
        Literal["local", "s3"],
        typer.Option(
            help="Where the sink's output and checkpoint live: local (folders in OUT) or s3 (a "
            "bucket on an S3 store, SeaweedFS, started for the run and stopped with it).",
        ),
    ] = "local",
) -> None:
    """Run ZooKeeper, Kafka, lease servers, producers, a copier and the Spark sink with faults,
    then check exactly-once.

    Exit 0 with zero anomalies, 1 on any anomaly (a requested fault that did not happen or work
    left undone included), 2 for a bad option or an --out the demo must not reset, 3 when a
    service does not start or cannot be reached (a rerun starts over), 130 on Ctrl-C and 143 on
    SIGTERM (every process it started stopped first). Spark's and the JVM's output goes to
    OUT/logs/spark.log. With `--store s3` the sink's output and checkpoint are on an S3 store
    started for the run (SeaweedFS on loopback) and the checker reads the table from there.
    """
    from rich.console import Console

    from pidfence.cli.exits import EXIT_UNAVAILABLE, EXIT_USAGE, fail, first_line
    from pidfence.cli.extras import require

    require("demo", "demo")
    from pidfence.demo import BadDemoOption, DemoConfig, Fault, SinkStore, parse_faults, run_demo
    from pidfence.demo.runner import Stopped
    from pidfence.testing import missing_reason
    from pidfence.wire import PidfenceError

    console = Console(log_path=False)
    if seed is None:
        import secrets

        seed = secrets.randbelow(1_000_000)
    try:
        config = DemoConfig(
            store=SinkStore(store),
            records=records,
            producers=producers,
            partitions=partitions,
            faults=parse_faults(faults),
            out=out,
            keep_running=keep_running,
            copier_records=copier_records,
            lease_lifetime_s=lease_lifetime,
            produce_seconds=produce_seconds,
            bootstrap=bootstrap,
            zk_hosts=zk_hosts,
            seed=seed,
        )
    except BadDemoOption as exc:
        fail("demo", str(exc), EXIT_USAGE)
    if Fault.NET in config.faults:
        if reason := missing_reason():
            fail("demo", reason)
        console.print(f"network faults: seed {seed} (replay: --faults net --seed {seed})")
    try:
        from pidfence.cli import preflight

        if bootstrap:
            preflight.check_kafka(bootstrap, [])
        if zk_hosts:
            preflight.check_zookeeper(zk_hosts)
        summary = run_demo(config, console)
    except KeyboardInterrupt:
        _stopped("interrupted (SIGINT)", 130)
    except Stopped as exc:
        _stopped(f"stopped by {exc}", exc.exit_code)
    except BadDemoOption as exc:  # --out refused
        fail("demo", first_line(exc), EXIT_USAGE)
    except PidfenceError as exc:
        # Never 75: every run resets OUT and starts over, so a rerun does not continue.
        fail("demo", first_line(exc), EXIT_UNAVAILABLE)
    except Exception as exc:  # noqa: BLE001 - one line, never a traceback (README)
        fail("demo", f"{type(exc).__name__}: {first_line(exc)}", EXIT_UNAVAILABLE)
    raise typer.Exit(0 if summary["ok"] else 1)


def _stopped(how: str, code: int) -> NoReturn:
    """One stderr line for a run stopped by a signal, then its exit code (128 + signal)."""
    import sys

    sys.stderr.write(f"pidfence demo: {how}: every process the demo started was stopped\n")
    sys.stderr.flush()
    raise typer.Exit(code)
