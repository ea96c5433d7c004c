"""A run's tables as Chrome trace JSON: one file to look at, or one Kineto-style file per rank.

Two layouts:

- **merged** (``FILE.json`` or ``FILE.json.gz``, for Perfetto's UI and chrome://tracing): one
  process per rank (``pid`` = rank), one track per location (main thread, other threads,
  communication lanes, imported timelines, accelerator streams: ``tid`` = its index in the
  rank, named by ``thread_name`` metadata), a ``steps`` track with one slice per step whose
  args hold the step's phases (and device phases), collectives with their operation, bytes,
  communicator, sequence number, wait and transfer in ``args.dltrace``, launch correlations as
  flow arrows, and metric samples as counters where the run has a ``metrics`` table.
- **per rank** (a directory): ``rank-<r>.pt.trace.json.gz`` per rank in Kineto's own layout,
  for Holistic Trace Analysis and anything that reads torch.profiler output. An imported
  Kineto trace comes back as it was read: the same header, tracks (pid, tid), names,
  categories, args, times to the nanosecond and every non-slice event, so importing the export
  gives identical tables. Other traces get Kineto-like events: accelerator streams as
  ``kernel`` / ``gpu_memcpy`` events with ``args.stream``, collectives on streams with
  ``Collective name``, ``In msg nelems`` (bytes, ``dtype`` Byte) and their process group.

Times: ``ts`` in microseconds relative to ``baseTimeNanoseconds`` (written exactly: whole
microseconds as integers, else floats that read back to the same nanosecond).

Most events are written by DuckDB: an interval without imported args (our markers, Score-P's
regions, collectives in the merged file) becomes its event's JSON text in the query that reads
it, from pieces ``json.dumps`` wrote (names, tracks) and integers written as Python writes
them; Python makes the others (imported Kineto events, strings that need escapes). Both give
the same bytes (tests/analyze/test_export_chrome.py), and a 10^7-event run's file is written
4-7x faster than in Python alone (bench/README.md, "Every verb at 10^8 events").
"""

from __future__ import annotations

import itertools
import json
import re
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from analyze.errors import AnalyzeError
from analyze.schema import CHROME_EVENTS, COLLECTIVES, CORRELATIONS, INTERVALS, Category
from analyze.tables.database import tables_of
from analyze.tables.device_phases import ACCELERATOR_PARADIGMS, DEVICE_PHASES
from analyze.tables.phases import PHASES
from analyze.tables.store import Store
from traceio import chrome
from traceio.chrome import Slice

STREAM_NAME = re.compile(r"GPU (-?\d+) stream (-?\d+)")
CPU_PID_BASE = 1_000_000  # pid of a rank's CPU threads in per-rank files of non-Kineto traces
USER_CATEGORIES = {Category.STEP, Category.TAIL, Category.FORWARD, Category.BACKWARD, Category.OPTIMIZER,
                   Category.DATALOADER, Category.USER, Category.WAIT, Category.COLLECTIVE, Category.P2P}
# what a merged file's collective holds in args.dltrace, in this order
DLTRACE_KEYS = ("op", "bytes", "bytes_sent", "bytes_recv", "comm", "seq", "wait_ns", "transfer_ns", "ranks_matched")


def is_merged(out: Path) -> bool:
    """A ``.json`` / ``.json.gz`` path is one merged file; anything else a directory of per-rank files."""
    return chrome.is_trace_file(Path(out))


ALL = (-(2**63), 2**63 - 1)  # no window: every instant, every step


def export(con: duckdb.DuckDBPyConnection, out: Path, steps: tuple[int, int] | None = None) -> list[Path]:
    """Write the run behind ``con`` to ``out`` (see the module docstring); the files written.
    ``steps`` (A, B): only steps A to B-1, and what overlaps their time (intervals whole,
    counters and flows inside it; an imported Kineto trace's other events whole)."""
    out = Path(out)
    window = _window(con, steps)
    if is_merged(out):
        out.parent.mkdir(parents=True, exist_ok=True)
        header, events = merged(con, window)
        return [chrome.dump(out, header, events)]
    if out.exists() and not out.is_dir():
        raise AnalyzeError(f"{out} exists and is not a directory; name a .json.gz file for one merged "
                           "file, or a directory for one file per rank")
    out.mkdir(parents=True, exist_ok=True)
    return [chrome.dump(out / f"rank-{rank}.pt.trace.json.gz", header, events)
            for rank, header, events in per_rank(con, window)]


