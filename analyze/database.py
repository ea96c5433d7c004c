"""Build a run's DuckDB database from its OTF2 archive: read, load, derive, rename.

The database is written to a temporary file beside its final place and renamed when
complete, so an interrupted or failed build never leaves a half-written database, and two
analyses of the same run at once each produce a whole one (the last rename wins). A database
is reused while it is newer than the archive and was built by this schema with the same
options; ``force`` rebuilds.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import json
import os
import queue
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pandas as pd

from analyze import readers
from analyze.collectives import build_collectives, build_p2p
from analyze.columns import COLLECTIVE_COLUMNS, MESSAGE_COLUMNS, Definitions, ReadStats
from analyze.phases import build_phases
from analyze.regions import classify
from analyze.schema import SCHEMA_VERSION, TABLES
from analyze.steps import build_steps

DB_NAME = "trace.duckdb"
BUILD_INFO = "build_info"
# DuckDB's memory cap while building; it spills to disk beyond. Without one DuckDB takes up to
# 80% of RAM for the derived tables (3.1 GB RSS at 10^8 events, against 1.3 GB and a few seconds
# more with 1GB). DLTRACE_BUILD_MEMORY=4GB raises it; "default" leaves DuckDB's own.
DEFAULT_BUILD_MEMORY = "1GB"
LOAD_THREADS = 2  # connections appending interval rows (two append 1.5-1.6x as fast as one)


class AnalyzeError(Exception):
    """A problem with the user's input: one sentence naming the file and what to do."""

    def __init__(self, message: str, exit_status: int = 1):
        super().__init__(message)
        self.exit_status = exit_status


@dataclass
class RunPaths:
    run_dir: Path
    anchor: Path
    db: Path

    @property
    def name(self) -> str:
        return self.run_dir.name


def resolve(run: Path | str, db: Path | str | None = None) -> RunPaths:
    """Find the OTF2 anchor of ``run`` (a run directory, a Score-P experiment directory or an
    anchor file) and where its database lives."""
    path = Path(run)
    if not path.exists():
        raise AnalyzeError(f"no such run directory or archive: {path}")
    if path.is_file():
        if path.suffix != ".otf2":
            raise AnalyzeError(f"{path} is not an OTF2 anchor file (expected a .otf2 file or a run directory)")
        anchor, run_dir = path, path.parent
    else:
        run_dir = path
        anchor = path / "traces.otf2"
        if not anchor.is_file():
            found = sorted(path.glob("*.otf2"))
            if len(found) != 1:
                what = "no OTF2 archive (no .otf2 anchor file)" if not found else \
                    f"{len(found)} OTF2 archives; name one of them: " + ", ".join(f.name for f in found)
                raise AnalyzeError(f"{path} holds {what}")
            anchor = found[0]
    if db is not None:
        return RunPaths(run_dir.resolve(), anchor.resolve(), Path(db))
    target = run_dir / DB_NAME
    if not os.access(run_dir, os.W_OK):
        # Read-only archives (shared fixtures, someone else's runs): keep the database in the cache.
        key = hashlib.sha256(str(anchor.resolve()).encode()).hexdigest()[:12]
        cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "dltrace" / "analyze"
        cache.mkdir(parents=True, exist_ok=True)
        target = cache / f"{run_dir.name}-{key}.duckdb"
    return RunPaths(run_dir.resolve(), anchor.resolve(), target)


def _signature(paths: RunPaths, options: dict[str, Any]) -> str:
    """What the database was built from: archive files' sizes and times, options, schema."""
    files = [paths.anchor, paths.anchor.with_suffix(".def"), paths.run_dir / "run.json"]
    stamps = [(str(f.name), f.stat().st_size, f.stat().st_mtime_ns) for f in files if f.exists()]
    return json.dumps({"schema": SCHEMA_VERSION, "files": stamps, "options": options}, sort_keys=True)


def is_current(paths: RunPaths, options: dict[str, Any]) -> bool:
    if not paths.db.exists():
        return False
    try:
        with duckdb.connect(str(paths.db), read_only=True) as con:
            row = con.execute(f"SELECT value FROM {BUILD_INFO} WHERE key = 'signature'").fetchone()
    except duckdb.Error:
        return False
    return row is not None and row[0] == _signature(paths, options)


@contextlib.contextmanager
def _c_stderr_captured() -> Iterator[list[str]]:
    """Capture what the OTF2 C library prints on stderr, to fold it into one error message."""
    captured: list[str] = []
    try:
        fd = os.dup(2)
    except OSError:
        yield captured
        return
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield captured
        finally:
            os.dup2(fd, 2)
            os.close(fd)
            tmp.seek(0)
            captured.append(tmp.read().decode(errors="replace").strip())


