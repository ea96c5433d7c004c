"""Heterogeneous ranks: throughput and the balancing shares (rank_balance), with known answers."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import analyze
from analyze.tables.causes.balance import solve, split_batch
from tests.literal import write_literal

MS = 1_000_000
COLL = {"op": "allreduce", "bytes": 4096}


def run_with_shares(tmp_path: Path, params: dict, fwd_bwd: dict[int, int], steps: int = 3) -> Path:
    """Ranks with the given forward+backward ms per step (half each), 10 ms of optimizer,
    a blocking allreduce until 100 ms; run.json carries ``params``."""
    items = []
    for s in range(steps):
        base = 200 * s
        for rank, ms in fwd_bwd.items():
            half = ms // 2
            items += [(rank, "dltrace.step", base * MS, (base + 110) * MS),
                      (rank, "dltrace.forward", base * MS, (base + half) * MS),
                      (rank, "dltrace.backward", (base + half) * MS, (base + ms) * MS),
                      (rank, "MPI_Allreduce", (base + ms) * MS, (base + 100) * MS, COLL),
                      (rank, "dltrace.optimizer", (base + 100) * MS, (base + 110) * MS)]
    run = tmp_path / "run"
    write_literal(run, items)
    (run / "run.json").write_text(json.dumps({"params": params}))
    return run


def test_unequal_shares_give_throughput_and_balancing_shares(tmp_path: Path) -> None:
    # rank 0 takes 48 of 64 samples in 60 ms, rank 1 16 in 40 ms: 800 and 400 samples/s.
    # Balanced: fixed 10 ms each, T = (1 + 10 (0.0125 + 0.00625)) / 0.01875 = 63.33 ms,
    # shares (T - 10) x rate = 2/3 and 1/3
    run = run_with_shares(tmp_path, {"shares": "0.75,0.25", "global_batch": 64}, {0: 60, 1: 40})
    db = analyze.open(run)
    df = db.sql("select * from rank_balance order by rank").df()
    assert list(df["steps"]) == [2, 2]  # the first step left out
    assert list(df["samples"]) == [48, 16]
    assert list(df["scaled_ms"]) == [60, 40] and list(df["fixed_ms"]) == [10, 10]
    assert df["throughput_sps"].tolist() == pytest.approx([800, 400])
    assert df["balanced_share"].tolist() == pytest.approx([2 / 3, 1 / 3])
    assert list(df["balanced_samples"]) == [43, 21]
    assert df["predicted_compute_ms"].tolist() == pytest.approx([190 / 3] * 2)
    # predicted step: T plus the mean exposed communication: the allreduce from the last
    # arrival (60 ms) to its end (100 ms) on both ranks
    assert df["predicted_step_ms"].tolist() == pytest.approx([190 / 3 + 40] * 2)


def test_equal_shares_from_the_batch_size(tmp_path: Path) -> None:
    run = run_with_shares(tmp_path, {"batch_size": 16}, {0: 60, 1: 60})
    df = analyze.open(run).sql("select share, samples, balanced_share from rank_balance").df()
    assert df["share"].tolist() == [0.5, 0.5] and df["samples"].tolist() == [16, 16]
    assert df["balanced_share"].tolist() == pytest.approx([0.5, 0.5])


def test_a_rank_too_slow_for_any_share_gets_none() -> None:
    shares, t = solve(np.array([0.0, 50.0]), np.array([10.0, 10.0]), np.array([0.5, 0.5]))
    # rank 1's fixed time alone (50 ms) exceeds what rank 0 needs for the whole batch (20 ms)
    assert shares.tolist() == [1.0, 0.0] and t == pytest.approx(20.0)


def test_split_batch_is_whole_and_sums() -> None:
    assert split_batch(64, [0.7, 0.3]) == [45, 19]
    assert split_batch(10, [1, 1, 1]) == [4, 3, 3]


def test_many_ranks_print_groups_and_write_the_shares_to_a_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Above 64 ranks: rows of consecutive ranks, shares with the digits that tell them apart
    (1/80 of a batch is 0.0125, and a slow rank's share less: not 0.000), and the balancing
    shares in a file that ``--shares @FILE`` reads back, rather than 80 numbers on one line."""
    from analyze.cli import build_parser

    ranks = 80
    run = run_with_shares(tmp_path, {"global_batch": 8000}, {r: 40 + r // 2 for r in range(ranks)})

    def balance(*args: str) -> str:
        ns = build_parser().parse_args(["balance", str(run), *args])
        assert ns.command(ns) == 0
        return capsys.readouterr().out

    out = balance()
    lines = out.splitlines()
    assert lines[0] == "80 ranks in groups of 3 consecutive ranks, each row their mean (--all-ranks prints every rank)"
    assert lines[1].split()[:3] == ["ranks", "share", "samples"]
    assert lines[2].split()[:3] == ["0-2", "0.01250", "100.0"]
    assert len(lines) == 2 + 27 + 3
    written = run / "balanced_shares.txt"
    assert f"shares that balance compute, 80 of them (8,000 samples): written to {written}" in out
    values = [float(v) for v in written.read_text().split(",")]
    expected = analyze.open(run).sql("select balanced_share from rank_balance order by rank").df()["balanced_share"]
    assert len(values) == ranks and values == pytest.approx(list(expected), abs=5e-6)
    assert values[0] > values[-1] > 0.005  # the faster ranks get more
    again = balance("--shares", f"@{written}")
    assert "predicted step" in again
    every = balance("--all-ranks").splitlines()
    assert every[0].split()[0] == "rank" and len(every) == 1 + ranks + 3
    assert every[1].split()[:3] == ["0", "0.01250", "100"]  # a rank's samples whole, as before
    assert "--shares 0.0" in every[-3]  # few enough to print when asked for every rank


def test_shares_are_printed_with_three_significant_digits() -> None:
    from analyze.cli.balance import decimals, shares

    assert decimals([0.626, 0.374]) == 3
    assert decimals([1 / 4096, float("nan"), 0.0]) == 6  # 0.000244
    assert decimals([]) == 3
    assert shares("0.7, 0.3") == [0.7, 0.3] and shares("1 2\n3") == [1.0, 2.0, 3.0]
