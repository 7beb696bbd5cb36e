"""`pidfence demo`: the main job (what `make demo` runs)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

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
    out: Annotated[Path, typer.Option(help="Report, ledgers, logs and output log go here.")] = Path(
        "out"
    ),
    keep_running: Annotated[
        bool, typer.Option(help="Leave ZooKeeper, Kafka and the lease servers running.")
    ] = False,
    copier_records: Annotated[
        int, typer.Option(help="Records copied by `pidfence copy` (0: no copier).")
    ] = 2000,
    lease_lifetime: Annotated[
        float, typer.Option(help="Lease lifetime in seconds when the rollover fault is on.")
    ] = 20.0,
    produce_seconds: Annotated[
        float, typer.Option(help="Target producing time (sets the producers' rate).")
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

    Exit 0 with zero anomalies, 1 on any anomaly, 2 for a bad option, 3 when a service does not
    start or cannot be reached, 75 for a retriable failure. Spark's and the JVM's output goes to
    OUT/logs/spark.log. With `--store s3` the sink's output and checkpoint are on an S3 store
    started for the run (SeaweedFS on loopback) and the checker reads the table from there.
    """
    from rich.console import Console

    from pidfence.cli.exits import EXIT_USAGE, exit_cleanly, fail
    from pidfence.cli.extras import require

    require("demo", "demo")
    from pidfence.demo import BadDemoOption, DemoConfig, Fault, SinkStore, parse_faults, run_demo
    from pidfence.testing import missing_reason

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
        with exit_cleanly("demo"):
            from pidfence.cli import preflight

            if bootstrap:
                preflight.check_kafka(bootstrap, [])
            if zk_hosts:
                preflight.check_zookeeper(zk_hosts)
            summary = run_demo(config, console)
    except KeyboardInterrupt:
        console.print("[yellow]interrupted: every process the demo started was stopped[/yellow]")
        raise typer.Exit(130) from None
    raise typer.Exit(0 if summary["ok"] else 1)
