"""The demo's outputs: the summary table on the terminal, ``summary.json`` and ``report.html``."""

from __future__ import annotations

import base64
import html
import io
import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table


def summary_table(summary: dict[str, Any]) -> Table:
    """The terminal summary: counts, verdicts, anomalies."""
    table = Table(title="pidfence demo", show_header=True, header_style="bold")
    table.add_column("what")
    table.add_column("count", justify="right")
    counts = summary["counts"]
    rows = [
        ("sent (acknowledged data records)", counts["sent_acknowledged"]),
        ("  distinct (pid, partition, seq)", counts["sent_distinct"]),
        ("  FENCE records acknowledged", counts["fences_acknowledged"]),
        ("  pids used", counts["pids_used"]),
        ("in the raw topic (incl. FENCE)", counts["raw_records"]),
        ("appended to the output log", counts["appended"]),
    ]
    for label, value in rows:
        table.add_row(label, str(value))
    table.add_section()
    for verdict, value in summary["verdicts"].items():
        if verdict != "APPENDED":
            table.add_row(f"dropped: {verdict}", str(value))
    table.add_section()
    for name, value in summary["anomalies"].items():
        style = "red" if value else "green"
        table.add_row(f"anomaly: {name}", f"[{style}]{value}[/{style}]")
    for name, value in summary.get("informational", {}).items():
        table.add_row(f"info: {name}", str(value))
    happened = summary.get("faults_happened") or {}
    if happened:
        table.add_section()
        for name, done in sorted(happened.items()):
            shown = "[green]happened[/green]" if done else "[red]did not happen[/red]"
            table.add_row(f"fault: {name}", shown)
    network = network_lines(summary)
    if network:
        table.add_section()
        for label, value in network:
            table.add_row(label, value)
    if summary.get("copier"):
        copier = summary["copier"]
        table.add_section()
        table.add_row("copier: upstream records", str(copier["upstream"]))
        table.add_row("copier: in output log exactly once", str(copier["copied_once"]))
    table.add_section()
    verdict = "[green]OK: zero anomalies[/green]" if summary["ok"] else "[red]ANOMALIES[/red]"
    table.add_row("result", verdict)
    table.add_row("wall time", f"{summary.get('wall_s', 0):.1f}s")
    return table


def network_lines(summary: dict[str, Any]) -> list[tuple[str, str]]:
    """Rows for the network faults (``net``): the seed, then each link's faults in order."""
    plan = summary.get("plan") or {}
    if plan.get("seed") is None:
        return []
    per_link: dict[str, list[str]] = {}
    for line in plan.get("steps", []):
        where, _, what = line.partition(": ")
        link = where.split(" ", 1)[-1]
        if link in {"producer-kafka", "producer-lease", "lease-zookeeper", "sink-kafka"}:
            per_link.setdefault(link, []).append(what.split(" (")[0])
    seed = plan["seed"]
    rows = [
        (
            f"network faults (seed {seed}, replay: --seed {seed})",
            str(sum(map(len, per_link.values()))),
        )
    ]
    rows += [(f"  net: {link}", ", ".join(kinds)) for link, kinds in sorted(per_link.items())]
    rows += [(f"  note: {note}", "") for note in summary.get("notes", [])]
    return rows


