"""Collectives numbered and finished in numpy (analyze/tables/collectives.py: number, final)
give the rows of the SQL they replaced, on random collectives: any order, ties, several
ranks, locations and communicators, rooted operations with roots in and out of range,
unknown and bookkeeping operations, unknown bytes and regions, name-only collectives and
locations that are not defined. ``collective_rows`` (the SQL that numbers a rank with too
many collectives for memory) is the oracle of ``number``; the SQL ``final`` replaced is kept
here as its oracle."""

from __future__ import annotations

import duckdb
import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analyze.readers.columns import COLLECTIVE_COLUMNS
from analyze.tables import collectives
from analyze.tables.collectives import ALL_TO_ONE, NOT_DATA, ONE_TO_ALL

VOCABULARY = collectives.vocabulary(["allreduce", "broadcast", "mylib's op"])
OPS = [code for code, _ in collectives.op_names()] + [-1, 99]  # 99: a code OTF2 does not have
MEMBERS = {0: [0, 1, 2], 1: [2, 0], 5: [1]}  # communicator 7: not defined
LOCATIONS = {10: True, 11: False, 20: True, 21: False, 30: True}  # 40: not defined

record = st.fixed_dictionaries({
    "location_id": st.sampled_from([10, 11, 20, 21, 30, 40]), "interval_idx": st.integers(-1, 6),
    "begin_ns": st.integers(0, 30), "op": st.sampled_from(OPS), "comm_id": st.sampled_from([0, 1, 5, 7]),
    "root": st.integers(-1, 3), "bytes_sent": st.integers(-1, 9), "bytes_recv": st.integers(-1, 9),
    "region_id": st.integers(-1, 3), "enter_ns": st.integers(0, 20), "length": st.integers(0, 15)})
by_name = st.fixed_dictionaries({
    "location_id": st.sampled_from([10, 20, 40]), "interval_idx": st.integers(0, 6),
    "region_id": st.integers(0, 3), "enter_ns": st.integers(0, 20), "length": st.integers(0, 15),
    "op": st.sampled_from([None, "allreduce", "broadcast", "mylib's op"]), "comm_id": st.sampled_from([-1, -2, 0])})


def rank_of(location: int) -> int:
    return location // 10 - 1


def raw_columns(rows: list[dict]) -> dict[str, np.ndarray]:
    given = {c: [r[c] for r in rows] for c in COLLECTIVE_COLUMNS if rows and c in rows[0]}
    given["rank"] = [rank_of(r["location_id"]) for r in rows]
    given["end_ns"] = [r["begin_ns"] + 1 for r in rows]
    given["leave_ns"] = [r["enter_ns"] + r["length"] for r in rows]
    return {c: np.array(given.get(c, []), dtype=t) for c, t in COLLECTIVE_COLUMNS.items()}


def named_columns(rows: list[dict]) -> dict[str, np.ndarray]:
    return {"location_id": np.array([r["location_id"] for r in rows], np.int64),
            "rank": np.array([rank_of(r["location_id"]) for r in rows], np.int32),
            "interval_idx": np.array([r["interval_idx"] for r in rows], np.int64),
            "region_id": np.array([r["region_id"] for r in rows], np.int64),
            "enter_ns": np.array([r["enter_ns"] for r in rows], np.int64),
            "leave_ns": np.array([r["enter_ns"] + r["length"] for r in rows], np.int64),
            "op": np.array([r["op"] for r in rows], dtype=object),
            "comm_id": np.array([r["comm_id"] for r in rows], np.int64)}


def database(raw: dict[str, np.ndarray], named: dict[str, np.ndarray]) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    con.register("raw_df", raw)
    con.execute("CREATE TABLE raw_collectives AS SELECT * FROM raw_df")
    con.register("named_df", pd.DataFrame(named))
    con.execute("CREATE TABLE named_collectives AS SELECT location_id, rank, interval_idx, region_id, enter_ns, "
                "leave_ns, op::VARCHAR AS op, comm_id FROM named_df")
    con.execute("CREATE TABLE locations (location_id BIGINT, is_main BOOLEAN)")
    con.executemany("INSERT INTO locations VALUES (?, ?)", list(LOCATIONS.items()))
    con.execute("CREATE TABLE communicators (comm_id BIGINT, members INTEGER[])")
    con.executemany("INSERT INTO communicators VALUES (?, ?)", list(MEMBERS.items()))
    collectives.create_op_names(con)
    return con


