"""What an OTF2 reader produces: definitions plus column chunks, and the rules that build them.

Every reader (the ``otf2``-package one in :mod:`analyze.readers.otf2_python`, the native one) turns
events into the same four row kinds, applying exactly these rules per location:

- **Intervals**: an Enter pushes a region instance (``idx`` counts instances on the location
  in enter order; ``parent_idx`` is the instance below it, -1 at the top). A Leave closes the
  topmost instance of its region: instances above it are closed at the same time first
  (marked truncated). A Leave whose region is not open is ignored and counted. Instances
  still open after the last event of the location are closed at that event's time
  (truncated). A row is emitted when the instance closes, with its exclusive time: its
  duration minus the durations of its direct children (which all closed before it).
- **Collectives**: MpiCollectiveBegin notes the topmost open instance (the region performing
  the collective) and the time; the next MpiCollectiveEnd on the location completes the row.
  An End without a Begin is ignored and counted. The row carries the performing instance's
  region, enter and leave times (without one: -1 and the records' own times), so it is
  emitted once that instance has closed.
- **Messages**: MpiSend/MpiIsend (direction 0) and MpiRecv/MpiIrecv (direction 1), each with
  the topmost open instance at that moment and its enter and leave times (without one: the
  message's time), emitted once it has closed.
- **Metric samples**: one row per value of a Metric event: the metric it references (a
  MetricClass or MetricInstance), the value's position among the class's members and the
  value as a float64 (INT64 and UINT64 values converted as C converts them: round to nearest).

Times are converted from archive ticks to nanoseconds from the trace start by
:func:`ticks_to_ns`, which readers must reproduce exactly (integer arithmetic, floor).

A location whose events are more or fewer than its definition declares (when it declares a
number) is an error: the OTF2 library can read a truncated event file as an endless run of
events, or as fewer or none, depending on what its buffer held before.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import overload

import numpy as np

INTERVAL_COLUMNS = {
    "location_id": np.int64, "rank": np.int32, "idx": np.int64, "parent_idx": np.int64,
    "depth": np.int32, "region_id": np.int64, "start_ns": np.int64, "end_ns": np.int64,
    "truncated": np.bool_, "exclusive_ns": np.int64,
}
COLLECTIVE_COLUMNS = {
    "location_id": np.int64, "rank": np.int32, "interval_idx": np.int64, "begin_ns": np.int64,
    "end_ns": np.int64, "op": np.int32, "comm_id": np.int64, "root": np.int64,
    "bytes_sent": np.int64, "bytes_recv": np.int64, "region_id": np.int64, "enter_ns": np.int64,
    "leave_ns": np.int64,
}
MESSAGE_COLUMNS = {
    "location_id": np.int64, "rank": np.int32, "direction": np.int8, "peer": np.int64,
    "comm_id": np.int64, "tag": np.int64, "bytes": np.int64, "time_ns": np.int64,
    "interval_idx": np.int64, "enter_ns": np.int64, "leave_ns": np.int64,
}
METRIC_COLUMNS = {
    "location_id": np.int64, "rank": np.int32, "metric_id": np.int64, "member_index": np.int32,
    "time_ns": np.int64, "value": np.float64,
}
NS = 1_000_000_000
UNDEFINED_U32 = 0xFFFFFFFF


@overload
def ticks_to_ns(ticks: int, global_offset: int, resolution: int) -> int: ...
@overload
def ticks_to_ns(ticks: np.ndarray, global_offset: int, resolution: int) -> np.ndarray: ...
def ticks_to_ns(ticks: np.ndarray | int, global_offset: int, resolution: int) -> np.ndarray | int:
    """Archive ticks -> integer ns since ``global_offset`` (floor; exact for resolution < 9.2e9)."""
    d = ticks - global_offset
    if resolution == NS:
        return d
    q = d // resolution
    return q * NS + ((d - q * resolution) * NS) // resolution


@dataclass
class LocationDef:
    location_id: int
    rank: int
    thread: int
    name: str
    kind: str
    is_main: bool
    events: int


@dataclass
class RegionDef:
    region_id: int
    name: str
    canonical_name: str
    paradigm: str
    role: str
    source_file: str | None
    begin_line: int | None


@dataclass
class CommDef:
    comm_id: int
    name: str
    members: list[int]  # ranks in communicator order


@dataclass
class MetricMemberDef:
    member_id: int
    name: str
    description: str
    unit: str
    mode: str  # OTF2 MetricMode in lower case: accumulated_start, absolute_point, ...
    value_type: str  # int64, uint64 or double
    base: str  # decimal or binary
    exponent: int  # values times base**exponent are in ``unit``
    metric_type: str  # other, papi, rusage, user


@dataclass
class MetricDef:
    """A MetricClass (``recorder`` and ``scope`` None: its samples belong to the location that
    records them) or a MetricInstance of one, recorded by a location for a scope."""

    metric_id: int
    member_ids: list[int]
    occurrence: str  # synchronous_strict, synchronous or asynchronous (the class's)
    recorder: int | None  # location id (instances)
    scope: str | None  # location, location_group, system_tree_node or group (instances)
    scope_name: str | None
    scope_rank: int | None  # the rank a location or process location group scope belongs to
    host: str | None  # the system tree node the scope is on (a node scope: that node)
    class_id: int | None = None  # an instance's class


@dataclass
class Definitions:
    anchor: Path
    creator: str
    resolution: int
    global_offset: int
    length_ticks: int
    realtime_ns: int | None
    locations: list[LocationDef] = field(default_factory=list)
    regions: list[RegionDef] = field(default_factory=list)
    comms: list[CommDef] = field(default_factory=list)
    metric_members: list[MetricMemberDef] = field(default_factory=list)
    metrics: list[MetricDef] = field(default_factory=list)
    hosts: dict[int, str] = field(default_factory=dict)  # rank -> its process's system tree node
    notes: dict[str, str] = field(default_factory=dict)  # reader facts for build_info


@dataclass
class ReadStats:
    events: int = 0
    unmatched_leaves: int = 0
    truncated: int = 0
    unmatched_collective_ends: int = 0


@dataclass
class Chunk:
    """A batch of rows: table name -> column name -> array (all columns of equal length)."""

    intervals: dict[str, np.ndarray]
    collectives: dict[str, np.ndarray]
    messages: dict[str, np.ndarray]
    events: int  # events consumed to produce this chunk
    stats: ReadStats | None = None  # on the last chunk only
    metrics: dict[str, np.ndarray] = field(default_factory=lambda: _Columns(METRIC_COLUMNS).take())
    # rows of other tables (declared in analyze/schema.py, columns in their order), from
    # readers of formats that carry more than OTF2 does (Kineto: event args, correlations)
    tables: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)


class _Columns:
    """Growable column buffers for one row kind. Rows whose last column is still None wait for
    their performing instance to close; only the rows before the first of them are taken."""

    def __init__(self, spec: Mapping[str, type]):
        self.spec = spec
        self.rows: list[tuple | list] = []
        self.waiting = 0

    def take(self) -> dict[str, np.ndarray]:
        n = len(self.rows)
        if self.waiting:
            n = next(i for i, row in enumerate(self.rows) if row[-1] is None)
        taken, self.rows = self.rows[:n], self.rows[n:]
        cols = list(zip(*taken, strict=True)) if taken else [() for _ in self.spec]
        return {name: np.array(col, dtype=dt) for (name, dt), col in zip(self.spec.items(), cols, strict=True)}


class IntervalBuilder:
    """Applies the module's rules to a stream of events; times are already in ns."""

    def __init__(self, rank_of: dict[int, int]):
        self.rank_of = rank_of
        self.intervals = _Columns(INTERVAL_COLUMNS)
        self.collectives = _Columns(COLLECTIVE_COLUMNS)
        self.messages = _Columns(MESSAGE_COLUMNS)
        self.metrics = _Columns(METRIC_COLUMNS)
        self.stats = ReadStats()
        # per location: stack of [region, idx, start, children's ns]; next idx; pending
        # collective; last time
        self._stacks: dict[int, list[list[int]]] = {}
        self._next: dict[int, int] = {}
        # per location: the open collective [instance idx, begin, region, enter, leave or None]
        self._coll: dict[int, list] = {}
        self._waiting: dict[tuple[int, int], list[tuple[_Columns, list]]] = {}  # (loc, idx) -> rows
        self._last: dict[int, int] = {}

    def _close(self, loc: int, stack: list[list[int]], t: int, truncated: bool) -> None:
        region, idx, start, children = stack.pop()
        parent = -1
        if stack:
            parent = stack[-1][1]
            stack[-1][3] += t - start
        self.intervals.rows.append(
            (loc, self.rank_of[loc], idx, parent, len(stack), region, start, t, truncated,
             t - start - children)
        )
        if truncated:
            self.stats.truncated += 1
        for table, row in self._waiting.pop((loc, idx), ()):
            row[-1] = t
            table.waiting -= 1
        coll = self._coll.get(loc)
        if coll is not None and coll[0] == idx:
            coll[4] = t

    def enter(self, loc: int, t: int, region: int) -> None:
        stack = self._stacks.setdefault(loc, [])
        idx = self._next.get(loc, 0)
        self._next[loc] = idx + 1
        stack.append([region, idx, t, 0])
        self._last[loc] = t

    def leave(self, loc: int, t: int, region: int) -> None:
        self._last[loc] = t
        stack = self._stacks.get(loc)
        if not stack:
            self.stats.unmatched_leaves += 1
            return
        for depth in range(len(stack) - 1, -1, -1):
            if stack[depth][0] == region:
                break
        else:
            self.stats.unmatched_leaves += 1
            return
        while len(stack) > depth + 1:
            self._close(loc, stack, t, True)
        self._close(loc, stack, t, False)

    def _top(self, loc: int) -> int:
        stack = self._stacks.get(loc)
        return stack[-1][1] if stack else -1

    def touch(self, loc: int, t: int) -> None:
        """Any other event: it still counts as the location's last activity."""
        self._last[loc] = t

    def collective_begin(self, loc: int, t: int) -> None:
        stack = self._stacks.get(loc)
        top = stack[-1] if stack else None
        self._coll[loc] = [top[1], t, top[0], top[2], None] if top else [-1, t, -1, t, None]
        self._last[loc] = t

    def _row(self, table: _Columns, loc: int, idx: int, row: list) -> None:
        """Append ``row``; if its leave (last column) is None it waits for instance ``idx``."""
        table.rows.append(row)
        if row[-1] is None:
            table.waiting += 1
            self._waiting.setdefault((loc, idx), []).append((table, row))

    def collective_end(
        self, loc: int, t: int, op: int, comm: int, root: int, sent: int, recv: int
    ) -> None:
        self._last[loc] = t
        begin = self._coll.pop(loc, None)
        if begin is None:
            self.stats.unmatched_collective_ends += 1
            return
        root = -1 if root == UNDEFINED_U32 else root
        idx, begin_t, region, enter, leave = begin
        self._row(self.collectives, loc, idx, [
            loc, self.rank_of[loc], idx, begin_t, t, op, comm, root, sent, recv, region, enter,
            t if idx < 0 else leave])

    def message(
        self, loc: int, t: int, direction: int, peer: int, comm: int, tag: int, length: int
    ) -> None:
        self._last[loc] = t
        stack = self._stacks.get(loc)
        idx, enter = (stack[-1][1], stack[-1][2]) if stack else (-1, t)
        self._row(self.messages, loc, idx, [
            loc, self.rank_of[loc], direction, peer, comm, tag, length, t, idx, enter,
            None if stack else t])

    def metric(self, loc: int, t: int, metric: int, values: list[float]) -> None:
        self._last[loc] = t
        rank = self.rank_of[loc]
        self.metrics.rows += [(loc, rank, metric, i, t, v) for i, v in enumerate(values)]

    def finish(self) -> None:
        """Close what is still open at each location's last event."""
        for loc, stack in self._stacks.items():
            while stack:
                self._close(loc, stack, self._last[loc], True)

    def pending_rows(self) -> int:
        """Rows a :meth:`take` would hand out, about (rows after one still waiting count too)."""
        return (len(self.intervals.rows) + len(self.collectives.rows) - self.collectives.waiting
                + len(self.messages.rows) - self.messages.waiting + len(self.metrics.rows))

    def take(self, events: int, last: bool = False) -> Chunk:
        return Chunk(self.intervals.take(), self.collectives.take(), self.messages.take(), events,
                     self.stats if last else None, self.metrics.take())
