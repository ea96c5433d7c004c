"""The build as stages of independent tasks, and the files the tasks hand to each other.

An engine (analyze/engine/) runs each stage's tasks, in this process's threads or on a Dask
cluster; a stage starts when the previous one is done. Tasks exchange Parquet files under
the tables directory being built (``_work/`` for intermediate rows, removed at the end),
never Python objects, so a task runs the same in any process on any machine that sees the
directory, and both engines give the same tables by construction:

1. ``read`` (per bucket of locations): events -> ``intervals``, the raw collective records,
   messages and metric samples, partitioned by rank (and from Chrome trace JSON, the tables only
   it fills: ``correlations``, ``chrome_*``); when name patterns matched communication regions, also
   the outermost of their instances (:mod:`analyze.tables.named`: nesting is per location),
   whose reports then give the inferred groups and the waits' operations of the whole trace;
2. ``prepare`` (per group of ranks): per rank, collective instances (recorded and name-only)
   and messages with their sequence numbers, written whole for step 4 and, as matching keys, hashed into buckets;
   the candidate steps of every source, counted;
3. ``match`` (per bucket: the shuffle): collectives grouped by communicator and sequence
   number, messages paired by sender, receiver, communicator, tag and sequence number;
4. ``finish`` (per group of ranks): the final ``collectives``, ``p2p``, ``steps``, ``phases``,
   ``metrics`` and ``device_phases`` of its ranks.

What a task holds at once does not grow with the number of ranks: a read task one chunk, a
group at most :data:`GROUP_RANKS` ranks (and the phase sweep's windows), a bucket its share of
the matching keys.
"""

from __future__ import annotations

import math
import os
import shutil
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pandas as pd

from analyze.readers import dispatch, otf2_native
from analyze.readers.columns import (
    COLLECTIVE_COLUMNS,
    MESSAGE_COLUMNS,
    METRIC_COLUMNS,
    Definitions,
    ReadStats,
)
from analyze.schema import (
    BY_NAME,
    CHROME_EVENTS,
    CHROME_FILES,
    CHROME_TRACKS,
    COLLECTIVES,
    COMMUNICATORS,
    CORRELATIONS,
    DEVICE_PHASES,
    INTERVALS,
    LOCATIONS,
    METRICS,
    P2P,
    PHASES,
    REGIONS,
    STEPS,
    Category,
    Column,
    Table,
)
from analyze.tables import collectives, device_phases, metrics, named, phases, steps
from analyze.tables.named import Seen
from analyze.tables.regions import classify
from analyze.tables.store import FORMAT, WORK, Codes, Store, literal, table_of

GROUP_RANKS = 64  # ranks per prepare/finish task at most
# Tasks are at most this big (in events) and, up to one per worker (read) or two (groups, so
# that a slow group does not hold a stage up), at least the smaller size: small traces take
# few tasks, each of which has fixed costs.
READ_TASK_EVENTS = (1_000_000, 20_000_000)
GROUP_EVENTS = 2_000_000
PHASE_ROWS = 1_000_000  # phase rows collected before they are written
MATERIALIZE_ROWS = 2_000_000  # a group's collectives and messages held in memory up to this many
COLLECTIVE_ROWS = 2_000_000  # collectives numbered at once at most (a rank's own: all of them, in SQL)

# Intermediate tables under _work/ (their rows never reach the run's database).
# They are partitioned by group of ranks (a task's share): a group task then reads a few files,
# not a few per rank, which for thousands of small ranks is most of its time.
RAW_COLLECTIVES = table_of("raw_collectives", {**COLLECTIVE_COLUMNS, "rank_group": np.int32}, "rank_group")
RAW_MESSAGES = table_of("raw_messages", {**MESSAGE_COLUMNS, "rank_group": np.int32}, "rank_group")
RAW_METRICS = table_of("raw_metrics", {**METRIC_COLUMNS, "rank_group": np.int32}, "rank_group")
# the numbered collectives (files per group and batch of ranks: g<group>_<batch>), and their keys
# for the shuffle, by bucket
COLL_ROWS = table_of("coll_rows", collectives.ROW_COLUMNS)
# the shuffle's output per bucket: each communicator's and sequence number's instance across
# ranks (collectives.collective_match, root_enter -1 where no root took part: has_root false)
INSTANCES = table_of("instances", {"comm_id": np.int64, "seq": np.int64, "last_enter": np.int64,
                                   "ranks_matched": np.int64, "root_enter": np.int64, "has_root": np.bool_})
ARRIVAL_DTYPES = {"comm_id": np.int64, "seq": np.int64, "enter_ns": np.int64, "is_root": np.bool_, "bucket": np.int32}
ARRIVALS = table_of("arrivals", ARRIVAL_DTYPES, "bucket")
# what the finish tasks need of the metric channels (metrics.channels: from the whole trace)
CHANNELS = table_of("channel_rows", {"channel_id": np.int64, "metric_id": np.int64, "member_index": np.int32,
                                     "name": object, "unit": object, "mode": object, "scale": np.float64})
# The intervals the steps and the phase sweep look at (main threads; steps and the regions
# that give segments): in our DDP traces about one in seven, so the later stages scan these
# instead of every interval (the bench's synthetic archive too). The queries still filter as
# they would over all intervals. Only the columns those queries read, which are also those of
# the communication regions' instances (COMM_INTERVALS).
_SWEPT = ("location_id", "rank", "idx", "region_id", "start_ns", "end_ns")
MAIN_INTERVALS = Table("main_intervals", "", (*(c for c in INTERVALS.columns if c.name in _SWEPT),
                                             Column("rank_group", "INTEGER", "")), "rank_group")
MAIN_CATEGORIES = (Category.STEP, *phases.SEGMENT_CATEGORIES)
# The intervals of accelerator streams, for the device phases (kernels, copies: few per step).
DEVICE_INTERVALS = Table("device_intervals", "", MAIN_INTERVALS.columns, "rank_group")
# The main threads' intervals of step regions (our markers: one per step), which the marker
# steps are numbered from (_marker_steps; the query where it declines), rather than from all
# of MAIN_INTERVALS (a query over them took 30-40 ms a task at 10M events).
STEP_INTERVALS = Table("step_intervals", "", MAIN_INTERVALS.columns, "rank_group")
# a group's candidate steps from the markers, as steps.candidate("marker") gives them
MARKER_STEPS = table_of("steps_marker", {"rank": np.int32, "step": np.int64, "start_ns": np.int64,
                                         "end_ns": np.int64, "duration_ns": np.int64, "source": object})
EXTENTS = table_of("extents", {"rank": np.int32, "start_ns": np.int64, "end_ns": np.int64})
# Name-only communication (only when a name pattern matched a communication region): what the
# driver knows of the pattern-classified regions, each read task's instances of communication
# regions, and the name-only collectives it found, for the groups of ranks to match.
REGION_PATTERNS = table_of("region_patterns", {"region_id": np.int64, "library": object, "kind": object})
COMM_INTERVALS = table_of("comm_intervals", {"location_id": np.int64, "rank": np.int32, "idx": np.int64,
                                             "start_ns": np.int64, "end_ns": np.int64, "region_id": np.int64})