def ordered(rows: dict[str, np.ndarray]) -> list[tuple]:
    return sorted(tuple(int(rows[c][i]) for c in collectives.ROW_COLUMNS) for i in range(len(rows["seq"])))


def without_ties(rows: list[dict]) -> list[dict]:
    """SQL's row_number numbers rows tied in its order (rank, communicator, enter, location,
    instance, begin) either way: keep one of each."""
    seen, kept = set(), []
    for r in rows:
        key = (rank_of(r["location_id"]), r["comm_id"], r["enter_ns"], r["location_id"], r["interval_idx"],
               r.get("begin_ns", r["enter_ns"]))
        if key not in seen:
            seen.add(key)
            kept.append(r)
    return kept


@settings(max_examples=200, deadline=None)
@given(st.lists(record, max_size=30), st.lists(by_name, max_size=10))
def test_number_gives_the_rows_of_the_sql(records: list[dict], names: list[dict]) -> None:
    # records and name-only collectives never tie with each other or themselves (SQL's
    # row_number numbers tied rows in any order)
    records = without_ties(records)
    names = [n for n in without_ties(names)
             if all((rank_of(r["location_id"]), r["comm_id"], r["enter_ns"], r["location_id"], r["interval_idx"])
                    != (rank_of(n["location_id"]), n["comm_id"], n["enter_ns"], n["location_id"], n["interval_idx"])
                    for r in records)]
    raw, named = raw_columns(records), named_columns(names)
    con = database(raw, named)
    sql = con.execute(collectives.collective_rows(VOCABULARY)).fetchnumpy()
    ours = collectives.number(raw, named, LOCATIONS, {k: np.array(v) for k, v in MEMBERS.items()}, VOCABULARY)
    assert ordered(ours) == ordered({c: np.asarray(v) for c, v in sql.items()})
    bookkeeping = {code for code, name in collectives.op_names() if name in NOT_DATA}
    assert not set(ours["op"].tolist()) & bookkeeping
    assert len(ours["seq"]) == sum(r["location_id"] in LOCATIONS and r["op"] not in bookkeeping for r in records) + \
        sum(n["location_id"] in LOCATIONS for n in names)


def old_final(con: duckdb.DuckDBPyConnection) -> dict[str, np.ndarray]:
    """The SQL ``final`` replaced (over views coll_rows, instances; operations by name)."""
    return con.execute(f"""
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
        FROM a ORDER BY rank, comm_id, seq
    """).fetchall()


@settings(max_examples=200, deadline=None)
@given(st.lists(record, max_size=30), st.lists(by_name, max_size=10), st.integers(0, 5))
def test_final_gives_the_rows_of_the_sql(records: list[dict], names: list[dict], dropped: int) -> None:
    raw, named = raw_columns(without_ties(records)), named_columns(without_ties(names))
    rows = collectives.number(raw, named, LOCATIONS, {k: np.array(v) for k, v in MEMBERS.items()}, VOCABULARY)
    con = duckdb.connect()
    con.register("numbered", rows)
    names = "[" + ", ".join("'" + n.replace("'", "''") + "'" for n in VOCABULARY) + "]"
    con.execute(f"""CREATE TABLE coll_rows AS  -- as the SQL numbering wrote them before
        SELECT rank, location_id, interval_idx, CASE WHEN region_id < 0 THEN NULL ELSE region_id END AS region_id,
               comm_id, CASE WHEN op < 0 THEN NULL ELSE {names}[op + 1] END AS op,
               CASE WHEN root < 0 THEN NULL ELSE root END AS root,
               CASE WHEN bytes_sent < 0 THEN NULL ELSE bytes_sent END AS bytes_sent,
               CASE WHEN bytes_recv < 0 THEN NULL ELSE bytes_recv END AS bytes_recv, enter_ns, leave_ns,
               CASE WHEN by_name THEN 'name' ELSE 'record' END AS source, is_async, seq, is_root
        FROM numbered""")
    con.execute(f"CREATE TABLE instances AS {collectives.collective_match()}")
    # an instance the shuffle did not give (it never happens) drops its rows, as SQL's join does
    con.execute(f"DELETE FROM instances WHERE seq = {dropped}")
    found = con.execute("SELECT comm_id, seq, last_enter, ranks_matched, coalesce(root_enter, -1) AS root_enter, "
                        "root_enter IS NOT NULL AS has_root FROM instances").fetchnumpy()
    done = collectives.final(rows, {c: np.asarray(v) for c, v in found.items()}, VOCABULARY)
    con.register("done", done)
    ours = con.execute(f"SELECT * FROM ({collectives.final_select(VOCABULARY).format(rows='done')}) "
                       "ORDER BY rank, comm_id, seq").fetchall()
    assert ours == old_final(con)


