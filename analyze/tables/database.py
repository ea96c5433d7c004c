"""Build a run's DuckDB database from its OTF2 archive: read, load, derive, rename.

The database is written to a temporary file beside its final place and renamed when
complete, so an interrupted or failed build never leaves a half-written database, and two
analyses of the same run at once each produce a whole one (the last rename wins). A database
is reused while it is newer than the archive and was built by this schema with the same
options; ``force`` rebuilds.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import pandas as pd

from analyze.errors import AnalyzeError
from analyze.readers import dispatch, kineto
from analyze.readers.columns import (
    COLLECTIVE_COLUMNS,
    MESSAGE_COLUMNS,
    METRIC_COLUMNS,
    Definitions,
    ReadStats,
)
from analyze.schema import SCHEMA_VERSION, TABLES
from analyze.tables import pattern_set
from analyze.tables.causes import build_causes
from analyze.tables.collectives import build_collectives, build_p2p
from analyze.tables.device_phases import build_device_phases
from analyze.tables.energy import build_energy
from analyze.tables.loading import IntervalLoader, Progress, c_stderr_captured, load_columns
from analyze.tables.metrics import build_metrics
from analyze.tables.named import build_named
from analyze.tables.pattern_set import PatternSet
from analyze.tables.phases import build_phases
from analyze.tables.regions import explain
from analyze.tables.steps import build_steps
from traceio import chrome

DB_NAME = "trace.duckdb"
BUILD_INFO = "build_info"
# DuckDB's memory cap while building; it spills to disk beyond. Without one DuckDB takes up to
# 80% of RAM for the derived tables (3.1 GB RSS at 10^8 events, against 1.3 GB and a few seconds
# more with 1GB). DLTRACE_BUILD_MEMORY=4GB raises it; "default" leaves DuckDB's own.
DEFAULT_BUILD_MEMORY = "1GB"
LOAD_THREADS = 2  # connections appending interval rows (two append 1.5-1.6x as fast as one)


@dataclass
class RunPaths:
    run_dir: Path
    anchor: Path
    db: Path

    @property
    def name(self) -> str:
        return self.run_dir.name


def resolve(run: Path | str, db: Path | str | None = None) -> RunPaths:
    """Find the trace of ``run`` (a run directory, a Score-P experiment directory, an OTF2
    anchor file, a directory of per-rank Kineto / Chrome trace JSON files or one such file) and
    where its database lives. A directory's OTF2 archive wins over JSON files beside it."""
    path = Path(run)
    if not path.exists():
        raise AnalyzeError(f"no such run directory or archive: {path}")
    db_name = DB_NAME
    if path.is_file():
        if chrome.is_trace_file(path):  # one Kineto / Chrome trace file: one rank
            db_name = f"{path.name.split('.')[0]}.duckdb"
        elif path.suffix != ".otf2":
            raise AnalyzeError(f"{path} is not an OTF2 anchor file or Chrome trace JSON "
                               "(expected a .otf2 or .json[.gz] file or a run directory)")
        anchor, run_dir = path, path.parent
    else:
        run_dir = path
        anchor = path / "traces.otf2"
        if not anchor.is_file():
            found = sorted(path.glob("*.otf2"))
            if len(found) > 1:
                raise AnalyzeError(f"{path} holds {len(found)} OTF2 archives; name one of them: "
                                   + ", ".join(f.name for f in found))
            if found:
                anchor = found[0]
            elif kineto.trace_files(path):
                anchor = path  # per-rank Kineto / Chrome trace JSON files
            else:
                raise AnalyzeError(f"{path} holds no OTF2 archive (no .otf2 anchor file) and no Chrome "
                                   "trace JSON files (torch.profiler's *.pt.trace.json[.gz])")
    if db is not None:
        return RunPaths(run_dir.resolve(), anchor.resolve(), Path(db))
    target = run_dir / db_name
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
    if dispatch.is_chrome(paths.anchor):
        files = kineto.trace_files(paths.anchor)
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


