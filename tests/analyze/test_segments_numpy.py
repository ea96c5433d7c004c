"""The phase stage's segments from arrays (phases.segments_of) are those of the SQL
(phases.segments) on built runs: recorded and name-pattern collectives, lanes, a late root and
sender, Kineto traces with NCCL kernels on streams; and the operation of an interval with
several collectives is a known one where there is one, as DuckDB's any_value takes it."""

from __future__ import annotations

from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pytest

import analyze
from analyze.engine.local import LocalEngine
from analyze.tables import phases
from tests.analyze.test_engines import literal_run, named_run

ROOT = Path(__file__).resolve().parents[2]


def from_arrays(con: duckdb.DuckDBPyConnection, ranks: list[int]) -> pd.DataFrame:
    listed = ", ".join(map(str, ranks))
    intervals = con.sql(f"SELECT i.rank, i.location_id, i.idx, i.region_id, i.start_ns, i.end_ns FROM intervals i "
                        f"JOIN locations l USING (location_id) WHERE l.is_main AND i.rank IN ({listed})").fetchnumpy()
    coll = con.sql(f"""
        SELECT c.rank, c.location_id, c.interval_idx, c.is_async, c.enter_ns, c.leave_ns, c.wait_ns,
               CASE WHEN c.op IS NULL THEN -1 WHEN c.op = 'allreduce' THEN 1 ELSE 0 END::TINYINT AS allreduce,
               l.kind = 'accelerator_stream' AS on_device
        FROM collectives c JOIN locations l USING (location_id) WHERE c.rank IN ({listed})""").fetchnumpy()
    return phases.segments_of({k: np.asarray(v) for k, v in intervals.items()}, con.sql(phases.LEVELS).fetchnumpy(),
                              {k: np.asarray(v) for k, v in coll.items()},
                              phases.receive_waits(con, f"AND p.rank IN ({listed})"))


def rows(frame: pd.DataFrame) -> list[tuple[int, ...]]:
    return sorted(map(tuple, frame[["rank", "start", "end", "level"]].to_numpy().tolist()))


@pytest.mark.parametrize("name", ["literal", "named", "kineto/hta_nccl_a100_rank0", "kineto/param_dlrm_v100_8rank",
                                  "kineto/hta_sampled_2rank", "scorep/sstelements-bcast4"])
def test_segments_from_arrays_are_those_of_sql(name: str, tmp_path: Path) -> None:
    if name == "literal":
        run, options = literal_run(tmp_path / "run"), {}
    elif name == "named":
        mine = tmp_path / "mylib.toml"
        mine.write_text('[[pattern]]\nlibrary = "mylib"\nglob = "mylib::sum_gradients"\ncategory = "allreduce"\n')
        run, options = named_run(tmp_path / "run"), {"patterns": mine}
    else:
        run, options = ROOT / "tests" / "fixtures" / name, {}
    db = analyze.build(run, db=tmp_path / "db.duckdb", engine=LocalEngine(1), **options).db
    with duckdb.connect(str(db), read_only=True) as con:
        ranks = [r for (r,) in con.execute("SELECT DISTINCT rank FROM intervals ORDER BY rank").fetchall()]
        assert rows(from_arrays(con, ranks)) == rows(phases.segments(con, ranks=ranks))
        assert rows(from_arrays(con, ranks[:1])) == rows(phases.segments(con, ranks=ranks[:1]))


def test_an_interval_takes_a_known_operation_of_its_collectives() -> None:
    # interval 0 performs an allreduce without a known op and one with; interval 1 only one
    # without (its region's level stays); interval 2 a broadcast
    collective = 1  # a region of the collective category, level by name: other
    levels = {"region_id": np.array([collective]), "by_op": np.array([True]), "level": np.array([phases.SYNC_OTHER])}
    intervals = {"rank": np.zeros(3, np.int32), "location_id": np.zeros(3, np.int64), "idx": np.arange(3),
                 "region_id": np.full(3, collective), "start_ns": np.array([0, 10, 20]), "end_ns": np.array([5, 15, 25])}
    coll = {"rank": np.zeros(4, np.int32), "location_id": np.zeros(4, np.int64), "interval_idx": np.array([0, 0, 1, 2]),
            "is_async": np.zeros(4, bool), "enter_ns": np.array([0, 0, 10, 20]), "leave_ns": np.array([5, 5, 15, 25]),
            "wait_ns": np.zeros(4, np.int64), "allreduce": np.array([-1, 1, -1, 0], np.int8),
            "on_device": np.zeros(4, bool)}
    none = {k: np.zeros(0, np.int64) for k in ("rank", "start", "end", "level")}
    got = phases.segments_of(intervals, levels, coll, none)
    regions = got[got["end"] > got["start"]].sort_values("start")
    assert regions["level"].tolist() == [phases.SYNC_ALLREDUCE, phases.SYNC_OTHER, phases.SYNC_OTHER]
    levels["level"] = np.array([phases.COMPUTE])  # the interval without a known op keeps its region's
    got = phases.segments_of(intervals, levels, coll, none)
    assert got[got["end"] > got["start"]].sort_values("start")["level"].tolist() == [
        phases.SYNC_ALLREDUCE, phases.COMPUTE, phases.SYNC_OTHER]
