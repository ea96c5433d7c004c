"""End to end: a loop that updates its weights by hand (no optimizer, as pytorch/examples'
regression) still has its steps, each from a forward pass to the next."""

from __future__ import annotations

from pathlib import Path

import pytest

import analyze
from tests.conftest import instrument_run

pytestmark = pytest.mark.slow


def test_steps_of_a_loop_without_an_optimizer(tmp_path: Path) -> None:
    run = instrument_run(tmp_path, "-np", "1", "tests/instrument/scripts/hand_sgd.py",
                         "--steps", "6", "--evaluate", "2", name="hand")
    assert run.proc.returncode == 0, run.output
    assert "(1 rank, 6 steps, " in run.proc.stdout
    db = analyze.open(run.run_dir)
    rows = db.execute("""
        select s.step, s.start_ns, s.end_ns,
               list(r.name order by i.start_ns) filter (where r.name like 'dltrace.%ward'),
               max(i.end_ns) filter (where r.name = 'dltrace.backward')
        from steps s join intervals i on i.rank = s.rank and i.start_ns >= s.start_ns
             and i.end_ns <= s.end_ns
        join regions r on r.region_id = i.region_id and r.name <> 'dltrace.step'
        group by all order by s.step
    """).fetchall()
    assert [r[0] for r in rows] == list(range(6))
    for step, _start, end, regions, backward_end in rows:
        assert regions == ["dltrace.forward", "dltrace.backward"], (step, regions)
        assert end >= backward_end
    # each step ends where the next begins: the update by hand is inside a step
    assert all(rows[i][2] == rows[i + 1][1] for i in range(5))
    # the evaluation's forward passes after the last backward are the tail, not a step
    tail = db.execute("select count(*) from intervals join regions using (region_id) "
                      "where name = 'dltrace.tail'").fetchone()
    assert tail == (1,)