def build(
    run: Path | str,
    *,
    db: Path | str | None = None,
    force: bool = False,
    step_region: str | None = None,
    chunk_rows: int = 500_000,
    reader: str = "auto",
) -> RunPaths:
    """Make sure ``run``'s database exists and is current; return its paths.

    ``reader`` picks the OTF2 reader (auto: native where built, else python); both give the
    same tables, so it is not part of what makes a database current.
    """
    paths = resolve(run, db)
    options = {"step_region": step_region}
    if not force and is_current(paths, options):
        return paths
    paths.db.parent.mkdir(parents=True, exist_ok=True)
    tmp = paths.db.with_name(f".{paths.db.name}.tmp-{os.getpid()}")
    tmp.unlink(missing_ok=True)
    config = _build_config()
    try:
        with duckdb.connect(str(tmp), config=config) as con:
            _fill(con, paths, chunk_rows, step_region, _signature(paths, options), reader)
        os.replace(tmp, paths.db)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        Path(str(tmp) + ".wal").unlink(missing_ok=True)
        if isinstance(e, duckdb.OutOfMemoryException):
            raise AnalyzeError(f"building {paths.db} ran out of memory ({str(e).splitlines()[0]}); "
                               f"raise DLTRACE_BUILD_MEMORY (now {config.get('memory_limit', 'default')}, e.g. 4GB) or free "
                               "disk space beside the database for DuckDB's spill files") from None
        raise
    return paths


def _build_config() -> dict[str, Any]:
    config: dict[str, Any] = {"preserve_insertion_order": False}  # lets DuckDB stream and spill
    memory = os.environ.get("DLTRACE_BUILD_MEMORY") or DEFAULT_BUILD_MEMORY
    if memory.lower() != "default":
        try:
            duckdb.connect(config={"memory_limit": memory}).close()
        except duckdb.Error:
            raise AnalyzeError(f"DLTRACE_BUILD_MEMORY={memory!r} is not a memory size; "
                               "give one like 2GB or 500MB, or 'default' for DuckDB's own") from None
        config["memory_limit"] = memory
    return config


def _create_tables(con: duckdb.DuckDBPyConnection) -> None:
    for table in TABLES:
        con.execute(table.ddl())
    con.execute(f"CREATE TABLE {BUILD_INFO} (key VARCHAR, value VARCHAR)")
    for name, spec in (("raw_collectives", COLLECTIVE_COLUMNS), ("raw_messages", MESSAGE_COLUMNS)):
        cols = ", ".join(f"{c} {_sql_type(t)}" for c, t in spec.items())
        con.execute(f"CREATE TEMP TABLE {name} ({cols})")


def _sql_type(t: type) -> str:
    return {"int64": "BIGINT", "int32": "INTEGER", "int8": "TINYINT", "bool": "BOOLEAN"}[
        pd.api.types.pandas_dtype(t).name]


def _load(con: duckdb.DuckDBPyConnection, table: str, columns: dict[str, Any]) -> None:
    # DuckDB scans a dict of numpy arrays in place: no per-row Python work, no DataFrame copy.
    if len(next(iter(columns.values()))):
        con.register("chunk_rows", columns)
        con.execute(f"INSERT INTO {table} SELECT * FROM chunk_rows")
        con.unregister("chunk_rows")


