"""Per-rank trace writing: each rank writes its own OTF2 event files; the end step writes
only the definitions, so its cost does not grow with the number of events.

During the run a rank's records go to its spill file (:mod:`.spill`) at least every second
(the flusher thread), which is what survives a SIGKILL. When the rank finalizes, it replays
its own records exactly as the merge does (:func:`.merge._rank`: nesting repair, step
discards, collective begins, communication lanes) and writes one OTF2 event file per location
with its *own* references (regions, communicators and metric channels numbered as it defined
them), into ``ranks/rank-<r>.otf2/``, then a small description of them,
``ranks/rank-<r>.otf2.json`` (written last: its presence marks the event files complete).

The end step (:func:`assemble`) reads those descriptions, numbers the definitions as the merge
would (so both archives read back into identical tables), writes the global definitions, the
anchor file and each location's local definitions (its rank's clock offsets and the OTF2
mapping tables from the rank's references to the archive's, as Score-P does), and hard-links
the ranks' event files into the archive under their archive location numbers (an event file
does not contain its location's reference). A rank that did not finalize (killed, or its
conversion failed) has its spill file converted here, by the same code, and is flagged as the
merge flags it.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from instrument.tracer import merge
from instrument.tracer.spill import SpillError, rank_paths, ranks_present, read_rank
from traceio import archive as arch
from traceio import codec, native_writer
from traceio.otf2_writer import install
from traceio.records import EVENT_DTYPE, STEP, Role

MODE_ENV = "DLTRACE_TRACE_WRITING"  # per-rank (default) or merged (one process writes all)
FORMAT = 1


def enabled(env: dict[str, str] | None = None) -> bool:
    """Whether runs write per rank: the native codec is built and ``DLTRACE_TRACE_WRITING``
    does not ask for the merged path."""
    mode = (os.environ if env is None else env).get(MODE_ENV, "per-rank")
    return codec.available() and mode != "merged"


def paths(ranks_dir: Path, rank: int) -> tuple[Path, Path]:
    """(event file directory, description) of ``rank``'s OTF2 event files."""
    stem = ranks_dir / f"rank-{rank:05d}"
    return stem.with_suffix(".otf2"), stem.with_suffix(".otf2.json")


def write_rank(ranks_dir: Path, rank: int) -> dict[str, Any]:
    """Convert ``rank``'s spill file into its OTF2 event files and their description.

    Raises :class:`SpillError` when the spill files are unusable, RuntimeError where the
    codec is not built, and the codec's error when OTF2 fails."""
    ranks_dir = Path(ranks_dir)
    spill = read_rank(ranks_dir, rank)
    local = merge._Defs()  # the rank's own numbering (ids unchanged), plus step / tail if new
    for r in spill.meta.get("regions", []):
        local.region(r["name"], r["role"])
    spec, summary = merge._rank(spill, local)
    out, description = paths(ranks_dir, rank)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    metrics = list(spill.meta.get("metrics", []))
    events = native_writer.write_events(spec.locations, tmp, arch.ARCHIVE_NAME, len(local.comms), len(metrics))
    description.unlink(missing_ok=True)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    evt, _ = rank_paths(ranks_dir, rank)
    side: dict[str, Any] = {
        "format": FORMAT,
        "rank": rank,
        "spill_bytes": evt.stat().st_size if evt.exists() else 0,
        "host": spec.host,
        "clock_offsets": [list(o) for o in spec.clock_offsets],
        "start_realtime_ns": spill.meta.get("start_realtime_ns"),
        "regions": [list(r) for r in local.regions],
        "comms": [[name, list(members)] for name, members in local.comms],
        "metrics": metrics,
        "locations": [
            {"index": loc.index, "name": loc.name, "kind": loc.kind, "events": n,
             "first_ns": int(loc.records["time"][0]) if len(loc.records) else None,
             "last_ns": int(loc.records["time"][-1]) if len(loc.records) else None}
            for loc, n in zip(spec.locations, events, strict=True)
        ],
        "summary": asdict(summary),
    }
    part = description.with_name(description.name + ".tmp")
    part.write_text(json.dumps(side), encoding="utf-8")
    os.replace(part, description)
    return side


