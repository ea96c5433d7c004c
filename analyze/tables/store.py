"""Where a run's tables live: Parquet datasets, one directory per table, and the SQL to read
and write them.

A table flagged ``partition_by`` in :mod:`analyze.schema` (the per-rank ones) is split
hive-style, ``<root>/<table>/rank=N/*.parquet``, so DuckDB, Spark, pandas or any Parquet
reader sees one dataset per table, and a task writes or reads one rank's rows without the
others'. Other tables are one directory of files, ``<root>/<table>/*.parquet``. The partition
column is in the directory names, not in the files (the hive convention). Every file of a
table has the schema's column types, so readers need no type inference.

The build's intermediate tables (raw reader rows, the shuffle's buckets) use the same layout
under ``<root>/_work/``, with their own :class:`~analyze.schema.Table` declarations.
"""

from __future__ import annotations

import glob
import os
import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import numpy as np

from analyze.schema import Column, Table
from traceio import codec

WORK = "_work"
# Parquet 2 encodings (delta-coded integers: times, ids and counters shrink to a few bits) with
# zstd; no dictionaries (the dictionary attempts cost more than they save on such columns).
# On 10M events: half the CPU time of DuckDB's default writer, a tenth of the size.
FORMAT = "FORMAT parquet, PARQUET_VERSION v2, COMPRESSION zstd, DICTIONARY_SIZE_LIMIT 1"
# Above this many partitions in one batch of rows, one partitioned COPY beats one COPY each.
SPLIT_COPIES = 16


def sql_type(dtype: Any) -> str:
    """The DuckDB type of a numpy column."""
    return {"int64": "BIGINT", "int32": "INTEGER", "int8": "TINYINT", "bool": "BOOLEAN",
            "float64": "DOUBLE", "object": "VARCHAR"}[np.dtype(dtype).name]


def table_of(name: str, columns: Mapping[str, Any], partition_by: str | None = None) -> Table:
    """A Table declaration for intermediate rows given as column name -> numpy dtype."""
    return Table(name, "", tuple(Column(c, sql_type(t), "") for c, t in columns.items()), partition_by)


def literal(path: Path | str) -> str:
    return "'" + str(path).replace("'", "''") + "'"


@dataclass(frozen=True)
class Codes:
    """A text column as codes into ``names`` (negative: NULL), as :meth:`Store.write_arrays`
    writes VARCHAR columns; sliced and indexed like the numpy column of its codes."""

    codes: np.ndarray
    names: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.codes)

    def __getitem__(self, index: Any) -> Codes:
        return Codes(self.codes[index], self.names)

    def strings(self) -> np.ndarray:
        """The text itself (None where NULL)."""
        names = np.array([*self.names, None], dtype=object)
        return names[np.where(self.codes < 0, len(self.names), self.codes)]