@settings(max_examples=150, deadline=None)
@given(st.sampled_from([(0, 50), (0, 2**40)]), st.data())
def test_instances_are_found_by_communicator_and_sequence(seqs: tuple[int, int], data: st.DataObject) -> None:
    # a dense range of keys is a table, a narrow one one integer key to sort; communicators far
    # apart need the general lookup
    pair = st.tuples(st.sampled_from([0, 3, -5, 2**61, -2**61, 9]), st.integers(*seqs))
    given_keys = data.draw(st.lists(pair, max_size=20, unique=True))
    wanted = data.draw(st.lists(pair, max_size=20))
    comm, seq = (np.array([k[i] for k in given_keys], np.int64) for i in (0, 1))
    want_comm, want_seq = (np.array([k[i] for k in wanted], np.int64) for i in (0, 1))
    where = {k: i for i, k in enumerate(given_keys)}
    assert collectives.position(comm, seq, want_comm, want_seq).tolist() == [where.get(k, -1) for k in wanted]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(-2**20, 2**20), st.integers(0, 2**40)), min_size=1, max_size=30),
       st.integers(1, 64))
def test_keys_hashed_in_numpy_meet_those_hashed_in_sql(keys: list[tuple[int, int]], buckets: int) -> None:
    # a group numbered in numpy and another in SQL send the same instance to the same bucket
    from analyze.tables import stages

    spec = stages.Spec(anchor="", root="", reader="native", global_offset=0, resolution=1, buckets=buckets)
    comm, seq = (np.array([k[i] for k in keys], np.int64) for i in (0, 1))
    con = duckdb.connect()
    con.register("keys", {"comm_id": comm, "seq": seq})
    sql = con.execute(f"SELECT {stages._bucket_of(spec, 'comm_id', 'seq')} FROM keys").fetchnumpy()["bucket"]
    assert stages._buckets(spec, comm, seq).tolist() == np.asarray(sql).tolist()


instance = st.tuples(st.sampled_from([0, 3, -5, 2**61, 9]), st.integers(0, 40), st.integers(0, 99),
                     st.integers(1, 4), st.integers(-1, 99))


@settings(max_examples=60, deadline=None)
@given(given_instances=st.lists(instance, max_size=30, unique_by=lambda i: i[:2]),
       wanted=st.lists(st.tuples(st.sampled_from([0, 3, -5, 2**61, 7]), st.integers(0, 40)), max_size=20),
       files=st.integers(1, 3), by_codec=st.booleans(), limit=st.sampled_from([0, 1000]))
