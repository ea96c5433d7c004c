"""Merge the per-rank spill files of a run into one OTF2 archive.

Works on whatever the ranks left behind: a rank that was killed has a spill file ending at
its last flush and metadata saying ``running``. Per location the records are replayed
against a region stack so the archive is always properly nested:

- a Leave without a matching Enter is dropped (counted);
- regions still open at the end are closed at the rank's last timestamp (counted, and the
  rank is reported incomplete);
- a COLL_END becomes an MpiCollectiveBegin at its region's enter time and an
  MpiCollectiveEnd before its Leave;
- asynchronous collectives go onto communication lanes: the first lane free at the issue
  time, so overlapping operations stay visible without breaking nesting;
- metric samples (the power sampler's) stay on their METRIC location; each channel is charged
  to the rank whose GPU it measures (the rank's pinned device, from its metadata, on the same
  host), else to its host.
"""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from instrument.tracer.spill import RankSpill, SpillError, ranks_present, read_rank
from traceio import codec, records
from traceio.archive import ArchiveSpec, LocationSpec, MetricSpec, RankSpec
from traceio.records import EVENT_DTYPE, Device, Kind, Role


def _version() -> str:
    try:
        return importlib.metadata.version("dltrace")
    except importlib.metadata.PackageNotFoundError:
        return "dev"


class MergeError(Exception):
    """Nothing to merge, or the per-rank files cannot be used."""


@dataclass
class RankSummary:
    rank: int
    status: str
    status_detail: str | None
    host: str
    pid: int | None
    events: int
    steps: int
    open_regions_closed: int
    unmatched_leaves: int
    partial_bytes: int
    records_dropped: int
    last_time_ns: int | None
    frameworks: list[str]
    extra: dict[str, Any]

    @property
    def complete(self) -> bool:
        return self.status == "ok" and self.open_regions_closed == 0 and self.records_dropped == 0


@dataclass
class MergeResult:
    spec: ArchiveSpec
    ranks: list[RankSummary] = field(default_factory=list)
    missing_ranks: list[int] = field(default_factory=list)

    @property
    def events(self) -> int:
        return self.spec.event_count()

    @property
    def complete(self) -> bool:
        return not self.missing_ranks and all(r.complete for r in self.ranks)


class _Defs:
    """Global region and communicator tables built from every rank's local ones."""

    def __init__(self) -> None:
        self.regions: list[tuple[str, str]] = []
        self._region_index: dict[tuple[str, str], int] = {}
        self.comms: list[tuple[str, list[int]]] = []
        self._comm_index: dict[tuple[str, tuple[int, ...]], int] = {}

    def region(self, name: str, role: str) -> int:
        key = (name, role)
        if key not in self._region_index:
            self._region_index[key] = len(self.regions)
            self.regions.append(key)
        return self._region_index[key]

    def comm(self, name: str, members: list[int]) -> int:
        key = (name, tuple(members))
        if key not in self._comm_index:
            self._comm_index[key] = len(self.comms)
            self.comms.append((name, list(members)))
        return self._comm_index[key]


def _records(rows: list[tuple]) -> np.ndarray:
    return np.array(rows, dtype=EVENT_DTYPE) if rows else np.zeros(0, dtype=EVENT_DTYPE)


def _rows(recs: np.ndarray, which: np.ndarray) -> np.ndarray:
    """``recs[which]`` (a mask or indices) as a new array. Selecting through an opaque 48-byte
    view copies whole records; numpy's field-by-field copy of the structured dtype is 3-4x slower."""
    return recs.view(np.dtype((np.void, EVENT_DTYPE.itemsize)))[which].view(EVENT_DTYPE)


def _known(recs: np.ndarray, n_regions: int) -> np.ndarray:
    """Records not referring to a region beyond the rank's definitions (lost with a killed rank)."""
    return ~np.isin(recs["kind"], (Kind.ENTER, Kind.LEAVE, Kind.ASYNC_COLL)) | (recs["region"] < n_regions)