@dataclass(frozen=True)
class Window:
    """What an export covers: steps ``a`` to ``b - 1`` and the instants ``t0`` to ``t1`` (ns)."""

    a: int = ALL[0]
    b: int = ALL[1]
    t0: int = ALL[0]
    t1: int = ALL[1]

    def params(self, *names: str, **more: Any) -> dict[str, Any]:
        """Named parameters of a query: ``names`` of this window's fields, and ``more``."""
        return {**{n: getattr(self, n) for n in names}, **more}


def _window(con: duckdb.DuckDBPyConnection, steps: tuple[int, int] | None) -> Window:
    if steps is None:
        return Window()
    a, b = steps
    t0, t1 = con.execute("SELECT min(start_ns), max(end_ns) FROM steps WHERE step >= $a AND step < $b",
                         {"a": a, "b": b}).fetchone() or (None, None)
    if t0 is None:
        first, last = con.execute("SELECT min(step), max(step) FROM steps").fetchone() or (None, None)
        raise AnalyzeError(f"the run has no steps {a}:{b} (it has steps {first}-{last}); choose others with --steps A:B")
    return Window(a, b, int(t0), int(t1))


# -- what the tables hold --------------------------------------------------------------
def _origin(con: duckdb.DuckDBPyConnection) -> int:
    """Epoch ns of time 0 in the tables (0 when the trace has no wall-clock time)."""
    reader, offset, realtime = con.execute(
        "SELECT reader, global_offset, epoch_us(start_realtime) FROM runs").fetchone()  # type: ignore[misc]
    if reader == "kineto":
        return int(offset)
    return int(realtime) * 1000 if realtime is not None else 0


