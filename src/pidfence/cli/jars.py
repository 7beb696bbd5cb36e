"""``pidfence jars``: the JVM jars in the cache, a copy for a machine without network, or the
sink's Maven coordinates (the logic is :mod:`pidfence.jars`)."""

from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor
from importlib.util import find_spec
from pathlib import Path
from typing import Annotated

import typer

from pidfence.cli.exits import EXIT_USAGE, exit_cleanly, fail


def register(app: typer.Typer) -> None:
    """Add ``jars`` to the ``pidfence`` app."""

    @app.command("jars")
    def jars_command(
        names: Annotated[
            list[str] | None,
            typer.Argument(
                help="zookeeper, kafka, spark-kafka, delta, hadoop-aws (default: zookeeper, "
                "kafka and, with pyspark, spark-kafka and delta; hadoop-aws is fetched when a "
                "checkpoint is on s3a://; with --to: spark-kafka)",
                show_default=False,
            ),
        ] = None,
        to: Annotated[
            Path | None,
            typer.Option(
                help="Also copy the jars into DIR, for `pidfence sink --jars DIR` on a machine "
                "without network"
            ),
        ] = None,
        packages: Annotated[
            bool,
            typer.Option(
                "--packages",
                help="Print the Maven coordinates the sink needs (for spark.jars.packages or "
                "spark-submit --packages) and exit",
            ),
        ] = False,
    ) -> None:
        """Fetch JVM jars from Maven Central into the cache once; later runs use them offline.

        The Spark components match the installed pyspark. Exit 0 when every component named is
        in the cache, 2 for an unknown name, 3 when one cannot be had (no java, no network,
        pyspark missing: the line names the fix).
        """
        from pidfence import jars

        with exit_cleanly("jars"):
            if packages:
                typer.echo(str(jars.connector_module()))
                return
            spark = ["spark-kafka", "delta"] if find_spec("pyspark") else []
            chosen = names or (["spark-kafka"] if to else ["zookeeper", "kafka", *spark])
            if unknown := [n for n in chosen if n not in jars.COMPONENTS]:
                known = ", ".join(jars.COMPONENTS)
                fail("jars", f"unknown component {', '.join(unknown)}: use {known}", EXIT_USAGE)
            # Side by side: each is one Ivy process, mostly waiting on the repository.
            with ThreadPoolExecutor(len(chosen)) as pool:
                fetched = list(pool.map(jars.jars, chosen))
            for name, found in zip(chosen, fetched, strict=True):
                where = found[0].parent if found else jars.cache_dir()
                if to is not None:
                    try:
                        to.mkdir(parents=True, exist_ok=True)
                        for jar in found:
                            shutil.copy2(jar, to / jar.name)
                    except OSError as exc:
                        fail("jars", f"cannot copy the jars into --to {to}: {exc}", EXIT_USAGE)
                    where = to
                typer.echo(f"{name}: {len(found)} jars in {where}")
