"""What the merge hands to an OTF2 writer: unified definitions plus one ordered record stream
per location. Writers (the ``otf2``-package writer here, a native one later) translate it
record by record and must not reorder or drop anything.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class LocationSpec:
    rank: int
    index: int  # 0: main thread; then other threads; then communication lanes
    name: str
    kind: str  # "main", "thread" or "comm_lane"
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
class ArchiveSpec:
    regions: list[tuple[str, str]]  # (name, Role value)
    comms: list[tuple[str, list[int]]]  # (name, member ranks in communicator order)
    ranks: list[RankSpec]
    start_realtime_ns: int | None = None
    creator: str = "dltrace"

    def event_count(self) -> int:
        return sum(len(loc.records) for r in self.ranks for loc in r.locations)