class Store:
    """The Parquet datasets under ``root`` (a tables directory)."""

    def __init__(self, root: Path | str):
        self.root = Path(root)

    def dir(self, table: Table) -> Path:
        return self.root / table.name

    def files(self, table: Table, parts: Iterable[int] | None = None) -> list[str]:
        """Glob patterns, relative to the root, of the table's files (only of partitions
        ``parts`` when given), for the partitions that hold any."""
        base = self.dir(table)
        if table.partition_by is None:
            return [f"{table.name}/*.parquet"] if _any_parquet(base) else []
        if parts is None:
            return [f"{table.name}/*/*.parquet"] if base.is_dir() and any(
                _any_parquet(d) for d in base.iterdir()) else []
        return [f"{table.name}/{table.partition_by}={p}/*.parquet" for p in parts
                if _any_parquet(base / f"{table.partition_by}={p}")]

    def source(self, *patterns: str) -> str | None:
        """What read_parquet reads for the glob ``patterns`` (relative to the root): the
        patterns, or the files they match if the root's own path holds glob characters
        (DuckDB would take them for a pattern); None when nothing matches."""
        root = str(self.root)
        if any(c in root for c in "*?[]{}"):
            files = sorted(f for p in patterns for f in glob.glob(glob.escape(root) + "/" + p))
            return "[" + ", ".join(literal(f) for f in files) + "]" if files else None
        if not any(glob.glob(glob.escape(root) + "/" + p) for p in patterns):
            return None
        return "[" + ", ".join(literal(f"{root}/{p}") for p in patterns) + "]"

    def scan(self, table: Table, parts: Iterable[int] | None = None) -> str:
        """A SELECT over the table's files with the declared column types, in declaration
        order; an empty relation of those types when there are no files."""
        files = self.source(*self.files(table, parts))
        cols = ", ".join(f"CAST({c.name} AS {c.type}) AS {c.name}" for c in table.columns)
        if files is None:
            empty = ", ".join(f"CAST(NULL AS {c.type}) AS {c.name}" for c in table.columns)
            return f"SELECT {empty} LIMIT 0"
        hive = ", hive_partitioning = true" if table.partition_by else ", hive_partitioning = false"
        return f"SELECT {cols} FROM read_parquet({files}{hive})"

    def view(self, con: duckdb.DuckDBPyConnection, table: Table, parts: Iterable[int] | None = None,
             name: str | None = None, temporary: bool = False) -> None:
        """(Re)define a view named after the table over its files."""
        con.execute(self.view_sql(table, parts, name, temporary))

    def view_sql(self, table: Table, parts: Iterable[int] | None = None, name: str | None = None,
                 temporary: bool = False) -> str:
        """The statement :meth:`view` runs: several of them run as one call cost less each."""
        temp = "TEMP " if temporary else ""
        return f"CREATE OR REPLACE {temp}VIEW {name or table.name} AS {self.scan(table, parts)}"

    def write(self, con: duckdb.DuckDBPyConnection, table: Table, select: str, tag: str,
              parts: list[int] | None = None) -> None:
        """Write the rows of ``select`` (the table's columns, by name) as new files of the
        table named after ``tag`` (unique per writer: files are never overwritten by another
        writer's). Partitioned tables get one file per partition present in the rows; given
        the few ``parts`` the rows can be in, one query per part writes them."""
        cols = ", ".join(f"CAST({c.name} AS {c.type}) AS {c.name}" for c in table.columns)
        base = self.dir(table)
        base.mkdir(parents=True, exist_ok=True)
        if table.partition_by is not None and parts is not None and len(parts) == 1:
            stored = ", ".join(f"CAST({c.name} AS {c.type}) AS {c.name}" for c in table.columns
                               if c.name != table.partition_by)
            target = base / f"{table.partition_by}={parts[0]}"
            target.mkdir(exist_ok=True)
            con.execute(f"COPY (SELECT {stored} FROM ({select}) WHERE {table.partition_by} = {int(parts[0])}) "
                        f"TO {literal(target / f'{tag}.parquet')} ({FORMAT})")
            return
        if table.partition_by is not None and parts is not None and len(parts) <= SPLIT_COPIES:
            stored = ", ".join(f"CAST({c.name} AS {c.type}) AS {c.name}" for c in table.columns
                               if c.name != table.partition_by)
            con.execute(f"CREATE OR REPLACE TEMP TABLE written AS {select}")
            try:
                for part in parts:
                    target = base / f"{table.partition_by}={part}"
                    target.mkdir(exist_ok=True)
                    con.execute(f"COPY (SELECT {stored} FROM written WHERE {table.partition_by} = {int(part)}) "
                                f"TO {literal(target / f'{tag}.parquet')} ({FORMAT})")
            finally:
                con.execute("DROP TABLE written")
            return
        if table.partition_by is None:
            con.execute(f"COPY (SELECT {cols} FROM ({select})) TO {literal(base / f'{tag}.parquet')} ({FORMAT})")
            return
        con.execute(f"""COPY (SELECT {cols} FROM ({select})) TO {literal(base)}
                        ({FORMAT}, PARTITION_BY ({table.partition_by}),
                         FILENAME_PATTERN {literal(tag + '_{i}')}, OVERWRITE_OR_IGNORE)""")

    def write_columns(self, con: duckdb.DuckDBPyConnection, table: Table, columns: Mapping[str, np.ndarray],
                      tag: str, select: str = "SELECT * FROM {rows}") -> None:
        """Write numpy columns (DuckDB scans them in place) as files of ``table``, through
        ``select`` (which names them ``{rows}``). A few partitions are written one file each
        from slices of the columns, which costs half as much as DuckDB's partitioned COPY."""
        key = table.partition_by
        name = f"rows_{threading.get_ident()}"
        cols = ", ".join(f"CAST({c.name} AS {c.type}) AS {c.name}" for c in table.columns
                         if c.name != key)
        for part, rows in _split(columns, key):
            con.register(name, rows)
            try:
                query = select.format(rows=name)
                if part is None:
                    self.write(con, table, query, tag)
                else:
                    target = self.dir(table) / f"{key}={part}"
                    target.mkdir(parents=True, exist_ok=True)
                    con.execute(f"COPY (SELECT {cols} FROM ({query})) TO "
                                f"{literal(target / f'{tag}.parquet')} ({FORMAT})")
            finally:
                con.unregister(name)

    def write_arrays(self, con: duckdb.DuckDBPyConnection, table: Table, columns: Mapping[str, np.ndarray | Codes],
                     tag: str, nullable: frozenset[str] = frozenset()) -> None:
        """Write numpy columns that are exactly the table's (integers and booleans, text as
        :class:`Codes`; negative values and codes of ``nullable`` columns are NULL) with the
        codec's Parquet writer, which takes a tenth of DuckDB's time; through DuckDB where the
        codec is not built."""
        native = codec.native()
        if native is None or any(c.type not in _ARRAY_KINDS for c in table.columns):
            plain = {k: v.strings() if isinstance(v, Codes) else v for k, v in columns.items()}
            nulls = {c: f"CASE WHEN {c} < 0 THEN NULL ELSE {c} END AS {c}" for c in nullable
                     if not isinstance(columns[c], Codes)}
            select = "SELECT " + ", ".join(nulls.get(c.name, c.name) for c in table.columns) + " FROM {rows}"
            self.write_columns(con, table, plain, tag, select)
            return
        key = table.partition_by
        for part, rows in _split(columns, key, limit=None):
            target = self.dir(table) if part is None else self.dir(table) / f"{key}={part}"
            target.mkdir(parents=True, exist_ok=True)
            spec: list[tuple[Any, ...]] = []
            for c in table.columns:
                if c.name == key:
                    continue
                values = rows[c.name]
                if isinstance(values, Codes):
                    spec.append((c.name, "text", np.ascontiguousarray(values.codes, dtype=np.int32),
                                 c.name in nullable, values.names))
                else:
                    kind = _ARRAY_KINDS[c.type]
                    spec.append((c.name, kind, np.ascontiguousarray(values, dtype=kind), c.name in nullable))
            native.write_parquet(str(target / f"{tag}.parquet"), spec, CREATED_BY)

    def write_empty(self, con: duckdb.DuckDBPyConnection, table: Table) -> None:
        """One file of the table's columns and no rows (in ``rank=0/`` for a table partitioned
        by rank), every column nullable as DuckDB's would be: written by the codec where it
        writes every column type (tens of microseconds), else by DuckDB (2-3 ms)."""
        base = self.dir(table) / (f"{table.partition_by}=0" if table.partition_by else "")
        base.mkdir(parents=True, exist_ok=True)
        cols = [c for c in table.columns if c.name != table.partition_by]
        native = codec.native()
        if native is not None and all(c.type in _EMPTY_KINDS for c in cols):
            spec = []
            for c in cols:
                kind = _EMPTY_KINDS[c.type]
                text = kind in _TEXT_KINDS  # codes (into no names)
                spec.append((c.name, kind, np.zeros(0, np.int32 if text else kind), True, *([()] if text else [])))
            native.write_parquet(str(base / "empty.parquet"), spec, CREATED_BY)
            return
        empty = ", ".join(f"CAST(NULL AS {c.type}) AS {c.name}" for c in cols)
        con.execute(f"COPY (SELECT {empty} LIMIT 0) TO {literal(base / 'empty.parquet')} ({FORMAT})")

    def read_arrays(self, path: Path | str) -> dict[str, np.ndarray] | None:
        """The columns of a file :meth:`write_arrays` wrote, decoded by the codec (NULL as -1),
        at a fifth of what fetching them from DuckDB costs; None for a file it did not write
        (one DuckDB wrote) or where the codec is not built."""
        read = getattr(codec.native(), "read_parquet", None)  # (an in-place build from before it: None)
        found = read(str(path), CREATED_BY) if read is not None else None
        if found is None:
            return None
        return {name: np.frombuffer(data, np.dtype(kind)) for name, kind, data in found}  # int64, int32, bool

    def rows(self, path: Path | str) -> int | None:
        """How many rows a file :meth:`write_arrays` wrote has (its footer only); None for a
        file :meth:`read_arrays` would not read."""
        count = getattr(codec.native(), "parquet_rows", None)
        return count(str(path), CREATED_BY) if count is not None else None

    def held(self, paths: Iterable[Path | str], limit: int) -> bool:
        """Whether :meth:`read_arrays` reads all of ``paths`` and they hold at most ``limit`` rows."""
        total = 0
        for path in paths:
            rows = self.rows(path)
            if rows is None:
                return False
            total += rows
        return total <= limit

    def read_all(self, paths: Iterable[Path | str], columns: Mapping[str, Any], limit: int | None = None,
                 ) -> dict[str, np.ndarray] | None:
        """``columns`` (name -> dtype) of all of ``paths`` by :meth:`read_arrays`, one after the
        other (of those dtypes, empty, for no files); None when it does not read one of them or,
        given ``limit``, they hold more rows."""
        paths = list(paths)
        if limit is not None and not self.held(paths, limit):
            return None
        parts = []
        for path in paths:
            part = self.read_arrays(path)
            if part is None:
                return None
            parts.append(part)
        return {c: np.concatenate([part[c] for part in parts]) if parts else np.zeros(0, t)
                for c, t in columns.items()}

    def views(self, con: duckdb.DuckDBPyConnection, tables: Iterable[Table]) -> None:
        """:meth:`view` of each of ``tables``, in one call (a call of its own costs 0.1-0.2 ms
        beside the millisecond DuckDB takes to read a file's schema)."""
        statements = [self.view_sql(table) for table in tables]
        if statements:
            con.execute(";\n".join(statements))

    def prepare(self, table: Table, parts: Iterable[int]) -> None:
        """Create the partition directories up front: writers in several processes then never
        race to create the same one."""
        base = self.dir(table)
        base.mkdir(parents=True, exist_ok=True)
        if table.partition_by is not None:
            for p in parts:
                (base / f"{table.partition_by}={p}").mkdir(exist_ok=True)