def _locations(con: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    return con.execute("""
        SELECT l.location_id, l.rank, l.thread, l.name, l.kind, t.pid, t.tid
        FROM locations l LEFT JOIN chrome_tracks t USING (location_id) ORDER BY l.rank, l.thread
    """).df().to_dict("records")


def _intervals(con: duckdb.DuckDBPyConnection, ranks: tuple[int, int], window: Window, plain: str,
               tail: str = "'}'") -> Iterator[pa.RecordBatch]:
    """The intervals of ranks ``ranks[0]`` to ``ranks[1]`` overlapping the window in (rank,
    location, idx) order, with what an event needs, as Arrow batches. Where the SQL condition
    ``plain`` holds, column ``encoded`` is the row's whole event as JSON, made by DuckDB from
    the lookups :class:`_Encoding` registered and ending in the SQL ``tail`` (its keys after
    ``dur``, and the closing brace); else, and wherever a piece of it is null, it is null and
    Python makes the event."""
    rel = con.sql(f"""
        WITH c AS (
            SELECT c.location_id, c.interval_idx, any_value(c.op) AS op, any_value(c.bytes) AS bytes,
                   any_value(c.bytes_sent) AS bytes_sent, any_value(c.bytes_recv) AS bytes_recv,
                   any_value(m.name) AS comm, any_value(m.members) AS members, any_value(c.seq) AS seq,
                   any_value(c.wait_ns) AS wait_ns, any_value(c.transfer_ns) AS transfer_ns,
                   any_value(c.ranks_matched) AS ranks_matched
            FROM {_SCOPED}collectives c LEFT JOIN communicators m USING (comm_id)
            WHERE c.rank BETWEEN $r0 AND $r1 GROUP BY c.location_id, c.interval_idx)
        SELECT i.rank, i.location_id, i.idx, i.start_ns, i.end_ns, r.name, r.category, r.paradigm, r.role,
               e.cat, e.args, e.extra,
               c.op, c.bytes, c.bytes_sent, c.bytes_recv, c.comm, c.members, c.seq, c.wait_ns,
               c.transfer_ns, c.ranks_matched, k.correlation,
               CASE WHEN ({plain}) AND h.head IS NOT NULL AND t.track IS NOT NULL
                         AND abs(i.start_ns + t.delta) < {EXACT_NS} AND i.end_ns - i.start_ns < {EXACT_NS}
                    THEN h.head || t.track || {_us_sql("i.start_ns + t.delta")} || ', "dur": '
                         || {_us_sql("i.end_ns - i.start_ns")} || {tail} END AS encoded
        FROM {_SCOPED}intervals i JOIN regions r USING (region_id)
        LEFT JOIN {_SCOPED}chrome_events e ON e.location_id = i.location_id AND e.idx = i.idx
        LEFT JOIN c ON c.location_id = i.location_id AND c.interval_idx = i.idx
        LEFT JOIN {_SCOPED}correlations k ON k.location_id = i.location_id AND k.idx = i.idx
        LEFT JOIN {_Encoding.TRACKS} t ON t.location_id = i.location_id
        LEFT JOIN {_Encoding.HEADS} h
               ON h.region_id = i.region_id AND h.kind = t.kind AND h.has_op = (c.op IS NOT NULL)
        WHERE i.rank BETWEEN $r0 AND $r1 AND i.end_ns >= $t0 AND i.start_ns <= $t1
        ORDER BY i.rank, i.location_id, i.idx
    """, params=window.params("t0", "t1", r0=ranks[0], r1=ranks[1]))
    yield from rel.to_arrow_reader(ENCODE_BATCH)


_SCOPED = "_dltrace_export_"  # prefix of the temporary views and tables an export makes
SCOPED_TABLES = (INTERVALS, COLLECTIVES, CHROME_EVENTS, CORRELATIONS)


def _store(con: duckdb.DuckDBPyConnection) -> Store | None:
    """The store of the run's tables (the ``tables`` folder ``build_info`` names); None where
    the database does not name one that exists."""
    folder = tables_of(con)
    return Store(folder) if folder and Path(folder).is_dir() else None


def _scope(con: duckdb.DuckDBPyConnection, ranks: tuple[int, int], store: Store | None) -> None:
    """(Re)define temporary views ``_dltrace_export_<table>`` of :data:`SCOPED_TABLES` over the
    files of ranks ``ranks[0]`` to ``ranks[1]`` only in ``store`` (:func:`_store`), for the
    queries of one batch. The run's own views list every rank's files at each query: 0.1 s a
    table and query at 4,096 ranks, which made the export's time grow with the square of the
    ranks. Without a store the views are the run's views."""
    parts = range(ranks[0], ranks[1] + 1)
    con.execute("; ".join(
        store.view_sql(t, parts, f"{_SCOPED}{t.name}", temporary=True) if store is not None
        else f"CREATE OR REPLACE TEMP VIEW {_SCOPED}{t.name} AS SELECT * FROM {t.name}" for t in SCOPED_TABLES))


def _unscope(con: duckdb.DuckDBPyConnection) -> None:
    con.execute("; ".join(f"DROP VIEW IF EXISTS {_SCOPED}{t.name}" for t in SCOPED_TABLES))


ENCODE_BATCH = 50_000  # intervals fetched and encoded at a time
EXACT_NS = 2**52  # below this, DuckDB's decimal of ns / 1000 is the float Python writes (see _us_sql)


def _us_sql(ns: str) -> str:
    """SQL writing the integer ``ns`` as :func:`traceio.chrome.us` and ``json.dumps`` do: whole
    microseconds as an integer, else the decimal with up to three places. Below 2^52 ns the
    nearest float to that decimal has no shorter repr (floats there are closer than 0.001
    apart, and any shorter decimal is at least 0.001 away), so Python writes the same digits."""
    return (f"CASE WHEN ({ns}) % 1000 = 0 THEN (({ns}) // 1000)::VARCHAR "
            f"ELSE CASE WHEN ({ns}) < 0 THEN '-' ELSE '' END || (abs({ns}) // 1000)::VARCHAR || '.' "
            f"|| rtrim(lpad((abs({ns}) % 1000)::VARCHAR, 3, '0'), '0') END")


def _str_sql(text: str) -> str:
    """SQL writing the VARCHAR ``text`` as ``json.dumps`` does when it is printable ASCII
    without quote or backslash (the string in quotes), null as ``null``; any other string gives
    NULL, which leaves the event to Python."""
    return (f"CASE WHEN ({text}) IS NULL THEN 'null' WHEN regexp_full_match({text}, '[ -!#-\\[\\]-~]*') "
            f"THEN '\"' || ({text}) || '\"' END")


# what _dltrace_args writes, in SQL: the merged file's collectives
DLTRACE_ARGS_SQL = ("CASE WHEN c.seq IS NULL THEN '}' ELSE ', \"args\": {\"dltrace\": {' || "
                    + " || ', ' || ".join(
                        f"'\"{k}\": ' || " + (_str_sql(f"c.{k}") if k in ("op", "comm") else f"coalesce(c.{k}::VARCHAR, 'null')")
                        for k in DLTRACE_KEYS) + " || '}}}' END")


class _Encoding:
    """What DuckDB needs to write a plain interval's event itself, temporary tables of ``con``
    until :meth:`close`: per location its track's JSON (``, "pid": P, "tid": T, "ts": ``) and the ns to add
    to its times to make them relative to its file's base; per region, location kind and
    whether a collective op is known, the event's start (``{"ph": "X", "cat": C, "name": N``),
    the category from :func:`_cat`. Every piece is written by ``json.dumps``, so the events are
    the bytes Python would write."""

    TRACKS = f"{_SCOPED}tracks"
    HEADS = f"{_SCOPED}heads"

    def __init__(self, con: duckdb.DuckDBPyConnection, tracks: dict[int, tuple[Any, Any, str, int]]):
        """``tracks``: location -> (pid, tid, kind, ns to add)."""
        self.con = con
        kinds = sorted({kind for _, _, kind, _ in tracks.values() if kind is not None})
        regions = con.execute("SELECT region_id, name, category, paradigm, role FROM regions").fetchall()
        heads: dict[str, list[Any]] = {"region_id": [], "kind": [], "has_op": [], "head": []}
        for region_id, name, category, paradigm, role in regions:
            for kind in kinds:
                for has_op in (False, True):
                    row = {"cat": None, "args": None, "category": category, "paradigm": paradigm,
                           "role": role, "name": name, "op": "" if has_op else None}
                    heads["region_id"].append(region_id)
                    heads["kind"].append(kind)
                    heads["has_op"].append(has_op)
                    heads["head"].append(f'{{"ph": "X", "cat": {json.dumps(_cat(row, kind))}, '
                                         f'"name": {json.dumps(str(name))}')
        locs = list(tracks)
        tracks_table = pa.table({
            "location_id": pa.array(locs, pa.int64()),
            "kind": pa.array([tracks[loc][2] for loc in locs], pa.string()),
            "track": pa.array([f', "pid": {json.dumps(tracks[loc][0])}, "tid": {json.dumps(tracks[loc][1])}, "ts": '
                               for loc in locs], pa.string()),
            "delta": pa.array([tracks[loc][3] for loc in locs], pa.int64())})
        heads_table = pa.table({"region_id": pa.array(heads["region_id"], pa.int64()),
                                "kind": pa.array(heads["kind"], pa.string()),
                                "has_op": pa.array(heads["has_op"], pa.bool_()),
                                "head": pa.array(heads["head"], pa.string())})
        for name, table in ((self.TRACKS, tracks_table), (self.HEADS, heads_table)):
            con.register(f"{name}_arrow", table)
            con.execute(f"CREATE OR REPLACE TEMP TABLE {name} AS SELECT * FROM {name}_arrow")
            con.unregister(f"{name}_arrow")
        # The query's hash joins are built on the tables as the query writes them, the small
        # ones: DuckDB's choice of build side took the 2.3M intervals of a rank of the 10^7
        # archive for three of them (6.2 s against 2.0 s for that rank).
        (self.optimizers,) = con.execute("SELECT current_setting('disabled_optimizers')").fetchone()  # type: ignore[misc]
        con.execute("SET disabled_optimizers = "
                    f"'{','.join(filter(None, [self.optimizers, 'build_side_probe_side']))}'")

    def close(self) -> None:
        _unscope(self.con)
        self.con.execute(f"SET disabled_optimizers = '{self.optimizers}'")
        for name in (self.TRACKS, self.HEADS):
            self.con.execute(f"DROP TABLE IF EXISTS {name}")


def _encoded(batch: pa.RecordBatch, event: Callable[[dict[str, Any]], dict[str, Any]]) -> chrome.Encoded:
    """A batch of :func:`_intervals` as JSON: DuckDB's encoding where it made one, else
    ``json.dumps(event(row))``."""
    encoded = batch.column("encoded")
    texts = encoded.to_pylist()
    if encoded.null_count:
        missing = pc.indices_nonzero(pc.is_null(encoded)).to_pylist()
        for i, row in zip(missing, batch.take(missing).to_pylist(), strict=True):
            texts[i] = json.dumps(event(row))
    return chrome.Encoded(", ".join(texts))


def _cat(row: dict[str, Any], kind: str) -> str:
    if row["cat"] is not None or row["args"] is not None:
        return row["cat"]  # type: ignore[no-any-return]
    category = row["category"]
    if kind == "accelerator_stream":
        if category in (Category.KERNEL, Category.COLLECTIVE) or row["op"] is not None or (
                row["paradigm"] in ACCELERATOR_PARADIGMS and row["role"] in ("function", "kernel")):
            return "kernel"  # (Score-P writes CUDA kernels as functions of paradigm cuda)
        if category == Category.MEMORY:
            return "gpu_memset" if str(row["name"]).startswith("Memset") else "gpu_memcpy"
        return "gpu_user_annotation"
    if category == Category.OVERHEAD:
        return "overhead"
    return "user_annotation" if category in USER_CATEGORIES else "cpu_op"


def _dltrace_args(row: dict[str, Any]) -> dict[str, Any] | None:
    """What we know of a collective, for args.dltrace."""
    if row["seq"] is None:
        return None
    return {k: (int(row[k]) if isinstance(row[k], int | float) and k != "op" else row[k]) for k in DLTRACE_KEYS}


def _step_args(con: duckdb.DuckDBPyConnection, window: Window) -> dict[tuple[int, int], dict[str, Any]]:
    """Per (rank, step), its phases and device phases in their canonical order (so the file
    does not depend on the order DuckDB's threads return them)."""
    out: dict[tuple[int, int], dict[str, Any]] = defaultdict(dict)
    for rank, step, phase, ns in con.execute("""
            SELECT rank, step, phase, duration_ns FROM phases WHERE step >= $a AND step < $b
            ORDER BY rank, step, list_position($order, phase), phase""",
            window.params("a", "b", order=[str(p) for p in PHASES])).fetchall():
        out[(rank, step)].setdefault("phases_ns", {})[phase] = int(ns)
    for rank, step, phase, ns in con.execute("""
            SELECT rank, step, phase, sum(duration_ns) FROM device_phases WHERE step >= $a AND step < $b
            GROUP BY rank, step, phase ORDER BY rank, step, list_position($order, phase), phase""",
            window.params("a", "b", order=[str(p) for p in DEVICE_PHASES])).fetchall():
        out[(rank, step)].setdefault("device_phases_ns", {})[phase] = int(ns)
    return out


def _series_names(con: duckdb.DuckDBPyConnection) -> dict[tuple[int, int, int], str]:
    """(rank, channel, location) -> the counter's name: the member with its unit (``#`` is
    none), made unique within the rank by the channel's scope, then its location, then its id
    (Score-P writes one ``HIP Memory`` per HIP context, for instance)."""
    rows = con.execute("""
        SELECT DISTINCT m.rank, m.channel_id, m.location_id, c.name, c.unit, c.scope_name, l.name
        FROM metrics m JOIN metric_channels c USING (channel_id) JOIN locations l USING (location_id)
        WHERE m.rank IS NOT NULL ORDER BY ALL""").fetchall()
    names = {(r, ch, loc): f"{name} [{unit}]" if unit and unit != "#" else str(name)
             for r, ch, loc, name, unit, _, _ in rows}
    for pick in (lambda scope, loc, ch: scope, lambda scope, loc, ch: loc, lambda scope, loc, ch: f"#{ch}"):
        seen: Counter[tuple[int, str]] = Counter((k[0], n) for k, n in names.items())
        for r, ch, loc, _, _, scope, loc_name in rows:
            key = (r, ch, loc)
            extra = pick(scope, loc_name, ch)
            if seen[(r, names[key])] > 1 and extra:
                names[key] = f"{names[key]} ({extra})"
    return names


def _counters(con: duckdb.DuckDBPyConnection, origin: int, base: int, window: Window) -> list[dict[str, Any]]:
    """Every metric sample as a counter event (``ph`` C) of its rank's process, one counter per
    channel and recording location; and each energy or power series' mean power between two
    samples (the ``power`` table) as a counter ``<name> (power, W)``, set at the earlier sample."""
    names = _series_names(con)
    out: list[dict[str, Any]] = []
    cur = con.execute("""SELECT rank, channel_id, location_id, time_ns, value FROM metrics
                         WHERE rank IS NOT NULL AND value IS NOT NULL AND time_ns BETWEEN $t0 AND $t1
                         ORDER BY rank, channel_id, location_id, time_ns""", window.params("t0", "t1"))
    while rows := cur.fetchmany(50_000):
        for rank, ch, loc, t, value in rows:
            out.append({"ph": "C", "cat": "dltrace.metric", "name": names[(rank, ch, loc)], "pid": rank,
                        "ts": chrome.us(origin + t - base), "args": {"value": value}})
    cur = con.execute("""
        SELECT l.rank, p.channel_id, p.location_id, p.start_ns, p.power_w
        FROM power p JOIN locations l USING (location_id)
        WHERE l.rank IS NOT NULL AND p.power_w IS NOT NULL AND p.start_ns BETWEEN $t0 AND $t1
        ORDER BY ALL""", window.params("t0", "t1"))
    while rows := cur.fetchmany(50_000):
        for rank, ch, loc, t, watts in rows:
            name = names.get((rank, ch, loc))
            if name is not None:
                out.append({"ph": "C", "cat": "dltrace.power", "name": f"{name} (power, W)", "pid": rank,
                            "ts": chrome.us(origin + t - base), "args": {"value": watts}})
    return out


# -- merged: one file, one process per rank --------------------------------------------
def merged(con: duckdb.DuckDBPyConnection, window: Window | None = None
           ) -> tuple[dict[str, Any], Iterator[dict[str, Any] | chrome.Encoded]]:
    """(header, events) of the merged file; the events come as they are read (consume them
    while ``con`` is open)."""
    window = window or Window()
    origin = _origin(con)
    base = origin - origin % 1000
    run_name, ranks_n = con.execute("SELECT run_name, ranks FROM runs").fetchone()  # type: ignore[misc]
    header = {"displayTimeUnit": "ms", "baseTimeNanoseconds": base,
              "otherData": {"exported_by": "dltrace analyze export", "run": run_name, "ranks": ranks_n}}
    return header, _merged_events(con, origin, base, window)


def _merged_events(con: duckdb.DuckDBPyConnection, origin: int, base: int, window: Window
                   ) -> Iterator[dict[str, Any] | chrome.Encoded]:
    events: list[dict[str, Any]] = []  # the metadata, then each rank's slices as they are read
    locations = _locations(con)
    tid_of = {loc["location_id"]: (loc["rank"], int(loc["thread"])) for loc in locations}
    steps_tid: dict[int, int] = {}
    for loc in locations:
        rank = int(loc["rank"])
        if rank not in steps_tid:
            events += [_meta("process_name", rank, 0, name=f"rank {rank}"),
                       _meta("process_sort_index", rank, 0, sort_index=rank)]
        steps_tid[rank] = max(steps_tid.get(rank, 0), int(loc["thread"]) + 1)
        if loc["kind"] == "metric":
            continue  # its samples are the process's counters, not a thread's slices
        events += [_meta("thread_name", rank, int(loc["thread"]), name=str(loc["name"])),
                   _meta("thread_sort_index", rank, int(loc["thread"]), sort_index=int(loc["thread"]))]
    kinds = {loc["location_id"]: loc["kind"] for loc in locations}
    yield from events

    def event(row: dict[str, Any]) -> dict[str, Any]:
        args = json.loads(row["args"]) if row["args"] is not None else None
        extra = _dltrace_args(row)
        if extra is not None:
            args = {**(args or {}), "dltrace": extra}
        s = Slice(row["rank"], tid_of[row["location_id"]][1], str(row["name"]), _cat(row, kinds[row["location_id"]]),
                  origin + int(row["start_ns"]), origin + int(row["end_ns"]), args)
        return chrome.slice_event(s, base)

    encoding = _Encoding(con, {loc: (rank, tid, kinds[loc], origin - base) for loc, (rank, tid) in tid_of.items()})
    store = _store(con)
    try:
        for ranks in _rank_batches(con, sorted(steps_tid)):
            _scope(con, ranks, store)
            for batch in _intervals(con, ranks, window, "e.args IS NULL AND e.cat IS NULL", DLTRACE_ARGS_SQL):
                yield _encoded(batch, event)
    finally:
        encoding.close()
    step_args = _step_args(con, window)
    for rank, tid in steps_tid.items():
        yield _meta("thread_name", rank, tid, name="steps")
        yield _meta("thread_sort_index", rank, tid, sort_index=-1)
    for rank, step, start, end, source in con.execute(
            "SELECT rank, step, start_ns, end_ns, source FROM steps WHERE step >= $a AND step < $b ORDER BY rank, step",
            window.params("a", "b")).fetchall():
        if rank in steps_tid:
            args = {"source": source, **step_args.get((rank, step), {})}
            yield chrome.slice_event(Slice(rank, steps_tid[rank], f"step {step}", "dltrace.step",
                                           origin + start, origin + end, args), base)
    for n, (rank, lloc, lstart, dloc, dstart) in enumerate(con.execute("""
            SELECT rank, launch_location_id, launch_start_ns, location_id, start_ns FROM correlations
            WHERE start_ns BETWEEN $t0 AND $t1 ORDER BY rank, start_ns""", window.params("t0", "t1")).fetchall()):
        yield {"ph": "s", "id": n, "cat": "ac2g", "name": "ac2g", "pid": rank, "tid": tid_of[lloc][1],
               "ts": chrome.us(origin + lstart - base)}
        yield {"ph": "f", "id": n, "cat": "ac2g", "name": "ac2g", "bp": "e", "pid": rank,
               "tid": tid_of[dloc][1], "ts": chrome.us(origin + dstart - base)}
    yield from _counters(con, origin, base, window)


EXPORT_BATCH = 1_000_000  # intervals one query of the merged file reads at most
EXPORT_RANKS = 32  # ranks one query reads at most (its memory grows with its ranks' files)


def _rank_batches(con: duckdb.DuckDBPyConnection, ranks: list[int]) -> list[tuple[int, int]]:
    """``ranks`` (sorted) as ranges of consecutive ranks, at most :data:`EXPORT_RANKS` of
    them and :data:`EXPORT_BATCH` intervals (a rank with more is a range of its own). One
    query per rank took 100 ms each at 1,024 ranks, far more than their rows; one query over
    all of them took 3x the memory (745 MB against 230 MB; 32 ranks: 265 MB)."""
    counts = dict(con.execute("SELECT rank, count(*) FROM intervals GROUP BY rank").fetchall())
    out: list[tuple[int, int]] = []
    rows = 0
    for r in ranks:
        if (out and r == out[-1][1] + 1 and r - out[-1][0] < EXPORT_RANKS
                and rows + counts.get(r, 0) <= EXPORT_BATCH):
            out[-1] = (out[-1][0], r)
            rows += counts.get(r, 0)
        else:
            out.append((r, r))
            rows = counts.get(r, 0)
    return out


def _meta(event: str, pid: Any, tid: Any, **args: Any) -> dict[str, Any]:
    return {"name": event, "ph": "M", "pid": pid, "tid": tid, "args": args}


# -- per rank: Kineto's layout ---------------------------------------------------------
def per_rank(con: duckdb.DuckDBPyConnection, window: Window | None = None
             ) -> Iterator[tuple[int, dict[str, Any], Iterator[dict[str, Any] | chrome.Encoded]]]:
    """(rank, header, events) per rank, in Kineto's layout (see the module docstring); each
    rank's events come as they are read (consume them before the next rank's)."""
    window = window or Window()
    origin = _origin(con)
    files = {int(r): (int(b), json.loads(h), json.loads(o)) for r, b, h, o in con.execute(
        "SELECT rank, base_time_ns, header, other_events FROM chrome_files").fetchall()}
    world = con.execute("SELECT ranks FROM runs").fetchone()[0]  # type: ignore[index]
    locations = _locations(con)
    by_rank: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for loc in locations:
        by_rank[int(loc["rank"])].append(loc)
    track = {loc["location_id"]: _track(loc) for loc in locations}
    kinds = {loc["location_id"]: loc["kind"] for loc in locations}
    ours = origin - origin % 1000  # the base time of the files we make (Kineto's keep theirs)
    base_of = {rank: files[rank][0] if rank in files else ours for rank in by_rank}
    encoding = _Encoding(con, {loc["location_id"]: (*track[loc["location_id"]], loc["kind"],
                                                     origin - base_of[int(loc["rank"])]) for loc in locations})
    store = _store(con)
    try:
        for batch in _rank_batches(con, sorted(by_rank)):
            _scope(con, batch, store)
            made = any(rank not in files for rank in range(batch[0], batch[1] + 1))  # (files keep their flows)
            flows = _flows(con, batch, track, origin, ours, window) if made else {}
            # last: a query on con ends the one before
            rows = _Rows(_intervals(con, batch, window, "e.args IS NULL AND e.cat IS NULL "
                                                        "AND t.kind <> 'accelerator_stream'"))
            for rank in range(batch[0], batch[1] + 1):
                if rank in files:
                    _, header, events = files[rank]
                else:
                    header = {"schemaVersion": 1, "distributedInfo": {"rank": rank, "world_size": world},
                              "displayTimeUnit": "ms", "baseTimeNanoseconds": ours}
                    events = _synthesized_meta(rank, by_rank[rank], track) + flows.get(rank, [])
                slices = _rank_slices(rows.of(rank), track, kinds, origin, base_of.get(rank, ours))
                yield rank, header, itertools.chain(events, slices)
    finally:
        encoding.close()


class _Rows:
    """The batches of a query over several ranks, in rank order, handed out rank by rank
    (rows of earlier ranks left unread are skipped)."""

    def __init__(self, batches: Iterator[pa.RecordBatch]):
        self._batches = batches
        self._next = next(batches, None)

    def of(self, rank: int) -> Iterator[pa.RecordBatch]:
        while self._next is not None:
            ranks = self._next.column("rank").to_numpy()
            lo, hi = np.searchsorted(ranks, [rank, rank + 1])
            if hi > lo:
                yield self._next.slice(lo, hi - lo)
            if hi < len(ranks):  # the rows of later ranks wait for them
                self._next = self._next.slice(hi)
                return
            self._next = next(self._batches, None)


def _rank_slices(batches: Iterator[pa.RecordBatch], track: dict[int, tuple[Any, Any]], kinds: dict[int, str],
                 origin: int, base: int) -> Iterator[chrome.Encoded]:
    def event(row: dict[str, Any]) -> dict[str, Any]:
        loc = row["location_id"]
        pid, tid = track[loc]
        if row["args"] is not None or row["cat"] is not None:
            args = json.loads(row["args"]) if row["args"] is not None else None
            extra = json.loads(row["extra"]) if row["extra"] is not None else None
        else:
            args, extra = _kineto_args(row, kinds[loc], pid, tid), None
        s = Slice(pid, tid, str(row["name"]), _cat(row, kinds[loc]), origin + int(row["start_ns"]),
                  origin + int(row["end_ns"]), args, extra)
        return chrome.slice_event(s, base)

    for batch in batches:
        yield _encoded(batch, event)


def _track(loc: dict[str, Any]) -> tuple[Any, Any]:
    if loc["pid"] is not None:
        return json.loads(loc["pid"]), json.loads(loc["tid"])
    m = STREAM_NAME.fullmatch(str(loc["name"]))
    if loc["kind"] == "accelerator_stream" and m:
        return int(m.group(1)), int(m.group(2))
    return CPU_PID_BASE + int(loc["rank"]), int(loc["thread"])


def _synthesized_meta(rank: int, locs: list[dict[str, Any]], track: dict[int, tuple[Any, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    pids: set[Any] = set()
    for loc in locs:
        pid, tid = track[loc["location_id"]]
        if pid not in pids:
            pids.add(pid)
            gpu = loc["kind"] == "accelerator_stream"
            out += [_meta("process_name", pid, 0, name=f"rank {rank}"),
                    _meta("process_labels", pid, 0, labels=f"GPU {pid}" if gpu else "CPU")]
        out.append(_meta("thread_name", pid, tid, name=str(loc["name"])))
    return out


def _flows(con: duckdb.DuckDBPyConnection, ranks: tuple[int, int], track: dict[int, tuple[Any, Any]],
           origin: int, base: int, window: Window) -> dict[int, list[dict[str, Any]]]:
    """Per rank of ``ranks[0]`` to ``ranks[1]``, its flow arrows from launch to kernel."""
    out: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for rank, cid, lloc, lstart, dloc, dstart in con.execute(f"""
            SELECT rank, correlation, launch_location_id, launch_start_ns, location_id, start_ns
            FROM {_SCOPED}correlations WHERE rank BETWEEN $r0 AND $r1 AND start_ns BETWEEN $t0 AND $t1
            ORDER BY rank, start_ns""", window.params("t0", "t1", r0=ranks[0], r1=ranks[1])).fetchall():
        for ph, loc, t in (("s", lloc, lstart), ("f", dloc, dstart)):
            pid, tid = track[loc]
            e = {"ph": ph, "id": cid, "pid": pid, "tid": tid, "ts": chrome.us(origin + t - base),
                 "cat": "ac2g", "name": "ac2g"}
            if ph == "f":
                e["bp"] = "e"
            out[rank].append(e)
    return out


def _kineto_args(row: dict[str, Any], kind: str, pid: Any, tid: Any) -> dict[str, Any] | None:
    """Args a Kineto reader (ours, HTA) needs on a device event of a non-Kineto trace."""
    if kind != "accelerator_stream":
        return None
    args: dict[str, Any] = {"device": pid, "stream": tid}
    if row["correlation"] is not None:
        args["correlation"] = int(row["correlation"])
    if row["seq"] is not None:  # a collective: its bytes as Byte elements, so they read back
        args["Collective name"] = row["op"]
        if row["bytes_sent"] is not None:
            args.update({"In msg nelems": int(row["bytes_sent"]), "dtype": "Byte"})
        if row["bytes_recv"] is not None:
            args["Out msg nelems"] = int(row["bytes_recv"])
        if row["comm"] is not None:
            members = [int(m) for m in row["members"] or []]
            args.update({"Group size": len(members), "Process Group Name": row["comm"],
                         "Process Group Ranks": str(members)})
    return args
