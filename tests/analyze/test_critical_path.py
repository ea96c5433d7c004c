"""The critical path per step and the cost of imbalance, on literal traces with known answers."""

from __future__ import annotations

from pathlib import Path

import analyze
from analyze.tables.causes.critical_path import walk
from tests.literal import write_literal

MS = 1_000_000
COLL = {"op": "allreduce", "bytes": 4096}


def step(rank: int, base: int, compute: int, opt: int) -> list[tuple]:
    """From ``base`` ms: forward for ``compute`` ms, a blocking allreduce that completes at
    base + 150 (after the last rank arrives), then the optimizer for ``opt`` ms."""
    return [(rank, "dltrace.step", base * MS, (base + 150 + opt) * MS),
            (rank, "dltrace.forward", base * MS, (base + compute) * MS),
            (rank, "MPI_Allreduce", (base + compute) * MS, (base + 150) * MS, COLL),
            (rank, "dltrace.optimizer", (base + 150) * MS, (base + 150 + opt) * MS)]


def test_path_switches_ranks_between_steps(tmp_path: Path) -> None:
    # step 0: rank 1 computes 140 ms, rank 0 110 ms and has the longer optimizer (20 ms vs 15),
    #         so rank 0 ends the step, after waiting 30 ms for rank 1;
    # step 1: the other way round
    items = step(0, 0, 110, 20) + step(1, 0, 140, 15) + step(0, 200, 140, 15) + step(1, 200, 110, 20)
    write_literal(tmp_path / "run", items)
    db = analyze.open(tmp_path / "run")
    chain = db.sql("select step, hop, rank, start_ns, end_ns, via from critical_path order by step, hop").fetchall()
    assert chain == [
        (0, 0, 1, 0, 140 * MS, "allreduce"),  # rank 1 until it reaches the allreduce ...
        (0, 1, 0, 140 * MS, 170 * MS, None),  # ... then rank 0, which ends the step
        (1, 0, 0, 200 * MS, 340 * MS, "allreduce"),
        (1, 1, 1, 340 * MS, 370 * MS, None),
    ]
    balance = db.sql("""select step, duration_ns, slowest_rank_ns, balanced_ns, imbalance_ns, end_rank,
                               path_ranks, critical_rank, critical_region from step_balance order by step""").fetchall()
    # non-idle time: 170 - 30 = 140 ms on the rank that waited, 165 ms on the other: mean 152.5
    assert balance == [
        (0, 170 * MS, 170 * MS, 152_500_000, 17_500_000, 0, 2, 1, "dltrace.forward"),
        (1, 170 * MS, 170 * MS, 152_500_000, 17_500_000, 1, 2, 0, "dltrace.forward"),
    ]
    regions = db.sql("""select step, rank, region, duration_ns from critical_path_regions
                        order by step, rank, region""").fetchall()
    assert regions == [
        (0, 0, "MPI_Allreduce", 10 * MS), (0, 0, "dltrace.optimizer", 20 * MS),
        (0, 1, "dltrace.forward", 140 * MS),
        (1, 0, "dltrace.forward", 140 * MS),
        (1, 1, "MPI_Allreduce", 10 * MS), (1, 1, "dltrace.optimizer", 20 * MS),
    ]


def test_balanced_step_has_no_imbalance_cost(tmp_path: Path) -> None:
    write_literal(tmp_path / "run", step(0, 0, 100, 10) + step(1, 0, 100, 10))
    db = analyze.open(tmp_path / "run")
    assert db.sql("select duration_ns, balanced_ns, imbalance_ns, path_ranks from step_balance").fetchall() == [
        (160 * MS, 160 * MS, 0, 1)]


def test_walk_follows_a_chain_of_waits_across_three_ranks() -> None:
    # rank 2 ends last at 100 after waiting 60-80 for rank 1, which waited 30-50 for rank 0
    ends = {0: (0, 90), 1: (0, 95), 2: (0, 100)}
    waits = [(2, 60, 80, 1, 80, "allreduce"), (1, 30, 50, 0, 50, "bcast")]
    assert walk(ends, waits) == [(2, 80, 100, None), (1, 50, 80, "allreduce"), (0, 0, 50, "bcast")]


