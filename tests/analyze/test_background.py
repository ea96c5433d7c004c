"""Horovod's background thread per step, from timeline locations (analyze/background.py)."""

from __future__ import annotations

from pathlib import Path

import analyze
from analyze import background
from tests.analyze.test_inputs import cli
from tests.literal import write_literal

MS = 1_000_000
NEG = {"timeline": "horovod allreduce.a", "role": "wait"}


def horovod_run(path: Path) -> Path:
    def act(name: str) -> dict[str, str]:
        return {"timeline": name}

    write_literal(path, [
        (0, "dltrace.step", 0, 100 * MS), (0, "dltrace.step", 100 * MS, 200 * MS),
        (1, "dltrace.step", 0, 100 * MS), (1, "dltrace.step", 100 * MS, 200 * MS),
        (0, "MPI_Allreduce", 40 * MS, 70 * MS, {"op": "allreduce", "bytes": 64}),
        (1, "MPI_Allreduce", 50 * MS, 70 * MS, {"op": "allreduce", "bytes": 64}),
        # two tensors negotiated with overlap (10-40 covered once), one negotiation across steps
        (0, "horovod.NEGOTIATE_ALLREDUCE", 10 * MS, 30 * MS, NEG),
        (0, "horovod.ALLREDUCE", 35 * MS, 60 * MS, act("horovod allreduce.a")),
        (0, "horovod.NEGOTIATE_ALLREDUCE", 95 * MS, 110 * MS, NEG),
        (0, "horovod.NEGOTIATE_ALLREDUCE", 20 * MS, 40 * MS, {**NEG, "timeline": "horovod allreduce.b"}),
        (0, "horovod.ALLREDUCE", 45 * MS, 70 * MS, act("horovod allreduce.b")),
        (0, "horovod.MEMCPY_IN_FUSION_BUFFER", 35 * MS, 38 * MS, act("horovod activities")),
        (0, "horovod.GLOO_ALLREDUCE", 38 * MS, 55 * MS, act("horovod activities")),
        (0, "horovod.MEMCPY_OUT_FUSION_BUFFER", 55 * MS, 57 * MS, act("horovod activities")),
        (0, "horovod.GLOO_ALLREDUCE", 60 * MS, 68 * MS, act("horovod activities")),
    ])
    return path


def test_per_step_covered_time_of_each_activity(tmp_path: Path) -> None:
    db = analyze.open(horovod_run(tmp_path / "run"))
    assert background.available(db)
    rows = background.per_step(db).to_dict("records")
    assert rows == [
        {"step": 0, "step_ns": 100 * MS, "negotiate_ns": 35 * MS, "fusion_copy_ns": 5 * MS,
         "transfer_ns": 25 * MS, "allreduce_ns": 20 * MS, "idle_ns": 10 * MS},
        {"step": 1, "step_ns": 100 * MS, "negotiate_ns": 10 * MS, "fusion_copy_ns": 0,
         "transfer_ns": 0, "allreduce_ns": 0, "idle_ns": 0},
    ]
    # timeline locations stay out of the main thread's phases and steps
    assert db.execute("SELECT count(*) FROM steps").fetchone() == (4,)


def test_phases_prints_the_background_table_only_with_a_timeline(tmp_path: Path) -> None:
    out = cli("phases", str(horovod_run(tmp_path / "run")))
    assert out.returncode == 0, out.stderr
    lines = {" ".join(line.split()[:-2]): line.split()[-2:] for line in out.stdout.splitlines()
             if line.strip().startswith(("horovod ", "main thread"))}
    assert lines == {  # mean ms per step of rank 0, and % of its 200 ms
        "horovod negotiate": ["22.5", "22.5"], "horovod fusion copies": ["2.5", "2.5"],
        "horovod transfer": ["12.5", "12.5"], "main thread allreduce": ["10.0", "10.0"],
        "main thread idle": ["5.0", "5.0"]}
    plain = tmp_path / "plain"
    write_literal(plain, [(0, "dltrace.step", 0, 10 * MS)])
    out = cli("phases", str(plain))
    assert out.returncode == 0 and "horovod" not in out.stdout
    assert background.per_step(analyze.open(plain)).empty
