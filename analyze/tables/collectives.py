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

Collectives are numbered and finished in numpy (:func:`number`, :func:`final`: a few ranks'
rows at a time, a tenth of a second per million), with the SQL of :func:`collective_rows` for
a rank whose collectives are too many to hold (DuckDB's sort spills to disk). Both give the
rows of :data:`ROW_COLUMNS`: integers, with -1 for NULL and operations as codes of the
build's :func:`vocabulary`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import duckdb
import numpy as np
import pandas as pd
from otf2.enums import CollectiveOp

from analyze.tables.store import Codes, literal

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


def vocabulary(pattern_ops: Iterable[str | None]) -> tuple[str, ...]:
    """The names of the operations a build's collectives can have, by code: OTF2's at their
    own codes, then the other operations of the name patterns (``regions.pattern_op``)."""
    otf2 = dict(op_names())
    names = tuple(otf2[code] for code in range(len(otf2)))  # OTF2's codes run from 0 without gaps
    return names + tuple(sorted({op for op in pattern_ops if op is not None} - set(names)))


# A rank's numbered collectives (``*_rows``), as stages.prepare writes them for the shuffle
# and stages.finish: -1 is NULL (never for comm_id, whose inferred groups are negative).
ROW_COLUMNS = {
    "rank": np.int32, "location_id": np.int64, "interval_idx": np.int64, "region_id": np.int64,
    "comm_id": np.int64, "op": np.int32, "root": np.int64, "bytes_sent": np.int64, "bytes_recv": np.int64,
    "enter_ns": np.int64, "leave_ns": np.int64, "by_name": np.bool_, "is_async": np.bool_, "seq": np.int64,
    "is_root": np.bool_,
}


def collective_rows(vocabulary: tuple[str, ...]) -> str:
    """:data:`ROW_COLUMNS` in SQL, as :func:`number` gives them (over views raw_collectives,
    named_collectives, locations, communicators and the table op_names): for a rank whose
    collectives are too many for memory."""
    codes = ", ".join(f"({i}, {literal(name)})" for i, name in enumerate(vocabulary))
    return f"""
        WITH vocabulary(code, name) AS (VALUES {codes}),
        rc AS (
            SELECT rc.rank, rc.location_id, rc.interval_idx, greatest(rc.region_id, -1) AS region_id,
                   rc.comm_id, CASE WHEN o.name IS NULL THEN -1 ELSE rc.op END AS op,
                   greatest(rc.root, -1) AS root, greatest(rc.bytes_sent, -1) AS bytes_sent,
                   greatest(rc.bytes_recv, -1) AS bytes_recv, rc.begin_ns, rc.enter_ns, rc.leave_ns,
                   false AS by_name
            FROM raw_collectives rc
            LEFT JOIN op_names o ON o.op = rc.op  -- no name: the operation is unknown
            WHERE o.name IS NULL OR o.name NOT IN {NOT_DATA}
            UNION ALL
            SELECT n.rank, n.location_id, n.interval_idx, n.region_id, n.comm_id, coalesce(v.code, -1),
                   -1, -1, -1, n.enter_ns, n.enter_ns, n.leave_ns, true
            FROM named_collectives n LEFT JOIN vocabulary v ON v.name = n.op
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
        SELECT s.rank, s.location_id, s.interval_idx, s.region_id, s.comm_id, s.op, s.root, s.bytes_sent,
               s.bytes_recv, s.enter_ns, s.leave_ns, s.by_name, s.is_async, s.seq,
               coalesce(s.rank = r.root_rank, false) AS is_root
        FROM s LEFT JOIN roots r ON r.comm_id = s.comm_id AND r.root = s.root
        ORDER BY s.rank, s.comm_id, s.seq
    """


def number(raw: Mapping[str, np.ndarray], named: Mapping[str, np.ndarray], main: Mapping[int, bool],
           members: Mapping[int, np.ndarray], vocabulary: tuple[str, ...]) -> dict[str, np.ndarray]:
    """:data:`ROW_COLUMNS` of some ranks: their data-moving collective records (``raw``:
    the reader's columns) and name-only collectives (``named``: location_id, rank,
    interval_idx, region_id, enter_ns, leave_ns, op as a name or None, comm_id), numbered per
    rank and communicator in enter order. ``main``: every location, whether it is a rank's main
    thread (rows of other locations are dropped); ``members``: each communicator's ranks. The
    reader gives each record the region performing it and that region's enter and leave, so no
    join with the intervals is needed; a name-only collective is an instance itself."""
    op = np.asarray(raw["op"], np.int64)
    unknown = (op < 0) | (op >= len(op_names()))
    data = unknown | ~np.isin(op, [code for code, name in op_names() if name in NOT_DATA])
    rec = {k: np.asarray(v) for k, v in raw.items()} | {"op": np.where(unknown, -1, op)}
    if not data.all():
        rec = {k: v[data] for k, v in rec.items()}
    n_named = len(named["rank"])
    codes = {name: i for i, name in enumerate(vocabulary)}
    missing = {o for o in named["op"] if o is not None and o not in codes}
    if missing:
        raise ValueError(f"operations {sorted(missing)} are not in the build's vocabulary")
    none = np.full(n_named, -1, np.int64)
    given = {  # the name-only collectives' columns, as records' (no root, bytes or begin)
        "rank": named["rank"], "location_id": named["location_id"], "interval_idx": named["interval_idx"],
        "region_id": named["region_id"], "comm_id": named["comm_id"],
        "op": np.array([-1 if o is None else codes[o] for o in named["op"]], np.int64),
        "root": none, "bytes_sent": none, "bytes_recv": none, "enter_ns": named["enter_ns"],
        "leave_ns": named["leave_ns"], "begin_ns": named["enter_ns"]}
    rows = {c: (np.concatenate([rec[c], np.asarray(given[c])]) if n_named else rec[c]).astype(ROW_COLUMNS.get(
        c, np.int64), copy=False) for c in given}
    for c in ("region_id", "root", "bytes_sent", "bytes_recv"):  # negative: not known (NULL)
        if len(rows[c]) and rows[c].min() < -1:  # (a scan, where a clip would write a copy)
            rows[c] = np.maximum(rows[c], -1)
    rows["by_name"] = np.r_[np.zeros(len(rec["rank"]), bool), np.ones(n_named, bool)]
    ids = np.fromiter(main.keys(), np.int64, len(main))
    flags = np.fromiter(main.values(), bool, len(main))
    at = index_of(ids, rows["location_id"])
    if (at < 0).any():  # as the SQL's join with the locations: rows of other locations go
        defined = at >= 0
        rows = {k: v[defined] for k, v in rows.items()}
        at = at[defined]
    rows["is_async"] = ~flags[at]
    begin = rows.pop("begin_ns")
    rows["seq"] = numbered(rows["rank"], rows["comm_id"], rows["enter_ns"], rows["location_id"],
                            rows["interval_idx"], begin)
    is_root = np.zeros(len(begin), bool)
    rooted = np.flatnonzero(rows["root"] >= 0)
    for comm in np.unique(rows["comm_id"][rooted]):
        ranks = members.get(int(comm))
        if ranks is None:
            continue
        mine = rooted[rows["comm_id"][rooted] == comm]
        root = rows["root"][mine]
        inside = root < len(ranks)
        is_root[mine[inside]] = np.asarray(ranks, np.int64)[root[inside]] == rows["rank"][mine[inside]]
    rows["is_root"] = is_root
    return rows


def numbered(rank: np.ndarray, comm: np.ndarray, *order: np.ndarray) -> np.ndarray:
    """Each row's position among the rows of its rank and communicator, in ``order`` (keys,
    most significant first). (The steps' markers are numbered so, with one communicator.)"""
    n = len(rank)
    if n == 0:
        return np.zeros(0, np.int64)
    keys = [k for k in (rank, comm) if not (k == k[0]).all()]  # one rank, one communicator: no key
    by = np.lexsort((*reversed(order), *reversed(keys)))
    seq = np.empty(n, np.int64)
    if not keys:  # one group: its order is the numbering
        seq[by] = np.arange(n, dtype=np.int64)
        return seq
    first = np.ones(n, bool)
    first[1:] = False
    for k in keys:
        sorted_key = k[by]
        first[1:] |= sorted_key[1:] != sorted_key[:-1]
    starts = np.flatnonzero(first)
    seq[by] = np.arange(n, dtype=np.int64) - np.repeat(starts, np.diff(np.r_[starts, n]))
    return seq


def collective_match() -> str:
    """Across the ranks of each communicator and sequence number (over ``collective_rows``
    as view coll_rows): the last enter, the root's enter and how many ranks took part."""
    return """
        SELECT comm_id, seq, max(enter_ns) AS last_enter, count(*) AS ranks_matched,
               max(CASE WHEN is_root THEN enter_ns END) AS root_enter
        FROM coll_rows GROUP BY comm_id, seq
    """


def final(rows: Mapping[str, np.ndarray], instances: Mapping[str, np.ndarray],
          vocabulary: tuple[str, ...]) -> dict[str, np.ndarray]:
    """The ``collectives`` rows of some ranks' :data:`ROW_COLUMNS` (-1 for NULL, operations as
    codes: :func:`final_select` names them), given ``instances``: ``collective_match`` of every
    bucket their communicators and sequence numbers fell in, with root_enter -1 where no root
    took part (``has_root`` false)."""
    at = position(instances["comm_id"], instances["seq"], rows["comm_id"], rows["seq"])
    if (at < 0).any():  # an instance every rank took part in was matched: never, as in SQL's join
        rows = {k: v[at >= 0] for k, v in rows.items()}
        at = at[at >= 0]
    op, enter, leave, is_root = rows["op"], rows["enter_ns"], rows["leave_ns"], rows["is_root"]
    last_enter = np.asarray(instances["last_enter"], np.int64)[at]
    root_enter = np.where(np.asarray(instances["has_root"], bool)[at],
                          np.asarray(instances["root_enter"], np.int64)[at], enter)
    one_to_all = np.isin(op, [vocabulary.index(o) for o in ONE_TO_ALL])
    all_to_one = np.isin(op, [vocabulary.index(o) for o in ALL_TO_ONE])
    last = np.where(one_to_all, np.where(is_root, enter, root_enter),
                    np.where(all_to_one & ~is_root, enter, last_enter))
    wait = np.maximum(0, np.minimum(last, leave) - enter)
    return {**rows, "bytes": np.where(one_to_all, rows["bytes_recv"], rows["bytes_sent"]),
            "last_arrival_ns": last, "wait_ns": wait, "transfer_ns": leave - enter - wait,
            "ranks_matched": np.asarray(instances["ranks_matched"], np.int64)[at]}


def index_of(ids: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Where each wanted integer is among the distinct ``ids`` (definition ids: regions,
    locations), -1 where it is not: :func:`position` with one communicator."""
    return position(np.zeros(len(ids), np.int64), np.asarray(ids, np.int64), np.zeros(len(want), np.int64),
                    np.asarray(want, np.int64))


def position(comm: np.ndarray, seq: np.ndarray, want_comm: np.ndarray, want_seq: np.ndarray) -> np.ndarray:
    """Where each wanted pair of integers (a communicator and sequence number, a location and
    interval) is among the given pairs, which are distinct; -1 where it is not."""
    if not len(seq) or not len(want_seq):
        return np.full(len(want_seq), -1, np.int64)
    lo_c = min(int(comm.min()), int(want_comm.min()))
    lo_s = min(int(seq.min()), int(want_seq.min()))
    span = max(int(seq.max()), int(want_seq.max())) - lo_s + 1
    size = (max(int(comm.max()), int(want_comm.max())) - lo_c + 1) * span  # of the keys' range
    if size >= 1 << 62:  # no one integer key
        return np.asarray(pd.MultiIndex.from_arrays([comm, seq]).get_indexer(
            pd.MultiIndex.from_arrays([want_comm, want_seq])), np.int64)
    key = (np.asarray(comm, np.int64) - lo_c) * span + (np.asarray(seq, np.int64) - lo_s)
    want = (np.asarray(want_comm, np.int64) - lo_c) * span + (np.asarray(want_seq, np.int64) - lo_s)
    if size <= 4 * (len(key) + len(want)) + 4096:  # dense keys (sequence numbers, intervals): a table
        table = np.full(size, -1, np.int64)
        table[key] = np.arange(len(key))
        return table[want]
    order = np.argsort(key)
    at = np.searchsorted(key[order], want).clip(0, len(key) - 1)
    return np.where(key[order][at] == want, order[at], -1)


# what final() adds to ROW_COLUMNS
FINAL_COLUMNS = {"bytes": np.int64, "last_arrival_ns": np.int64, "wait_ns": np.int64, "transfer_ns": np.int64,
                 "ranks_matched": np.int64}
SOURCES = ("record", "name")  # collectives.source by by_name
NULLABLE = frozenset({"region_id", "root", "bytes", "bytes_sent", "bytes_recv", "op"})  # -1 (op: no name)


def table_columns(done: Mapping[str, np.ndarray], vocabulary: tuple[str, ...]) -> dict[str, np.ndarray | Codes]:
    """:func:`final`'s arrays as the columns of ``collectives`` (text as codes), for
    :meth:`~analyze.tables.store.Store.write_arrays` with :data:`NULLABLE`."""
    return {**done, "op": Codes(done["op"], vocabulary), "source": Codes(done["by_name"].astype(np.int32), SOURCES)}


def final_select(vocabulary: tuple[str, ...]) -> str:
    """The ``collectives`` columns of :func:`final`'s arrays, as a template whose ``{rows}``
    names them (``str.format``)."""
    names = "[" + ", ".join(literal(name) for name in vocabulary) + "]"
    names = names.replace("{", "{{").replace("}", "}}")
    null = {c: f"CASE WHEN {c} < 0 THEN NULL ELSE {c} END" for c in
            ("region_id", "root", "bytes", "bytes_sent", "bytes_recv")}
    return f"""
        SELECT rank, location_id, is_async, interval_idx, {null['region_id']} AS region_id, comm_id, seq,
               CASE WHEN op < 0 THEN NULL ELSE {names}[op + 1] END AS op, {null['root']} AS root,
               {null['bytes']} AS bytes, {null['bytes_sent']} AS bytes_sent, {null['bytes_recv']} AS bytes_recv,
               enter_ns, leave_ns, last_arrival_ns, wait_ns, transfer_ns, ranks_matched,
               CASE WHEN by_name THEN '{SOURCES[1]}' ELSE '{SOURCES[0]}' END AS source
        FROM {{rows}}
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
