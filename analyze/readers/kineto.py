"""Read a directory of per-rank Kineto (torch.profiler) or other Chrome trace JSON files into the
same definitions and column chunks the OTF2 readers give, so everything downstream works alike.

One file is one rank (``torch.profiler.tensorboard_trace_handler`` writes
``<host>_<pid>.<time>.pt.trace.json[.gz]`` per rank; any ``*.json[.gz]`` holding
``traceEvents`` counts). The rank is ``distributedInfo.rank`` when every file has a distinct
one, else the files' order by name (natural order: rank-2 before rank-10), and the build says
so. How the events become rows (the rules are in :mod:`traceio.kineto`):

- locations: each rank's main thread (index 0), its other CPU threads, timelines (Kineto's
  own spans) and accelerator streams (``GPU <pid> stream <tid>``), in that order;
- regions: one per name and role, the name without Python object addresses (``with_stack``'s
  ``<built-in method get of dict object at 0x7fd6...>`` is ``... dict object>`` on every rank;
  the name as written stays in ``chrome_events.extra``);
- intervals: every slice with its recorded times, nested per track (a slice that only partly
  overlaps the one before it is its sibling, not its child; counted in build_info as
  ``chrome_partial_overlaps``); the overlap is the later slice's time, as on a call stack: the
  earlier slice's exclusive time stops where the later one starts
  (``chrome_events.own_end_ns``), so time per region counts every instant once;
- collectives: every NCCL/RCCL kernel, with its operation (NULL when neither the args nor the
  kernel name say), bytes (NULL without ``In/Out msg nelems`` and a known ``dtype``) and its
  process group as the communicator (a group of all ranks when the kernel names none), so
  they match across ranks by communicator and sequence like any other collective; and every
  gloo work item on a CPU thread (``gloo:all_reduce``, ...), with the bytes of its input
  tensors (NULL unless the profiler recorded shapes) in a communicator of its own, gloo's
  group of all ranks (its events name no process group);
- extra tables: ``chrome_events`` (cat, args), ``chrome_tracks`` (pid, tid),
  ``chrome_files`` (header and every non-slice event, verbatim) and ``correlations``.

Times: ``baseTimeNanoseconds + ts`` in ns (epoch time in Kineto's files), from the earliest
slice of any rank. Nothing is dropped silently: what was not a slice is kept in
``chrome_files.other_events`` and counted in build_info.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from otf2.enums import CollectiveOp

from analyze.readers.columns import (
    COLLECTIVE_COLUMNS,
    INTERVAL_COLUMNS,
    MESSAGE_COLUMNS,
    Chunk,
    CommDef,
    Definitions,
    LocationDef,
    ReadStats,
    RegionDef,
)
from traceio import chrome, kineto
from traceio.chrome import ChromeTrace, ChromeTraceError

PEEK_BYTES = 1 << 20
NO_VALUE = -1  # bytes or root unknown, in the raw collective columns (NULL in the tables)
DEFAULT_GROUP = "default (all ranks)"
GLOO_GROUP = "gloo: default (all ranks)"  # a sequence of its own beside NCCL's default group


# the extra tables' columns (analyze/schema.py), in their order; text columns as objects
EVENT_COLUMNS = {"location_id": np.int64, "idx": np.int64, "cat": object, "args": object, "extra": object,
                 "own_end_ns": object}
TRACK_COLUMNS = {"location_id": np.int64, "rank": np.int32, "pid": object, "tid": object}
FILE_COLUMNS = {"rank": np.int32, "path": object, "base_time_ns": np.int64, "header": object,
                "other_events": object}
CORRELATION_COLUMNS = {
    "rank": np.int32, "correlation": np.int64, "launch_location_id": np.int64, "launch_idx": np.int64,
    "launch_start_ns": np.int64, "launch_end_ns": np.int64, "location_id": np.int64, "idx": np.int64,
    "start_ns": np.int64, "end_ns": np.int64, "source": object}


class KinetoError(Exception):
    """The directory holds no usable trace files, or they contradict each other."""


def _natural(path: Path) -> list[Any]:
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", path.name)]


def _holds_trace_events(path: Path) -> bool:
    """Whether the start of ``path`` mentions traceEvents (a Chrome trace, not run.json)."""
    try:
        if path.name.endswith(".gz"):
            import gzip

            with gzip.open(path, "rb") as fh:
                head = fh.read(PEEK_BYTES)
        else:
            with path.open("rb") as fh:
                head = fh.read(PEEK_BYTES)
    except (OSError, EOFError):
        return False
    return b'"traceEvents"' in head or head.lstrip()[:1] == b"["


def trace_files(path: Path) -> list[Path]:
    """The Chrome trace files of directory ``path`` (or ``[path]`` for one file), by name."""
    path = Path(path)
    if path.is_file():
        return [path] if chrome.is_trace_file(path) else []
    if not path.is_dir():
        return []
    found = [p for p in path.iterdir() if p.is_file() and chrome.is_trace_file(p)
             and (p.name.endswith((".pt.trace.json", ".pt.trace.json.gz")) or _holds_trace_events(p))]
    return sorted(found, key=_natural)


def _ranks(heads: list[tuple[Path, dict[str, Any]]]) -> tuple[list[int], str]:
    given = [(h.get("distributedInfo") or {}).get("rank") for _, h in heads]
    ranks = [int(r) for r in given  # (an integer, or its digits in some writers)
             if isinstance(r, str) and r.isdigit() or isinstance(r, int) and not isinstance(r, bool)]
    if len(ranks) == len(heads):
        seen: dict[int, Path] = {}
        for r, (path, _) in zip(ranks, heads, strict=True):
            if r in seen:
                raise KinetoError(f"{seen[r].name} and {path.name} both say they are rank {r} "
                                  "(distributedInfo.rank); keep one file per rank in the directory")
            seen[r] = path
        return ranks, "distributedInfo.rank"
    return list(range(len(heads))), "file order (not every file has a distinct distributedInfo.rank)"


def read(path: Path, chunk_rows: int = 500_000) -> tuple[Definitions, Iterator[Chunk]]:
    """Read the trace files of ``path`` (a directory or one file); definitions and chunks.

    Two passes, one file in memory at a time: the first finds each file's rank and time span
    (the tables count from the earliest event of any rank), the second reads each file again
    into its rank's chunk, adding its locations, regions and communicators to the definitions
    on the way (they are complete once the chunks are consumed, as for the OTF2 readers).
    Raises :class:`KinetoError` or :class:`traceio.chrome.ChromeTraceError` for unusable input.
    """
    files = trace_files(path)
    if not files:
        raise KinetoError(f"{path} holds no Chrome trace JSON files (*.json or *.json.gz with traceEvents)")
    heads: list[tuple[Path, dict[str, Any]]] = []
    starts, ends = [], []
    for f in files:
        t = chrome.load(f)
        heads.append((f, t.header))
        if t.slices:
            starts.append(min(s.start_ns for s in t.slices))
            ends.append(max(s.end_ns for s in t.slices))
    ranks, rank_source = _ranks(heads)
    if not starts:
        raise KinetoError(f"the trace files in {path} hold no timed events")
    offset = min(starts)
    epoch = offset > 10**18  # after 2001-09-09: the times are epoch (Kineto: base + ts)
    defs = Definitions(anchor=Path(path), creator=_creator(heads[0][1]), resolution=1_000_000_000,
                       global_offset=offset, length_ticks=max(ends) - offset,
                       realtime_ns=offset if epoch else None)
    defs.notes["ranks_from"] = rank_source
    worlds = {(h.get("distributedInfo") or {}).get("world_size") for _, h in heads}
    world = worlds.pop() if len(worlds) == 1 else None
    default = list(range(world)) if isinstance(world, int) and world >= max(ranks) + 1 else sorted(ranks)
    return defs, _chunks(files, ranks, default, defs)


def _creator(header: dict[str, Any]) -> str:
    version = header.get("schemaVersion")
    return "PyTorch profiler (Kineto)" + (f", schema {version}" if version is not None else "") \
        if "schemaVersion" in header or "distributedInfo" in header else "Chrome trace JSON"


class _Rank:
    """One rank's tracks and where each slice went."""

    def __init__(self, tracks: list[kineto.Track], location_ids: list[int]):
        self.tracks = tracks
        self.location_ids = location_ids
        self.where: dict[int, tuple[int, int]] = {}  # slice -> (location_id, idx)
        for t, loc in zip(tracks, location_ids, strict=True):
            for pos, i in enumerate(t.slices):
                self.where[i] = (loc, pos)