NAMED = Table("named", "", (
    Column("location_id", "BIGINT", ""), Column("rank", "INTEGER", ""), Column("interval_idx", "BIGINT", ""),
    Column("region_id", "BIGINT", ""), Column("enter_ns", "BIGINT", ""), Column("leave_ns", "BIGINT", ""),
    Column("op", "VARCHAR", ""), Column("library", "VARCHAR", ""), Column("rank_group", "INTEGER", "")),
    "rank_group")
STAGE_TABLES = (INTERVALS, COLLECTIVES, P2P, STEPS, PHASES, METRICS, DEVICE_PHASES,  # written by the tasks
                CORRELATIONS, CHROME_EVENTS, CHROME_TRACKS, CHROME_FILES)
# what a group sees when none of its ranks had a name-only collective, or when no rank had a message at all
_NO_MATCHES = {
    "named_collectives": "SELECT NULL::BIGINT AS location_id, NULL::INTEGER AS rank, "
                         "NULL::BIGINT AS interval_idx, NULL::BIGINT AS region_id, NULL::BIGINT AS enter_ns, "
                         "NULL::BIGINT AS leave_ns, NULL::VARCHAR AS op, NULL::BIGINT AS comm_id LIMIT 0",
    "partners": "SELECT NULL::TINYINT AS direction, NULL::BIGINT AS sender, NULL::BIGINT AS receiver, "
                "NULL::BIGINT AS comm_id, NULL::BIGINT AS tag, NULL::BIGINT AS seq, "
                "NULL::BIGINT AS partner_enter_ns LIMIT 0",
}


# Rows of intervals a read task takes from the reader at a time (each chunk: one file per
# table it has rows of). A chunk's columns go through numpy and the Parquet writer and are
# freed, and later chunks reuse that memory from the heap (analyze/heap.py): smaller chunks
# touch less fresh memory. 250k against 500k at 10M events (14 interleaved rounds,
# bench/HISTORY.md "eighth pass"): page faults 102k -> 68k, peak RSS 485 -> 406 MB, CPU
# 2.05 -> 1.90 s, wall 0.90 per round; 100k made more files, and the phases stage slower.
CHUNK_ROWS = 250_000


@dataclass(frozen=True)
class Spec:
    """What every task of one build needs (small and picklable)."""

    anchor: str
    root: str  # the tables directory being built
    reader: str  # native or python
    global_offset: int
    resolution: int
    buckets: int  # of the shuffle
    chunk_rows: int = CHUNK_ROWS
    step_region: str | None = None
    memory: str | None = None  # DuckDB's memory limit per process (None: DuckDB's default)
    main_locations: tuple[int, ...] = ()  # each rank's main thread
    main_regions: tuple[int, ...] = ()  # regions of MAIN_CATEGORIES
    step_regions: tuple[int, ...] = ()  # those of them of Category.STEP
    group_starts: tuple[int, ...] = (0,)  # the first rank of each group (Plan.groups)
    # regions of the communication categories, when a name pattern matched one (else none:
    # nothing to recognize by name); then, after the read stage, each library's inferred group
    comm_regions: tuple[int, ...] = ()
    named_groups: tuple[tuple[str, int], ...] = ()
    device_locations: tuple[int, ...] = ()  # accelerator streams (device phases)
    # other tools' timelines (torch.profiler's copy of the host in --device-activity runs,
    # Horovod's timeline): what they show is recorded elsewhere, so no communication is
    # recognized by name there
    timeline_locations: tuple[int, ...] = ()
    metrics: bool = False  # after the read stage: whether there are metric channels
    # DuckDB's threads in a process while this stage's tasks run there (None: its default,
    # one per core); set per stage by the driver (Engine.threads_per_task)
    threads: int | None = None
    # after the read stage: the names of the collectives' operations by code (collectives.vocabulary)
    vocabulary: tuple[str, ...] = collectives.vocabulary(())

    def group_of(self, ranks: np.ndarray) -> np.ndarray:
        return (np.searchsorted(np.array(self.group_starts), ranks, side="right") - 1).astype(np.int32)

    @property
    def store(self) -> Store:
        return Store(self.root)

    @property
    def work(self) -> Store:
        return Store(Path(self.root) / WORK)


@dataclass(frozen=True)
class Plan:
    read: list[tuple[int, list[tuple[int, int, int]]]]  # bucket number, (location, rank, events)
    read_events: list[int]
    groups: list[tuple[int, list[int]]]  # group number, ranks (consecutive)
    buckets: int

    @property
    def group_starts(self) -> tuple[int, ...]:
        return tuple(ranks[0] for _, ranks in self.groups) or (0,)


@dataclass
class ReadResult:
    """What a read task says besides its files: its reader's counts, what it saw of the
    communication recognized by name (None: nothing to recognize), and the metrics its
    samples reference."""

    stats: ReadStats
    named: Seen | None
    metric_ids: set[int]


def main_of(defs: Definitions, categories: Mapping[int, str] | None = None,
            ) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """(main locations, regions of MAIN_CATEGORIES, those of the step category) for
    :class:`Spec`; ``categories``: each region's category as the build classified it (default:
    by the default patterns)."""
    if categories is None:
        categories = {r.region_id: classify(r.name, r.paradigm, r.role, r.canonical_name) for r in defs.regions}
    regions = tuple(r.region_id for r in defs.regions if categories[r.region_id] in MAIN_CATEGORIES)
    steps = tuple(r for r in regions if categories[r] == Category.STEP)
    return tuple(loc.location_id for loc in defs.locations if loc.is_main), regions, steps


def comm_of(categories: Mapping[int, str], pattern_kinds: list[str]) -> tuple[int, ...]:
    """The regions :func:`named.outer_instances` looks at (:attr:`Spec.comm_regions`): those of
    the communication categories, when any name pattern matched a communication region."""
    if not named.communicates(pattern_kinds):
        return ()
    return tuple(sorted(r for r, c in categories.items() if c in named.COMM))


def plan(defs: Definitions, reader: str, workers: int) -> Plan:
    """Split the work: locations into read buckets of similar event counts (one bucket for
    the Python reader, which reads the whole archive at once), ranks into groups."""
    events = sum(loc.events for loc in defs.locations)
    small, large = READ_TASK_EVENTS
    if reader == "native":
        n = max(min(workers, math.ceil(events / small)), math.ceil(events / large))
        declared = {loc.location_id: loc.events for loc in defs.locations}
        parts = [[(loc, rank, declared[loc]) for loc, rank in b] for b in otf2_native.buckets(defs, n)]
    else:
        parts = [[(loc.location_id, loc.rank, loc.events) for loc in defs.locations]]
    ranks = sorted({loc.rank for loc in defs.locations})
    n_groups = max(math.ceil(len(ranks) / GROUP_RANKS),
                   min(2 * workers, math.ceil(events / GROUP_EVENTS), len(ranks)), 1)
    size = math.ceil(len(ranks) / n_groups) if ranks else 1
    groups = [(g, ranks[i:i + size]) for g, i in enumerate(range(0, len(ranks), size))]
    return Plan(read=list(enumerate(parts)), read_events=[sum(x[2] for x in p) for p in parts],
                groups=groups, buckets=max(1, len(groups)))


def prepare_directories(spec: Spec) -> None:
    """The directories the shuffle's writers share (each rank's own are made by the tasks
    that write it: a group task its ranks', a read task a rank's intervals as they come)."""
    for table in (RAW_COLLECTIVES, RAW_MESSAGES, RAW_METRICS, MAIN_INTERVALS, DEVICE_INTERVALS, NAMED):
        spec.work.prepare(table, range(len(spec.group_starts)))
    for name in ("arrivals", "msg_keys"):
        base = spec.work.root / name
        for k in range(spec.buckets):
            (base / f"bucket={k}").mkdir(parents=True, exist_ok=True)


