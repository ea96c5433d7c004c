"""Build a run's tables from its OTF2 archive: Parquet datasets plus a DuckDB database of views.

Layout, for the default database ``RUN/trace.duckdb``::

    RUN/trace.duckdb             views over the Parquet files (and build_info)
    RUN/tables -> .tables/<id>   the current build's tables, one dataset per table:
    RUN/.tables/<id>/intervals/rank=0/*.parquet, ..., RUN/.tables/<id>/regions/*.parquet

Each build writes a new ``<id>`` directory and a temporary database whose views name it;
under a lock it then renames the database into place, moves the ``tables`` link, and removes
the builds before the one it replaced (and those of builds whose process died): a reader of
the database just replaced keeps its files until the next build. An interrupted or failed
build therefore never leaves a half-written database or table, two analyses of the same run
at once each produce a whole one (the last one installed wins), and the database and the
files it views always belong to the same build. A database is reused while it is newer than the archive and
was built by this schema with the same options, and its files are still there; ``force``
rebuilds. Another database path (``db``) keeps its tables beside it, in ``<stem>.tables``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import duckdb
import pandas as pd

from analyze.engine import Engine, make
from analyze.errors import AnalyzeError
from analyze.readers import dispatch, kineto
from analyze.readers.columns import Definitions, ReadStats
from analyze.schema import (
    BY_NAME,
    CAUSE_TABLES,
    COMMUNICATORS,
    LOCATIONS,
    REGIONS,
    SCHEMA_VERSION,
    TABLES,
    Table,
)
from analyze.tables import collectives, metrics, named, pattern_set, stages, steps
from analyze.tables.causes import build_causes
from analyze.tables.energy import build_energy
from analyze.tables.pattern_set import PatternSet
from analyze.tables.regions import explain
from analyze.tables.runpath import DB_NAME, otf2_anchors
from analyze.tables.store import Store
from traceio import chrome

BUILD_INFO = "build_info"
# DuckDB's memory cap while building, per process (the build's own and each Dask worker's);
# it spills to disk beyond. Without one DuckDB takes up to 80% of RAM. DLTRACE_BUILD_MEMORY=4GB
# raises it; "default" leaves DuckDB's own.
DEFAULT_BUILD_MEMORY = "1GB"
T = TypeVar("T")


@dataclass
class RunPaths:
    run_dir: Path
    anchor: Path
    db: Path

    @property
    def name(self) -> str:
        return self.run_dir.name

    @property
    def tables(self) -> Path:
        """The stable name of the tables directory (a link to the current build's)."""
        return self.db.parent / ("tables" if self.db.name == DB_NAME else f"{self.db.stem}.tables")

    @property
    def builds(self) -> Path:
        """Where each build's tables directory lives."""
        return self.db.parent / f".{self.tables.name}"


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
        found = otf2_anchors(path)
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
        return RunPaths(run_dir.resolve(), anchor.resolve(), Path(db).absolute())
    target = run_dir / db_name
    if not os.access(run_dir, os.W_OK):
        # Read-only archives (shared fixtures, someone else's runs): the database and its
        # tables go to the cache.
        key = hashlib.sha256(str(anchor.resolve()).encode()).hexdigest()[:12]
        cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "dltrace" / "analyze"
        cache.mkdir(parents=True, exist_ok=True)
        target = cache / f"{run_dir.name}-{key}.duckdb"
    return RunPaths(run_dir.resolve(), anchor.resolve(), target.absolute())


def _signature(paths: RunPaths, options: dict[str, Any]) -> str:
    """What the database was built from: archive files' sizes and times, options, schema, and
    where it is (its views name their files by absolute path)."""
    files = [paths.anchor, paths.anchor.with_suffix(".def"), paths.run_dir / "run.json"]
    if dispatch.is_chrome(paths.anchor):
        files = kineto.trace_files(paths.anchor)
    stamps = [(str(f.name), f.stat().st_size, f.stat().st_mtime_ns) for f in files if f.exists()]
    return json.dumps({"schema": SCHEMA_VERSION, "files": stamps, "options": options,
                       "at": str(paths.db.parent.resolve())}, sort_keys=True)


def is_current(paths: RunPaths, options: dict[str, Any]) -> bool:
    if not paths.db.exists():
        return False
    try:
        with duckdb.connect(str(paths.db), read_only=True) as con:
            info = dict(con.execute(f"SELECT key, value FROM {BUILD_INFO}").fetchall())
    except duckdb.Error:
        return False
    return info.get("signature") == _signature(paths, options) and Path(info.get("tables", "")).is_dir()


def build(
    run: Path | str,
    *,
    db: Path | str | None = None,
    force: bool = False,
    step_region: str | None = None,
    chunk_rows: int = stages.CHUNK_ROWS,
    reader: str = "auto",
    engine: Engine | Callable[[], Engine] | str | None = None,
    patterns: Path | str | None = None,
    causes: bool = False,
    then: Callable[[duckdb.DuckDBPyConnection], Any] | None = None,
) -> RunPaths:
    """Make sure ``run``'s database and tables exist and are current; return their paths.

    ``reader`` picks the OTF2 reader (auto: native where built, else python) and ``engine``
    where the work runs: ``local`` (the default) or ``dask`` by name, or a function making an
    :class:`~analyze.engine.Engine` (called only if there is work; the engine is closed
    after), or an engine the caller made and closes. Readers and engines give the same
    tables, so neither is part of what makes a database current. ``patterns`` is a TOML file
    of name patterns tried before the defaults (analyze/tables/pattern_set.py); the patterns
    used, defaults included, are part of what makes a database current.
    ``causes`` also fills the cause tables (overlap, delays, critical path, balance;
    docs/causes.md), into an existing current database if need be; without it they may be empty.
    ``then``, when this call builds, is called with the build's own connection once its tables
    are complete, before the database is installed (see :func:`built`); what it raises is
    raised once the database is installed.
    """
    paths = resolve(run, db)
    names = pattern_set.load(patterns)
    options = {"step_region": step_region, "patterns": names.digest()}
    if not force and is_current(paths, options):
        if causes and not has_causes(paths):
            _add_causes(paths)
        return paths
    _check_link(paths)
    paths.builds.mkdir(parents=True, exist_ok=True)
    build_id = f"{time.time_ns():x}-{socket.gethostname()}-{os.getpid()}"
    root = paths.builds / build_id
    tmp = paths.db.with_name(f".{paths.db.name}.tmp-{build_id}")
    tmp.unlink(missing_ok=True)
    failed: Exception | None = None  # raised by ``then``
    config = _build_config()
    own = engine is None or isinstance(engine, str) or not hasattr(engine, "run")
    if engine is None or isinstance(engine, str):
        runner: Engine = make(engine or "local")
    elif own:
        runner = engine()  # type: ignore[operator]
    else:
        runner = engine  # type: ignore[assignment]
    try:
        runner.everywhere(stages.warm, str(root), config.get("memory_limit"))
        t0 = time.perf_counter()
        used, defs = _read_definitions(paths, reader)  # while the instance is made (stages.warm)
        # the driver's database, attached to this process's DuckDB for the build (the local
        # engine's tasks use the same one): one thread, no DuckDB worker to trim this process's
        # heap while the stages run (stages.ONE_THREAD); the causes' queries and the energy's
        # get every core back
        con = stages.attach(str(root), config.get("memory_limit"), tmp)
        try:
            # one transaction: the driver's hundred-odd statements (tables, views, small
            # inserts) commit once, not each on its own (0.4 ms less each); nothing else reads
            # this database before it is installed
            con.execute("BEGIN TRANSACTION")
            _fill(con, paths, root, runner, chunk_rows, step_region, _signature(paths, options),
                  used, defs, config.get("memory_limit"), names, t0)
            con.execute("COMMIT")
            if causes:
                _fill_causes(con)
            if then is not None:
                try:
                    then(con)
                except Exception as e:  # the tables are complete: installed all the same
                    failed = e
        finally:
            stages.detach(str(root), con)
        _install(paths, tmp, root)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        Path(str(tmp) + ".wal").unlink(missing_ok=True)
        shutil.rmtree(root, ignore_errors=True)
        if isinstance(e, duckdb.OutOfMemoryException):
            raise AnalyzeError(f"building {paths.db} ran out of memory ({str(e).splitlines()[0]}); "
                               f"raise DLTRACE_BUILD_MEMORY (now {config.get('memory_limit', 'default')}, e.g. 4GB) or free "
                               "disk space beside the database for DuckDB's spill files") from None
        raise
    finally:
        runner.everywhere(stages.release, str(root))  # (made before the stages: also when they did not run)
        stages.release(str(root))  # the driver's (the local engine's: already released above)
        stages.settle()
        if own:
            runner.close()
    if failed is not None:
        raise failed
    return paths


def read_config() -> dict[str, Any]:
    """The config of the verbs' read-only connections (their queries sort, join and export
    every interval): the build's memory cap, so that DuckDB spills as the build's connection
    does rather than take up to 80% of RAM (`analyze export` of 10^7 events peaked at 2.0 GB
    without it, 1.3 GB with it)."""
    return {k: v for k, v in _build_config().items() if k == "memory_limit"}


def _build_config() -> dict[str, Any]:
    config: dict[str, Any] = {"preserve_insertion_order": False}  # lets DuckDB stream and spill
    memory = os.environ.get("DLTRACE_BUILD_MEMORY") or DEFAULT_BUILD_MEMORY
    if memory.lower() != "default":
        try:
            if memory != DEFAULT_BUILD_MEMORY:  # a size DuckDB accepts: one it can be set to
                duckdb.connect(config={"memory_limit": memory}).close()
        except duckdb.Error:
            raise AnalyzeError(f"DLTRACE_BUILD_MEMORY={memory!r} is not a memory size; "
                               "give one like 2GB or 500MB, or 'default' for DuckDB's own") from None
        config["memory_limit"] = memory
    return config


def _read_definitions(paths: RunPaths, reader: str) -> tuple[str, Definitions]:
    """The reader used and the archive's definitions (saying so when the native reader is not
    built)."""
    notice = dispatch.fallback_notice(reader)
    if notice:
        print(notice, file=sys.stderr)
    with _archive_errors(dispatch.is_chrome(paths.anchor)):
        return dispatch.definitions(paths.anchor, reader)


def _fill(con: duckdb.DuckDBPyConnection, paths: RunPaths, root: Path, engine: Engine, chunk_rows: int,
          step_region: str | None, signature: str, used: str, defs: Definitions, memory: str | None,
          names: PatternSet, t0: float) -> None:
    first_stage = len(engine.stages)  # an engine may have built other runs before
    store = Store(root)
    # Tables the stages do not write start as DuckDB tables and are exported at the end.
    for table in TABLES:
        if table not in stages.STAGE_TABLES:
            con.execute(table.ddl())
    categories = _definitions(con, defs, names)
    _write(con, store, DEFINITIONS)  # the stages read these
    stats, source, read_s, channels = _run_stages(engine, paths, store, defs, used, chunk_rows, step_region,
                                                  memory, con, categories)
    # the builds this one's install would remove go now, while the driver finishes alone and a
    # core is free: beside the read stage, deleting a 10M-event build's files (118 MB) cost a
    # rebuild 50 ms of its 0.66 s. (Until then they take their disk space, as the installed
    # build and the one it replaced do.)
    stages.in_background(_collect_replaced, paths, root)
    stages.fill_empty(con, store, stages.STAGE_TABLES)  # first: each view is made once
    # the stages' tables, and the definitions' (as written for the stages) instead of their tables
    con.execute(";\n".join(f"DROP TABLE {table.name}" for table in DEFINITIONS))
    store.views(con, (*stages.STAGE_TABLES, *DEFINITIONS))
    # from the tables the stages wrote: the channels' sample counts, then energy
    if channels is not None:
        con.execute("RESET threads")  # the energy's joins, over every core
        metrics.fill_channels(con, channels)
    build_energy(con, ours=defs.creator.startswith("dltrace"))
    _run_row(con, paths, defs, stats, used)
    # the tables made above that are still DuckDB's go to Parquet (known here: asking
    # information_schema costs 15 ms); the cause tables stay in the database: the verbs that
    # read them fill them, maybe later
    _export(con, store, tuple(t for t in TABLES if t not in stages.STAGE_TABLES and t not in DEFINITIONS
                              and t not in CAUSE_TABLES))
    # (their views were of no files)
    store.views(con, stages.fill_empty(con, store, tuple(t for t in TABLES if t not in CAUSE_TABLES)))
    con.execute(f"CREATE TABLE {BUILD_INFO} (key VARCHAR, value VARCHAR)")
    _insert(con, BUILD_INFO, [
        ("signature", signature), ("step_source", steps.label(source, step_region)), ("patterns", names.origin),
        *sorted(defs.notes.items()),
        ("unmatched_leaves", str(stats.unmatched_leaves)), ("truncated_intervals", str(stats.truncated)),
        ("unmatched_collective_ends", str(stats.unmatched_collective_ends)), ("tables", str(root)),
        # how the build ran and where its time went (bench/ reads these; not part of the results)
        ("engine", engine.name), ("engine_workers", str(engine.workers)),
        ("stages", json.dumps([dataclasses.asdict(t) for t in engine.stages[first_stage:]])),
        ("read_seconds", f"{read_s:.3f}"), ("derive_seconds", f"{time.perf_counter() - t0 - read_s:.3f}"),
    ])


def _run_stages(engine: Engine, paths: RunPaths, store: Store, defs: Definitions, reader: str,
                chunk_rows: int, step_region: str | None, memory: str | None,
                con: duckdb.DuckDBPyConnection, categories: dict[int, str],
                ) -> tuple[ReadStats, str, float, pd.DataFrame | None]:
    """The stages of analyze/tables/stages.py on ``engine``: stats, step source, read seconds
    and the metric channels (None: none). Between the read stage and the others, what the
    read tasks found of the communication recognized by name goes into ``con``'s regions and
    communicators and their files, and the channels follow from the metrics the samples
    reference."""
    t0 = time.perf_counter()
    plan = stages.plan(defs, reader, engine.workers)
    main_locations, main_regions, step_regions = stages.main_of(defs, categories)
    kinds = [k for (k,) in con.execute("SELECT kind FROM region_patterns").fetchall()]
    spec = stages.Spec(anchor=str(paths.anchor), root=str(store.root), reader=reader,
                       global_offset=defs.global_offset, resolution=defs.resolution,
                       buckets=plan.buckets, chunk_rows=chunk_rows, step_region=step_region,
                       memory=memory, main_locations=main_locations, main_regions=main_regions,
                       step_regions=step_regions,
                       group_starts=plan.group_starts, comm_regions=stages.comm_of(categories, kinds),
                       device_locations=tuple(loc.location_id for loc in defs.locations
                                              if loc.kind == "accelerator_stream" and not loc.is_main),
                       timeline_locations=tuple(loc.location_id for loc in defs.locations
                                                if loc.kind == "timeline" and not loc.is_main))
    stages.prepare_directories(spec)
    if spec.comm_regions:
        spec.work.write(con, stages.REGION_PATTERNS, "SELECT * FROM region_patterns", "data")
    try:
        with _archive_errors(dispatch.is_chrome(paths.anchor)):
            parts = engine.run(f"reading {paths.anchor.name}", stages.read, plan.read,
                               _threads(spec, engine, plan.read),
                               sizes=plan.read_events, unit="events", partial_progress=True)
        read_s = time.perf_counter() - t0
        if spec.comm_regions:
            seen = named.Seen()
            for part in parts:
                if part.named is not None:
                    seen.add(part.named)
            groups = named.groups(seen)
            named.apply(con, groups)
            _write(con, store, (REGIONS, COMMUNICATORS))  # the inferred groups, the waits' operations
            spec = dataclasses.replace(spec, named_groups=tuple(sorted(groups.comm_ids.items())))
        channels = metrics.channels(defs, set().union(*(part.metric_ids for part in parts)))
        if channels is not None:
            con.register("channel_rows", channels)
            spec.work.write(con, stages.CHANNELS, "SELECT * FROM channel_rows", "data")
            con.unregister("channel_rows")
            spec = dataclasses.replace(spec, metrics=True)
        ops = [op for (op,) in con.execute("SELECT DISTINCT pattern_op FROM regions").fetchall()]
        spec = dataclasses.replace(spec, vocabulary=collectives.vocabulary(ops))
        rank_counts = [len(g[1]) for g in plan.groups]
        spec = _threads(spec, engine, plan.groups)
        found = engine.run("matching collectives and steps", stages.prepare, plan.groups, spec,
                           sizes=rank_counts, unit="ranks")
        counts = {s: sum(f.get(s, 0) for f in found) for s in steps.SOURCES}
        source = steps.choose(counts, step_region)
        engine.run("matching across ranks", stages.match, list(range(plan.buckets)),
                   _threads(spec, engine, range(plan.buckets)))
        engine.run("phases", stages.finish, plan.groups, spec, source, sizes=rank_counts, unit="ranks")
    finally:
        engine.everywhere(stages.release, spec.root)
    stages.remove_work(spec)
    stats = ReadStats()
    for part in parts:
        stats.events += part.stats.events
        stats.unmatched_leaves += part.stats.unmatched_leaves
        stats.truncated += part.stats.truncated
        stats.unmatched_collective_ends += part.stats.unmatched_collective_ends
    return stats, source, read_s, channels


def _threads(spec: stages.Spec, engine: Engine, tasks: Sequence[Any]) -> stages.Spec:
    """``spec`` for a stage of ``tasks``: with the DuckDB threads each of them may use (an
    engine of one's own without ``threads_per_task`` leaves DuckDB's default)."""
    per_task = getattr(engine, "threads_per_task", None)
    return dataclasses.replace(spec, threads=per_task(len(tasks)) if per_task is not None else None)


DEFINITIONS = (LOCATIONS, REGIONS, COMMUNICATORS)  # written before the stages (which read them)


def _export(con: duckdb.DuckDBPyConnection, store: Store, tables: tuple[Table, ...]) -> None:
    """DuckDB tables -> Parquet files (partitioned as declared), each replaced by a view; an
    empty one is only dropped (stages.fill_empty gives it its file and view, a tenth of what
    DuckDB's COPY of no rows costs)."""
    exported = []
    for table in tables:
        found = con.execute(f"SELECT EXISTS (SELECT 1 FROM {table.name})").fetchone()
        rows = bool(found and found[0])
        if rows:
            store.write(con, table, f"SELECT * FROM {table.name}", "data")
        con.execute(f"DROP TABLE {table.name}")
        if rows:
            exported.append(table)
    store.views(con, exported)


def _write(con: duckdb.DuckDBPyConnection, store: Store, tables: tuple[Table, ...]) -> None:
    """DuckDB tables -> Parquet files that replace the tables' earlier ones (the tables stay)."""
    for table in tables:
        for old in store.dir(table).glob("*.parquet"):
            old.unlink()
        store.write(con, table, f"SELECT * FROM {table.name}", "data")


def _install(paths: RunPaths, tmp_db: Path, root: Path) -> None:
    """Put a finished build in place (see the module docstring), under the run's build lock."""
    with _locked(paths.builds / "lock"):
        replaced = paths.tables.resolve() if paths.tables.is_symlink() else None
        _check_link(paths)
        (root / INSTALLED).touch()
        os.replace(tmp_db, paths.db)
        link = paths.tables.with_name(f".{paths.tables.name}.tmp-{root.name}")
        link.unlink(missing_ok=True)
        link.symlink_to(Path(paths.builds.name) / root.name)
        os.replace(link, paths.tables)
        # the build just replaced stays until the next one: whoever opened its database a
        # moment ago (another analysis of this run printing its summary) can still read it
        keep = {root.name} | ({replaced.name} if replaced is not None else set())
        gone = _collect(paths.builds, keep)
    _remove(gone)  # (renamed: outside the lock, which other builds' installs wait for)


INSTALLED = ".installed"  # in a build's folder once a database has viewed it


def _collect_replaced(paths: RunPaths, root: Path) -> None:
    """Remove what installing ``root`` would remove (the build the installed one replaced,
    leftovers), chosen and renamed under the build lock: the installed build stays, and a build
    another process installs meanwhile waits for the lock."""
    with _locked(paths.builds / "lock"):
        current = paths.tables.resolve() if paths.tables.is_symlink() else None
        gone = _collect(paths.builds, {root.name} | ({current.name} if current is not None else set()))
    _remove(gone)


def _check_link(paths: RunPaths) -> None:
    if paths.tables.exists() and not paths.tables.is_symlink():
        raise AnalyzeError(f"{paths.tables} exists and is not the link analyze keeps there; "
                           "move it away and analyze again")


def _collect(builds: Path, keep: set[str]) -> list[Path]:
    """The tables of builds no database views any more (installed, then replaced twice), of
    builds whose process on this host is gone without installing them (killed, or crashed
    before cleaning up), and what an earlier removal left: renamed as being removed (no build
    takes them for its own any more), for :func:`_remove`. Called under the build lock."""
    host = socket.gethostname()
    gone = []
    for entry in builds.iterdir():
        if entry.name in keep or not entry.is_dir():
            continue
        work = entry.name.endswith(stages.WORK_REMOVING)  # a build's intermediate rows
        _, _, rest = entry.name.lstrip(".").removesuffix(stages.WORK_REMOVING if work else REMOVING).partition("-")
        owner, _, pid = rest.rpartition("-")
        gone_owner = owner == host and pid.isdigit() and not _alive(int(pid))
        if work and not gone_owner and owner == host:
            continue  # its process is removing them
        if entry.name.endswith(REMOVING) or (entry / INSTALLED).exists() or gone_owner:
            gone.append(entry)
    renamed = []
    for build in gone:
        target = build if build.name.endswith(REMOVING) else build.with_name(build.name + REMOVING)
        try:
            if target != build:
                os.rename(build, target)
        except OSError:  # removed meanwhile by another process's build
            continue
        renamed.append(target)
    return renamed


REMOVING = stages.REMOVING
# A build's tables hold a folder per rank and table: removing those of thousands of ranks takes
# tens of seconds of file system work (a millisecond per entry on our test machine), left to a
# process of its own so that analyze returns at once.
REMOVE_IN_BACKGROUND_RANKS = 64


def _remove(builds: list[Path]) -> None:
    """Delete the builds :func:`_collect` renamed: here, or in a process of its own for many ranks."""
    later = []
    for target in builds:
        try:
            ranks = sum(1 for _ in os.scandir(target / "intervals")) if (target / "intervals").is_dir() else 0
        except OSError:
            continue
        if ranks > REMOVE_IN_BACKGROUND_RANKS:
            later.append(str(target))
        else:
            shutil.rmtree(target, ignore_errors=True)
    if later:
        subprocess.Popen([sys.executable, "-c", "import shutil, sys\nfor p in sys.argv[1:]: shutil.rmtree(p, True)",
                          *later], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@contextlib.contextmanager
def _archive_errors(chrome_json: bool = False) -> Iterator[None]:
    """A reader's error as one sentence, with the last line the OTF2 library printed (for
    Chrome trace JSON, the reader's sentence says what to do)."""
    with c_stderr_captured() as library_said:
        try:
            yield
        except dispatch.ReaderError as e:
            error: Exception | None = e
        else:
            error = None
    if error is not None:
        detail = library_said[0].splitlines()[-1] if library_said and library_said[0] else ""
        hint = "" if chrome_json else \
            " The archive is truncated or corrupt; re-merge it (instrument merge) or copy it again."
        said = f"{error}{' (' + detail + ')' if detail else ''}"
        raise AnalyzeError(f"{said}{'' if said.endswith(('.', '?')) else '.'}{hint}") from None


@contextlib.contextmanager
def c_stderr_captured() -> Iterator[list[str]]:
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


# The cause tables cost about three times the rest of the derivation (bench/README.md, "The
# cause tables"), so `analyze phases` skips them; the verbs that read them, the report and
# analyze.open fill them, once (build_info's causes_seconds says they are filled).
def has_causes(paths: RunPaths) -> bool:
    try:
        with duckdb.connect(str(paths.db), read_only=True) as con:
            return bool(con.execute(f"SELECT 1 FROM {BUILD_INFO} WHERE key = 'causes_seconds'").fetchall())
    except duckdb.Error:
        return False


def _fill_causes(con: duckdb.DuckDBPyConnection) -> None:
    con.execute("RESET threads")  # a build's connection has one (stages.ONE_THREAD)
    t0 = time.perf_counter()
    build_causes(con)
    _insert(con, BUILD_INFO, [("causes_seconds", f"{time.perf_counter() - t0:.3f}")])


def _add_causes(paths: RunPaths) -> None:
    """Fill the cause tables of a current database: on a copy (it holds views and build_info;
    the cause tables are its only tables of rows), put in place under the build lock when
    complete, as a build is (readers never see half of it). If another build was installed
    meanwhile, its database gets them instead."""
    for _ in range(3):
        tmp = paths.db.with_name(f".{paths.db.name}.causes-{socket.gethostname()}-{os.getpid()}")
        try:
            shutil.copyfile(paths.db, tmp)
            with duckdb.connect(str(tmp), config=_build_config()) as con:
                tables = tables_of(con)
                _fill_causes(con)
            with _locked(paths.builds / "lock"):
                with duckdb.connect(str(paths.db), read_only=True) as con:
                    same = tables_of(con) == tables
                if same:
                    os.replace(tmp, paths.db)
                    return
        finally:
            tmp.unlink(missing_ok=True)
            Path(str(tmp) + ".wal").unlink(missing_ok=True)
        if has_causes(paths):
            return


def tables_of(con: duckdb.DuckDBPyConnection) -> str | None:
    """The tables directory a database's views read (build_info; None without one)."""
    if not con.execute(f"SELECT 1 FROM duckdb_tables() WHERE table_name = '{BUILD_INFO}'").fetchone():
        return None
    row = con.execute(f"SELECT value FROM {BUILD_INFO} WHERE key = 'tables'").fetchone()
    return row[0] if row else None


HOLD_RANKS = 64  # above this many ranks, :func:`held` copies a small table into memory
HOLD_ROWS = 2_000_000  # ... if it has at most this many rows


@contextlib.contextmanager
def held(con: duckdb.DuckDBPyConnection, table: str) -> Iterator[None]:
    """``table`` (a small one: steps) copied into a temporary table of ``con`` that the
    queries inside read instead of the view, when the run has more than :data:`HOLD_RANKS`
    ranks and the table at most :data:`HOLD_ROWS` rows: each read of the view opens every
    rank's file (0.3 s at 4,096 ranks), and a report reads the steps five times. Dropped
    after. The copy reads on one thread: on two, 4,096 files of a few rows took 0.8 s and
    210 MB more, on one 0.5 s and 26 MB; it stops past the limit (a long run's steps stay
    where they are)."""
    ((ranks,),) = con.execute("SELECT coalesce(max(ranks), 0) FROM runs").fetchall()
    if ranks <= HOLD_RANKS:
        yield
        return
    ((threads,),) = con.execute("SELECT current_setting('threads')").fetchall()
    con.execute("SET threads = 1")
    try:
        con.execute(f"CREATE OR REPLACE TEMP TABLE {table} AS SELECT * FROM main.{table} LIMIT {HOLD_ROWS + 1}")
        ((rows,),) = con.execute(f"SELECT count(*) FROM temp.{table}").fetchall()
        if rows > HOLD_ROWS:
            con.execute(f"DROP TABLE temp.{table}")
    finally:
        con.execute(f"SET threads = {int(threads)}")
    try:
        yield
    finally:
        con.execute(f"DROP TABLE IF EXISTS temp.{table}")


# Literal rows up to this many are inserted by one statement of parameters: executemany takes
# about half a millisecond a row, and a process's first DataFrame scan 10-15 ms. More (a Kineto
# trace defines thousands of kernel names) go through a DataFrame.
VALUES_ROWS = 200


def _insert(con: duckdb.DuckDBPyConnection, table: str, rows: list[tuple]) -> None:
    """Insert literal rows (each row's values in the table's column order)."""
    if len(rows) > VALUES_ROWS:
        frame = pd.DataFrame(rows, dtype=object)
        frame.columns = [f"c{i}" for i in range(frame.shape[1])]
        con.register("literal_rows", frame)
        con.execute(f"INSERT INTO {table} SELECT * FROM literal_rows")
        con.unregister("literal_rows")
    elif rows:
        row = "(" + ", ".join("?" * len(rows[0])) + ")"
        con.execute(f"INSERT INTO {table} VALUES " + ", ".join([row] * len(rows)), [v for r in rows for v in r])


def _definitions(con: duckdb.DuckDBPyConnection, defs: Definitions, names: PatternSet) -> dict[int, str]:
    """Fill locations, regions (classified), communicators and hosts, and the temporary table
    region_patterns (what the name-only matching needs of each pattern-classified region:
    analyze/tables/named.py); returns each region's category."""
    regions, by_pattern, categories = [], [], {}
    for r in defs.regions:
        c = explain(r.name, r.paradigm, r.role, r.canonical_name, names)
        categories[r.region_id] = str(c.category)
        regions.append((r.region_id, r.name, r.canonical_name, r.paradigm, r.role, str(c.category),
                        r.source_file, r.begin_line, c.match_name, c.op, str(c.rule),
                        c.pattern.label if c.pattern else None, c.pattern.blocking if c.pattern else None))
        if c.pattern is not None:
            by_pattern.append((r.region_id, c.pattern.library, str(c.pattern.kind)))
    con.execute("CREATE TEMP TABLE region_patterns (region_id BIGINT, library VARCHAR, kind VARCHAR)")
    _insert(con, "region_patterns", by_pattern)
    # many through a typed DataFrame (8,192 locations), a few as literal rows
    for table, rows in (
        ("locations", [(x.location_id, x.rank, x.thread, x.name, x.kind, x.is_main, x.events)
                       for x in defs.locations]),
        ("regions", regions),
        ("communicators", [(c.comm_id, c.name, len(c.members), c.members) for c in defs.comms]),
    ):
        if len(rows) <= VALUES_ROWS:
            _insert(con, table, rows)
        else:
            frame = pd.DataFrame(rows, columns=BY_NAME[table].names)
            con.register("definition_rows", frame)
            con.execute(f"INSERT INTO {table} SELECT * FROM definition_rows")
            con.unregister("definition_rows")
    hosts = metrics.host_rows(defs)
    if len(hosts):
        con.register("host_rows", hosts)
        con.execute("INSERT INTO hosts SELECT rank, host FROM host_rows ORDER BY rank")
        con.unregister("host_rows")
    return categories


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


def built(run: Path | str, read: Callable[[duckdb.DuckDBPyConnection], T], **build_options: Any,
          ) -> tuple[RunPaths, T]:
    """The run's paths and ``read`` of its database, built first if need be (:func:`build`'s
    options): on the build's own connection when this call builds it, else on a read-only
    one. A DuckDB instance made only to read what was just built costs 20-30 ms, a tenth of a
    small run's build."""
    out: list[T] = []
    paths = build(run, then=lambda con: out.append(read(con)), **build_options)
    if not out:
        config = read_config()
        with duckdb.connect(str(paths.db), read_only=True, config=config) as con:
            try:
                out.append(read(con))
            except duckdb.OutOfMemoryException as e:
                raise AnalyzeError(f"reading {paths.db} ran out of memory ({str(e).splitlines()[0]}); raise "
                                   f"DLTRACE_BUILD_MEMORY (now {config.get('memory_limit', 'default')}, e.g. 4GB) "
                                   "or free disk space beside the database for DuckDB's spill files") from None
    return paths, out[0]


def connect(run: Path | str, causes: bool = True, **build_options: Any) -> duckdb.DuckDBPyConnection:
    """A read-only DuckDB connection over ``run``'s tables, building them first if needed
    (the cause tables too unless ``causes`` is False)."""
    paths = build(run, causes=causes, **build_options)
    return duckdb.connect(str(paths.db), read_only=True)
