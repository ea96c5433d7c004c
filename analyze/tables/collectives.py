"""Match collectives and point-to-point messages across ranks (SQL over the raw reader rows).

Collectives are matched by communicator and sequence number: the n-th collective a rank
enters on a communicator matches every other member's n-th, as MPI and every collective
library require. Waiting time follows Scalasca's patterns:

- all-to-all and barriers (``Wait at N x N``): from the rank's enter to the last enter;
- one-to-all (broadcast, scatter; ``Late Broadcast``): non-roots wait for the root's enter;
- all-to-one (reduce, gather; ``Early Reduce``): the root waits for the last enter.

Waiting is clipped to the rank's own region. Collectives recognized by name only (the
temporary ``named_collectives`` rows of :mod:`analyze.tables.named`: no root, so rooted
operations get no waiting) are matched the same way within their inferred group. Messages: the n-th send from A to B with a given
communicator and tag matches B's n-th receive from A with them; a receive whose region
started before the send's region waits for the late sender.
"""

from __future__ import annotations

import duckdb
from otf2.enums import CollectiveOp

# Collective records that do not move data: communicator and window bookkeeping.
NOT_DATA = ("create_handle", "destroy_handle", "allocate", "deallocate",
            "create_handle_and_allocate", "destroy_handle_and_deallocate")
ONE_TO_ALL = ("bcast", "scatter", "scatterv")
ALL_TO_ONE = ("reduce", "gather", "gatherv")


def op_names() -> list[tuple[int, str]]:
    """(OTF2 code, lowercase name) of every collective operation (the enum is a ctypes type)."""
    return [(getattr(CollectiveOp, k).value, k.lower()) for k in dir(CollectiveOp) if k.isupper()]


def build_collectives(con: duckdb.DuckDBPyConnection) -> None:
    con.execute("CREATE TEMP TABLE op_names (op INTEGER, name VARCHAR)")
    con.executemany("INSERT INTO op_names VALUES (?, ?)", op_names())
    con.execute(f"""
        INSERT INTO collectives
        WITH rc AS (
            SELECT rc.location_id, rc.rank, rc.interval_idx, rc.begin_ns, rc.end_ns, o.name AS op,
                   rc.comm_id, rc.root, rc.bytes_sent, rc.bytes_recv, 'record' AS source
            FROM raw_collectives rc
            LEFT JOIN op_names o ON o.op = rc.op  -- no name (NULL op): the operation is unknown
            WHERE o.name IS NULL OR o.name NOT IN {NOT_DATA}
            UNION ALL
            SELECT location_id, rank, interval_idx, begin_ns, end_ns, op, comm_id, root,
                   bytes_sent, bytes_recv, 'name' AS source
            FROM named_collectives
        ),
        ci AS (
            -- only the instances that perform a collective: a hash table over the whole
            -- intervals table would need gigabytes at 10^8 events
            SELECT i.location_id, i.idx, i.region_id, i.start_ns, i.end_ns
            FROM intervals i SEMI JOIN rc
              ON rc.location_id = i.location_id AND rc.interval_idx = i.idx
        ),
        c AS (
            SELECT rc.rank, rc.location_id, NOT l.is_main AS is_async,
                   rc.interval_idx, i.region_id, rc.comm_id, rc.op,
                   CASE WHEN rc.root < 0 THEN NULL ELSE rc.root END AS root,
                   -- negative: not known (a Kineto NCCL kernel without its args)
                   CASE WHEN rc.bytes_sent < 0 THEN NULL ELSE rc.bytes_sent END AS bytes_sent,
                   CASE WHEN rc.bytes_recv < 0 THEN NULL ELSE rc.bytes_recv END AS bytes_recv,
                   coalesce(i.start_ns, rc.begin_ns) AS enter_ns,
                   coalesce(i.end_ns, rc.end_ns) AS leave_ns, rc.source
            FROM rc
            JOIN locations l USING (location_id)
            LEFT JOIN ci i ON i.location_id = rc.location_id AND i.idx = rc.interval_idx
        ),
        s AS (
            SELECT *, row_number() OVER (
                       PARTITION BY rank, comm_id ORDER BY enter_ns, location_id, interval_idx) - 1 AS seq
            FROM c
        ),
        g AS (
            SELECT s.comm_id, s.seq, max(s.enter_ns) AS last_enter, count(*) AS ranks_matched,
                   max(CASE WHEN s.rank = cm.members[s.root + 1] THEN s.enter_ns END) AS root_enter
            FROM s LEFT JOIN communicators cm USING (comm_id)
            GROUP BY s.comm_id, s.seq
        ),
        a AS (
            SELECT s.*, g.ranks_matched,
                   CASE
                     WHEN s.op IN {ONE_TO_ALL} THEN
                       CASE WHEN s.rank = cm.members[s.root + 1] THEN s.enter_ns
                            ELSE coalesce(g.root_enter, s.enter_ns) END
                     WHEN s.op IN {ALL_TO_ONE} THEN
                       CASE WHEN s.rank = cm.members[s.root + 1] THEN g.last_enter ELSE s.enter_ns END
                     ELSE g.last_enter
                   END AS last_arrival_ns
            FROM s JOIN g USING (comm_id, seq) LEFT JOIN communicators cm USING (comm_id)
        )
        SELECT rank, location_id, is_async, interval_idx, region_id, comm_id, seq, op, root,
               CASE WHEN op IN {ONE_TO_ALL} THEN bytes_recv ELSE bytes_sent END AS bytes,
               bytes_sent, bytes_recv, enter_ns, leave_ns, last_arrival_ns,
               greatest(0, least(last_arrival_ns, leave_ns) - enter_ns) AS wait_ns,
               leave_ns - enter_ns - greatest(0, least(last_arrival_ns, leave_ns) - enter_ns) AS transfer_ns,
               ranks_matched, source
        FROM a
        ORDER BY rank, enter_ns
    """)


