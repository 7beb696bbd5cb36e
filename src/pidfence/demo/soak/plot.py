"""The soak's PNG: RSS per process, per-batch time and state bytes over time, faults marked."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pidfence.demo.soak.figures import MB


def write_plot(
    samples: Sequence[dict[str, Any]],
    batches: Sequence[dict[str, Any]],
    faults: Sequence[dict[str, Any]],
    path: Path,
    wall_start: float,
    title: str,
) -> None:
    """Four panels sharing the time axis (minutes since the producers started): RSS, batch time,
    state bytes and records read, files under the output's ``_pidfence/`` and ``_delta_log/``.

    Args:
        samples: the soak's samples (``t_s``, ``rss``, ``state_bytes``, ``batch_s_median``).
        batches: every batch line (wall ``t``, ``seconds``, ``streaming``).
        faults: fault events (``t_s``, ``fault``); one marker per fault start.
        path: the PNG to write.
        wall_start: wall time of the producers' start (batch lines carry wall time).
        title: the figure's title.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_rss, ax_batch, ax_state, ax_files) = plt.subplots(4, 1, figsize=(11, 14), sharex=True)
    names: list[str] = []
    for sample in samples:
        names.extend(n for n in sample["rss"] if n not in names)
    palette = [plt.get_cmap("tab20")(i) for i in range(20)]
    for k, name in enumerate(names):
        points = [(s["t_s"] / 60, s["rss"][name] / MB) for s in samples if s["rss"].get(name)]
        if points:
            px, py = zip(*points, strict=True)
            ax_rss.plot(
                px,
                py,
                marker=".",
                label=name,
                color=palette[(2 * k) % 20 + k // 10],
                ls=("-", "--", ":")[k % 3],
            )
    ax_rss.set_ylabel("RSS (MB)")
    ax_rss.set_yscale("log")
    ax_rss.legend(fontsize="x-small", ncol=3, loc="upper left")
    ax_rss.set_title("resident memory per process tree")

    streaming = [b for b in batches if b.get("streaming") and b.get("seconds") is not None]
    if streaming:
        ax_batch.scatter(
            [(b["t"] - wall_start) / 60 for b in streaming],
            [b["seconds"] for b in streaming],
            s=4,
            alpha=0.4,
            label="each batch",
        )
    medians = [(s["t_s"] / 60, s["batch_s_median"]) for s in samples if s.get("batch_s_median")]
    if medians:
        mx, my = zip(*medians, strict=True)
        ax_batch.plot(mx, my, color="black", marker="o", label="median since previous sample")
    ax_batch.set_ylabel("batch time (s)")
    ax_batch.set_title("per-batch time (query progress: triggerExecution)")
    ax_batch.legend(fontsize="x-small", loc="upper left")

    xs: list[float] = [s["t_s"] / 60 for s in samples]
    ax_state.plot(xs, [s["state_bytes"] / 1024 for s in samples], marker="o", label="state KB")
    ax_state.set_ylabel("bytes under _state (KB)")
    ax_state.set_title("sink state on disk")
    twin = ax_state.twinx()
    twin.plot(xs, [s["records_in"] for s in samples], color="grey", ls="--", label="records in")
    twin.set_ylabel("records read (cumulative)")

    for key, name in (("pidfence_files", "_pidfence/"), ("delta_log_files", "_delta_log/")):
        counted = [(s["t_s"] / 60, s[key]) for s in samples if key in s]
        if counted:
            fx, fy = zip(*counted, strict=True)
            ax_files.plot(fx, fy, marker="o", label=f"files under {name}")
    ax_files.set_ylabel("files")
    ax_files.set_xlabel("minutes since the producers started")
    ax_files.set_title("the output's bookkeeping: files under _pidfence/ and _delta_log/")
    ax_files.legend(fontsize="x-small", loc="upper left")
    batches_twin = ax_files.twinx()
    batches_twin.plot(xs, [s["batches"] for s in samples], color="grey", ls="--")
    batches_twin.set_ylabel("batches committed (cumulative, dashed)")

    # Producer rounds start kill, zombie and lease-zombie together: one line per round.
    colours = {"kill": "red", "sink-restart": "green", "sink-crash": "brown"}
    for event in faults:
        name = event["fault"]
        if name in colours and str(event["event"]).startswith("round"):
            for ax in (ax_rss, ax_batch, ax_state, ax_files):
                ax.axvline(event["t_s"] / 60, color=colours[name], alpha=0.3, lw=1)
    legend = (
        "vertical lines: red = a round of producer faults (kill + resume, zombie, lease-zombie), "
        "green = sink SIGTERM restart, brown = sink crash (SIGKILL)"
    )
    fig.suptitle(f"{title}\n{legend}", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