def _remap(recs: np.ndarray, region_map: np.ndarray, comm_map: np.ndarray) -> np.ndarray:
    """The rank's region and communicator ids -> the archive's, in place; returns ``recs``."""
    has_region = np.isin(recs["kind"], (Kind.ENTER, Kind.LEAVE, Kind.ASYNC_COLL))
    recs["region"][has_region] = region_map[recs["region"][has_region]]
    has_comm = (recs["comm"] >= 0) & (recs["comm"] < len(comm_map))
    recs["comm"][has_comm] = comm_map[recs["comm"][has_comm]]
    return recs


def _replay_thread(
    recs: np.ndarray, loc: int, step: int, tail: int, discard: set[int], end_t: int,
    region_map: np.ndarray, comm_map: np.ndarray,
) -> tuple[np.ndarray, int, int, int]:
    """Thread ``loc``'s records among a rank's ``recs`` (with the rank's own region and
    communicator ids, mapped by ``region_map`` and ``comm_map``) -> (normalized stream, steps
    kept, regions closed, bad leaves). ``step`` and ``tail`` are archive region ids."""
    native = codec.native()
    if native is not None:  # the same in C (traceio/native/replay.c), without copying the rank's records
        stream, kept, closed, bad = native.replay_thread(
            np.ascontiguousarray(recs), loc, step, tail, np.array(sorted(discard), dtype=np.int64), end_t,
            np.ascontiguousarray(region_map, dtype=np.uint32), np.ascontiguousarray(comm_map, dtype=np.int32))
        return np.frombuffer(stream, dtype=EVENT_DTYPE), kept, closed, bad
    recs = _remap(_rows(recs, (recs["loc"] == loc) & _known(recs, len(region_map))), region_map, comm_map)
    out: list[tuple] = []
    stack: list[tuple[int, int, int]] = []  # (recorded region, written region, index in out)
    steps_seen = 0
    steps_kept = 0
    bad = 0
    for t, _aux, sent, recv, region, comm, root, _loc, kind, op in recs.tolist():
        if kind == Kind.ENTER:
            written = region
            if region == step:
                if steps_seen in discard:
                    written = tail
                else:
                    steps_kept += 1
                steps_seen += 1
            stack.append((region, written, len(out)))
            out.append((t, 0, 0, 0, written, -1, -1, loc, Kind.ENTER, 0))
        elif kind == Kind.LEAVE:
            depth = next((i for i in range(len(stack) - 1, -1, -1) if stack[i][0] == region), None)
            if depth is None:
                bad += 1
                continue
            while len(stack) > depth:
                _, written, _ = stack.pop()
                out.append((t, 0, 0, 0, written, -1, -1, loc, Kind.LEAVE, 0))
        elif kind == Kind.COLL_END:
            if not stack:
                bad += 1
                continue
            enter_at = stack[-1][2]
            begin_t = out[enter_at][0]
            out.insert(enter_at + 1, (begin_t, 0, 0, 0, 0, -1, -1, loc, Kind.COLL_BEGIN, 0))
            out.append((t, 0, sent, recv, 0, comm, root, loc, Kind.COLL_END, op))
    closed = len(stack)
    last = max(end_t, out[-1][0]) if out else end_t
    while stack:
        _, written, _ = stack.pop()
        out.append((last, 0, 0, 0, written, -1, -1, loc, Kind.LEAVE, 0))
    return _records(out), steps_kept, closed, bad


