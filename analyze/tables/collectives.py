"""Match collectives and point-to-point messages across ranks (SQL over the raw reader rows).

Collectives are matched by communicator and sequence number: the n-th collective a rank
enters on a communicator matches every other member's n-th, as MPI and every collective
library require. Waiting time follows Scalasca's patterns:

- all-to-all and barriers (``Wait at N x N``): from the rank's enter to the last enter;
- one-to-all (broadcast, scatter; ``Late Broadcast``): non-roots wait for the root's enter;
- all-to-one (reduce, gather; ``Early Reduce``): the root waits for the last enter.

Waiting is clipped to the rank's own region. Collectives recognized by name only (the
``named_collectives`` rows of :mod:`analyze.tables.named`: no root, so rooted operations get
no waiting) are matched the same way within their inferred group. Messages: the n-th send
from A to B with a given communicator and tag matches B's n-th receive from A with them; a
receive whose region started before the send's region waits for the late sender.

Each matching is three steps, so that ranks can be processed apart (analyze/tables/stages.py):
per rank, the instances and their sequence numbers (``*_rows``); across ranks, grouped by
communicator and sequence number (or by sender, receiver, communicator, tag and sequence
number), what each instance needs from the others (``*_match``: the shuffle); per rank
again, the final rows (``*_final``). Sequence numbers are per rank, so only the middle step
sees more than one rank.
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


def create_op_names(con: duckdb.DuckDBPyConnection) -> None:
    con.execute("CREATE OR REPLACE TEMP TABLE op_names (op INTEGER, name VARCHAR)")
    con.executemany("INSERT INTO op_names VALUES (?, ?)", op_names())


def collective_rows() -> str:
    """Per rank, every data-moving collective instance with its region, times and sequence
    number on its communicator, and ``is_root`` (over views raw_collectives, named_collectives,
    locations, communicators and the table op_names). The reader gives each record the region
    performing it and that region's enter and leave, so no join with the intervals is needed;
    a name-only collective is an instance itself."""
    return f"""
        WITH rc AS (
            SELECT rc.rank, rc.location_id, rc.interval_idx,
                   CASE WHEN rc.region_id < 0 THEN NULL ELSE rc.region_id END AS region_id,
                   rc.comm_id, o.name AS op, CASE WHEN rc.root < 0 THEN NULL ELSE rc.root END AS root,
                   -- negative: not known (a Kineto NCCL kernel without its args)
                   CASE WHEN rc.bytes_sent < 0 THEN NULL ELSE rc.bytes_sent END AS bytes_sent,
                   CASE WHEN rc.bytes_recv < 0 THEN NULL ELSE rc.bytes_recv END AS bytes_recv,
                   rc.begin_ns, rc.enter_ns, rc.leave_ns, 'record' AS source
            FROM raw_collectives rc
            LEFT JOIN op_names o ON o.op = rc.op  -- no name (NULL op): the operation is unknown
            WHERE o.name IS NULL OR o.name NOT IN {NOT_DATA}
            UNION ALL
            SELECT rank, location_id, interval_idx, region_id, comm_id, op, NULL, NULL, NULL,
                   enter_ns, enter_ns, leave_ns, 'name' AS source
            FROM named_collectives
        ),
        c AS (
            SELECT rc.*, NOT l.is_main AS is_async
            FROM rc JOIN locations l USING (location_id)
        ),
        s AS (
            SELECT *, row_number() OVER (
                       PARTITION BY rank, comm_id
                       ORDER BY enter_ns, location_id, interval_idx, begin_ns) - 1 AS seq
            FROM c
        ),
        -- each communicator's members by position: an equality join, not a list lookup per row
        roots AS (SELECT comm_id, unnest(range(0, len(members))) AS root, unnest(members) AS root_rank
                  FROM communicators)
        SELECT s.* EXCLUDE (begin_ns), coalesce(s.rank = r.root_rank, false) AS is_root
        FROM s LEFT JOIN roots r ON r.comm_id = s.comm_id AND r.root = s.root
    """


def collective_match() -> str:
    """Across the ranks of each communicator and sequence number (over ``collective_rows``
    as view coll_rows): the last enter, the root's enter and how many ranks took part."""
    return """
        SELECT comm_id, seq, max(enter_ns) AS last_enter, count(*) AS ranks_matched,
               max(CASE WHEN is_root THEN enter_ns END) AS root_enter
        FROM coll_rows GROUP BY comm_id, seq
    """