def build_p2p(con: duckdb.DuckDBPyConnection) -> None:
    con.execute("""
        INSERT INTO p2p
        WITH mi AS (  -- only the instances enclosing a message (see build_collectives)
            SELECT i.location_id, i.idx, i.start_ns, i.end_ns
            FROM intervals i SEMI JOIN raw_messages rm
              ON rm.location_id = i.location_id AND rm.interval_idx = i.idx
        ),
        m AS (
            SELECT rm.rank, rm.location_id, rm.direction, cm.members[rm.peer + 1] AS peer,
                   rm.comm_id, rm.tag, rm.bytes, rm.time_ns, rm.interval_idx,
                   coalesce(i.start_ns, rm.time_ns) AS enter_ns,
                   coalesce(i.end_ns, rm.time_ns) AS leave_ns
            FROM raw_messages rm
            LEFT JOIN communicators cm USING (comm_id)
            LEFT JOIN mi i ON i.location_id = rm.location_id AND i.idx = rm.interval_idx
        ),
        s AS (
            SELECT *,
                   CASE WHEN direction = 0 THEN rank ELSE peer END AS sender,
                   CASE WHEN direction = 0 THEN peer ELSE rank END AS receiver
            FROM m
        ),
        q AS (
            SELECT *, row_number() OVER (
                PARTITION BY direction, sender, receiver, comm_id, tag ORDER BY time_ns) - 1 AS seq
            FROM s
        )
        SELECT a.rank, a.location_id, CASE WHEN a.direction = 0 THEN 'send' ELSE 'recv' END,
               a.peer, a.comm_id, a.tag, a.bytes, a.time_ns, a.interval_idx, a.enter_ns,
               a.leave_ns, a.seq, b.enter_ns AS partner_enter_ns,
               CASE WHEN a.direction = 1 AND b.enter_ns IS NOT NULL
                    THEN greatest(0, least(b.enter_ns, a.leave_ns) - a.enter_ns) ELSE 0 END
        FROM q a
        LEFT JOIN q b ON b.direction <> a.direction AND b.sender = a.sender
                     AND b.receiver = a.receiver AND b.comm_id = a.comm_id
                     AND b.tag = a.tag AND b.seq = a.seq
        ORDER BY a.rank, a.time_ns
    """)