class _ChildTime:
    """Per interval row, the summed durations of its direct children (for exclusive_ns).

    Readers emit a row when its instance closes, and an instance closes after every instance
    opened inside it (analyze/columns.py), so all of a row's children come before it, in its
    chunk or an earlier one. Only the sums for parents still open cross chunk boundaries: a
    handful per location, however big the trace.
    """

    def __init__(self) -> None:
        self.pending: dict[tuple[int, int], int] = {}  # (location_id, parent idx) -> ns

    def __call__(self, rows: dict[str, np.ndarray]) -> np.ndarray:
        loc, idx, parent = rows["location_id"], rows["idx"], rows["parent_idx"]
        if not len(loc):
            return np.zeros(0, dtype=np.int64)
        # one int64 key per (location, idx < 2**40): the chunk's few locations numbered densely
        locations, code = np.unique(loc, return_inverse=True)
        key = (code.astype(np.int64) << 40) | idx
        child = parent >= 0
        ckey = (code[child].astype(np.int64) << 40) | parent[child]
        order = np.argsort(ckey, kind="stable")
        ckey = ckey[order]
        first = np.flatnonzero(np.r_[True, ckey[1:] != ckey[:-1]]) if len(ckey) else np.zeros(0, np.int64)
        sums = np.add.reduceat((rows["end_ns"] - rows["start_ns"])[child][order], first) if len(ckey) else \
            np.zeros(0, dtype=np.int64)
        parents = ckey[first]
        out = np.zeros(len(loc), dtype=np.int64)
        used = np.zeros(len(parents), dtype=bool)
        if len(parents):
            pos = np.minimum(np.searchsorted(parents, key), len(parents) - 1)
            hit = parents[pos] == key
            out[hit] = sums[pos[hit]]
            used[pos[hit]] = True
        if self.pending:  # children from earlier chunks
            items = [(lo, p, ns) for (lo, p), ns in self.pending.items()]
            ploc, pidx, psum = (np.array(v, dtype=np.int64) for v in zip(*items, strict=True))
            at = np.minimum(np.searchsorted(locations, ploc), len(locations) - 1)
            pkey = (at.astype(np.int64) << 40) | pidx
            order = np.argsort(key)
            pos = np.minimum(np.searchsorted(key[order], pkey), len(key) - 1)
            found = (locations[at] == ploc) & (key[order][pos] == pkey)
            out[order[pos[found]]] += psum[found]  # an instance closes once: no repeats
            for lo, p in zip(ploc[found].tolist(), pidx[found].tolist(), strict=True):
                del self.pending[(lo, p)]
        for k, ns in zip(parents[~used].tolist(), sums[~used].tolist(), strict=True):
            item = (int(locations[k >> 40]), k & ((1 << 40) - 1))
            self.pending[item] = self.pending.get(item, 0) + ns
        return out


class _IntervalLoader:
    """Inserts interval rows into the ``intervals`` table from worker threads, each with its
    own DuckDB cursor: DuckDB compresses what it appends, and two appending connections go
    about 1.6 times as fast as one. At most two chunks per worker wait, so memory stays bounded.
    (Row order in the table is not a result: queries order what they read.)"""

    def __init__(self, con: duckdb.DuckDBPyConnection, workers: int):
        self._cursors: queue.SimpleQueue[duckdb.DuckDBPyConnection] = queue.SimpleQueue()
        for _ in range(workers):
            self._cursors.put(con.cursor())
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="duckdb-load")
        self._pending: collections.deque[Future] = collections.deque()
        self._limit = 2 * workers
        self.children = _ChildTime()

    def add(self, rows: dict[str, np.ndarray]) -> None:
        if not len(rows["idx"]):
            return
        rows = {**rows, "children_ns": self.children(rows)}  # in arrival order: see _ChildTime
        while len(self._pending) >= self._limit:
            self._pending.popleft().result()
        self._pending.append(self._pool.submit(self._insert, rows))

    def _insert(self, rows: dict[str, np.ndarray]) -> None:
        cur = self._cursors.get()
        try:
            cur.register("chunk_rows", rows)
            cur.execute("""
                INSERT INTO intervals
                SELECT location_id, rank, idx, CASE WHEN parent_idx < 0 THEN NULL ELSE parent_idx END,
                       depth, region_id, start_ns, end_ns, end_ns - start_ns,
                       end_ns - start_ns - children_ns, truncated
                FROM chunk_rows
            """)
            cur.unregister("chunk_rows")
        finally:
            self._cursors.put(cur)

    def close(self) -> None:
        """Wait for every insert; raises the first failure."""
        try:
            while self._pending:
                self._pending.popleft().result()
        finally:
            for f in self._pending:
                f.cancel()
            self._pool.shutdown(wait=True)
            while not self._cursors.empty():
                self._cursors.get().close()


class _Progress:
    """Events read so far, redrawn on one line of the terminal (stderr); silent when stderr
    is not a terminal or the reading ends within half a second."""

    def __init__(self, label: str):
        self.label = label
        self.total = 0
        self.done = 0
        self._t0 = time.monotonic()
        self._drawn = 0.0
        # a duplicate of the terminal, taken before the OTF2 library's stderr is captured
        self._fd = os.dup(2) if os.isatty(2) else None

    def add(self, events: int) -> None:
        self.done += events
        now = time.monotonic()
        if self._fd is None or now - self._t0 < 0.5 or now - self._drawn < 0.2:
            return
        self._drawn = now
        share = f"{100 * self.done / self.total:3.0f}% " if self.total else ""
        line = (f"\r{self.label}: {share}({self.done / 1e6:.1f}M of {self.total / 1e6:.1f}M events, "
                f"{self.done / (now - self._t0) / 1e6:.1f}M/s)")
        os.write(self._fd, line.encode())

    def close(self) -> None:
        if self._fd is not None:
            if self._drawn:
                os.write(self._fd, b"\r\x1b[K")
            os.close(self._fd)
            self._fd = None