def collective_final() -> str:
    """The ``collectives`` rows of some ranks (views coll_rows of those ranks, and instances:
    ``collective_match`` of every bucket their communicators and sequence numbers fell in)."""
    return f"""
        WITH a AS (
            SELECT s.*, g.ranks_matched,
                   CASE
                     WHEN s.op IN {ONE_TO_ALL} THEN
                       CASE WHEN s.is_root THEN s.enter_ns ELSE coalesce(g.root_enter, s.enter_ns) END
                     WHEN s.op IN {ALL_TO_ONE} THEN
                       CASE WHEN s.is_root THEN g.last_enter ELSE s.enter_ns END
                     ELSE g.last_enter
                   END AS last_arrival_ns
            FROM coll_rows s JOIN instances g USING (comm_id, seq)
        )
        SELECT rank, location_id, is_async, interval_idx, region_id, comm_id, seq, op, root,
               CASE WHEN op IN {ONE_TO_ALL} THEN bytes_recv ELSE bytes_sent END AS bytes,
               bytes_sent, bytes_recv, enter_ns, leave_ns, last_arrival_ns,
               greatest(0, least(last_arrival_ns, leave_ns) - enter_ns) AS wait_ns,
               leave_ns - enter_ns - greatest(0, least(last_arrival_ns, leave_ns) - enter_ns) AS transfer_ns,
               ranks_matched, source
        FROM a
    """


def message_rows() -> str:
    """Per rank, every message with its enclosing region's times (from the reader), sender,
    receiver and sequence number (over views raw_messages, communicators)."""
    return """
        WITH s AS (
            SELECT rm.rank, rm.location_id, rm.direction, cm.members[rm.peer + 1] AS peer,
                   rm.comm_id, rm.tag, rm.bytes, rm.time_ns, rm.interval_idx, rm.enter_ns, rm.leave_ns,
                   CASE WHEN rm.direction = 0 THEN rm.rank ELSE cm.members[rm.peer + 1] END AS sender,
                   CASE WHEN rm.direction = 0 THEN cm.members[rm.peer + 1] ELSE rm.rank END AS receiver
            FROM raw_messages rm LEFT JOIN communicators cm USING (comm_id)
        )
        SELECT *, row_number() OVER (
                   PARTITION BY direction, sender, receiver, comm_id, tag
                   ORDER BY time_ns, location_id, interval_idx) - 1 AS seq
        FROM s
    """


def message_match() -> str:
    """For each message (view msg_keys: all messages of some senders and receivers), the
    enter time of its partner's region."""
    return """
        SELECT a.direction, a.sender, a.receiver, a.comm_id, a.tag, a.seq,
               b.enter_ns AS partner_enter_ns
        FROM msg_keys a JOIN msg_keys b
          ON b.direction <> a.direction AND b.sender = a.sender AND b.receiver = a.receiver
         AND b.comm_id = a.comm_id AND b.tag = a.tag AND b.seq = a.seq
    """


def message_final() -> str:
    """The ``p2p`` rows of some ranks (views msg_rows of those ranks, partners)."""
    return """
        SELECT a.rank, a.location_id, CASE WHEN a.direction = 0 THEN 'send' ELSE 'recv' END AS direction,
               a.peer, a.comm_id, a.tag, a.bytes, a.time_ns, a.interval_idx, a.enter_ns,
               a.leave_ns, a.seq, b.partner_enter_ns,
               CASE WHEN a.direction = 1 AND b.partner_enter_ns IS NOT NULL
                    THEN greatest(0, least(b.partner_enter_ns, a.leave_ns) - a.enter_ns)
                    ELSE 0 END AS wait_ns
        FROM msg_rows a
        LEFT JOIN partners b ON b.direction = a.direction AND b.sender = a.sender
             AND b.receiver = a.receiver AND b.comm_id = a.comm_id AND b.tag = a.tag AND b.seq = a.seq
    """
