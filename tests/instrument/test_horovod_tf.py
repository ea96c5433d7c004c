"""Horovod with TensorFlow: 2-rank runs of runs/horovod_tf_resnet.py through our launcher, with
DistributedGradientTape in a tf.function and with horovod.tensorflow.keras in model.fit."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

import analyze
from tests.conftest import Run
from tests.instrument.test_tensorflow import phase_totals, run_ok

if os.environ.get("DLTRACE_SKIP_HOROVOD") == "1":  # the setup was told not to build Horovod
    pytest.skip("DLTRACE_SKIP_HOROVOD=1", allow_module_level=True)

pytestmark = pytest.mark.slow
SCRIPT = "runs/horovod_tf_resnet.py"
ARGS = ("--model", "tiny", "--batch-size", "8")
STEPS = 3


def gradient_tensors(run: Run) -> int:
    m = re.search(r"gradient tensors (\d+)", run.output)
    assert m, run.output
    return int(m.group(1))


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hvd-tf")


@pytest.fixture(scope="module")
def tape(out: Path) -> Run:
    return run_ok(out, "hvd-tape", "-np", "2", SCRIPT, *ARGS, "--steps", str(STEPS))


@pytest.fixture(scope="module")
def keras(out: Path) -> Run:
    return run_ok(out, "hvd-keras", "-np", "2", SCRIPT, "--api", "keras", *ARGS, "--steps", str(STEPS))


def allreduces_per_step(db: Any) -> list[tuple[int, int, list[str], int]]:
    """(rank, step, allreduce region names, bytes) of the allreduces issued in each step."""
    return db.execute("""
        SELECT s.rank, s.step, list(r.name ORDER BY r.name), sum(c.bytes)
        FROM steps s JOIN collectives c ON c.rank = s.rank AND c.op = 'allreduce'
             AND c.enter_ns >= s.start_ns AND c.enter_ns < s.end_ns
        JOIN regions r ON r.region_id = c.region_id
        GROUP BY s.rank, s.step ORDER BY s.rank, s.step
    """).fetchall()


def assert_every_step_allreduces_the_gradients(run: Run) -> Any:
    info = run.info
    assert info["status"] == "ok" and info["framework"] == "horovod-tensorflow"
    assert [r["steps"] for r in info["rank_info"]] == [STEPS, STEPS]
    db = analyze.open(run.run_dir)
    rows = allreduces_per_step(db)
    assert [(r[0], r[1]) for r in rows] == [(rank, s) for rank in (0, 1) for s in range(STEPS)]
    for rank, step, names, nbytes in rows:
        # one allreduce per gradient, named by Horovod's tensor name
        assert len(set(names)) == len(names) == gradient_tensors(run), (rank, step, names)
        assert all(n.startswith("horovod.allreduce:HorovodAllreduce_") for n in names), names
        assert nbytes == run.number("gradient bytes"), (rank, step)
    for key, phases in phase_totals(db).items():
        assert phases["compute"] > 0 and phases["allreduce"] > 0, (key, phases)
    return db


def test_tape_steps_allreduce_every_gradient_once(tape: Run) -> None:
    db = assert_every_step_allreduces_the_gradients(tape)
    # The n-th execution of each op pairs up across ranks: same tensor on both.
    groups = db.execute("""
        SELECT count(*), count(DISTINCT r.name), min(c.ranks_matched)
        FROM collectives c JOIN regions r USING (region_id) GROUP BY c.comm_id, c.seq
    """).fetchall()
    assert groups and all(row == (2, 1, 2) for row in groups), groups
    # Several allreduces of a step are in flight at once (Horovod can fuse them): the markers
    # did not serialize them.
    lanes = db.execute("SELECT max(location_id) - min(location_id) + 1 FROM collectives WHERE rank = 0 "
                       "AND op = 'allreduce'").fetchone()[0]
    assert lanes > 1


def test_initial_variables_are_broadcast_from_rank_0_before_the_first_step(tape: Run) -> None:
    db = analyze.open(tape.run_dir)
    rows = db.execute("""
        SELECT c.rank, count(*), min(c.root), max(c.root), max(c.leave_ns) < min(s.start_ns)
        FROM collectives c JOIN steps s ON s.rank = c.rank
        WHERE c.op = 'bcast' GROUP BY c.rank ORDER BY c.rank
    """).fetchall()
    # model variables (trainable and the BatchNorm statistics) and the optimizer's
    assert [r[0] for r in rows] == [0, 1] and rows[0][1] == rows[1][1] > gradient_tensors(tape)
    assert all(r[2] == r[3] == 0 and r[4] for r in rows), rows


def test_keras_fit_with_horovod_allreduces_every_gradient_once(keras: Run) -> None:
    assert_every_step_allreduces_the_gradients(keras)


def test_tracing_does_not_change_the_losses(out: Path, tape: Run) -> None:
    plain = run_ok(out, "hvd-plain", "--tracer", "none", "-np", "2", SCRIPT, *ARGS, "--steps", str(STEPS))
    assert len(tape.losses) == STEPS
    assert plain.losses == tape.losses


COLLECTIVES_SCRIPT = '''
import horovod.tensorflow as hvd
import tensorflow as tf

hvd.init()
r = hvd.rank()
x = tf.fill([4], float(r + 1))


def every_op(x):
    return [hvd.allreduce(x, op=hvd.Sum), *hvd.grouped_allreduce([x, 2 * x], op=hvd.Sum),
            hvd.allgather(tf.fill([r + 1, 2], float(r))), hvd.broadcast(x, root_rank=1),
            hvd.alltoall(tf.range(4, dtype=tf.float32) + 10 * r)]


print("eager", [t.numpy().tolist() for t in every_op(x)], flush=True)
print("graph", [t.numpy().tolist() for t in tf.function(every_op)(x)], flush=True)
'''


def test_every_horovod_tf_collective_is_recorded_eagerly_and_in_graphs(out: Path) -> None:
    script = out / "hvd_tf_collectives.py"
    script.write_text(COLLECTIVES_SCRIPT)
    run = run_ok(out, "hvd-ops", "-np", "2", str(script))
    results = {kind: json.loads(m) for kind, m in re.findall(r"\[rank 0\] (eager|graph) (\[.*\])", run.output)}
    assert results["eager"] == results["graph"]
    assert results["eager"][:3] == [[3.0] * 4, [3.0] * 4, [6.0] * 4]  # the values are Horovod's
    db = analyze.open(run.run_dir)
    rows = db.execute("""
        SELECT c.rank, c.op, regexp_replace(r.name, ':.*', ''), count(*), min(c.bytes_sent),
               max(c.bytes_sent), min(c.bytes_recv), max(c.bytes_recv), min(c.root), min(c.ranks_matched)
        FROM collectives c JOIN regions r USING (region_id)
        GROUP BY ALL ORDER BY 1, 2, 3
    """).fetchall()
    expected = []
    for rank in (0, 1):
        gathered = (rank + 1) * 2 * 4  # this rank's rows of the allgather, float32
        expected += [
            # op, region, eager + graph, sent, recv (allgather: 1 + 2 rows of 2 floats), root
            (rank, "allgather", "horovod.allgather", 2, gathered, gathered, 24, 24, None, 2),
            (rank, "allreduce", "horovod.allreduce", 2, 16, 16, 16, 16, None, 2),
            (rank, "allreduce", "horovod.grouped_allreduce", 2, 32, 32, 32, 32, None, 2),
            (rank, "alltoall", "horovod.alltoall", 2, 16, 16, 16, 16, None, 2),
            (rank, "bcast", "horovod.broadcast", 2, 16, 16, 16, 16, 1, 2),
        ]
    assert rows == expected