def test_a_slices_instances_are_those_of_its_communicators_and_sequence_ranges(
        given_instances: list[tuple[int, ...]], wanted: list[tuple[int, int]], files: int, by_codec: bool,
        limit: int, tmp_path_factory: pytest.TempPathFactory) -> None:
    # the shuffle's instances (bucket files written by the codec or, without it, by DuckDB)
    # that a slice of rows needs: per communicator of the rows, the sequence numbers from its
    # smallest to its largest, as the SQL join with those ranges gives them (which reads
    # DuckDB's files and more than the limit of rows; numpy the codec's few)
    from analyze.tables import stages
    from analyze.tables.store import Store

    work = Store(tmp_path_factory.mktemp("work"))
    con = duckdb.connect()
    columns = [c.name for c in stages.INSTANCES.columns]
    rows: dict[str, np.ndarray] = {c: np.array([i[k] for i in given_instances], np.int64) for k, c in enumerate(columns[:-1])}
    rows["has_root"] = rows["root_enter"] >= 0
    for b in range(files):
        part = {c: v[b::files] for c, v in rows.items()}
        if by_codec:
            work.write_arrays(con, stages.INSTANCES, part, str(b))
        else:
            work.dir(stages.INSTANCES).mkdir(parents=True, exist_ok=True)
            con.register("part", part)
            con.execute(f"COPY part TO '{work.dir(stages.INSTANCES) / f'{b}.parquet'}' (FORMAT parquet)")
            con.unregister("part")
    paths = sorted(work.dir(stages.INSTANCES).glob("*.parquet"))  # as the finish tasks find them
    want = {"comm_id": np.array([w[0] for w in wanted], np.int64), "seq": np.array([w[1] for w in wanted], np.int64)}
    kept, stages.COLLECTIVE_ROWS = stages.COLLECTIVE_ROWS, limit
    try:
        found = stages._instances_of(con, work, paths, want)
    finally:
        stages.COLLECTIVE_ROWS = kept
    assert list(found) == columns
    con.register("want", want)
    con.register("given", rows)
    expected = con.execute("""
        SELECT i.* FROM given i
        JOIN (SELECT comm_id, min(seq) AS lo, max(seq) AS hi FROM want GROUP BY comm_id) w
          ON i.comm_id = w.comm_id AND i.seq BETWEEN w.lo AND w.hi ORDER BY comm_id, seq""").fetchall()
    order = np.lexsort((found["seq"], found["comm_id"]))
    assert [tuple(found[c][order][k].item() for c in columns) for k in range(len(order))] == expected


@settings(max_examples=80, deadline=None)
@given(arrivals=st.lists(st.tuples(st.sampled_from([0, 3, -5]), st.integers(0, 5), st.integers(-5, 99), st.booleans()),
                         max_size=40),
       batches=st.integers(1, 3), sparse=st.booleans(), limit=st.sampled_from([3, 1000]))
def test_a_buckets_instances_counted_in_numpy_are_the_sqls(
        arrivals: list[tuple[int, int, int, bool]], batches: int, sparse: bool, limit: int,
        tmp_path_factory: pytest.TempPathFactory) -> None:
    # the shuffle's match of one bucket (arrivals from several groups' files) in numpy, where
    # the keys are dense enough for a table; a communicator far from the others leaves it to the SQL
    from analyze.tables import stages

    spec = stages.Spec(anchor="", root=str(tmp_path_factory.mktemp("build")), reader="native", global_offset=0,
                       resolution=1, buckets=1)
    con = duckdb.connect()
    arrivals = arrivals + [(2**61, 0, 7, True)] * sparse
    rows = {c: np.array([a[i] for a in arrivals], t) for i, (c, t) in
            enumerate((("comm_id", np.int64), ("seq", np.int64), ("enter_ns", np.int64), ("is_root", bool)))}
    for b in range(batches):
        spec.work.write_arrays(con, stages.ARRIVALS, {c: v[b::batches] for c, v in rows.items()} | {
            "bucket": np.zeros(len(rows["seq"][b::batches]), np.int32)}, f"g{b}")
    kept, stages.COLLECTIVE_ROWS = stages.COLLECTIVE_ROWS, limit
    try:
        found = stages._instances_in_numpy(spec, 0)
    finally:
        stages.COLLECTIVE_ROWS = kept
    if not arrivals or sparse and len(arrivals) > 1 or len(arrivals) > limit:  # no files; keys too sparse; too many
        assert found is None
        return
    assert found is not None and list(found) == [c.name for c in stages.INSTANCES.columns]
    con.register("coll_rows", rows)
    expected = con.execute(f"""SELECT comm_id, seq, last_enter, ranks_matched, coalesce(root_enter, -1),
                                      root_enter IS NOT NULL FROM ({collectives.collective_match()})
                               ORDER BY comm_id, seq""").fetchall()
    assert [tuple(found[c][k].item() for c in found) for k in range(len(found["seq"]))] == expected