def _read(con: duckdb.DuckDBPyConnection, paths: RunPaths, chunk_rows: int,
          reader: str) -> tuple[str, Definitions, ReadStats]:
    stats = ReadStats()
    notice = readers.fallback_notice(reader)
    if notice:
        print(notice, file=sys.stderr)
    progress = _Progress(f"reading {paths.anchor.name}")
    loader = _IntervalLoader(con, LOAD_THREADS)
    with _c_stderr_captured() as library_said:
        try:
            used, defs, chunks = readers.read(paths.anchor, chunk_rows, reader)
            progress.total = sum(loc.events for loc in defs.locations)
            for chunk in chunks:
                loader.add(chunk.intervals)
                _load(con, "raw_collectives", chunk.collectives)
                _load(con, "raw_messages", chunk.messages)
                progress.add(chunk.events)
                if chunk.stats is not None:
                    stats = chunk.stats
        except readers.ReaderError as e:
            error: Exception | None = e
        else:
            error = None
        finally:
            progress.close()
            loader.close()
    if error is not None:
        detail = library_said[0].splitlines()[-1] if library_said and library_said[0] else ""
        hint = " The archive is truncated or corrupt; re-merge it (instrument merge) or copy it again."
        raise AnalyzeError(f"{error}{' (' + detail + ')' if detail else ''}.{hint}") from None
    return used, defs, stats


def _fill(con: duckdb.DuckDBPyConnection, paths: RunPaths, chunk_rows: int,
          step_region: str | None, signature: str, reader: str) -> None:
    t0 = time.perf_counter()
    _create_tables(con)
    used, defs, stats = _read(con, paths, chunk_rows, reader)
    read_s = time.perf_counter() - t0
    _definitions(con, defs)
    build_collectives(con)
    build_p2p(con)
    step_source = build_steps(con, step_region)
    build_phases(con)
    _run_row(con, paths, defs, stats, used)
    _insert(con, BUILD_INFO, [
        ("signature", signature), ("step_source", step_source),
        ("unmatched_leaves", str(stats.unmatched_leaves)), ("truncated_intervals", str(stats.truncated)),
        ("unmatched_collective_ends", str(stats.unmatched_collective_ends)),
        # where the build's time went (bench/ reads these; not part of the results)
        ("read_seconds", f"{read_s:.3f}"), ("derive_seconds", f"{time.perf_counter() - t0 - read_s:.3f}"),
    ])


def _insert(con: duckdb.DuckDBPyConnection, table: str, rows: list[tuple]) -> None:
    """Insert literal rows (DuckDB's executemany rejects an empty list)."""
    if rows:
        con.executemany(f"INSERT INTO {table} VALUES ({', '.join('?' * len(rows[0]))})", rows)


def _definitions(con: duckdb.DuckDBPyConnection, defs: Definitions) -> None:
    _insert(con, "locations", [
        (x.location_id, x.rank, x.thread, x.name, x.kind, x.is_main, x.events) for x in defs.locations])
    _insert(con, "regions", [
        (r.region_id, r.name, r.canonical_name, r.paradigm, r.role,
         str(classify(r.name, r.paradigm, r.role)), r.source_file, r.begin_line) for r in defs.regions])
    _insert(con, "communicators", [(c.comm_id, c.name, len(c.members), c.members) for c in defs.comms])


def _run_row(con: duckdb.DuckDBPyConnection, paths: RunPaths, defs: Definitions, stats: ReadStats,
             reader: str) -> None:
    info = _run_json(paths.run_dir)
    ranks = len({loc.rank for loc in defs.locations})
    duration = int(defs.length_ticks * 1_000_000_000 // defs.resolution) if defs.resolution else None
    realtime = None if defs.realtime_ns is None else pd.Timestamp(defs.realtime_ns, unit="ns", tz="UTC")
    con.execute("INSERT INTO runs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", [
        paths.run_dir.name, str(paths.anchor), defs.creator or None, info.get("framework"), ranks,
        json.dumps(info.get("params", {})), realtime, duration, defs.resolution, defs.global_offset,
        stats.events, info.get("complete"), reader, SCHEMA_VERSION,
    ])


def _run_json(run_dir: Path) -> dict[str, Any]:
    try:
        return json.loads((run_dir / "run.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def connect(run: Path | str, **build_options: Any) -> duckdb.DuckDBPyConnection:
    """A read-only DuckDB connection over ``run``'s tables, building them first if needed."""
    paths = build(run, **build_options)
    return duckdb.connect(str(paths.db), read_only=True)