def _lanes(recs: np.ndarray, first_index: int) -> list[tuple[int, np.ndarray]]:
    """Asynchronous collectives -> [(location index, stream)], first-fit by issue time."""
    if len(recs) == 0:
        return []
    order = np.argsort(recs["time"], kind="stable")
    native = codec.native()
    if native is not None:  # the same loop in C (traceio/native/replay.c)
        return [(i, np.frombuffer(s, dtype=EVENT_DTYPE)) for i, s in native.lanes(_rows(recs, order), first_index)]
    lane_free: list[int] = []
    streams: list[list[tuple]] = []
    for t, end, sent, recv, region, comm, root, _loc, _kind, op in recs[order].tolist():
        end = max(end, t)
        lane = next((i for i, free in enumerate(lane_free) if free <= t), None)
        if lane is None:
            lane = len(lane_free)
            lane_free.append(end)
            streams.append([])
        lane_free[lane] = end
        index = first_index + lane
        streams[lane] += [
            (t, 0, 0, 0, region, -1, -1, index, Kind.ENTER, 0),
            (t, 0, 0, 0, 0, -1, -1, index, Kind.COLL_BEGIN, 0),
            (end, 0, sent, recv, 0, comm, root, index, Kind.COLL_END, op),
            (end, 0, 0, 0, region, -1, -1, index, Kind.LEAVE, 0),
        ]
    return [(first_index + i, _records(s)) for i, s in enumerate(streams)]


def _rank(spill: RankSpill, defs: _Defs) -> tuple[RankSpec, RankSummary]:
    meta = spill.meta
    local_regions = meta.get("regions", [])
    region_map = np.array([defs.region(r["name"], r["role"]) for r in local_regions], dtype=np.uint32)
    comm_map = np.array(
        [defs.comm(c["name"], c["members"]) for c in meta.get("comms", [])] or [0], dtype=np.int32
    )
    # The records keep the rank's ids: the replay maps them thread by thread, without a copy
    # of the whole rank; records whose definitions were lost with a killed rank are dropped.
    recs = spill.records
    rec_kind = recs["kind"]
    known = _known(recs, len(local_regions))

    step = defs.region(records.STEP, Role.FUNCTION)
    discard = {int(a) for a in recs["aux"][rec_kind == Kind.STEP_DISCARD]}
    tail = defs.region(records.TAIL, Role.FUNCTION) if discard else step
    last_t = int(max(recs["time"].max(where=known & ~np.isin(rec_kind, (Kind.STEP_DISCARD, Kind.METRIC)),
                                      initial=0),
                     recs["aux"].max(where=known & (rec_kind == Kind.ASYNC_COLL), initial=0))
                 ) if known.any() else None

    threads = meta.get("threads", ["main thread"])
    kinds = meta.get("thread_kinds", ["main"] + ["thread"] * (len(threads) - 1))
    locations: list[LocationSpec] = []
    steps = closed = bad = 0
    on_thread = known & np.isin(rec_kind, (Kind.ENTER, Kind.LEAVE, Kind.COLL_END))
    for loc in sorted(set(np.flatnonzero(np.bincount(recs["loc"][on_thread])).tolist()) | {0}):
        stream, kept, n_closed, n_bad = _replay_thread(
            recs, loc, step, tail, discard if loc == 0 else set(), last_t or 0, region_map, comm_map
        )
        steps += kept if loc == 0 else 0
        closed += n_closed
        bad += n_bad
        name = threads[loc] if loc < len(threads) else f"thread {loc}"
        kind = "main" if loc == 0 else (kinds[loc] if loc < len(kinds) else "thread")
        locations.append(LocationSpec(spill.rank, loc, name, kind, stream))
    first_lane = max(len(threads), max((loc.index for loc in locations), default=0) + 1)
    asyncs = _remap(_rows(recs, known & (rec_kind == Kind.ASYNC_COLL)), region_map, comm_map)
    for index, stream in _lanes(asyncs, first_lane):
        locations.append(LocationSpec(spill.rank, index, f"comm lane {index - first_lane}",
                                      "comm_lane", stream))
    # metric locations: samples keep the rank's own channel ids until collect() maps them
    n_metrics = len(meta.get("metrics", []))
    is_metric = (rec_kind == Kind.METRIC) & (recs["region"] < n_metrics)
    for loc in sorted(set(recs["loc"][is_metric].tolist())):
        name = threads[loc] if loc < len(threads) else f"metrics {loc}"
        locations.append(LocationSpec(spill.rank, loc, name, "metric", _rows(recs, is_metric & (recs["loc"] == loc))))

    samples = meta.get("clock_samples", [])
    offsets = [(s["local_ns"], s["offset_ns"], s["rtt_ns"] / 2) for s in samples]
    offsets.sort()
    rank_spec = RankSpec(spill.rank, str(meta.get("host", "?")), offsets, locations)
    summary = RankSummary(
        rank=spill.rank,
        status=str(meta.get("status", "running")),
        status_detail=meta.get("status_detail"),
        host=str(meta.get("host", "?")),
        pid=meta.get("pid"),
        events=sum(len(loc.records) for loc in locations),
        steps=steps,
        open_regions_closed=closed,
        unmatched_leaves=bad,
        partial_bytes=spill.dropped_bytes,
        records_dropped=int(meta.get("records_dropped", 0)),
        last_time_ns=last_t,
        frameworks=list(meta.get("frameworks", [])),
        extra=dict(meta.get("extra", {})),
    )
    return rank_spec, summary