def test_walk_stays_on_a_rank_whose_idle_ended_before_its_cause_arrived() -> None:
    # rank 0's idle 30-40 was cut short (it computed again) while rank 1 arrived at 55
    assert walk({0: (0, 100), 1: (0, 90)}, [(0, 30, 40, 1, 55, "allreduce")]) == [(0, 0, 100, None)]


def _reference_paths(ends: dict[int, dict[int, tuple[int, int]]], waits: list[tuple]) -> tuple[list, list]:
    """What the windows' paths are by definition: :func:`walk` on every step (the chain rows
    and the path ends, as window_paths gives them)."""
    chain, summary = [], []
    for s in sorted(ends):
        path = walk(ends[s], [w[1:] for w in waits if w[0] == s])
        summary.append((s, path[-1][1], path[0][2], path[0][0]))
        kept = [(r, a, b, via) for r, a, b, via in reversed(path) if b > a or len(path) == 1]
        chain += [(s, hop, r, a, b, b - a, via) for hop, (r, a, b, via) in enumerate(kept)]
    return chain, summary


def test_window_paths_agree_with_walking_every_step() -> None:
    """Steps whose last rank has no wait inside the step are one stretch, found without a walk;
    the others are walked: random windows of 1-5 ranks give the rows of a walk on every step."""
    import numpy as np
    import pandas as pd

    from analyze.tables.causes.critical_path import window_paths
    from analyze.tables.causes.window import RankWindow, Window

    rng = np.random.default_rng(7)
    nothing = np.zeros(0, np.int64)
    walked_some = single_some = False
    for _ in range(400):
        n_ranks, n_steps = int(rng.integers(1, 6)), int(rng.integers(1, 12))
        ends: dict[int, dict[int, tuple[int, int]]] = {}
        ranks = {}
        for r in range(n_ranks):
            steps = np.sort(rng.choice(n_steps + 2, size=n_steps, replace=False)) if r else np.arange(n_steps)
            # coarse times: equal ends across ranks, waits ending at a step's very end
            start = steps * 10 + rng.integers(0, 3, len(steps))
            end = start + rng.integers(0, 6, len(steps))
            for s, a, b in zip(steps.tolist(), start.tolist(), end.tolist(), strict=True):
                ends.setdefault(s, {})[r] = (a, b)
            ranks[r] = RankWindow(r, steps, start, end, nothing, nothing, nothing, nothing, nothing.astype(bool))
        waits = []
        for _ in range(int(rng.integers(0, 4 * n_steps))):
            s = int(rng.choice(sorted(ends)))
            r = int(rng.choice(sorted(ends[s])))
            a, b = ends[s][r]
            i1 = int(rng.integers(a - 1, b + 2))
            i0 = int(rng.integers(a - 2, i1 + 1))
            cause = int(rng.integers(0, n_ranks + 1))  # n_ranks: a rank without the step
            enter = i1 - int(rng.integers(-2, 8))
            waits.append((s, r, i0, i1, cause, enter, "allreduce"))
        frame = pd.DataFrame(waits, columns=["step", "rank", "idle_start_ns", "idle_end_ns", "cause_rank",
                                             "cause_enter_ns", "op"])
        unknown = pd.DataFrame([(0, 0, 0, 0, None, 0, "x")], columns=frame.columns)  # no cause: ignored
        frame = pd.concat([frame, unknown], ignore_index=True).astype({"cause_rank": "Int64"})
        win = Window(0, 0, ranks, pd.DataFrame(), pd.DataFrame(), pd.DataFrame())
        chain, summary = window_paths(win, frame)
        want_chain, want_summary = _reference_paths(ends, waits)
        got = [(*row[:-1], None if pd.isna(row[-1]) else row[-1]) for row in chain.itertuples(index=False, name=None)]
        assert got == want_chain
        assert list(summary.itertuples(index=False, name=None)) == want_summary
        walked_some |= any(hop > 0 for _, hop, *_ in want_chain)
        single_some |= any(hop == 0 for _, hop, *_ in want_chain)
    assert walked_some and single_some