def _written(ranks_dir: Path, rank: int) -> dict[str, Any] | None:
    """The rank's description if its event files are complete and match its spill file."""
    out, description = paths(ranks_dir, rank)
    evt, _ = rank_paths(ranks_dir, rank)
    try:
        side = json.loads(description.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    size = evt.stat().st_size if evt.exists() else 0
    if side.get("format") != FORMAT or side.get("spill_bytes") != size:
        return None  # written by another version, or records were appended since
    if not all((out / arch.ARCHIVE_NAME / f"{i}.evt").is_file() for i in range(len(side["locations"]))):
        return None
    return side


def assemble(run_dir: Path, expected_ranks: int | None = None) -> tuple[merge.MergeResult, Path]:
    """Write ``run_dir/traces.otf2`` from the ranks' own event files (converting the spill
    files of ranks that did not write them); return what :func:`.merge.collect` returns
    and the anchor path. Raises :class:`.merge.MergeError` as the merge does."""
    run_dir = Path(run_dir)
    ranks_dir = run_dir / "ranks"
    present = ranks_present(ranks_dir)
    if not present:
        raise merge.MergeError(f"{ranks_dir}: no per-rank trace files; did any rank start with the tracer?")
    sides = []
    for rank in present:
        side = _written(ranks_dir, rank)
        if side is None:
            try:
                side = write_rank(ranks_dir, rank)
            except SpillError as e:
                raise merge.MergeError(str(e)) from None
        sides.append(side)

    defs = merge._Defs()
    defs.region(STEP, Role.FUNCTION)
    specs: list[arch.RankSpec] = []
    summaries: list[merge.RankSummary] = []
    metric_defs: dict[int, list[dict[str, Any]]] = {}
    maps: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    start_realtime = None
    no_records = np.zeros(0, dtype=EVENT_DTYPE)
    for side in sides:
        rank = int(side["rank"])
        region_map = np.array([defs.region(n, r) for n, r in side["regions"]], dtype=np.uint64)
        comm_map = np.array([defs.comm(n, m) for n, m in side["comms"]], dtype=np.uint64)
        maps[rank] = (region_map, comm_map)
        locations = [arch.LocationSpec(rank, loc["index"], loc["name"], loc["kind"], no_records)
                     for loc in side["locations"]]
        offsets = [(int(t), int(o), float(sd)) for t, o, sd in side["clock_offsets"]]
        specs.append(arch.RankSpec(rank, side["host"], offsets, locations))
        summaries.append(merge.RankSummary(**side["summary"]))
        metric_defs[rank] = list(side["metrics"])
        rt = side.get("start_realtime_ns")
        if rt is not None and (start_realtime is None or rt < start_realtime):
            start_realtime = int(rt)
    metrics = merge._metrics(specs, metric_defs, summaries)

    written: dict[tuple[int, int], native_writer.Written] = {}
    links: list[tuple[Path, int]] = []
    lo: int | None = None
    hi: int | None = None
    first_metric = 0
    for side, spec in zip(sides, specs, strict=True):
        region_map, comm_map = maps[spec.rank]
        # _metrics numbers the channels rank by rank, each rank's in its own order
        metric_map = np.arange(first_metric, first_metric + len(side["metrics"]), dtype=np.uint64)
        first_metric += len(side["metrics"])
        out, _ = paths(ranks_dir, spec.rank)
        for i, loc in enumerate(side["locations"]):
            written[(spec.rank, loc["index"])] = native_writer.Written(
                int(loc["events"]), region_map, comm_map,
                metric_map if loc["kind"] == arch.METRIC_KIND else metric_map[:0])
            links.append((out / arch.ARCHIVE_NAME / f"{i}.evt", len(links)))
            if loc["first_ns"] is not None:
                first, last = arch.corrected(np.array([loc["first_ns"], loc["last_ns"]], dtype=np.int64),
                                             spec.clock_offsets).tolist()
                lo = first if lo is None else min(lo, first)
                hi = last if hi is None else max(hi, last)
    spec_all = arch.ArchiveSpec(defs.regions, defs.comms, specs, start_realtime_ns=start_realtime,
                                creator=f"dltrace {merge._version()}", metrics=metrics)
    tmp = run_dir / ".archive.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    events = native_writer.write(spec_all, tmp, arch.ARCHIVE_NAME, written,
                                 None if lo is None or hi is None else (lo, hi))
    for source, ref in links:
        _link(source, tmp / arch.ARCHIVE_NAME / f"{ref}.evt")
    anchor = install(tmp, run_dir)
    expected = expected_ranks if expected_ranks is not None else max(present) + 1
    missing = [r for r in range(expected) if r not in present]
    return merge.MergeResult(spec_all, summaries, missing, written_events=events), anchor


def _link(source: Path, target: Path) -> None:
    """``target`` as a second name of ``source`` (no copy), or a copy where links fail."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)
