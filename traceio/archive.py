"""What an OTF2 writer is handed: unified definitions plus one ordered record stream per
location, and the layout both writers share (archive name, timer, roles and operations).

The tracer's merge builds an :class:`ArchiveSpec`; the writers (:mod:`traceio.otf2_writer`,
:mod:`traceio.native_writer`) translate it record by record and must not reorder or drop
anything.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from otf2.enums import CollectiveOp, LocationType, RegionRole

from traceio.records import Op, Role


@dataclass
class LocationSpec:
    rank: int
    index: int  # 0: main thread; then other threads; then communication lanes
    name: str
    kind: str  # "main", "thread", "comm_lane", "timeline", "tracer", "accelerator_stream" or "metric"
    records: np.ndarray  # EVENT_DTYPE, kinds ENTER / LEAVE / COLL_BEGIN / COLL_END, time-ordered

    @property
    def otf2_id(self) -> int:
        """Score-P's numbering: thread index in the high 32 bits, rank in the low ones."""
        return (self.index << 32) | self.rank


@dataclass
class RankSpec:
    rank: int
    host: str
    clock_offsets: list[tuple[int, int, float]]  # (local ns, offset ns, stddev ns)
    locations: list[LocationSpec] = field(default_factory=list)


@dataclass
class MetricSpec:
    """One metric channel, written as Score-P writes its asynchronous per-host plugin metrics:
    a MetricMember (INT64), its own ASYNCHRONOUS MetricClass, and a MetricInstance recorded by
    the METRIC location ``recorder`` (rank, location index) whose scope is the host's system
    tree node, or the location group (process) of ``rank`` when the channel is charged to one
    rank (a GPU pinned to it). METRIC records of the recorder refer to it by its index in
    :attr:`ArchiveSpec.metrics`. No two channels may have identical definitions (the ``otf2``
    package would merge them): the merge puts the host into each description."""

    name: str
    description: str
    unit: str  # SI unit of the value times 10**exponent: "J", "W"
    exponent: int  # value * 10**exponent is in ``unit``: -6 for microjoules
    mode: str  # MetricMode name: "ACCUMULATED_START" (running totals) or "ABSOLUTE_POINT"
    host: str
    rank: int | None  # the rank it is charged to; None: shared by the host
    recorder: tuple[int, int]  # (rank, location index) of the METRIC location recording it


@dataclass
class ArchiveSpec:
    regions: list[tuple[str, str]]  # (name, Role value)
    comms: list[tuple[str, list[int]]]  # (name, member ranks in communicator order)
    ranks: list[RankSpec]
    start_realtime_ns: int | None = None
    creator: str = "dltrace"
    metrics: list[MetricSpec] = field(default_factory=list)

    def event_count(self) -> int:
        return sum(len(loc.records) for r in self.ranks for loc in r.locations)


ARCHIVE_NAME = "traces"
TIMER_RESOLUTION = 1_000_000_000

OTF2_ROLE = {
    Role.FUNCTION: RegionRole.FUNCTION,
    Role.COLL_ALL2ALL: RegionRole.COLL_ALL2ALL,
    Role.COLL_ONE2ALL: RegionRole.COLL_ONE2ALL,
    Role.COLL_ALL2ONE: RegionRole.COLL_ALL2ONE,
    Role.BARRIER: RegionRole.BARRIER,
    Role.POINT2POINT: RegionRole.POINT2POINT,
    Role.WAIT: RegionRole.TASK_WAIT,
    Role.ARTIFICIAL: RegionRole.ARTIFICIAL,
    Role.KERNEL: RegionRole.KERNEL,
    Role.DATA_TRANSFER: RegionRole.DATA_TRANSFER,
    Role.COLL_OTHER: RegionRole.COLL_OTHER,
}
OTF2_OP = {
    Op.BARRIER: CollectiveOp.BARRIER,
    Op.BCAST: CollectiveOp.BCAST,
    Op.GATHER: CollectiveOp.GATHER,
    Op.SCATTER: CollectiveOp.SCATTER,
    Op.ALLGATHER: CollectiveOp.ALLGATHER,
    Op.ALLTOALL: CollectiveOp.ALLTOALL,
    Op.REDUCE: CollectiveOp.REDUCE,
    Op.ALLREDUCE: CollectiveOp.ALLREDUCE,
    Op.REDUCE_SCATTER: CollectiveOp.REDUCE_SCATTER,
    Op.ALLTOALLV: CollectiveOp.ALLTOALLV,
}
# OTF2 location type of each location kind (what is not listed is a CPU thread)
UNDEFINED_ROOT = 0xFFFFFFFF
METRIC_KIND = "metric"
# OTF2 location types by LocationSpec.kind; everything else is a CPU thread.
OTF2_LOCATION_TYPE = {"accelerator_stream": LocationType.ACCELERATOR_STREAM, METRIC_KIND: LocationType.METRIC}


def corrected(times: np.ndarray, offsets: list[tuple[int, int, float]]) -> np.ndarray:
    """Local times -> reference times, interpolating offsets as OTF2 readers do."""
    if not offsets:
        return times
    local = np.array([o[0] for o in offsets], dtype=np.float64)
    off = np.array([o[1] for o in offsets], dtype=np.float64)
    return times + np.rint(np.interp(times.astype(np.float64), local, off)).astype(np.int64)


def time_span(spec: ArchiveSpec) -> tuple[int, int] | None:
    """(first, last) reference time of any record in ``spec``, or None when it is empty."""
    lo, hi = None, None
    for rank in spec.ranks:
        for loc in rank.locations:
            if len(loc.records):
                t = corrected(loc.records["time"][[0, -1]], rank.clock_offsets)
                lo = int(t[0]) if lo is None else min(lo, int(t[0]))
                hi = int(t[-1]) if hi is None else max(hi, int(t[-1]))
    return None if lo is None or hi is None else (lo, hi)
