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

The remaining blocking collectives (pattern ``blocking``) become rows of the temporary
table ``named_collectives``, which :func:`analyze.tables.collectives.build_collectives`
matches like recorded ones: the n-th instance of a library on a rank matches the n-th of
every other rank, in one group per library (a communicator of its own, with a negative id,
members the ranks that have such instances), bytes and root unknown (NULL).

A wait whose pattern names no operation (``Al::Wait``, ``hvd.synchronize``) completes what
the library started without blocking: when all outermost non-blocking starts of the library
in the trace perform one operation, the wait's region gets it as ``regions.pattern_op`` (so the wait
of an ``nb_allreduce`` counts as allreduce time).
"""

from __future__ import annotations

import duckdb

from analyze.schema import Category
from analyze.tables.collectives import NOT_DATA, op_names
from analyze.tables.patterns import Kind

COMM = (Category.COLLECTIVE, Category.P2P, Category.WAIT)
COLLECTIVE_KINDS = (Kind.ALLREDUCE, Kind.COLLECTIVE)


def _listed(values: tuple[str, ...]) -> str:
    return "(" + ", ".join(f"'{v}'" for v in values) + ")"


def _not_data() -> str:
    """OTF2 codes of the collective records that move no data (MPI_Init's handle creation)."""
    return "(" + ", ".join(str(code) for code, name in op_names() if name in NOT_DATA) + ")"


def build_named(con: duckdb.DuckDBPyConnection) -> None:
    """Fill the temporary ``named_collectives`` table (empty when no pattern matched a
    communication region), the inferred groups in ``communicators`` and waits' ``op``."""
    con.execute("""CREATE TEMP TABLE named_collectives (location_id BIGINT, rank INTEGER, interval_idx BIGINT,
                   begin_ns BIGINT, end_ns BIGINT, op VARCHAR, comm_id BIGINT, root BIGINT,
                   bytes_sent BIGINT, bytes_recv BIGINT)""")
    used = con.execute(f"SELECT count(*) FROM region_patterns WHERE kind <> '{Kind.RUNTIME}' "
                       f"AND kind <> '{Kind.COMPUTE}'").fetchone()
    if not used or not used[0]:
        return  # nothing recognized by name: the tables are exactly what the records say
    con.execute(f"""
        CREATE TEMP TABLE comm_iv AS
        WITH rec AS (SELECT DISTINCT location_id, interval_idx AS idx FROM raw_collectives
                     WHERE op NOT IN {_not_data()})
        SELECT i.location_id, i.rank, i.idx, i.depth, i.start_ns, i.end_ns, i.region_id,
               rec.idx IS NOT NULL AS has_record, rp.library, rp.kind, rp.blocking, r.pattern_op AS op
        FROM intervals i JOIN regions r USING (region_id)
        LEFT JOIN rec ON rec.location_id = i.location_id AND rec.idx = i.idx
        LEFT JOIN region_patterns rp ON rp.region_id = i.region_id
        WHERE r.category IN {_listed(COMM)} OR rec.idx IS NOT NULL
    """)
    # Instances on a location nest properly and enter in idx order, so an instance entered
    # earlier that is still open when X starts encloses X, and the instances entered after X
    # that start before X ends are inside it: two window functions instead of range joins
    # (which took minutes at 10^5 instances).
    con.execute("""
        CREATE TEMP TABLE named_outer AS
        WITH w AS (
            SELECT *,
                   max(end_ns) OVER (PARTITION BY location_id ORDER BY idx
                                     ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS open_until,
                   min(CASE WHEN has_record THEN start_ns END) OVER (
                       PARTITION BY location_id ORDER BY idx
                       ROWS BETWEEN 1 FOLLOWING AND UNBOUNDED FOLLOWING) AS next_record
            FROM comm_iv
        )
        SELECT *, has_record OR coalesce(next_record < end_ns, false) AS encloses_record
        FROM w WHERE library IS NOT NULL AND coalesce(open_until <= start_ns, true)
    """)
    libraries = [lib for (lib,) in con.execute(f"""
        SELECT DISTINCT library FROM named_outer
        WHERE kind IN {_listed(COLLECTIVE_KINDS)} AND blocking AND NOT encloses_record ORDER BY library
    """).fetchall()]
    for n, library in enumerate(libraries):
        comm_id = -1 - n  # OTF2 references are unsigned: negative ids are ours
        con.execute(f"""
            INSERT INTO communicators
            SELECT $id, 'name-only: ' || $lib, count(DISTINCT rank), list(DISTINCT rank ORDER BY rank)
            FROM named_outer WHERE library = $lib AND kind IN {_listed(COLLECTIVE_KINDS)}
              AND blocking AND NOT encloses_record
        """, {"id": comm_id, "lib": library})
        con.execute(f"""
            INSERT INTO named_collectives
            SELECT location_id, rank, idx, start_ns, end_ns, op, $id, NULL, NULL, NULL
            FROM named_outer WHERE library = $lib AND kind IN {_listed(COLLECTIVE_KINDS)}
              AND blocking AND NOT encloses_record
        """, {"id": comm_id, "lib": library})
    con.execute(f"""
        UPDATE regions SET pattern_op = s.op
        FROM (SELECT library, any_value(op) AS op FROM named_outer
              WHERE NOT blocking AND kind <> '{Kind.WAIT}' AND op IS NOT NULL
              GROUP BY library HAVING count(DISTINCT op) = 1) s,
             region_patterns rp
        WHERE rp.region_id = regions.region_id AND rp.library = s.library AND rp.kind = '{Kind.WAIT}'
          AND regions.pattern_op IS NULL
    """)
    con.execute("DROP TABLE comm_iv")
    con.execute("DROP TABLE named_outer")