# The codec's column kind for each type it writes (a kind that is not text is also the numpy
# dtype of its values; text is int32 codes into names): write_arrays' columns, whose negative
# values may stand for NULL, and the empty files of write_empty, which have no values.
_ARRAY_KINDS = {"BIGINT": "int64", "INTEGER": "int32", "BOOLEAN": "bool", "VARCHAR": "text"}
_EMPTY_KINDS = {**_ARRAY_KINDS, "DOUBLE": "float64", "JSON": "json"}
_TEXT_KINDS = ("text", "json")
CREATED_BY = "dltrace"  # the codec's Parquet files say so, and it reads back only those


def _split(columns: Mapping[str, Any], key: str | None, limit: int | None = SPLIT_COPIES,
           ) -> Iterator[tuple[int | None, dict[str, Any]]]:
    """(partition, its rows) for the rows' partitions, or (None, all rows) when the table is
    not partitioned or the rows hold more than ``limit`` partitions (written by DuckDB's
    partitioned COPY then); nothing for no rows."""
    values = columns[key] if key is not None else next(iter(columns.values()))
    if not len(values):
        return
    if key is None:
        yield None, dict(columns)
        return
    if len(values) > 1 and not bool(np.all(values[1:] >= values[:-1])):
        order = np.argsort(values, kind="stable")
        columns = {k: v[order] for k, v in columns.items()}
        values = columns[key]
    starts = np.flatnonzero(np.r_[True, values[1:] != values[:-1]])
    if limit is not None and len(starts) > limit:
        yield None, dict(columns)
        return
    ends = np.r_[starts[1:], len(values)]
    for a, b in zip(starts, ends, strict=True):
        yield int(values[a]), {k: v[a:b] for k, v in columns.items()}


def _any_parquet(directory: Path) -> bool:
    try:
        with os.scandir(directory) as it:
            return any(e.name.endswith(".parquet") for e in it)
    except (FileNotFoundError, NotADirectoryError):
        return False