def _layout(t: ChromeTrace, rank: int, defs: Definitions, counts: Counter[str]) -> _Rank:
    tracks, overlaps = kineto.tracks(t)
    ids = [(index << 32) | rank for index in range(len(tracks))]
    for index, (track, loc) in enumerate(zip(tracks, ids, strict=True)):
        defs.locations.append(LocationDef(
            location_id=loc, rank=rank, thread=index, name=track.name, kind=track.kind,
            is_main=index == 0 and track.kind == kineto.CPU_THREAD, events=len(track.slices)))
    counts["chrome_partial_overlaps"] += overlaps
    return _Rank(tracks, ids)


def _chunks(files: list[Path], ranks: list[int], default: list[int], defs: Definitions) -> Iterator[Chunk]:
    regions: dict[tuple[str, str], int] = {}
    comms: dict[tuple[str, tuple[int, ...]], int] = {}
    stats = ReadStats()
    counts: Counter[str] = Counter()
    off = defs.global_offset
    for n, (f, rank) in enumerate(zip(files, ranks, strict=True)):
        t = chrome.load(f)
        lay = _layout(t, rank, defs, counts)
        info = t.header.get("distributedInfo") or {}
        comms_args = kineto.param_comms(t)
        iv: list[tuple] = []
        coll: list[tuple] = []
        ev: list[tuple] = []
        for track, loc in zip(lay.tracks, lay.location_ids, strict=True):
            device = track.kind == kineto.ACCELERATOR_STREAM
            exclusive, own = _exclusive(t, track)
            for pos, i in enumerate(track.slices):
                s = t.slices[i]
                is_coll = device and kineto.is_collective_kernel(s)
                gloo = track.kind == kineto.CPU_THREAD and kineto.is_gloo_collective(s)
                args, from_cpu = kineto.collective_args(s, comms_args) if is_coll else (s.args, False)
                counts["collective_kernels_with_args_of_record_param_comms"] += from_cpu
                op = kineto.collective_op(s, args) if is_coll or gloo else None
                name = kineto.region_name(s.name)
                key = (name, kineto.collective_role(op) if gloo else kineto.role(s, op))
                rid = regions.get(key)
                if rid is None:
                    rid = regions[key] = len(defs.regions)
                    defs.regions.append(RegionDef(rid, name, name, "user", key[1], None, None))
                iv.append((loc, rank, pos, track.parent[pos], track.depth[pos], rid,
                           s.start_ns - off, s.end_ns - off, s.truncated, exclusive[pos]))
                extra = s.extra if name == s.name else {**(s.extra or {}), "name": s.name}  # as written
                ev.append((loc, pos, s.cat, _json(s.args), _json(extra),
                           own[pos] - off if own[pos] < s.end_ns else None))
                if is_coll or gloo:
                    group = None if gloo else kineto.process_group(args, info)
                    if group is None:
                        counts["gloo_collectives" if gloo else "collective_kernels_in_default_group"] += 1
                        group = (GLOO_GROUP if gloo else DEFAULT_GROUP, default)
                    gkey = (group[0], tuple(group[1]))
                    if gkey not in comms:
                        comms[gkey] = len(defs.comms)
                        defs.comms.append(CommDef(comm_id=comms[gkey], name=gkey[0], members=list(gkey[1])))
                    sent, recv = kineto.gloo_payload(s) if gloo else kineto.payload(args)
                    # (a profile without record_shapes; any other reason is counted in _collective)
                    counts["gloo_collectives_without_shapes"] += gloo and "Input Dims" not in (s.args or {})
                    coll.append(_collective(s, args, op, sent, recv, loc, rank, pos, comms[gkey], off, counts,
                                            "gloo_collectives" if gloo else "collective_kernels")
                                + (rid, s.start_ns - off, s.end_ns - off))  # the slice is its own instance
        device_slices = [i for tr in lay.tracks if tr.kind == kineto.ACCELERATOR_STREAM for i in tr.slices]
        cpu = [i for tr in lay.tracks if tr.kind != kineto.ACCELERATOR_STREAM for i in tr.slices]
        pairs, missing = kineto.correlations(t, device_slices, cpu)
        counts["device_slices_without_launch"] += missing
        corr = []
        for launch, dev, cid, how in pairs:
            (lloc, lidx), (dloc, didx) = lay.where[launch], lay.where[dev]
            ls, ds = t.slices[launch], t.slices[dev]
            corr.append((rank, cid, lloc, lidx, ls.start_ns - off, ls.end_ns - off, dloc, didx,
                         ds.start_ns - off, ds.end_ns - off, how))
        counts.update({f"chrome_{k}": v for k, v in t.stats.items()})
        counts["chrome_other_events"] += len(t.other)
        stats.events += t.events
        stats.truncated += sum(s.truncated for s in t.slices)
        tables = {
            "chrome_events": _rows(EVENT_COLUMNS, ev),
            "chrome_tracks": _rows(TRACK_COLUMNS, [
                (loc, rank, json.dumps(tr.pid), json.dumps(tr.tid))
                for tr, loc in zip(lay.tracks, lay.location_ids, strict=True)]),
            "chrome_files": _rows(FILE_COLUMNS, [
                (rank, str(t.path), t.base_ns, json.dumps(t.header), json.dumps(t.other))]),
            "correlations": _rows(CORRELATION_COLUMNS, corr),
        }
        last = n == len(files) - 1
        if last:
            for k, v in sorted(counts.items()):
                if v:
                    defs.notes[k] = str(v)
        yield Chunk(_rows(INTERVAL_COLUMNS, iv), _rows(COLLECTIVE_COLUMNS, coll), _rows(MESSAGE_COLUMNS, []),
                    t.events, stats if last else None, tables=tables)