def _png(fig: Any) -> str:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90, bbox_inches="tight")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def plots(summary: dict[str, Any]) -> dict[str, str]:
    """Base64 PNGs: counts over time, verdicts per producer, unique users per minute."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    images: dict[str, str] = {}

    fig, ax = plt.subplots(figsize=(7, 3.5))
    for name, label in (("raw", "raw topic"), ("appended", "output log (deduplicated)")):
        points = summary["timeline"][name]
        if points:
            xs, ys = zip(*points, strict=True)
            ax.step(xs, ys, where="post", label=label)
    ax.set_xlabel("seconds since the first record (Kafka timestamp)")
    ax.set_ylabel("records (cumulative)")
    ax.legend()
    ax.set_title("raw vs deduplicated records over time")
    images["timeline"] = _png(fig)
    plt.close(fig)

    per_producer = summary["verdicts_per_producer"]
    verdicts = sorted({v for counts in per_producer.values() for v in counts})
    fig, ax = plt.subplots(figsize=(7, 3.5))
    names = list(per_producer)
    bottoms = [0] * len(names)
    for verdict in verdicts:
        heights = [per_producer[n].get(verdict, 0) for n in names]
        ax.bar(names, heights, bottom=bottoms, label=verdict)
        bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    ax.set_yscale("symlog")
    ax.set_ylabel("records (symlog)")
    ax.legend(fontsize="small")
    ax.set_title("verdicts per producer")
    images["verdicts"] = _png(fig)
    plt.close(fig)

    downstream = summary["downstream"]
    sources = [("raw", "raw topic"), ("output_log", "output log"), ("truth", "truth (ledger)")]
    labels = sorted(set().union(*(set(v) for v in downstream.values())))
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
    width = 0.8 / len(sources)
    for column, (ax, what) in enumerate(zip(axes, ("unique users", "events"), strict=True)):
        for k, (name, label) in enumerate(sources):
            heights = [downstream[name].get(m, [0, 0])[column] for m in labels]
            offsets = [i + (k - 1) * width for i in range(len(labels))]
            ax.bar(offsets, heights, width=width, label=label)
        ax.set_xticks(range(len(labels)), [m[-5:] for m in labels])
        ax.set_xlabel("minute (UTC, event time)")
        ax.set_title(f"{what} per minute")
    axes[0].legend(fontsize="small")
    fig.suptitle("downstream job: raw topic vs output log vs truth")
    images["downstream"] = _png(fig)
    plt.close(fig)
    return images


def render_html(summary: dict[str, Any], images: dict[str, str]) -> str:
    """A self-contained HTML report (images embedded as base64)."""
    esc = html.escape
    status = "OK: zero anomalies" if summary["ok"] else "ANOMALIES FOUND"
    counts = "".join(
        f"<tr><td>{esc(k)}</td><td>{v}</td></tr>" for k, v in summary["counts"].items()
    )
    verdicts = "".join(
        f"<tr><td>{esc(k)}</td><td>{v}</td></tr>" for k, v in summary["verdicts"].items()
    )
    anomalies = "".join(
        f"<tr><td>{esc(k)}</td><td>{v}</td></tr>" for k, v in summary["anomalies"].items()
    )
    faults = _faults_html(summary)
    network = _network_html(summary)
    figures = "".join(
        f'<figure><img alt="{esc(name)}" src="data:image/png;base64,{data}"></figure>'
        for name, data in images.items()
    )
    downstream = summary["downstream"]
    minute_rows = "".join(
        f"<tr><td>{esc(m)}</td>"
        + "".join(
            f"<td>{downstream[s].get(m, ['', ''])[i]}</td>"
            for i in (0, 1)
            for s in ("raw", "output_log", "truth")
        )
        + "</tr>"
        for m in sorted(set().union(*(set(v) for v in downstream.values())))
    )
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>pidfence demo</title>
<style>body{{font-family:sans-serif;max-width:60em;margin:auto}}
table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:2px 8px}}
.ok{{color:green}}.bad{{color:#b00}}</style></head><body>
<h1>pidfence demo — <span class="{"ok" if summary["ok"] else "bad"}">{status}</span></h1>
<p>wall time {summary.get("wall_s", 0):.1f}s; config
<code>{esc(json.dumps(summary["config"]))}</code></p>
{_open_the_table(summary.get("output", "out/output"))}
<h2>Counts</h2><table>{counts}</table>
<h2>Verdicts</h2><table>{verdicts}</table>
<h2>Anomalies (checker)</h2><table>{anomalies}</table>
<h2>Faults injected</h2><ul>{faults}</ul>
{network}
<h2>Plots</h2>{figures}
<h2>Downstream job: unique users per minute (seed 003)</h2>
<p>Distinct users cannot be inflated by duplicates, events can: the raw topic over-counts
events; the output log must equal the truth computed from the send ledgers.</p>
<table><tr><th rowspan="2">minute</th><th colspan="3">unique users</th>
<th colspan="3">events</th></tr>
<tr><th>raw topic</th><th>output log</th><th>truth</th>
<th>raw topic</th><th>output log</th><th>truth</th></tr>
{minute_rows}</table>
</body></html>
"""


def _faults_html(summary: dict[str, Any]) -> str:
    """Each requested fault, whether it happened (a fault that did not is an anomaly), and the
    events of every fault script."""
    esc = html.escape
    happened: dict[str, bool] = summary.get("faults_happened") or {}
    events: dict[str, list[str]] = summary.get("faults") or {}
    items = []
    for name in [*sorted(happened), *(n for n in events if n not in happened)]:
        mark = ""
        if name in happened:
            mark = (
                ' <span class="ok">happened</span>'
                if happened[name]
                else ' <span class="bad">did not happen</span>'
            )
        lines = "".join(f"<li>{esc(e)}</li>" for e in events.get(name, []))
        items.append(f"<li><b>{esc(name)}</b>{mark}<ul>{lines}</ul></li>")
    return "".join(items)


def _network_html(summary: dict[str, Any]) -> str:
    """The seeded network faults: the plan, one step per line, and how to replay it."""
    plan = summary.get("plan") or {}
    if plan.get("seed") is None:
        return ""
    esc = html.escape
    steps = "".join(f"<li><code>{esc(line)}</code></li>" for line in plan.get("steps", []))
    notes = "".join(f"<p>{esc(note)}</p>" for note in summary.get("notes", []))
    return (
        f"<h2>Network faults (seed {plan['seed']})</h2>"
        "<p>Each link ran through a TCP fault proxy (toxiproxy); these faults were put on it at "
        "these times and taken off after their duration. Replay them with "
        f"<code>pidfence demo --faults net --seed {plan['seed']}</code>.</p>"
        f"{notes}<ul>{steps}</ul>"
    )


def _open_the_table(output: str) -> str:
    """How to read the output log (a Delta Lake table by default) in other tools."""
    path = html.escape(output)
    return f"""<h2>The output log</h2>
<p>A Delta Lake table at <code>{path}</code>, rejects at <code>{path}/_rejects</code> (with two
extra columns, <code>pf</code> and <code>batch</code>). Only committed batches are visible.</p>
<ul>
<li>Polars: <code>pl.read_delta("{path}")</code></li>
<li>deltalake / pyarrow: <code>DeltaTable("{path}").to_pyarrow_table()</code></li>
<li>Spark: start the session with the jars <code>pidfence jars delta</code> fetches,
<code>spark.sql.extensions=io.delta.sql.DeltaSparkSessionExtension</code> and
<code>spark.sql.catalog.spark_catalog=org.apache.spark.sql.delta.catalog.DeltaCatalog</code>, then
<code>spark.read.format("delta").load("{path}")</code></li>
<li>pidfence: <code>pidfence.spark_sink.read_log("{path}")</code> or
<code>spark.read.format("pidfence").load("{path}")</code></li>
</ul>"""


def write_report(summary: dict[str, Any], out: Path, console: Console) -> None:
    """Print the summary table; write ``out/summary.json`` and ``out/report.html``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    (out / "report.html").write_text(render_html(summary, plots(summary)))
    console.print(summary_table(summary))
    console.print(f"report: {out / 'report.html'}  summary: {out / 'summary.json'}")