def build(
    run: Path | str,
    *,
    db: Path | str | None = None,
    force: bool = False,
    step_region: str | None = None,
    chunk_rows: int = 500_000,
    reader: str = "auto",
    patterns: Path | str | None = None,
    causes: bool = False,
) -> RunPaths:
    """Make sure ``run``'s database exists and is current; return its paths.

    ``reader`` picks the OTF2 reader (auto: native where built, else python); both give the
    same tables, so it is not part of what makes a database current. ``patterns`` is a TOML
    file of name patterns tried before the defaults (analyze/tables/pattern_set.py); the
    patterns used, defaults included, are part of what makes a database current. ``causes``
    also fills the cause tables (overlap, delays, critical path, balance; docs/causes.md),
    into an existing current database if need be; without it they may be empty.
    """
    paths = resolve(run, db)
    names = pattern_set.load(patterns)
    options = {"step_region": step_region, "patterns": names.digest()}
    if not force and is_current(paths, options):
        if causes and not has_causes(paths):
            _add_causes(paths)
        return paths
    paths.db.parent.mkdir(parents=True, exist_ok=True)
    tmp = paths.db.with_name(f".{paths.db.name}.tmp-{os.getpid()}")
    tmp.unlink(missing_ok=True)
    config = _build_config()
    try:
        with duckdb.connect(str(tmp), config=config) as con:
            _fill(con, paths, chunk_rows, step_region, _signature(paths, options), reader, names)
            if causes:
                _fill_causes(con)
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
    for name, spec in (("raw_collectives", COLLECTIVE_COLUMNS), ("raw_messages", MESSAGE_COLUMNS),
                       ("raw_metrics", METRIC_COLUMNS)):
        cols = ", ".join(f"{c} {_sql_type(t)}" for c, t in spec.items())
        con.execute(f"CREATE TEMP TABLE {name} ({cols})")


def _sql_type(t: type) -> str:
    return {"int64": "BIGINT", "int32": "INTEGER", "int8": "TINYINT", "bool": "BOOLEAN", "float64": "DOUBLE"}[
        pd.api.types.pandas_dtype(t).name]


def _read(con: duckdb.DuckDBPyConnection, paths: RunPaths, chunk_rows: int,
          reader: str) -> tuple[str, Definitions, ReadStats]:
    stats = ReadStats()
    notice = dispatch.fallback_notice(reader)
    if notice:
        print(notice, file=sys.stderr)
    progress = Progress(f"reading {paths.anchor.name}")
    loader = IntervalLoader(con, LOAD_THREADS)
    with c_stderr_captured() as library_said:
        try:
            used, defs, chunks = dispatch.read(paths.anchor, chunk_rows, reader)
            progress.total = sum(loc.events for loc in defs.locations)
            for chunk in chunks:
                loader.add(chunk.intervals)
                load_columns(con, "raw_collectives", chunk.collectives)
                load_columns(con, "raw_messages", chunk.messages)
                load_columns(con, "raw_metrics", chunk.metrics)
                for table, columns in chunk.tables.items():
                    load_columns(con, table, columns)
                progress.add(chunk.events)
                if chunk.stats is not None:
                    stats = chunk.stats
        except dispatch.ReaderError as e:
            error: Exception | None = e
        else:
            error = None
        finally:
            progress.close()
            loader.close()
    if error is not None:
        detail = library_said[0].splitlines()[-1] if library_said and library_said[0] else ""
        hint = "" if dispatch.is_chrome(paths.anchor) else \
            " The archive is truncated or corrupt; re-merge it (instrument merge) or copy it again."
        raise AnalyzeError(f"{error}{' (' + detail + ')' if detail else ''}.{hint}") from None
    return used, defs, stats


def _fill(con: duckdb.DuckDBPyConnection, paths: RunPaths, chunk_rows: int,
          step_region: str | None, signature: str, reader: str, names: PatternSet) -> None:
    t0 = time.perf_counter()
    _create_tables(con)
    used, defs, stats = _read(con, paths, chunk_rows, reader)
    read_s = time.perf_counter() - t0
    _definitions(con, defs, names)
    build_named(con)
    build_collectives(con)
    build_p2p(con)
    step_source = build_steps(con, step_region)
    build_phases(con)
    build_device_phases(con)
    build_metrics(con, defs)
    build_energy(con, ours=defs.creator.startswith("dltrace"))
    _run_row(con, paths, defs, stats, used)
    _insert(con, BUILD_INFO, [
        ("signature", signature), ("step_source", step_source), ("patterns", names.origin), *sorted(defs.notes.items()),
        ("unmatched_leaves", str(stats.unmatched_leaves)), ("truncated_intervals", str(stats.truncated)),
        ("unmatched_collective_ends", str(stats.unmatched_collective_ends)),
        # where the build's time went (bench/ reads these; not part of the results)
        ("read_seconds", f"{read_s:.3f}"), ("derive_seconds", f"{time.perf_counter() - t0 - read_s:.3f}"),
    ])