def collect(run_dir: Path, expected_ranks: int | None = None) -> MergeResult:
    """Read every rank's spill files in ``run_dir/ranks`` into an :class:`ArchiveSpec`."""
    ranks_dir = Path(run_dir) / "ranks"
    present = ranks_present(ranks_dir)
    if not present:
        raise MergeError(f"{ranks_dir}: no per-rank trace files; did any rank start with the tracer?")
    defs = _Defs()
    defs.region(records.STEP, Role.FUNCTION)
    specs: list[RankSpec] = []
    summaries: list[RankSummary] = []
    metric_defs: dict[int, list[dict[str, Any]]] = {}
    start_realtime = None
    for rank in present:
        try:
            spill = read_rank(ranks_dir, rank)
        except SpillError as e:
            raise MergeError(str(e)) from None
        spec, summary = _rank(spill, defs)
        metric_defs[rank] = list(spill.meta.get("metrics", []))
        specs.append(spec)
        summaries.append(summary)
        rt = spill.meta.get("start_realtime_ns")
        if rt is not None and (start_realtime is None or rt < start_realtime):
            start_realtime = int(rt)
    expected = expected_ranks if expected_ranks is not None else max(present) + 1
    missing = [r for r in range(expected) if r not in present]
    archive = ArchiveSpec(defs.regions, defs.comms, specs, start_realtime_ns=start_realtime,
                          creator=f"dltrace {_version()}",
                          metrics=_metrics(specs, metric_defs, summaries))
    return MergeResult(archive, summaries, missing)


def _pinned_rank(channel: dict[str, Any], host: str, summaries: list[RankSummary]) -> int | None:
    """The rank on ``host`` whose pinned GPU (its metadata's ``gpu.device``: an index or a
    UUID, from CUDA_VISIBLE_DEVICES and LOCAL_RANK) ``channel`` measures; None if none is."""
    if channel.get("device") != Device.GPU:
        return None
    for s in sorted(summaries, key=lambda s: s.rank):
        token = str((s.extra.get("gpu") or {}).get("device", ""))
        if s.host != host or not token:
            continue
        if token == str(channel.get("index")) or (channel.get("uuid") and str(channel["uuid"]).startswith(token)):
            return s.rank
    return None


def _metrics(specs: list[RankSpec], metric_defs: dict[int, list[dict[str, Any]]],
             summaries: list[RankSummary]) -> list[MetricSpec]:
    """The archive's metric channels; remaps each METRIC location's samples to them."""
    out: list[MetricSpec] = []
    for spec in specs:
        local = metric_defs.get(spec.rank, [])
        ids = np.array([len(out) + i for i in range(len(local))] or [0], dtype=np.uint32)
        for d in local:
            out.append(MetricSpec(
                name=str(d["name"]), description=f"{d.get('description', '')} on {spec.host}",
                unit=str(d["unit"]), exponent=int(d["exponent"]), mode=str(d["mode"]), host=spec.host,
                rank=_pinned_rank(d, spec.host, summaries), recorder=(spec.rank, int(d["loc"]))))
        for loc in spec.locations:
            if loc.kind == "metric":
                loc.records["region"] = ids[loc.records["region"]]
    return out
