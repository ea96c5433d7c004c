"""Merge OTF2 experiments (one multi-rank archive, or one per rank) and our side files into one
archive with our region names, roles and collective records, one location group per rank.

Made for Score-P runs (see :mod:`instrument.scorep`), but generic: any archive whose location
groups are processes will do, e.g. archives our own writer produced, which tests use as
stand-ins for per-rank Score-P experiments. Per rank:

1. Read the rank's CPU-thread locations: Enter, Leave and MPI collective records, in archive
   ticks (the OTF2 reader applies the archive's own ClockOffset records, so an MPI experiment
   arrives clock-synchronized by Score-P).
2. Clock: the side file lists the local times (our host clock, ns) at which the rank's recorder
   entered and left each ``dltrace.clock_sync`` user region; pairing them with the archive's
   timestamps of the same events gives a linear map from ticks to local time. The side file's
   offset samples then take local time to the reference clock, as for the built-in tracer.
   Without such pairs, ticks become nanoseconds through the archive's clock properties
   (its real-time start, when it has one).
3. Names: user regions our recorder made (``user:dltrace.step``, ``user:torch.distributed.
   all_reduce``) get our names and roles back.
4. Collectives: the side file's collective records (operation, bytes, communicator) attach to
   the instances of their regions, in time order, unless an MPI collective record inside the
   instance already describes it (mpi4py under an MPI experiment).
5. The result is handed, as one synthetic spill per rank, to the built-in merge's per-rank
   replay (:mod:`instrument.tracer.merge`): nesting repair, step discards, asynchronous collectives on
   lanes, clock offsets, summaries.

What is not carried over: point-to-point messages, metrics, parameters and non-CPU locations
(the original experiments keep them for Vampir, Scalasca and Cube).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import otf2
from otf2 import events as ev
from otf2.enums import LocationGroupType, LocationType

from instrument.tracer import merge
from instrument.tracer.spill import RankSpill, SpillError, ranks_present, read_rank
from traceio import records
from traceio.archive import ArchiveSpec
from traceio.records import EVENT_DTYPE, Kind, Op, Role

EXPERIMENT_DIR = "scorep"
RANK_DIR = re.compile(r"rank-(\d+)$")
USER_PREFIX = "user:"
UNDEFINED_ROOT = 0xFFFFFFFF
_ROLES = {r.value: r for r in Role}
_ROLES.update(coll_other=Role.COLL_ALL2ALL, task_wait=Role.WAIT)
# OTF2 collective operations -> ours; handle creation and destruction (Score-P 8 writes them
# for MPI_Init and communicator creation) move no data and are dropped.
_OPS = {
    "barrier": Op.BARRIER, "bcast": Op.BCAST, "gather": Op.GATHER, "gatherv": Op.GATHER,
    "scatter": Op.SCATTER, "scatterv": Op.SCATTER, "allgather": Op.ALLGATHER,
    "allgatherv": Op.ALLGATHER, "alltoall": Op.ALLTOALL, "alltoallv": Op.ALLTOALL,
    "alltoallw": Op.ALLTOALL, "allreduce": Op.ALLREDUCE, "reduce": Op.REDUCE,
    "reduce_scatter": Op.REDUCE_SCATTER, "reduce_scatter_block": Op.REDUCE_SCATTER,
    "scan": Op.REDUCE, "exscan": Op.REDUCE,
}


def _enum(value: Any) -> str:
    return str(value).rsplit(".", 1)[-1].lower()


@dataclass
class Process:
    """One process (location group) of an archive: CPU threads and their records in ticks."""

    index: int  # among the archive's process groups, in definition order
    host: str
    threads: list[str]  # location names; 0 is the main thread
    rows: list[list[tuple]] = field(default_factory=list)  # per thread, EVENT_DTYPE tuples
    has_mpi: list[list[bool]] = field(default_factory=list)  # per thread row: a leave whose
    # instance contains an MPI collective record


@dataclass
class Archive:
    anchor: Path
    resolution: int
    global_offset: int
    realtime_ns: int | None
    regions: list[tuple[str, str]]  # (name, Role value), indexed by the rows' region field
    comms: list[tuple[str, list[int]]]  # (name, member process indices)
    processes: list[Process]


def read_archive(anchor: Path) -> Archive:
    """Read the process-level content of an OTF2 archive (see the module docstring)."""
    try:
        reader = otf2.reader.open(str(anchor))
    except Exception as e:  # the otf2 package raises several types for bad archives
        raise merge.MergeError(f"cannot read the OTF2 archive {anchor}: {e}") from None
    with reader as trace:
        d = trace.definitions
        clock = d.clock_properties
        groups = sorted((g for g in d.location_groups
                         if g.location_group_type == LocationGroupType.PROCESS), key=lambda g: g._ref)
        proc_of_group = {g._ref: i for i, g in enumerate(groups)}
        processes = [Process(i, str(getattr(g.system_tree_parent, "name", "?")), []) for i, g in enumerate(groups)]
        thread_of: dict[int, tuple[int, int]] = {}  # location ref -> (process, thread)
        for loc in sorted(d.locations, key=lambda x: x._ref):
            p = proc_of_group.get(loc.group._ref)
            if p is None or loc.type != LocationType.CPU_THREAD:
                continue
            proc = processes[p]
            thread_of[loc._ref] = (p, len(proc.threads))
            proc.threads.append(str(loc.name))
            proc.rows.append([])
            proc.has_mpi.append([])
        region_of: dict[int, int] = {}
        regions: list[tuple[str, str]] = []
        for r in sorted(d.regions, key=lambda x: x._ref):
            region_of[r._ref] = len(regions)
            regions.append((str(r.name), str(_ROLES.get(_enum(r.region_role), Role.FUNCTION))))
        comm_of: dict[int, int] = {}
        comms: list[tuple[str, list[int]]] = []
        for c in sorted(d.comms, key=lambda x: x._ref):
            members = []
            for m in getattr(c.group, "members", None) or []:
                group = getattr(m, "group", None)
                members.append(proc_of_group.get(getattr(group, "_ref", -1), -1))
            comm_of[c._ref] = len(comms)
            comms.append((str(c.name), members))
        stacks: dict[int, list[int]] = {}  # location -> row indices of open enters
        flagged: dict[int, set[int]] = {}  # location -> open enters holding an MPI collective
        for location, event in trace.events:
            where = thread_of.get(location._ref)
            if where is None:
                continue
            proc = processes[where[0]]
            rows, mpi = proc.rows[where[1]], proc.has_mpi[where[1]]
            stack = stacks.setdefault(location._ref, [])
            cls = type(event)
            if cls is ev.Enter:
                stack.append(len(rows))
                rows.append(_row(event.time, Kind.ENTER, region_of[event.region._ref], where[1]))
                mpi.append(False)
            elif cls is ev.Leave:
                opened = stack.pop() if stack else -1
                rows.append(_row(event.time, Kind.LEAVE, region_of[event.region._ref], where[1]))
                mpi.append(opened in flagged.get(location._ref, ()))
            elif cls is ev.MpiCollectiveEnd:
                op = _OPS.get(_enum(event.collective_op))
                if op is None:
                    continue
                flagged.setdefault(location._ref, set()).update(stack)
                root = int(event.root)
                rows.append((event.time, 0, int(event.size_sent), int(event.size_received), 0,
                             comm_of[event.communicator._ref], -1 if root == UNDEFINED_ROOT else root,
                             where[1], Kind.COLL_END, op))
                mpi.append(False)
    realtime = clock.realtime_timestamp
    return Archive(Path(anchor), int(clock.timer_resolution), int(clock.global_offset),
                   None if realtime in (None, 0xFFFFFFFFFFFFFFFF) else int(realtime),
                   regions, comms, processes)


def _row(t: int, kind: int, region: int, loc: int) -> tuple:
    return (int(t), 0, 0, 0, region, -1, -1, loc, kind, 0)


# -- clocks ------------------------------------------------------------------------------------
def clock_map(archive: Archive, proc: Process, sync: list[dict[str, Any]]) -> tuple[float, int, int, str]:
    """(slope, base tick, base ns, method): ``local_ns = base_ns + slope * (tick - base_tick)``.

    ``sync`` is the side file's ``scorep_sync`` list; its n-th entry pairs with the process's
    n-th ``dltrace.clock_sync`` region instance (enter and leave)."""
    names = {records.CLOCK_SYNC, USER_PREFIX + records.CLOCK_SYNC}
    ids = {i for i, (name, _) in enumerate(archive.regions) if name in names}
    enters = sorted(r[0] for rows in proc.rows for r in rows if r[8] == Kind.ENTER and r[4] in ids)
    leaves = sorted(r[0] for rows in proc.rows for r in rows if r[8] == Kind.LEAVE and r[4] in ids)
    ticks, local = [], []
    for i, s in enumerate(sync[: min(len(enters), len(leaves))]):
        ticks += [enters[i], leaves[i]]
        local += [int(s["enter_ns"]), int(s["leave_ns"])]
    per_tick = 1e9 / archive.resolution
    if not ticks:
        return per_tick, archive.global_offset, archive.realtime_ns or 0, "clock properties"
    # Fit on differences from the first pair: local clocks are large numbers, and float64
    # keeps whole nanoseconds only below 2**53.
    x = np.array(ticks, dtype=np.int64) - ticks[0]
    y = (np.array(local, dtype=np.int64) - local[0]).astype(np.float64)
    slope = per_tick
    if x.max() - x.min() > 1e6 / per_tick:  # pairs at least 1 ms apart: fit the rate too
        slope, _ = np.polyfit(x.astype(np.float64), y, 1)
    shift = float(np.mean(y - slope * x))
    return float(slope), ticks[0], local[0] + int(round(shift)), "clock sync regions"


# -- one rank --------------------------------------------------------------------------------
def _ours(name: str, known: set[str]) -> str | None:
    """Our name for an archive region written by our recorder, else None."""
    if name.startswith(USER_PREFIX):
        base = name[len(USER_PREFIX):]
        if base in known or base.startswith("dltrace."):
            return base
    return None


def synthetic_spill(archive: Archive, proc: Process, rank: int, ranks_of: list[int],
                    side: RankSpill | None) -> tuple[RankSpill, dict[str, Any]]:
    """The rank as a spill for :func:`instrument.tracer.merge._rank`, plus notes for run.json."""
    meta: dict[str, Any] = dict(side.meta) if side else {"host": proc.host, "status": "ok"}
    regions = [dict(r) for r in meta.get("regions", [])]
    by_name = {r["name"]: i for i, r in enumerate(regions)}
    known = set(by_name)
    region_map = []
    for name, role in archive.regions:
        mine = _ours(name, known)
        if mine is not None and mine in by_name:
            region_map.append(by_name[mine])
            continue
        region_map.append(len(regions))
        regions.append({"name": mine or name, "role": role})
    comms = [dict(c) for c in meta.get("comms", [])]
    comm_map = [len(comms) + i for i in range(len(archive.comms))]
    comms += [{"name": n, "members": [ranks_of[m] for m in ms if 0 <= m < len(ranks_of)]}
              for n, ms in archive.comms]

    slope, base_tick, base_ns, method = clock_map(archive, proc, meta.get("scorep_sync", []))
    rmap = np.array(region_map or [0], dtype=np.uint32)
    cmap = np.array(comm_map or [0], dtype=np.int32)
    out: list[np.ndarray] = []
    leaves: dict[int, list[tuple[int, int, int, bool]]] = {}  # region -> (t, thread, row, mpi)
    for loc, (rows, flags) in enumerate(zip(proc.rows or [[]], proc.has_mpi or [[]], strict=True)):
        a = np.array(rows, dtype=EVENT_DTYPE) if rows else np.zeros(0, dtype=EVENT_DTYPE)
        a["time"] = np.rint(slope * (a["time"] - base_tick)).astype(np.int64) + base_ns
        is_region = np.isin(a["kind"], (Kind.ENTER, Kind.LEAVE))
        a["region"][is_region] = rmap[a["region"][is_region]]
        a["comm"][~is_region] = cmap[a["comm"][~is_region]]
        for row in np.flatnonzero(a["kind"] == Kind.LEAVE).tolist():
            leaves.setdefault(int(a["region"][row]), []).append((int(a["time"][row]), loc, row, flags[row]))
        out.append(a)

    side_recs = side.records if side else np.zeros(0, dtype=EVENT_DTYPE)
    notes: dict[str, Any] = {}
    out = _attach(side_recs[side_recs["kind"] == Kind.COLL_END], leaves, out, notes)

    # Named locations of the side file (imported timelines) follow Score-P's threads.
    kinds = list(meta.get("thread_kinds", ["main"]))
    side_names = meta.get("threads", [])
    names = list(proc.threads) or ["main thread"]
    new_kinds = ["main"] + ["thread"] * (len(names) - 1)
    renumber = {}
    for i, kind in enumerate(kinds):
        if kind not in ("main", "thread"):
            renumber[i] = len(names)
            names.append(side_names[i] if i < len(side_names) else f"timeline {i}")
            new_kinds.append(kind)
    on_named = side_recs[np.isin(side_recs["kind"], (Kind.ENTER, Kind.LEAVE))
                         & np.isin(side_recs["loc"], list(renumber))].copy()
    on_named["loc"] = [renumber[i] for i in on_named["loc"].tolist()]
    rest = side_recs[np.isin(side_recs["kind"], (Kind.ASYNC_COLL, Kind.STEP_DISCARD))]
    records = np.concatenate([*out, on_named, rest])
    meta.update(regions=regions, comms=comms, threads=names, thread_kinds=new_kinds)
    notes["clock"] = method
    return RankSpill(rank, records, meta, side.dropped_bytes if side else 0), notes


def _attach(colls: np.ndarray, leaves: dict[int, list[tuple[int, int, int, bool]]],
            out: list[np.ndarray], notes: dict[str, Any]) -> list[np.ndarray]:
    """Put each side-file collective record just before the leave of its region's instance:
    a region's records, in time order, take its instances in time order, skipping instances
    that end earlier than the record (less a slack for clock-mapping error). Returns the new
    per-thread arrays; counts go to ``notes``."""
    slack = 1_000_000  # ns
    inserts: dict[int, list[tuple[int, tuple]]] = {}  # thread -> (row, record)
    attached = unmatched = 0
    for region in sorted(set(colls["region"].tolist())):
        recs = np.sort(colls[colls["region"] == region], order="time")
        instances = sorted(leaves.get(region, []))
        i = 0
        for t, _aux, sent, recv, _region, comm, root, _loc, _kind, op in recs.tolist():
            while i < len(instances) and instances[i][0] < t - slack:
                i += 1
            if i == len(instances):
                unmatched += 1
                continue
            leave_t, loc, row, has_mpi = instances[i]
            i += 1
            if not has_mpi:  # else an MPI record inside already describes this collective
                rec = (leave_t, 0, sent, recv, region, comm, root, loc, Kind.COLL_END, op)
                inserts.setdefault(loc, []).append((row, rec))
                attached += 1
    notes.update(collectives_attached=attached, collectives_unmatched=unmatched)
    for loc, items in inserts.items():
        items.sort(key=lambda x: x[0])
        rows = np.array([r for _, r in items], dtype=EVENT_DTYPE)
        out[loc] = np.insert(out[loc], [row for row, _ in items], rows)
    return out


# -- a run -----------------------------------------------------------------------------------
def find_experiments(run_dir: Path) -> list[tuple[Path, int]]:
    """(anchor, rank of its first process) of each experiment under ``run_dir/scorep``: one
    MPI experiment (``scorep/traces.otf2``) or one per rank (``scorep/rank-NNNNN/``)."""
    top = Path(run_dir) / EXPERIMENT_DIR
    if (top / "traces.otf2").is_file():
        return [(top / "traces.otf2", 0)]
    found = []
    for d in sorted(top.iterdir()) if top.is_dir() else []:
        m = RANK_DIR.match(d.name)
        if m and (d / "traces.otf2").is_file():
            found.append((d / "traces.otf2", int(m.group(1))))
    return found


def merge_archives(sources: list[tuple[Path, int]], sides: dict[int, RankSpill],
                   expected_ranks: int | None = None) -> merge.MergeResult:
    """Merge archives (anchor, rank of its first process) and side files (by rank)."""
    defs = merge._Defs()
    defs.region(records.STEP, Role.FUNCTION)
    specs, summaries = [], []
    for anchor, first in sources:
        archive = read_archive(anchor)
        ranks_of = [first + p.index for p in archive.processes]
        for proc, rank in zip(archive.processes, ranks_of, strict=True):
            spill, notes = synthetic_spill(archive, proc, rank, ranks_of, sides.get(rank))
            spec, summary = merge._rank(spill, defs)
            summary.extra.setdefault("scorep_merge", notes)
            specs.append(spec)
            summaries.append(summary)
    if not specs:
        raise merge.MergeError("no OTF2 experiment to merge; did Score-P write any (see the ranks' output)?")
    order = sorted(range(len(specs)), key=lambda i: specs[i].rank)
    specs = [specs[i] for i in order]
    summaries = [summaries[i] for i in order]
    present = [s.rank for s in specs]
    expected = expected_ranks if expected_ranks is not None else max(present) + 1
    starts = [s.meta.get("start_realtime_ns") for s in sides.values()]
    start = min((int(t) for t in starts if t is not None), default=None)
    merged = ArchiveSpec(defs.regions, defs.comms, specs, start_realtime_ns=start,
                         creator=f"dltrace {merge._version()} (from Score-P experiments)")
    return merge.MergeResult(merged, summaries, [r for r in range(expected) if r not in present])


def collect(run_dir: Path, expected_ranks: int | None = None) -> merge.MergeResult:
    """Merge a Score-P run's experiments with its side files (``run_dir/ranks``)."""
    sources = find_experiments(run_dir)
    if not sources:
        raise merge.MergeError(f"{Path(run_dir) / EXPERIMENT_DIR}: no Score-P experiment "
                               "(traces.otf2); did Score-P start in the ranks (see their output)?")
    ranks_dir = Path(run_dir) / "ranks"
    sides = {}
    for rank in ranks_present(ranks_dir):
        try:
            sides[rank] = read_rank(ranks_dir, rank)
        except SpillError as e:
            raise merge.MergeError(str(e)) from None
    return merge_archives(sources, sides, expected_ranks)