# The cause tables cost about as much again as the rest of the derivation (bench/README.md),
# so `analyze phases` skips them; the verbs that read them, the report and analyze.open fill
# them, once (build_info's causes_seconds says they are filled).
def has_causes(paths: RunPaths) -> bool:
    try:
        with duckdb.connect(str(paths.db), read_only=True) as con:
            return bool(con.execute(f"SELECT 1 FROM {BUILD_INFO} WHERE key = 'causes_seconds'").fetchall())
    except duckdb.Error:
        return False


def _fill_causes(con: duckdb.DuckDBPyConnection) -> None:
    t0 = time.perf_counter()
    build_causes(con)
    _insert(con, BUILD_INFO, [("causes_seconds", f"{time.perf_counter() - t0:.3f}")])


def _add_causes(paths: RunPaths) -> None:
    """Fill the cause tables of a current database: on a copy, renamed over it when
    complete, as the database is built (readers never see half of it)."""
    tmp = paths.db.with_name(f".{paths.db.name}.tmp-{os.getpid()}")
    try:
        shutil.copyfile(paths.db, tmp)
        with duckdb.connect(str(tmp), config=_build_config()) as con:
            _fill_causes(con)
        os.replace(tmp, paths.db)
    finally:
        tmp.unlink(missing_ok=True)
        Path(str(tmp) + ".wal").unlink(missing_ok=True)


def _insert(con: duckdb.DuckDBPyConnection, table: str, rows: list[tuple]) -> None:
    """Insert literal rows (DuckDB's executemany rejects an empty list, and takes about half a
    millisecond a row: a Kineto trace defines thousands of kernel names)."""
    if len(rows) > 100:
        frame = pd.DataFrame(rows, dtype=object)
        frame.columns = [f"c{i}" for i in range(frame.shape[1])]
        con.register("literal_rows", frame)
        con.execute(f"INSERT INTO {table} SELECT * FROM literal_rows")
        con.unregister("literal_rows")
    elif rows:
        con.executemany(f"INSERT INTO {table} VALUES ({', '.join('?' * len(rows[0]))})", rows)


def _definitions(con: duckdb.DuckDBPyConnection, defs: Definitions, names: PatternSet) -> None:
    _insert(con, "locations", [
        (x.location_id, x.rank, x.thread, x.name, x.kind, x.is_main, x.events) for x in defs.locations])
    rows, by_pattern = [], []
    for r in defs.regions:
        c = explain(r.name, r.paradigm, r.role, r.canonical_name, names)
        rows.append((r.region_id, r.name, r.canonical_name, r.paradigm, r.role, str(c.category), r.source_file,
                     r.begin_line, c.match_name, c.op, str(c.rule), c.pattern.label if c.pattern else None))
        if c.pattern is not None:
            by_pattern.append((r.region_id, c.pattern.library, str(c.pattern.kind), c.pattern.blocking))
    _insert(con, "regions", rows)
    # what the name-only matching needs of each pattern-classified region (analyze/tables/named.py)
    con.execute("CREATE TEMP TABLE region_patterns (region_id BIGINT, library VARCHAR, kind VARCHAR, blocking BOOLEAN)")
    _insert(con, "region_patterns", by_pattern)
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


def connect(run: Path | str, causes: bool = True, **build_options: Any) -> duckdb.DuckDBPyConnection:
    """A read-only DuckDB connection over ``run``'s tables, building them first if needed
    (the cause tables too unless ``causes`` is False)."""
    paths = build(run, causes=causes, **build_options)
    return duckdb.connect(str(paths.db), read_only=True)
