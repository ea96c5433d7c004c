"""The verbs on why a step is slow, run as a user runs them, on a literal straggler trace."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.analyze.test_delays import step
from tests.conftest import ROOT
from tests.kineto_literal import late_kernels
from tests.literal import write_literal


def analyze(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "analyze.cli", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two runs of 3 ranks and 4 steps: in the second, rank 2 loads data 30 ms longer at steps 1-2."""
    out = tmp_path_factory.mktemp("cli")
    for name, slow in (("even", 10), ("straggler", 40)):
        items = []
        for s in range(4):
            for rank in range(3):
                items += step(rank, 200 * s, slow if rank == 2 and s in (1, 2) else 10, 50, 50)
        write_literal(out / name, items)
    return out / "even", out / "straggler"


def test_causes_prints_the_sentence(runs: tuple[Path, Path]) -> None:
    proc = analyze("causes", str(runs[1]))
    assert proc.returncode == 0, proc.stderr
    assert "idle time: 120.0 ms over 12 rank-steps" in proc.stdout
    assert "rank 2's dltrace.dataloader at steps 1-2 caused 120.0 ms of idle on 2 ranks (100% of all idle)" \
        in proc.stdout
    quiet = analyze("causes", str(runs[0]))
    assert quiet.returncode == 0 and "no idle time" in quiet.stdout


def test_overlap_and_critical_path_tables(runs: tuple[Path, Path]) -> None:
    proc = analyze("overlap", str(runs[1]))
    assert proc.returncode == 0, proc.stderr
    assert "allreduce" in proc.stdout and "hidden_ms" in proc.stdout
    path = analyze("critical-path", str(runs[1]))
    assert path.returncode == 0, path.stderr
    # steps 1 and 2 cost 20 ms each (160 ms on the path, 140 ms balanced)
    assert "imbalance cost: 40.0 ms of 640.0 ms (6.2%)" in path.stdout
    assert "dltrace.forward" in path.stdout
    # a long run prints the steps that cost the most, and the cost of all of them
    top = analyze("critical-path", str(runs[1]), "--steps", "1")
    assert top.returncode == 0, top.stderr
    table = top.stdout.split("(1 of 4 steps")[0].splitlines()
    assert len(table) == 2 and table[1].split()[0] in ("1", "2"), top.stdout
    assert "imbalance cost: 40.0 ms of 640.0 ms (6.2%)" in top.stdout
    # a run without accelerator streams has no devices' path
    assert "on the accelerators" not in path.stdout


def test_critical_path_prints_the_devices_path(tmp_path: Path) -> None:
    # kineto_literal.late_kernels: at step 0 rank 0's allreduce kernel waited 20 us for rank 1's
    proc = analyze("critical-path", str(late_kernels(tmp_path / "run", second_step_start=110)))
    assert proc.returncode == 0, proc.stderr
    device = proc.stdout.split("on the accelerators (walked back through the waits inside collective kernels):\n")[1]
    lines = device.splitlines()
    assert lines[0].split() == ["step", "path_ms", "path_ranks", "path", "critical_rank", "critical_ms"]
    assert lines[1].split() == ["0", "0.10", "2", "1", "->", "0", "1", "0.06"]
    assert lines[2].split() == ["1", "0.09", "1", "0", "0", "0.09"]
    assert lines[3] == "where the accelerators' path runs (all steps):"
    assert lines[4].split() == ["rank", "path_ms", "path%"] and lines[5].split() == ["0", "0.13", "68.4"]
    # printing one step: the one whose path runs longest on other ranks than the one that ended it
    one = analyze("critical-path", str(tmp_path / "run"), "--steps", "1").stdout
    assert "(1 of 2 steps: those whose path spends longest on other ranks" in one
    assert one.split("collective kernels):\n")[1].splitlines()[1].split()[:2] == ["0", "0.1"]


def test_balance_with_shares_given_and_their_errors(runs: tuple[Path, Path]) -> None:
    proc = analyze("balance", str(runs[0]), "--shares", "0.5,0.25,0.25", "--global-batch", "64")
    assert proc.returncode == 0, proc.stderr
    assert "shares that balance compute: --shares " in proc.stdout and "predicted step" in proc.stdout
    bad = analyze("balance", str(runs[0]), "--shares", "0.5,0.5")
    assert bad.returncode != 0 and "gives 2 shares for 3 ranks" in bad.stderr and "Traceback" not in bad.stderr
    worse = analyze("balance", str(runs[0]), "--shares", "a,b")
    assert worse.returncode != 0 and "expected shares such as 0.7,0.3" in worse.stderr


def test_diff_prints_and_draws(runs: tuple[Path, Path], tmp_path: Path) -> None:
    out = tmp_path / "d.pdf"
    proc = analyze("diff", str(runs[0]), str(runs[1]), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("A: even (1 run)   B: straggler (1 run)")
    assert out.is_file() and (tmp_path / "d-diff.png").is_file()
    wrong = analyze("diff", str(runs[0]), str(runs[1]), "-o", str(tmp_path / "d.png"))
    assert wrong.returncode != 0 and "must be written to a .pdf file" in wrong.stderr
    missing = analyze("diff", str(runs[0]), str(tmp_path / "nope"))
    assert missing.returncode != 0 and "no such run or directory" in missing.stderr
    assert "Traceback" not in missing.stderr


@pytest.mark.parametrize("verb", ["causes", "overlap", "critical-path", "balance", "patterns", "export", "energy"])
def test_a_verb_that_builds_reads_on_the_builds_connection(
        verb: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Each verb that may build reads what it prints from the build's own connection (no second
    DuckDB instance, 20-30 ms), and prints the same from a current database read read-only;
    energy's sentence about a run without power comes once the database is installed."""
    import duckdb

    from analyze.cli import build_parser
    from analyze.errors import AnalyzeError
    from analyze.tables import database

    items = []
    for s in range(2):
        for rank in range(2):
            items += step(rank, 200 * s, 40 if rank == 1 else 10, 50, 50)
    run = tmp_path / "run"
    write_literal(run, items)
    extra = ["--output", str(tmp_path / "out.json.gz")] if verb == "export" else []
    made: list[bool] = []
    real_connect = duckdb.connect

    def spy(*args: object, **kwargs: object) -> duckdb.DuckDBPyConnection:
        made.append(bool(kwargs.get("read_only")))
        return real_connect(*args, **kwargs)  # type: ignore[arg-type]

    def printed() -> str:
        ns = build_parser().parse_args([verb, str(run), *extra])
        try:
            ns.command(ns)
        except AnalyzeError as e:
            print(f"analyze: {e}")
        return capsys.readouterr().out

    monkeypatch.setattr(duckdb, "connect", spy)
    first = printed()
    assert made == [False]  # the build's one instance, read too
    assert database.is_current(database.resolve(run), {"step_region": None, "patterns": database.pattern_set.load(
        None).digest()})
    made.clear()
    again = printed()
    assert made and all(made)  # current: read-only
    assert again == first and ("no energy or power samples" in first if verb == "energy" else "analyze:" not in first)
