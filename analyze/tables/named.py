"""Communication recognized by name only: which instances are collectives to match across
ranks, and what the waits of a library complete.

A library's communication often nests (``lbann::lbann_comm::allreduce`` encloses
``Al::Allreduce``, which encloses ``MPI_Allreduce``), and must count once:

- Only the *outermost* communication instance on its location counts: an instance inside
  another collective, point-to-point or wait region, or inside one carrying an OTF2
  collective record, is part of that one.
- An instance that carries an OTF2 collective record, or encloses one, is not a name-only
  collective: the record says what happened (operation, bytes, communicator) and wins.
  (Records that move no data, such as MPI_Init's handle creation, do not count.)

The remaining blocking collectives (pattern ``blocking``) become ``named_collectives`` rows,
which :func:`analyze.tables.collectives.collective_rows` matches like recorded ones: the n-th
instance of a library on a rank matches the n-th of every other rank, in one group per library
(a communicator of its own, with a negative id, members the ranks that have such instances),
bytes and root unknown (NULL).

A wait whose pattern names no operation (``Al::Wait``, ``hvd.synchronize``) completes what
the library started without blocking: when all outermost non-blocking starts of the library
in the trace perform one operation, the wait's region gets it as ``regions.pattern_op`` (so the
wait of an ``nb_allreduce`` counts as allreduce time).

In the build (analyze/tables/stages.py) each read task finds the outermost instances of its
locations (:func:`outer_instances`: nesting is per location) and reports what it saw of each
library (:class:`Seen`); between the stages :func:`groups` joins those reports into the
inferred groups and the waits' operations, for every rank at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import duckdb

from analyze.schema import Category
from analyze.tables.collectives import NOT_DATA, op_names
from analyze.tables.patterns import Kind

COMM = (Category.COLLECTIVE, Category.P2P, Category.WAIT)
COLLECTIVE_KINDS = (Kind.ALLREDUCE, Kind.COLLECTIVE)
GROUP_PREFIX = "name-only: "


def _listed(values: tuple[str, ...]) -> str:
    return "(" + ", ".join(f"'{v}'" for v in values) + ")"


def _not_data() -> str:
    """OTF2 codes of the collective records that move no data (MPI_Init's handle creation)."""
    return "(" + ", ".join(str(code) for code, name in op_names() if name in NOT_DATA) + ")"


def communicates(kinds: list[str]) -> bool:
    """Whether any region's pattern (``kinds``: the kind of each pattern-classified region)
    is communication: else nothing is recognized by name and the tables are exactly what the
    records say."""
    return any(k not in (Kind.RUNTIME, Kind.COMPUTE) for k in kinds)


def outer_instances() -> str:
    """The outermost communication instances of some locations that a name pattern matched,
    with ``encloses_record`` (over views comm_intervals: location_id, rank, idx, start_ns,
    end_ns, region_id of the instances of COMM regions; raw_collectives; regions;
    region_patterns). Columns: location_id, rank, idx, start_ns, end_ns, region_id, op (the
    region's pattern op), library, kind, blocking (regions.pattern_blocking), encloses_record."""
    # Instances on a location nest properly and enter in idx order, so an instance entered
    # earlier that is still open when X starts encloses X, and the instances entered after X
    # that start before X ends are inside it: two window functions instead of range joins
    # (which took minutes at 10^5 instances).
    return f"""
        WITH rec AS (
            SELECT location_id, any_value(rank) AS rank, interval_idx AS idx, any_value(enter_ns) AS start_ns,
                   any_value(leave_ns) AS end_ns, any_value(region_id) AS region_id
            FROM raw_collectives WHERE op NOT IN {_not_data()} AND region_id >= 0
            GROUP BY location_id, interval_idx
        ),
        iv AS (
            SELECT ci.location_id, ci.rank, ci.idx, ci.start_ns, ci.end_ns, ci.region_id,
                   rec.idx IS NOT NULL AS has_record
            FROM comm_intervals ci LEFT JOIN rec ON rec.location_id = ci.location_id AND rec.idx = ci.idx
            UNION ALL  -- instances of other regions that carry a record
            SELECT rec.location_id, rec.rank, rec.idx, rec.start_ns, rec.end_ns, rec.region_id, true
            FROM rec ANTI JOIN comm_intervals ci ON ci.location_id = rec.location_id AND ci.idx = rec.idx
        ),
        w AS (
            SELECT iv.*, rp.library, rp.kind, r.pattern_blocking AS blocking, r.pattern_op AS op,
                   max(end_ns) OVER (PARTITION BY location_id ORDER BY idx
                                     ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS open_until,
                   min(CASE WHEN has_record THEN start_ns END) OVER (
                       PARTITION BY location_id ORDER BY idx
                       ROWS BETWEEN 1 FOLLOWING AND UNBOUNDED FOLLOWING) AS next_record
            FROM iv JOIN regions r USING (region_id)
            LEFT JOIN region_patterns rp USING (region_id)
        )
        SELECT location_id, rank, idx, start_ns, end_ns, region_id, op, library, kind, blocking,
               has_record OR coalesce(next_record < end_ns, false) AS encloses_record
        FROM w WHERE library IS NOT NULL AND coalesce(open_until <= start_ns, true)
    """


COLLECTIVE_ROWS = f"kind IN {_listed(COLLECTIVE_KINDS)} AND blocking AND NOT encloses_record"


def collective_instances(outer: str) -> str:
    """The name-only collectives among ``outer`` (a table of :func:`outer_instances`)."""
    return f"SELECT * FROM {outer} WHERE {COLLECTIVE_ROWS}"


@dataclass
class Seen:
    """What some locations' outermost instances say of each library: the ranks with name-only
    collectives, and the operations of the non-blocking starts."""

    ranks: dict[str, set[int]] = field(default_factory=dict)
    start_ops: dict[str, set[str]] = field(default_factory=dict)

    @classmethod
    def of(cls, con: duckdb.DuckDBPyConnection, outer: str) -> Seen:
        seen = cls()
        for library, rank in con.execute(
                f"SELECT DISTINCT library, rank FROM {outer} WHERE {COLLECTIVE_ROWS}").fetchall():
            seen.ranks.setdefault(library, set()).add(int(rank))
        for library, op in con.execute(
                f"SELECT DISTINCT library, op FROM {outer} "
                f"WHERE NOT blocking AND kind <> '{Kind.WAIT}' AND op IS NOT NULL").fetchall():
            seen.start_ops.setdefault(library, set()).add(op)
        return seen

    def add(self, other: Seen) -> None:
        for library, ranks in other.ranks.items():
            self.ranks.setdefault(library, set()).update(ranks)
        for library, ops in other.start_ops.items():
            self.start_ops.setdefault(library, set()).update(ops)


@dataclass(frozen=True)
class Groups:
    comm_ids: dict[str, int]  # library -> the id of its inferred group
    communicators: list[tuple[int, str, int, list[int]]]  # rows of ``communicators``
    wait_ops: dict[str, str]  # library -> the operation its waits complete


def groups(seen: Seen) -> Groups:
    """The inferred groups (ids -1, -2, ... in library order; OTF2 references are unsigned,
    so negative ids are ours) and the operations waits complete, from the whole trace."""
    libraries = sorted(seen.ranks)
    comm_ids = {lib: -1 - n for n, lib in enumerate(libraries)}
    comms = [(comm_ids[lib], GROUP_PREFIX + lib, len(seen.ranks[lib]), sorted(seen.ranks[lib]))
             for lib in libraries]
    waits = {lib: next(iter(ops)) for lib, ops in seen.start_ops.items() if len(ops) == 1}
    return Groups(comm_ids, comms, waits)


def apply(con: duckdb.DuckDBPyConnection, found: Groups) -> None:
    """Add the inferred groups to ``communicators`` and the waits' operations to ``regions``
    (DuckDB tables; the temporary table region_patterns)."""
    if found.communicators:
        con.executemany("INSERT INTO communicators VALUES (?, ?, ?, ?)", found.communicators)
    for library, op in sorted(found.wait_ops.items()):
        con.execute(f"""
            UPDATE regions SET pattern_op = $op
            FROM region_patterns rp
            WHERE rp.region_id = regions.region_id AND rp.library = $lib AND rp.kind = '{Kind.WAIT}'
              AND regions.pattern_op IS NULL
        """, {"op": op, "lib": library})
