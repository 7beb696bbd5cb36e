"""Age a pidfence output synthetically: what a month of batches leaves, generated in a minute.

``age_output`` takes an output a few batches old (its sink ran ``s + 1`` batches) and its Spark
checkpoint, and writes an output that has committed ``batches`` batches (a month at a 1 s
trigger: 2,592,000) and stands exactly where the young one stands, so the same records continue
both. What it holds is what the sink leaves at that age, made with the sink's own code:

* ``_pidfence/`` as the fold leaves it: the newest ``retainBatches`` (100) to 163 batches live
  (their manifests, decisions and held files, committed through ``Output.publish``, so their Delta
  commits are real), the two position indexes, and the folded segments of every older batch with
  the spans the fold's merge rule gives at that age. The young output's batches are the newest
  ones, renumbered (manifests, files, state chains re-encoded under the new batch ids); older live
  batches are copies of its first. Folded segments are stand-ins (one manifest and its decisions
  each, of the right span): a batch reads a segment only for a state rebuild or a merge, and the
  decisions of a month (about 100 KB per batch) would not fit on a bench machine.
* Each Delta table's ``_delta_log/`` with the entries its ``delta.logRetentionDuration`` keeps at
  that age (one commit per batch, a checkpoint every ``delta.checkpointInterval``; the rejects
  table in the young output's proportion of batches with rejects): the real newest checkpoint and
  the commits after it moved to the aged versions, older entries hard links to one real commit
  and one real checkpoint (a listing sees every name; nothing reads below the newest checkpoint).
* Spark's checkpoint: the young one's, its last batch renumbered to the aged last batch.

The table's data files of a month are not generated: keeping them few (compaction) is table
care, measured elsewhere.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable

from pidfence.spark_sink import query_owner
from pidfence.spark_sink.delta.checkpoints import checkpoint_interval, last_checkpoint
from pidfence.spark_sink.manifest import (
    KINDS,
    BatchManifest,
    PartFiles,
    Position,
    encode_positions,
)
from pidfence.spark_sink.output import NO_OWNER, open_output
from pidfence.spark_sink.positions import INDEX, INDEX_EVERY
from pidfence.spark_sink.segments import LISTS, MERGE, WIDEST, Segment, segment_stem, with_place
from pidfence.spark_sink.state_files import STATE, decode_state, encode_state
from pidfence.spark_sink.storage import Store, batch_name

#: Batches a day at a 1 s trigger.
DAY = 86_400
RETAIN = 100
#: Links per inode (ext4 allows 65,000).
_LINKS = 60_000
_UNITS = {"second": 1, "minute": 60, "hour": 3600, "day": 86_400, "week": 604_800}


def retention_s(dt: DeltaTable) -> int:
    """The table's ``delta.logRetentionDuration`` in seconds (Delta's default: 30 days)."""
    raw = dt.metadata().configuration.get("delta.logRetentionDuration", "interval 30 days")
    found = re.fullmatch(r"\s*interval\s+(\d+)\s+(\w+?)s?\s*", raw.lower())
    if found is None:
        raise ValueError(f"cannot read delta.logRetentionDuration {raw!r}")
    return int(found[1]) * _UNITS[found[2]]


def fold_spans(last: int, retain: int = RETAIN) -> list[tuple[int, int]]:
    """The folded segments' spans after batch ``last`` (fold.py's rule: every INDEX_EVERY
    batches, fold up to ``batch - retain``; runs of MERGE equal widths merge, up to WIDEST
    batches)."""
    spans: list[tuple[int, int]] = []
    for at in range(INDEX_EVERY, last + 1, INDEX_EVERY):
        first = spans[-1][1] + 1 if spans else 0
        if at - retain < first:
            continue
        spans.append((first, at - retain))
        while len(spans) >= MERGE:
            tail = spans[-MERGE:]
            if len({b - a for a, b in tail}) != 1 or tail[-1][1] - tail[0][0] + 1 > WIDEST:
                break
            spans[-MERGE:] = [(tail[0][0], tail[-1][1])]
    return spans


def _moved(rel: str, src: int, dst: int) -> str:
    return rel.replace(f"/{batch_name(src)}/", f"/{batch_name(dst)}/")


def _link(src: str, dst: str) -> None:
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    if not os.path.exists(dst):
        os.link(src, dst)


def _states(young: Store, aged: Store, shift: int) -> None:
    """Every state file of the young output under its batch id + ``shift`` (re-encoded)."""
    root = Path(young.join(STATE))
    for path in root.glob("*/*"):
        batch, tag, kind = path.name.split(".")
        sf = decode_state(path.read_bytes())
        prev_name = sf.prev_name
        if sf.prev is not None and prev_name is not None:
            prev_name = f"{batch_name(sf.prev + shift)}.{prev_name.split('.', 1)[1]}"
        moved = dataclasses.replace(
            sf, prev=None if sf.prev is None else sf.prev + shift, prev_name=prev_name
        )
        name = f"{batch_name(int(batch) + shift)}.{tag}.{kind}"
        aged.put(aged.join(STATE, path.parent.name, name), encode_state(moved))


def _age_log(root: str, commits: int) -> int:
    """Give the table at ``root`` the versions and log entries of ``commits`` commits kept by
    its retention at one commit a second; returns the entries in ``_delta_log/``."""
    dt = DeltaTable(root)
    log = Path(root) / "_delta_log"
    newest, cp = dt.version(), last_checkpoint(Store.at(root))
    if cp < 0:
        return sum(1 for _ in os.scandir(log))
    interval = checkpoint_interval(dt)
    kept = min(commits, retention_s(dt))
    shift = max(0, commits - newest)
    sample = next(p for p in sorted(log.glob("*.json"), reverse=True))
    checkpoint = log / f"{cp:020d}.checkpoint.parquet"
    spare_json, spare_cp = log / ".sample.json", log / ".sample.checkpoint"
    shutil.copy(sample, spare_json)
    shutil.copy(checkpoint, spare_cp)
    for path in sorted(log.iterdir(), reverse=True):
        if path.name[:20].isdigit():
            version = int(path.name[:20])
            if version >= cp:
                path.rename(log / f"{version + shift:020d}{path.name[20:]}")
            else:
                path.unlink()
    last = json.loads((log / "_last_checkpoint").read_text())
    last["version"] = cp + shift
    (log / "_last_checkpoint").write_text(json.dumps(last))
    sources: dict[str, Path] = {}
    for n, version in enumerate(range(max(1, newest + shift - kept), cp + shift)):
        if n % _LINKS == 0:
            sources = {}
            for kind, spare in (("json", spare_json), ("cp", spare_cp)):
                sources[kind] = log / f".link{n}.{kind}"
                shutil.copy(spare, sources[kind])
        os.link(sources["json"], log / f"{version:020d}.json")
        if version % interval == 0:
            os.link(sources["cp"], log / f"{version:020d}.checkpoint.parquet")
    for path in log.glob(".*"):
        path.unlink()
    return sum(1 for _ in os.scandir(log))


def age_output(young: Path, young_ckpt: Path, aged: Path, aged_ckpt: Path, batches: int) -> Any:
    """Write at ``aged`` (and ``aged_ckpt``) the output ``young`` would be after ``batches``
    batches; returns what it generated."""
    src = open_output(str(young), str(young / "_rejects"), NO_OWNER)
    query = query_owner.owner_of(src.own) or ""
    src.query_id = query
    newest = src.committed_version()
    last = batches - 1
    shift = last - newest
    out = open_output(str(aged), str(aged / "_rejects"), query)
    query_owner.take_ownership(out.own, query)
    fold_at = last - last % INDEX_EVERY
    made: dict[int, BatchManifest] = {}
    for batch in range(fold_at - RETAIN + 1, last + 1):
        x = max(0, batch - shift)
        m = src.committed(x)
        if m is None:
            raise RuntimeError(f"{young}: batch {x} is not committed")
        parts = []
        for part in m.parts:
            names = {}
            for kind in KINDS:
                rel = part.files.of(kind)
                if rel is None:
                    continue
                store_src = src.own if kind in ("held", "decided") else src.table(kind)
                store_dst = out.own if kind in ("held", "decided") else out.table(kind)
                names[kind] = _moved(rel, x, batch)
                _link(store_src.join(rel), store_dst.join(names[kind]))
            state = f"{batch_name(batch)}.{part.state.split('.', 1)[1]}"
            files = PartFiles(**names, stats=part.files.stats)
            prev = batch - 1 if batch > 0 else None
            parts.append(dataclasses.replace(part, files=files, state=state, prev=prev))
        made[batch] = out.publish(dataclasses.replace(m, batch=batch, parts=tuple(parts)))
    _states(src.own, out.own, shift)
    for at in (fold_at - INDEX_EVERY, fold_at):
        positions = {p.name: Position(at, p) for p in made[at].parts}
        out.own.put(out.own.join(INDEX, batch_name(at) + ".json"), encode_positions(at, positions))
    out.own.put(out.own.join(INDEX, "latest"), str(fold_at).encode())
    spans = fold_spans(last)
    template = made[last]
    for first, end in spans:
        stem = out.own.join(segment_stem(Segment(first, end, "aged")))
        line = dataclasses.replace(template, batch=first).encode().replace(b"\n", b"")
        out.own.put(stem + ".json", line + b"\n")
        pieces = [
            with_place(rows, first, part)
            for part in template.parts
            if (rows := out.read_decided(last, part)) is not None
        ]
        if pieces:
            out.own.write_table(stem + ".parquet", pa.concat_tables(pieces))
    listed = [[first, end, "aged"] for first, end in spans]
    out.own.put(out.own.join(LISTS, batch_name(0) + ".json"), json.dumps(listed).encode())
    # The rejects table gets a commit for a batch with rejects only: the young one's share.
    young_rejects = DeltaTable(str(young / "_rejects")).version()
    entries = {
        "log": _age_log(str(aged), batches),
        "rejects": _age_log(str(aged / "_rejects"), batches * young_rejects // (newest + 1)),
    }
    shutil.copytree(young_ckpt, aged_ckpt)
    # Spark restarts from the newest two batches' offsets and the newest commit.
    for folder in ("offsets", "commits"):
        for path in sorted((aged_ckpt / folder).iterdir(), reverse=True):
            name = path.name.strip(".").removesuffix(".crc")
            if not name.isdigit():
                continue
            if int(name) in (newest - 1, newest):
                path.rename(path.with_name(path.name.replace(name, str(int(name) + shift))))
            else:
                path.unlink()
    return {
        "batches": batches,
        "live_batches": len(made),
        "segments": len(spans),
        "delta_log_entries": entries,
        "pidfence_files": sum(len(f) for _, _, f in os.walk(out.own.root)),
    }