# ---- one DuckDB per process and build ------------------------------------------------------

# DuckDB's instances here start with one thread and no asynchronous I/O threads, and keep the
# thread count a stage asks for until the next stage asks for another. Each of DuckDB's
# background threads (its workers, and its 8 asynchronous I/O threads by default), once idle
# for half a second, calls glibc's malloc_trim (Allocator::ThreadFlush), and so does every
# change of the thread count (Allocator::FlushAll): malloc_trim hands every free page of the
# heap back to the kernel, the memory the analyze command keeps on purpose (analyze/heap.py),
# and the next chunks fault it in again, zeroed. With one thread and no asynchronous ones
# DuckDB runs queries on the calling thread and has no background thread to idle.
ONE_THREAD = {"threads": 1, "async_threads": 0}

_instances: dict[str, duckdb.DuckDBPyConnection] = {}
_threads: dict[str, int | None] = {}  # as last set on each instance (None: DuckDB's default)
_defined: set[str] = set()  # builds whose instance has the definitions' views
_attached: set[str] = set()  # builds whose driver has its database attached to the instance
_lock = threading.Lock()
TARGET = "target"  # what the driver's database is attached as


def _connect(spec: Spec) -> duckdb.DuckDBPyConnection:
    """A cursor of this process's DuckDB for ``spec``'s build: tasks running side by side in one
    process share its memory limit, and it spills into the build's own directory."""
    with _lock:
        con = _instance(spec.root, spec.memory)
        if _threads[spec.root] != spec.threads:
            # the tasks of one stage share the instance and ask for the same, so this happens
            # once per stage, before its queries (None: DuckDB's default, every core)
            con.execute("RESET threads" if spec.threads is None else f"SET threads = {int(spec.threads)}")
            _threads[spec.root] = spec.threads
        return con.cursor()


def _instance(root: str, memory: str | None) -> duckdb.DuckDBPyConnection:
    """This process's DuckDB for the build in ``root``, made if need be (under _lock)."""
    con = _instances.get(root)
    if con is None:
        # not among the work rows: the driver goes on with the instance once they are removed
        spill = Path(root) / f".spill-{os.uname().nodename}-{os.getpid()}"
        config: dict[str, Any] = {"preserve_insertion_order": False, "temp_directory": str(spill),
                                  **ONE_THREAD}
        if memory is not None:
            config["memory_limit"] = memory
        con = _instances[root] = duckdb.connect(config=config)
        _threads[root] = ONE_THREAD["threads"]
    return con


def warm(root: str, memory: str | None) -> None:
    """Start making this process's DuckDB for the build in ``root`` (about 20 ms) on a thread
    of its own, while the driver reads the definitions; the first task that needs it waits
    for it."""

    def make() -> None:
        with _lock:
            _instance(root, memory)

    in_background(make)


def attach(root: str, memory: str | None, db: Path) -> duckdb.DuckDBPyConnection:
    """The driver's connection: a cursor of this process's DuckDB for the build in ``root``
    (the tasks' own with the local engine), with the database file ``db`` attached and in use.
    A second instance for the driver cost 20-40 ms to make beside this one, and its close
    another malloc_trim. The instance stays open until :func:`detach`."""
    with _lock:
        base = _instance(root, memory)
        _attached.add(root)
    try:
        con = base.cursor()
        con.execute(f"ATTACH {literal(db)} AS {TARGET}")
        con.execute(f"USE {TARGET}")
    except BaseException:
        detach(root)
        raise
    return con


def detach(root: str, con: duckdb.DuckDBPyConnection | None = None) -> None:
    """Close the driver's connection (a transaction it left open is rolled back) and its
    database: detached, which checkpoints it into its file."""
    if con is not None:
        con.close()
    with _lock:
        _attached.discard(root)
        base = _instances.get(root)
        if base is not None:
            base.execute(f"DETACH DATABASE IF EXISTS {TARGET}")


def release(root: str) -> None:
    """Close this process's DuckDB for the build in ``root`` (called when the build ends, and
    on every worker after the stages; not while the driver's database is attached to it), on
    a thread of its own: the driver goes on meanwhile."""
    with _lock:
        if root in _attached:
            return
        con = _instances.pop(root, None)
        _threads.pop(root, None)
        _defined.discard(root)
    if con is not None:
        in_background(con.close)


_pending: list[threading.Thread] = []  # making DuckDB before the stages, closing and removing after


def in_background(fn: Callable[..., Any], *args: Any) -> None:
    """Run ``fn(*args)`` on a thread of its own, waited for by :func:`settle`."""
    thread = threading.Thread(target=fn, args=args, name="analyze-background")
    with _lock:  # before it starts: it may hold _lock a while
        _pending[:] = [t for t in _pending if t.is_alive()] + [thread]  # (workers never settle)
    try:
        thread.start()
    except RuntimeError:  # no thread to be had (a process at its memory limit): do it here
        with _lock:
            _pending.remove(thread)
        fn(*args)


def settle() -> None:
    """Wait for the threads :func:`in_background` started in this process (making and closing
    DuckDB, removing files; the driver calls it before a build returns, by when they are
    done)."""
    with _lock:
        threads = list(_pending)
        _pending.clear()
    for thread in threads:
        thread.join()


def _definition_views(spec: Spec) -> None:
    """Views of the definitions (locations, regions, communicators) for the tasks' queries:
    made once in this process's DuckDB for the build, where every task's cursor sees them
    (3-4 ms each, which every task of three stages paid for its own temporary ones). A view
    reads its files when a query uses it, so the driver's rewrite of the regions and
    communicators after the read stage (the groups inferred from names) is what later
    stages see."""
    with _lock:
        if spec.root in _defined:
            return
        base = _instance(spec.root, spec.memory)
        for table in (LOCATIONS, REGIONS, COMMUNICATORS):
            spec.store.view(base, table)
        _defined.add(spec.root)


# ---- 1. read -------------------------------------------------------------------------------

