"""Getting a reader's column chunks into DuckDB: interval rows appended from worker threads
with their children's time worked out on the way, other tables' chunks, the progress line,
and what the OTF2 C library prints while it reads."""

from __future__ import annotations

import collections
import contextlib
import os
import queue
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import duckdb
import numpy as np


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


def load_columns(con: duckdb.DuckDBPyConnection, table: str, columns: dict[str, Any]) -> None:
    # DuckDB scans a dict of numpy arrays in place: no per-row Python work, no DataFrame copy.
    if len(next(iter(columns.values()))):
        con.register("chunk_rows", columns)
        con.execute(f"INSERT INTO {table} SELECT * FROM chunk_rows")
        con.unregister("chunk_rows")


class ChildTime:
    """Per interval row, the summed durations of its direct children (for exclusive_ns).

    Readers emit a row when its instance closes, and an instance closes after every instance
    opened inside it (analyze/readers/columns.py), so all of a row's children come before it, in its
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


class IntervalLoader:
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
        self.children = ChildTime()

    def add(self, rows: dict[str, np.ndarray]) -> None:
        if not len(rows["idx"]):
            return
        rows = {**rows, "children_ns": self.children(rows)}  # in arrival order: see ChildTime
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


class Progress:
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