def _exclusive(t: ChromeTrace, track: kineto.Track) -> tuple[list[int], list[int]]:
    """Per slice of ``track``: its exclusive time (the readers', analyze/readers/columns.py:
    its duration minus its direct children's) and where it stops being the innermost slice
    (:func:`traceio.kineto.own_ends`). A slice that a later one only partly overlaps gives
    the overlap to it, so the track's time is counted once."""
    own = kineto.own_ends([t.slices[i].start_ns for i in track.slices], [t.slices[i].end_ns for i in track.slices],
                          track.depth)
    duration = [end - t.slices[i].start_ns for i, end in zip(track.slices, own, strict=True)]
    out = list(duration)
    for pos, parent in enumerate(track.parent):
        if parent >= 0:
            out[parent] -= duration[pos]
    return out, own


def _collective(s: chrome.Slice, args: dict[str, Any] | None, op: str | None, sent: int | None, recv: int | None,
                loc: int, rank: int, pos: int, comm: int, off: int, counts: Counter[str], what: str) -> tuple:
    """A raw collective row; ``what`` names the kind of slice in the build_info counts
    (``<what>_without_bytes``: for gloo, a profiler run without ``record_shapes``)."""
    if sent is None:
        counts[f"{what}_without_bytes"] += 1
        types = (args or {}).get("Input type")  # a gloo work item's, with recorded shapes
        for dtype in [(args or {}).get("dtype"), *(types if isinstance(types, list) else [])]:
            if isinstance(dtype, str) and dtype not in kineto.DTYPE_BYTES and dtype not in kineto.TYPE_META_BYTES:
                counts[f"unknown_dtype:{dtype}"] += 1
    if op is None:
        counts[f"{what}_without_op"] += 1
    code = getattr(CollectiveOp, op.upper()).value if op else NO_VALUE
    return (loc, rank, pos, s.start_ns - off, s.end_ns - off, code, comm,
            NO_VALUE, NO_VALUE if sent is None else sent, NO_VALUE if recv is None else recv)


def _json(value: Any) -> str | None:
    return None if value is None else json.dumps(value)


def _rows(spec: dict[str, Any], rows: list[tuple]) -> dict[str, np.ndarray]:
    cols = list(zip(*rows, strict=True)) if rows else [() for _ in spec]
    return {name: np.array(col, dtype=dt) for (name, dt), col in zip(spec.items(), cols, strict=True)}




__all__ = ["ChromeTraceError", "KinetoError", "read", "trace_files"]