def read(bucket: tuple[int, list[tuple[int, int, int]]], spec: Spec,
         progress: Callable[[int], None] | None = None) -> ReadResult:
    """Read one bucket's locations; write their intervals and raw rows, and their name-only
    collectives. ``progress`` is called with the events of each chunk (in-process engines
    only)."""
    number, locations = bucket
    if spec.reader == "native":
        chunks = otf2_native.read_locations(Path(spec.anchor), locations, spec.global_offset,
                                            spec.resolution, spec.chunk_rows)
    else:  # the Python OTF2 reader or Chrome trace JSON: the whole trace in one bucket
        _, _, chunks = dispatch.read(Path(spec.anchor), spec.chunk_rows, "python")
    con = _connect(spec)
    stats = ReadStats()
    main_locations, main_regions = _Members(spec.main_locations), _Members(spec.main_regions)
    step_regions = _Members(spec.step_regions)
    comm_regions, device_locations = _Members(spec.comm_regions), _Members(spec.device_locations)
    timelines = _Members(spec.timeline_locations)
    extents: list[dict[str, np.ndarray]] = []
    metric_ids: set[int] = set()
    try:
        for i, chunk in enumerate(chunks):
            tag = f"b{number}c{i}"
            rows = chunk.intervals
            if len(rows["idx"]):
                rows = {**rows, "duration_ns": rows["end_ns"] - rows["start_ns"]}
                spec.store.write_arrays(con, INTERVALS, rows, tag, nullable=_PARENT)
                main = main_locations.of(rows["location_id"]) & main_regions.of(rows["region_id"])
                swept = {c: rows[c] for c in _SWEPT}
                main_rows = _picked(swept, main)
                main_rows["rank_group"] = spec.group_of(main_rows["rank"])
                spec.work.write_arrays(con, MAIN_INTERVALS, main_rows, tag)
                if len(step_regions):
                    step_rows = _picked(main_rows, step_regions.of(main_rows["region_id"]))
                    if len(step_rows["idx"]):
                        spec.work.write_arrays(con, STEP_INTERVALS, step_rows, tag)
                extents.append(_extents(rows))
                if len(device_locations):
                    dev = device_locations.of(rows["location_id"])
                    dev_rows = _picked(swept, dev)
                    spec.work.write_arrays(con, DEVICE_INTERVALS, dev_rows | {
                        "rank_group": spec.group_of(dev_rows["rank"])}, tag)
                if len(comm_regions):
                    comm = comm_regions.of(rows["region_id"])
                    if len(timelines):
                        comm &= ~timelines.of(rows["location_id"])
                    spec.work.write_arrays(con, COMM_INTERVALS, _picked(swept, comm), tag)
            for table, raw in ((RAW_COLLECTIVES, chunk.collectives), (RAW_MESSAGES, chunk.messages),
                               (RAW_METRICS, chunk.metrics)):
                if len(raw["rank"]):
                    spec.work.write_arrays(con, table, {**raw, "rank_group": spec.group_of(raw["rank"])}, tag)
            if len(chunk.metrics["metric_id"]):
                metric_ids.update(int(m) for m in np.unique(chunk.metrics["metric_id"]))
            for name, columns in chunk.tables.items():  # Chrome trace JSON's own tables
                spec.store.write_columns(con, BY_NAME[name], columns, tag)
            if chunk.stats is not None:
                stats = chunk.stats
            if progress is not None and chunk.events:
                progress(chunk.events)
        if extents:
            spec.work.write_columns(con, EXTENTS, {k: np.concatenate([e[k] for e in extents])
                                                   for k in extents[0]}, f"b{number}")
        seen = _named(spec, con, number) if len(comm_regions) else None
    finally:
        con.close()
    return ReadResult(stats, seen, metric_ids)


def _picked(columns: Mapping[str, np.ndarray], mask: np.ndarray) -> dict[str, np.ndarray]:
    """The rows of ``columns`` where ``mask`` is true: their positions found once and taken
    from each column, rather than the mask scanned again for each (on a chunk of 500k
    intervals and its eleven columns: 5-6 ms against 6-10 ms; on a mask without runs 5 ms
    against 21 ms)."""
    at = np.flatnonzero(mask)
    return {k: v.take(at) for k, v in columns.items()}


class _Members:
    """Membership in a set of definition ids, for every row of a chunk: a lookup table where
    the ids are small (OTF2's region and our location references are), else ``np.isin``."""

    def __init__(self, ids: tuple[int, ...]):
        self.ids = np.array(ids, dtype=np.int64)
        self.table: np.ndarray | None = None
        if len(self.ids) and self.ids.min() >= 0 and self.ids.max() < 1 << 22:
            # one more entry, never a member: ids above the largest (and -1) look there
            self.table = np.zeros(int(self.ids.max()) + 2, dtype=bool)
            self.table[self.ids] = True

    def __len__(self) -> int:
        return len(self.ids)

    def of(self, values: np.ndarray) -> np.ndarray:
        if self.table is None:
            return np.isin(values, self.ids)
        if len(values) and values.min() < 0:
            return self.table[np.clip(values, -1, len(self.table) - 1)]
        # ids above the largest clip to the last entry; a third of the time of indexing
        return self.table.take(values, mode="clip")


def _named(spec: Spec, con: duckdb.DuckDBPyConnection, number: int) -> Seen:
    """The bucket's outermost communication instances matched by name: its name-only
    collectives written for the groups, and what it saw of each library."""
    work = spec.work
    mine = f"b{number}c*.parquet"
    _definition_views(spec)
    work.view(con, REGION_PATTERNS, temporary=True)
    for table, files in ((COMM_INTERVALS, f"{COMM_INTERVALS.name}/{mine}"),
                         (RAW_COLLECTIVES, f"{RAW_COLLECTIVES.name}/*/{mine}")):
        cols = [c for c in table.columns if c.name != table.partition_by]
        found = work.source(files)
        select = (f"SELECT {', '.join(c.name for c in cols)} FROM read_parquet({found}, hive_partitioning = false)"
                  if found else "SELECT " + ", ".join(f"NULL::{c.type} AS {c.name}" for c in cols) + " LIMIT 0")
        con.execute(f"CREATE OR REPLACE TEMP VIEW {table.name} AS {select}")
    outer, bounds = f"named_outer_{number}", f"group_bounds_{number}"
    starts = list(spec.group_starts)
    con.execute(f"CREATE OR REPLACE TEMP TABLE {bounds} (rank_group INTEGER, lo BIGINT, hi BIGINT)")
    con.executemany(f"INSERT INTO {bounds} VALUES (?, ?, ?)",
                    [(g, lo, hi) for g, (lo, hi) in enumerate(zip(starts, [*starts[1:], 1 << 62], strict=True))])
    con.execute(f"CREATE OR REPLACE TEMP TABLE {outer} AS {named.outer_instances()}")
    try:
        work.write(con, NAMED, f"""
            SELECT n.location_id, n.rank, n.idx AS interval_idx, n.region_id, n.start_ns AS enter_ns,
                   n.end_ns AS leave_ns, n.op, n.library, b.rank_group
            FROM ({named.collective_instances(outer)}) n JOIN {bounds} b ON n.rank >= b.lo AND n.rank < b.hi
        """, f"b{number}")
        return Seen.of(con, outer)
    finally:
        con.execute(f"DROP TABLE {outer}")
        con.execute(f"DROP TABLE {bounds}")


_PARENT = frozenset({"parent_idx"})  # -1 from the readers: at the top, NULL in the table


