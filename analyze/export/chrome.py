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
"""

from __future__ import annotations

import itertools
import json
import re
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

from analyze.errors import AnalyzeError
from analyze.schema import Category
from analyze.tables.device_phases import ACCELERATOR_PARADIGMS
from traceio import chrome
from traceio.chrome import Slice

STREAM_NAME = re.compile(r"GPU (-?\d+) stream (-?\d+)")
CPU_PID_BASE = 1_000_000  # pid of a rank's CPU threads in per-rank files of non-Kineto traces
USER_CATEGORIES = {Category.STEP, Category.TAIL, Category.FORWARD, Category.BACKWARD, Category.OPTIMIZER,
                   Category.DATALOADER, Category.USER, Category.WAIT, Category.COLLECTIVE, Category.P2P}


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


def _intervals(con: duckdb.DuckDBPyConnection, ranks: tuple[int, int], window: Window
               ) -> Iterator[dict[str, Any]]:
    """The intervals of ranks ``ranks[0]`` to ``ranks[1]`` overlapping the window in (rank,
    location, idx) order, with what an event needs."""
    cur = con.execute("""
        WITH c AS (
            SELECT c.location_id, c.interval_idx, any_value(c.op) AS op, any_value(c.bytes) AS bytes,
                   any_value(c.bytes_sent) AS bytes_sent, any_value(c.bytes_recv) AS bytes_recv,
                   any_value(m.name) AS comm, any_value(m.members) AS members, any_value(c.seq) AS seq,
                   any_value(c.wait_ns) AS wait_ns, any_value(c.transfer_ns) AS transfer_ns,
                   any_value(c.ranks_matched) AS ranks_matched
            FROM collectives c LEFT JOIN communicators m USING (comm_id)
            WHERE c.rank BETWEEN $r0 AND $r1 GROUP BY c.location_id, c.interval_idx)
        SELECT i.rank, i.location_id, i.idx, i.start_ns, i.end_ns, r.name, r.category, r.paradigm, r.role,
               e.cat, e.args, e.extra,
               c.op, c.bytes, c.bytes_sent, c.bytes_recv, c.comm, c.members, c.seq, c.wait_ns,
               c.transfer_ns, c.ranks_matched, k.correlation
        FROM intervals i JOIN regions r USING (region_id)
        LEFT JOIN chrome_events e ON e.location_id = i.location_id AND e.idx = i.idx
        LEFT JOIN c ON c.location_id = i.location_id AND c.interval_idx = i.idx
        LEFT JOIN correlations k ON k.location_id = i.location_id AND k.idx = i.idx
        WHERE i.rank BETWEEN $r0 AND $r1 AND i.end_ns >= $t0 AND i.start_ns <= $t1
        ORDER BY i.rank, i.location_id, i.idx
    """, window.params("t0", "t1", r0=ranks[0], r1=ranks[1]))
    names = [d[0] for d in cur.description]
    while rows := cur.fetchmany(50_000):
        for row in rows:
            yield dict(zip(names, row, strict=True))


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
    keys = ("op", "bytes", "bytes_sent", "bytes_recv", "comm", "seq", "wait_ns", "transfer_ns", "ranks_matched")
    return {k: (int(row[k]) if isinstance(row[k], int | float) and k != "op" else row[k]) for k in keys}


def _step_args(con: duckdb.DuckDBPyConnection, window: Window) -> dict[tuple[int, int], dict[str, Any]]:
    out: dict[tuple[int, int], dict[str, Any]] = defaultdict(dict)
    for rank, step, phase, ns in con.execute("""SELECT rank, step, phase, duration_ns FROM phases
                                                WHERE step >= $a AND step < $b""", window.params("a", "b")).fetchall():
        out[(rank, step)].setdefault("phases_ns", {})[phase] = int(ns)
    for rank, step, phase, ns in con.execute("""
            SELECT rank, step, phase, sum(duration_ns) FROM device_phases WHERE step >= $a AND step < $b
            GROUP BY ALL""", window.params("a", "b")).fetchall():
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
           ) -> tuple[dict[str, Any], Iterator[dict[str, Any]]]:
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
                   ) -> Iterator[dict[str, Any]]:
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
    for ranks in _rank_batches(con, sorted(steps_tid)):
        for row in _intervals(con, ranks, window):
            rank = row["rank"]
            args = json.loads(row["args"]) if row["args"] is not None else None
            extra = _dltrace_args(row)
            if extra is not None:
                args = {**(args or {}), "dltrace": extra}
            s = Slice(rank, tid_of[row["location_id"]][1], str(row["name"]), _cat(row, kinds[row["location_id"]]),
                      origin + int(row["start_ns"]), origin + int(row["end_ns"]), args)
            yield chrome.slice_event(s, base)
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
             ) -> Iterator[tuple[int, dict[str, Any], Iterator[dict[str, Any]]]]:
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
    for batch in _rank_batches(con, sorted(by_rank)):
        flows = _flows(con, batch, track, origin, ours, window)
        rows = _Rows(_intervals(con, batch, window))  # last: a query on con ends the one before
        for rank in range(batch[0], batch[1] + 1):
            if rank in files:
                base, header, events = files[rank]
            else:
                base = ours
                header = {"schemaVersion": 1, "distributedInfo": {"rank": rank, "world_size": world},
                          "displayTimeUnit": "ms", "baseTimeNanoseconds": base}
                events = _synthesized_meta(rank, by_rank[rank], track) + flows.get(rank, [])
            yield rank, header, itertools.chain(events, _rank_slices(rows.of(rank), track, kinds, origin, base))


class _Rows:
    """The rows of a query over several ranks, in rank order, handed out rank by rank (rows
    of earlier ranks left unread are skipped)."""

    def __init__(self, rows: Iterator[dict[str, Any]]):
        self._rows = rows
        self._next = next(rows, None)

    def of(self, rank: int) -> Iterator[dict[str, Any]]:
        while self._next is not None and self._next["rank"] <= rank:
            row, self._next = self._next, next(self._rows, None)
            if row["rank"] == rank:
                yield row


def _rank_slices(rows: Iterator[dict[str, Any]], track: dict[int, tuple[Any, Any]], kinds: dict[int, str],
                 origin: int, base: int) -> Iterator[dict[str, Any]]:
    for row in rows:
        loc = row["location_id"]
        pid, tid = track[loc]
        if row["args"] is not None or row["cat"] is not None:
            args = json.loads(row["args"]) if row["args"] is not None else None
            extra = json.loads(row["extra"]) if row["extra"] is not None else None
        else:
            args, extra = _kineto_args(row, kinds[loc], pid, tid), None
        s = Slice(pid, tid, str(row["name"]), _cat(row, kinds[loc]), origin + int(row["start_ns"]),
                  origin + int(row["end_ns"]), args, extra)
        yield chrome.slice_event(s, base)


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
    for rank, cid, lloc, lstart, dloc, dstart in con.execute("""
            SELECT rank, correlation, launch_location_id, launch_start_ns, location_id, start_ns
            FROM correlations WHERE rank BETWEEN $r0 AND $r1 AND start_ns BETWEEN $t0 AND $t1
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