def _extents(rows: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Per rank in a chunk of interval rows: the first start and the last end."""
    rank = rows["rank"]
    order = np.argsort(rank, kind="stable") if not bool(np.all(rank[1:] >= rank[:-1])) else None
    rank, start, end = ((rank, rows["start_ns"], rows["end_ns"]) if order is None else
                        (rank[order], rows["start_ns"][order], rows["end_ns"][order]))
    first = np.flatnonzero(np.r_[True, rank[1:] != rank[:-1]])
    return {"rank": rank[first], "start_ns": np.minimum.reduceat(start, first),
            "end_ns": np.maximum.reduceat(end, first)}


# ---- 2. prepare ----------------------------------------------------------------------------

_MIX = (1, 1_000_003, 10_007, 101, 7)


def _bucket_of(spec: Spec, *keys: str) -> str:
    """A bucket number from integer key columns (NULL counts as -1); the same on every task."""
    mixed = " + ".join(f"coalesce({k}, -1) * {m}" for k, m in zip(keys, _MIX, strict=False))
    return f"CAST(abs({mixed}) % {spec.buckets} AS INTEGER) AS bucket"


def _buckets(spec: Spec, comm_id: np.ndarray, seq: np.ndarray) -> np.ndarray:
    """The buckets of collectives' keys, as :func:`_bucket_of` gives them for ('comm_id', 'seq')
    (ranks numbered in SQL and in numpy meet in the same buckets)."""
    return (np.abs(comm_id * _MIX[0] + seq * _MIX[1]) % spec.buckets).astype(np.int32)


def prepare(group: tuple[int, list[int]], spec: Spec) -> dict[str, int]:
    """Per rank of the group: collective instances and messages with their sequence numbers,
    their matching keys hashed into buckets, and the candidate steps; returns how many steps
    each candidate source found."""
    number, ranks = group
    work = spec.work
    con = _connect(spec)
    try:
        _definition_views(spec)
        work.view(con, RAW_COLLECTIVES, [number], name="group_raw_collectives", temporary=True)
        work.view(con, RAW_MESSAGES, [number], temporary=True)
        _named_view(spec, con, number)
        tag = f"g{number}"
        work.dir(COLL_ROWS).mkdir(parents=True, exist_ok=True)
        main = dict(con.execute("SELECT location_id, is_main FROM locations").fetchall())
        members = {comm: np.asarray(ranks or [], np.int64) for comm, ranks in
                   con.execute("SELECT comm_id, members FROM communicators").fetchall()}
        # Sequence numbers count per rank and communicator, so ranks can be numbered apart: a
        # few at a time, about COLLECTIVE_ROWS collectives, in numpy; a rank with more alone,
        # in SQL, whose sort spills to disk beyond DuckDB's memory limit
        # the group's collective records once, by the codec, when they are all there is to count
        # (no name-only collectives): counted per rank here, rather than in SQL over the files
        whole = _group_raw_collectives(spec, number, COLLECTIVE_ROWS) if not spec.named_groups else None
        if whole is None:
            batches = _rank_batches(con, COLLECTIVE_ROWS)
        else:
            batches = _batches(_rank_counts(whole["rank"]), COLLECTIVE_ROWS)
        for k, (lo, hi, held) in enumerate(batches):
            where = f"WHERE rank BETWEEN {lo} AND {hi}"
            if held <= COLLECTIVE_ROWS:
                raw = _raw_collectives(spec, con, number, lo, hi, whole)
                found = con.execute(f"SELECT * FROM group_named_collectives {where}").fetchnumpy()
                found["op"] = _names(found["op"])
                numbered = collectives.number(raw, found, main, members, spec.vocabulary)
                work.write_arrays(con, COLL_ROWS, numbered, f"{tag}_{k}")
                keys = {c: numbered[c] for c in ("comm_id", "seq", "enter_ns", "is_root")}
                keys["bucket"] = _buckets(spec, keys["comm_id"], keys["seq"])
                work.write_arrays(con, ARRIVALS, keys, f"{tag}_{k}")
                continue
            for view in ("raw_collectives", "named_collectives"):
                con.execute(f"CREATE OR REPLACE TEMP VIEW {view} AS SELECT * FROM group_{view} {where}")
            collectives.create_op_names(con)
            rows = work.dir(COLL_ROWS) / f"{tag}_{k}.parquet"
            con.execute(f"COPY ({collectives.collective_rows(spec.vocabulary)}) TO {literal(rows)} ({FORMAT})")
            pattern = literal(f"{tag}_{k}_" + "{i}")
            con.execute(f"""COPY (SELECT comm_id, seq, enter_ns, is_root, {_bucket_of(spec, 'comm_id', 'seq')}
                                  FROM read_parquet({literal(rows)}))
                            TO {literal(work.dir(ARRIVALS))} ({FORMAT}, PARTITION_BY (bucket),
                               FILENAME_PATTERN {pattern}, OVERWRITE_OR_IGNORE)""")
        if work.files(RAW_MESSAGES, [number]):  # a group without messages has no message rows
            rows = work.root / "msg_rows" / f"{tag}.parquet"
            rows.parent.mkdir(parents=True, exist_ok=True)
            con.execute(f"COPY ({collectives.message_rows()}) TO {literal(rows)} ({FORMAT})")
            con.execute(f"""COPY (SELECT direction, sender, receiver, comm_id, tag, seq, enter_ns,
                                         {_bucket_of(spec, 'sender', 'receiver', 'comm_id', 'tag', 'seq')}
                                  FROM read_parquet({literal(rows)}))
                            TO {literal(work.root / 'msg_keys')} ({FORMAT}, PARTITION_BY (bucket),
                               FILENAME_PATTERN {literal(tag + '_{i}')}, OVERWRITE_OR_IGNORE)""")
        counts = {}
        for source in steps.SOURCES:
            if source == "region" and spec.step_region is None:
                continue
            # the steps' queries over only the intervals they can pick (see MAIN_INTERVALS)
            if source == "marker":
                marked = _marker_steps(spec, number)
                if marked is not None:
                    work.write_arrays(con, MARKER_STEPS, marked, tag)
                    counts[source] = len(marked["step"])
                    continue
                work.view(con, STEP_INTERVALS, [number], name="intervals", temporary=True)
            elif source == "region":
                spec.store.view(con, INTERVALS, ranks, temporary=True)
            else:
                listed = ", ".join(str(int(r)) for r in ranks)
                con.execute(f"CREATE OR REPLACE TEMP VIEW intervals AS SELECT * FROM ({work.scan(EXTENTS)}) "
                            f"WHERE rank IN ({listed})")
            out = work.root / f"steps_{source}" / f"{tag}.parquet"
            out.parent.mkdir(parents=True, exist_ok=True)
            written = con.execute(f"COPY ({steps.candidate(source, spec.step_region)}) "
                                  f"TO {literal(out)} ({FORMAT})").fetchone()
            counts[source] = int(written[0]) if written else 0
        return counts
    finally:
        con.close()


def _group_files(spec: Spec, table: Table, number: int) -> list[Path]:
    """The files of group ``number``'s partition of a work table partitioned by rank_group."""
    return sorted((spec.work.dir(table) / f"{table.partition_by}={number}").glob("*.parquet"))


def _marker_steps(spec: Spec, number: int) -> dict[str, np.ndarray | Codes] | None:
    """The group's candidate steps from its markers (its STEP_INTERVALS: the main threads'
    intervals of step regions), numbered per rank by start, then position, as the marker
    query numbers them, in numpy (a tenth of the query's 20 ms over a rank's 44k markers);
    None, for the query, when the codec did not write the files, there are no markers (the
    query still writes the group's file of none) or more than COLLECTIVE_ROWS (the query's
    sort spills to disk beyond DuckDB's memory limit)."""
    found = spec.work.read_all(_group_files(spec, STEP_INTERVALS, number),
                               {"rank": np.int32, "idx": np.int64, "start_ns": np.int64, "end_ns": np.int64},
                               COLLECTIVE_ROWS)
    if found is None or not len(found["idx"]):
        return None
    rank, idx, start, end = found["rank"], found["idx"], found["start_ns"], found["end_ns"]
    step = collectives.numbered(rank, np.zeros(len(rank), np.int64), start, idx)  # one communicator
    return {"rank": rank, "step": step, "start_ns": start, "end_ns": end, "duration_ns": end - start,
            "source": Codes(np.zeros(len(rank), np.int32), ("marker",))}


def _group_raw_collectives(spec: Spec, number: int, limit: int | None = None) -> dict[str, np.ndarray] | None:
    """Group ``number``'s raw collective records, read by the codec; None where it did not
    write them (DuckDB's view group_raw_collectives has them then) or, given ``limit``, where
    they are more."""
    return spec.work.read_all(_group_files(spec, RAW_COLLECTIVES, number), COLLECTIVE_COLUMNS, limit)


def _raw_collectives(spec: Spec, con: duckdb.DuckDBPyConnection, number: int, lo: int, hi: int,
                     whole: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """The raw collective records of ranks ``lo`` to ``hi`` of group ``number``: of ``whole``
    (the group's, when read already), read by the codec, or from DuckDB's view
    group_raw_collectives where the codec did not write them. A read task's file holds
    several ranks, so a group numbered in several batches reads its files again for each."""
    rows = whole if whole is not None else _group_raw_collectives(spec, number)
    if rows is None:
        return con.sql(f"SELECT * EXCLUDE (rank_group) FROM group_raw_collectives "
                       f"WHERE rank BETWEEN {lo} AND {hi}").fetchnumpy()
    mine = (rows["rank"] >= lo) & (rows["rank"] <= hi)
    return rows if mine.all() else {c: v[mine] for c, v in rows.items()}


def _rank_batches(con: duckdb.DuckDBPyConnection, limit: int) -> list[tuple[int, int, int]]:
    """Consecutive ranks of the group (views group_raw_collectives, group_named_collectives)
    in batches of at most about ``limit`` collectives (:func:`_batches`)."""
    counts = con.execute("""
        SELECT rank, count(*) FROM (SELECT rank FROM group_raw_collectives
                                    UNION ALL SELECT rank FROM group_named_collectives)
        GROUP BY rank ORDER BY rank""").fetchall()
    return _batches(counts, limit)


def _rank_counts(rank: np.ndarray) -> list[tuple[int, int]]:
    """(rank, rows) of each rank in ``rank`` (a group's few ranks: counted by position), ascending."""
    if not len(rank):
        return []
    lowest = int(rank.min())
    per_rank = np.bincount(rank - lowest)
    return [(lowest + r, int(per_rank[r])) for r in np.flatnonzero(per_rank).tolist()]


def _batches(counts: list[tuple[int, int]], limit: int) -> list[tuple[int, int, int]]:
    """Ranks with their collectives (ascending ranks) in batches of consecutive ranks of at
    most about ``limit`` collectives (a rank with more is a batch alone), as (first rank,
    last rank, collectives); one batch of every rank when there are none, so that the group
    still writes its (empty) rows file."""
    if not counts:
        return [(-(1 << 31), (1 << 31) - 1, 0)]
    batches: list[tuple[int, int, int]] = []
    first, last, held = counts[0][0], counts[0][0], 0
    for rank, n in counts:
        if held and held + n > limit:
            batches.append((first, last, held))
            first, held = rank, 0
        held += n
        last = rank
    batches.append((first, last, held))
    return batches


def _names(column: np.ndarray) -> np.ndarray:
    """A VARCHAR column as DuckDB fetches it, with None where it is NULL (not masked)."""
    if not isinstance(column, np.ma.MaskedArray):
        return column
    out = np.asarray(column.data, dtype=object).copy()
    out[np.ma.getmaskarray(column)] = None
    return out


def _named_view(spec: Spec, con: duckdb.DuckDBPyConnection, number: int) -> None:
    """View group_named_collectives: the group's name-only collectives with their library's group."""
    if not spec.named_groups:
        con.execute(f"CREATE OR REPLACE TEMP VIEW group_named_collectives AS {_NO_MATCHES['named_collectives']}")
        return
    ids = ", ".join(f"({literal(lib)}, {int(comm)})" for lib, comm in spec.named_groups)
    con.execute(f"""
        CREATE OR REPLACE TEMP VIEW group_named_collectives AS
        SELECT n.location_id, n.rank, n.interval_idx, n.region_id, n.enter_ns, n.leave_ns, n.op, g.comm_id
        FROM ({spec.work.scan(NAMED, [number])}) n JOIN (VALUES {ids}) g(library, comm_id) USING (library)
    """)


# ---- 3. match ------------------------------------------------------------------------------

def match(k: int, spec: Spec) -> None:
    """Bucket ``k`` of the shuffle: collective instances across ranks, message partners."""
    con = _connect(spec)
    try:
        # the instances, written by the codec, which the finish tasks read back
        arrivals = spec.work.source(f"arrivals/bucket={k}/*.parquet")
        if arrivals is not None:
            found = _instances_in_numpy(spec, k)
            if found is None:
                con.execute(f"CREATE OR REPLACE TEMP VIEW coll_rows AS SELECT * FROM read_parquet({arrivals})")
                found = con.execute(f"""SELECT comm_id, seq, last_enter, ranks_matched,
                                               coalesce(root_enter, -1) AS root_enter,
                                               root_enter IS NOT NULL AS has_root
                                        FROM ({collectives.collective_match()})""").fetchnumpy()
            spec.work.write_arrays(con, INSTANCES, found, str(k))
        keys = spec.work.source(f"msg_keys/bucket={k}/*.parquet")
        if keys is not None:
            (spec.work.root / "partners").mkdir(parents=True, exist_ok=True)
            con.execute(f"CREATE OR REPLACE TEMP VIEW msg_keys AS SELECT * FROM read_parquet({keys})")
            con.execute(f"COPY ({collectives.message_match()}) TO "
                        f"{literal(spec.work.root / 'partners' / f'{k}.parquet')} ({FORMAT})")
    finally:
        con.close()


def _instances_in_numpy(spec: Spec, k: int) -> dict[str, np.ndarray] | None:
    """collectives.collective_match over bucket ``k``'s arrivals, in numpy, when the codec
    wrote them, they are at most COLLECTIVE_ROWS and their communicators and sequence numbers
    are dense enough to count in a table (a communicator's sequence numbers are consecutive:
    they are); None, for the SQL (which spills), otherwise. At 10M events, 7-10 ms a bucket
    against DuckDB's 17 ms."""
    # None: DuckDB wrote them (a rank numbered in SQL), or they are many
    found = spec.work.read_all(sorted((spec.work.dir(ARRIVALS) / f"{ARRIVALS.partition_by}={k}").glob("*.parquet")),
                               {c: t for c, t in ARRIVAL_DTYPES.items() if c != ARRIVALS.partition_by},
                               COLLECTIVE_ROWS)
    if found is None or not len(found["seq"]):
        return None
    comm, seq, enter, root = found["comm_id"], found["seq"], found["enter_ns"], found["is_root"]
    lo_c, lo_s = int(comm.min()), int(seq.min())
    span = int(seq.max()) - lo_s + 1
    size = (int(comm.max()) - lo_c + 1) * span  # Python's integers: no overflow
    if size > 4 * len(seq) + 4096:
        return None
    key = (comm - lo_c) * span + (seq - lo_s)
    ranks = np.bincount(key, minlength=size)
    last = np.full(size, np.iinfo(np.int64).min)
    np.maximum.at(last, key, enter)
    root_enter = np.full(size, np.iinfo(np.int64).min)
    np.maximum.at(root_enter, key[root], enter[root])
    has_root = np.bincount(key[root], minlength=size) > 0
    present = np.flatnonzero(ranks)
    return {"comm_id": present // span + lo_c, "seq": present % span + lo_s, "last_enter": last[present],
            "ranks_matched": ranks[present], "root_enter": np.where(has_root[present], root_enter[present], -1),
            "has_root": has_root[present]}


# ---- 4. finish -----------------------------------------------------------------------------

def finish(group: tuple[int, list[int]], spec: Spec, source: str) -> None:
    """The final collectives, p2p, steps, phases, metrics and device phases of the group's ranks."""
    number, ranks = group
    work, store, tag = spec.work, spec.store, f"g{number}"
    for table in (COLLECTIVES, P2P, STEPS, PHASES, METRICS, DEVICE_PHASES):  # DuckDB's partitioned writes need them
        store.prepare(table, ranks)
    con = _connect(spec)
    try:
        _definition_views(spec)
        finished = _finish_collectives(spec, con, tag, ranks)
        # a group's rows file exists when it has messages; the shuffle's outputs only where rows were
        rows = work.source(f"msg_rows/{tag}.parquet")
        if rows is None:  # none: no p2p rows to write (the build gives the table its empty file)
            store.view(con, P2P, [], temporary=True)
        else:
            con.execute(f"CREATE OR REPLACE TEMP VIEW msg_rows AS SELECT * FROM read_parquet({rows})")
            files = work.source("partners/*.parquet")
            con.execute(f"CREATE OR REPLACE TEMP VIEW partners AS "
                        f"{_NO_MATCHES['partners'] if files is None else f'SELECT * FROM read_parquet({files})'}")
            counted = con.execute("SELECT count(*) FROM msg_rows").fetchone()
            if counted is not None and counted[0] <= MATERIALIZE_ROWS:
                # kept for the phase sweep, which would otherwise read them back rank by rank
                con.execute(f"CREATE OR REPLACE TEMP TABLE p2p AS {collectives.message_final()}")
                store.write(con, P2P, "SELECT * FROM p2p", tag, ranks)
            else:
                store.write(con, P2P, collectives.message_final(), tag, ranks)
                store.view(con, P2P, ranks, temporary=True)
        candidates = work.source(f"steps_{source}/{tag}.parquet")
        # the markers' steps numbered again in numpy, as prepare numbered them (where it did):
        # written by the codec and handed to the sweep, rather than read back through DuckDB
        marked = _marker_steps(spec, number) if source == "marker" else None
        if marked is None:
            store.write(con, STEPS, f"SELECT * FROM read_parquet({candidates})", tag, ranks)
        else:
            store.write_arrays(con, STEPS, marked, tag)
        con.execute(f"CREATE OR REPLACE TEMP VIEW steps AS SELECT * FROM read_parquet({candidates})")
        work.view(con, MAIN_INTERVALS, [number], name="intervals", temporary=True)  # all the sweep needs
        _phases(spec, con, tag, *_segments_in_memory(spec, con, number, finished), marked)
        if spec.metrics:
            work.view(con, RAW_METRICS, [number], temporary=True)
            work.view(con, CHANNELS, temporary=True)
            store.write(con, METRICS, metrics.METRIC_ROWS, tag, ranks)
        if spec.device_locations:
            # the device phases look at the accelerator streams and the main threads
            con.execute(f"CREATE OR REPLACE TEMP VIEW intervals AS SELECT * FROM ({work.scan(MAIN_INTERVALS, [number])}) "
                        f"UNION ALL SELECT * FROM ({work.scan(DEVICE_INTERVALS, [number])})")
            written = 0

            def emit(rows: dict[str, np.ndarray]) -> None:
                nonlocal written
                store.write_columns(con, DEVICE_PHASES, rows, f"{tag}d{written}")
                written += 1

            device_phases.build_device_phases(con, emit, ranks)
    finally:
        con.close()


def _finish_collectives(spec: Spec, con: duckdb.DuckDBPyConnection, tag: str, ranks: list[int],
                        ) -> dict[str, np.ndarray] | None:
    """The group's ``collectives`` from its numbered rows (about a million at a time) and the
    instances of the shuffle, and view collectives over them: in memory when they are few
    (the phase sweep would otherwise read them back rank by rank; returned, as
    :func:`collectives.final` gives them), else over their files (None)."""
    instances = sorted(spec.work.dir(INSTANCES).glob("*.parquet"))
    template = collectives.final_select(spec.vocabulary)
    kept: list[dict[str, np.ndarray]] = []
    held = 0
    for k, path in enumerate(sorted(spec.work.dir(COLL_ROWS).glob(f"{tag}_*.parquet"))):
        reader = con.cursor()
        try:
            for rows in _slices(spec, reader, path):
                done = collectives.final(rows, _instances_of(con, spec.work, instances, rows), spec.vocabulary)
                spec.store.write_arrays(con, COLLECTIVES, collectives.table_columns(done, spec.vocabulary),
                                        f"{tag}_{k}_{held}", collectives.NULLABLE)
                held += len(done["seq"])
                if held <= MATERIALIZE_ROWS:
                    kept.append(done)
        finally:
            reader.close()
    if held > MATERIALIZE_ROWS:
        spec.store.view(con, COLLECTIVES, ranks, temporary=True)
        return None
    rows = {c: np.concatenate([part[c] for part in kept]) for c in kept[0]} if kept else \
        {c: np.zeros(0, t) for c, t in {**collectives.ROW_COLUMNS, **collectives.FINAL_COLUMNS}.items()}
    con.register(FINISHED, rows)
    con.execute(f"CREATE OR REPLACE TEMP VIEW collectives AS {template.format(rows=FINISHED)}")
    return rows


def _segments_in_memory(spec: Spec, con: duckdb.DuckDBPyConnection, number: int,
                        finished: dict[str, np.ndarray] | None,
                        ) -> tuple[Callable[[list[int]], pd.DataFrame] | None, dict[int, int] | None]:
    """The segments of some of the group's ranks (phases.segments_of) from its collectives in
    memory and its main threads' intervals read with the codec, and how many of those
    intervals each rank has (what the sweep batches ranks by); (None, None): the phases' SQL,
    when the collectives are not in memory or the codec did not write the intervals."""
    if finished is None:
        return None, None
    files = _group_files(spec, MAIN_INTERVALS, number)
    # read once here: counted per rank, and kept when they are few (else read again for each
    # batch of ranks, only theirs kept)
    counts: dict[int, int] = {}
    parts: list[dict[str, np.ndarray]] | None = []
    total = 0
    for path in files:
        part = spec.work.read_arrays(path)
        if part is None:  # DuckDB wrote them (no codec)
            return None, None
        for rank, n in _rank_counts(part["rank"]):
            counts[rank] = counts.get(rank, 0) + n
        total += len(part["rank"])
        if total > phases.WINDOW_SEGMENTS:
            parts = None
        elif parts is not None:
            parts.append({c: part[c] for c in _SEGMENT_COLUMNS})
    held = _concatenated(parts) if parts is not None else None
    levels = con.sql(phases.LEVELS).fetchnumpy()
    devices = np.array([i for (i,) in con.execute(
        "SELECT location_id FROM locations WHERE kind = 'accelerator_stream'").fetchall()], np.int64)
    allreduce = spec.vocabulary.index("allreduce")
    coll = {c: finished[c] for c in ("rank", "location_id", "interval_idx", "is_async", "enter_ns", "leave_ns",
                                     "wait_ns")}
    coll["allreduce"] = np.where(finished["op"] < 0, -1, finished["op"] == allreduce).astype(np.int8)
    coll["on_device"] = np.isin(finished["location_id"], devices)
    messages = spec.work.source(f"msg_rows/g{number}.parquet") is not None  # else no receive waits

    def of_ranks(ranks: list[int]) -> pd.DataFrame:
        wanted = np.array(ranks, np.int32)
        found = held
        if found is None:
            found = _concatenated([_rows_of({c: part[c] for c in _SEGMENT_COLUMNS}, wanted)
                                   for part in map(spec.work.read_arrays, files) if part is not None])
        listed = ", ".join(str(r) for r in ranks)
        waits = phases.receive_waits(con, f"AND p.rank IN ({listed})") if messages else {
            c: np.zeros(0, np.int64) for c in ("rank", "start", "end", "level")}
        return phases.segments_of(_rows_of(found, wanted), levels, _rows_of(coll, wanted), waits)

    return of_ranks, counts


def _rows_of(columns: dict[str, np.ndarray], ranks: np.ndarray) -> dict[str, np.ndarray]:
    mine = np.isin(columns["rank"], ranks)
    return columns if mine.all() else {c: v[mine] for c, v in columns.items()}


def _concatenated(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    if len(parts) == 1:
        return parts[0]
    if not parts:
        return {c: np.zeros(0, t) for c, t in _SEGMENT_COLUMNS.items()}
    return {c: np.concatenate([part[c] for part in parts]) for c in parts[0]}


# what the segments need of the main threads' intervals
_SEGMENT_COLUMNS = {"rank": np.int32, "location_id": np.int64, "idx": np.int64, "region_id": np.int64,
                    "start_ns": np.int64, "end_ns": np.int64}


def _slices(spec: Spec, reader: duckdb.DuckDBPyConnection, path: Path) -> Iterator[dict[str, np.ndarray]]:
    """The rows of a numbered rows file: whole when numpy numbered them (at most
    COLLECTIVE_ROWS), else (SQL numbered a rank's many) a slice at a time."""
    whole = spec.work.read_arrays(path)
    if whole is not None:
        yield whole
        return
    reader.execute(f"SELECT * FROM read_parquet({literal(path)})")
    while not (chunk := reader.fetch_df_chunk(FINISH_VECTORS)).empty:
        yield {c: chunk[c].to_numpy() for c in chunk.columns}


FINISH_VECTORS = 500  # DuckDB vectors of numbered collectives finished at a time (about a million rows)
FINISHED = "finished_collectives"  # the group's collectives in memory, registered with its DuckDB


def _instances_of(con: duckdb.DuckDBPyConnection, work: Store, files: list[Path],
                  rows: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The shuffle's instances (:data:`INSTANCES`, one file per bucket) of the communicators
    and sequence numbers of ``rows`` (and a few more: those in the range of sequence numbers of
    each communicator). Read by the codec and filtered in numpy when they are at most
    COLLECTIVE_ROWS (at 10M events, 7-12 ms against the 25-40 ms of DuckDB's join of the files
    with the ranges); else by that join, which holds only what it finds."""
    columns = tuple(c.name for c in INSTANCES.columns)
    if not files or not len(rows["seq"]):
        return {c: np.zeros(0, bool if c == "has_root" else np.int64) for c in columns}
    comm, seq = rows["comm_id"], rows["seq"]
    order = np.argsort(comm, kind="stable")
    first = np.flatnonzero(np.r_[True, comm[order][1:] != comm[order][:-1]])
    comms = comm[order][first]  # sorted, distinct
    lo, hi = np.minimum.reduceat(seq[order], first), np.maximum.reduceat(seq[order], first)
    if not work.held(files, COLLECTIVE_ROWS):
        con.register(WANTED, pd.DataFrame({"comm_id": comms, "lo": lo, "hi": hi}))
        try:
            found = con.execute(f"""
                SELECT i.* FROM read_parquet([{", ".join(literal(f) for f in files)}]) i JOIN {WANTED} w
                  ON i.comm_id = w.comm_id AND i.seq BETWEEN w.lo AND w.hi""").fetchnumpy()
        finally:
            con.unregister(WANTED)
        return {c: np.asarray(found[c]) for c in columns}
    parts = []
    for part in map(work.read_arrays, files):
        assert part is not None  # (held: the codec's)
        at = np.searchsorted(comms, part["comm_id"]).clip(0, len(comms) - 1)
        wanted = (comms[at] == part["comm_id"]) & (part["seq"] >= lo[at]) & (part["seq"] <= hi[at])
        parts.append(part if wanted.all() else {c: part[c][wanted] for c in columns})
    return {c: np.concatenate([part[c] for part in parts]) for c in columns}


WANTED = "wanted_instances"  # per communicator, the range of sequence numbers a slice of rows has


def _phases(spec: Spec, con: duckdb.DuckDBPyConnection, tag: str,
            segments_of_ranks: Callable[[list[int]], pd.DataFrame] | None, counts: dict[int, int] | None,
            steps: Mapping[str, Any] | None) -> None:
    pending: list[dict[str, np.ndarray]] = []
    held = 0
    written = 0

    def flush() -> None:
        nonlocal pending, held, written
        if pending:
            rows: dict[str, np.ndarray | Codes] = {k: np.concatenate([p[k] for p in pending]) for k in pending[0]}
            rows["phase"] = Codes(rows["phase"], phases.PHASE_NAMES)  # type: ignore[arg-type]
            spec.store.write_arrays(con, PHASES, rows, f"{tag}w{written}")
            written += 1
        pending, held = [], 0

    def emit(rank: int, step_ids: np.ndarray, totals: np.ndarray) -> None:
        nonlocal held
        pending.append(phases.phase_rows(rank, step_ids, totals))
        held += len(step_ids) * len(phases.PHASES)
        if held >= PHASE_ROWS:
            flush()

    phases.build_phases(con, emit, segments_of_ranks, counts, steps)
    flush()


# ---- after the stages ----------------------------------------------------------------------

def fill_empty(con: duckdb.DuckDBPyConnection, store: Store, tables: tuple[Table, ...]) -> list[Table]:
    """Give every table without rows one empty file with its columns, so that every reader
    (DuckDB's views, Spark, pandas) finds each table, empty or not; returns those tables."""
    filled = []
    for table in tables:
        if store.files(table):
            continue
        store.write_empty(con, table)
        filled.append(table)
    return filled


def remove_work(spec: Spec) -> None:
    """Remove the build's intermediate rows: moved out of the build at once, beside it among
    the builds with the suffix that marks what is being removed (an interrupted removal is
    finished by a later build), and deleted on a thread of its own."""
    root = Path(spec.root)
    target = root.with_name(f".{root.name}{WORK_REMOVING}")
    try:
        os.rename(spec.work.root, target)
    except OSError:
        shutil.rmtree(spec.work.root, ignore_errors=True)
        return
    in_background(shutil.rmtree, target, True)


REMOVING = ".removing"  # the builds' folders being removed end so (analyze/tables/database.py)
WORK_REMOVING = f".work{REMOVING}"  # and the intermediate rows a build's process is removing

