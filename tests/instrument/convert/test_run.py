"""Run the output, do not only parse it: for a PyTorch loop, a Keras ``fit`` script and a TF2
``GradientTape`` loop (tests/instrument/convert/scripts/, synthetic data made in code),
``instrument run --horovodize`` trains 2 ranks under our launcher with the tracer, and:

- both ranks end with the same parameters (a checksum per rank; an optimizer left unwrapped
  would leave each rank with its own model),
- each rank saw half of the training samples,
- exactly one checkpoint file was written,
- the trace has allreduce regions on both ranks,
- on one rank the converted script prints the original's losses and ends with its parameters.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

import analyze
from tests.conftest import ROOT, Run, instrument_run

if os.environ.get("DLTRACE_SKIP_HOROVOD") == "1":  # the setup was told not to build Horovod
    pytest.skip("DLTRACE_SKIP_HOROVOD=1", allow_module_level=True)

pytestmark = pytest.mark.slow
SCRIPTS = Path(__file__).parent / "scripts"
FRAMEWORKS = {"pytorch": "torch_mnist_style.py", "keras": "keras_fit_style.py", "tensorflow": "tf_tape_style.py"}
STEP = re.compile(r"step (\d+) loss ([0-9.]+)")


@dataclass
class Runs:
    original: subprocess.CompletedProcess[str]
    two: Run
    one: Run
    checkpoints: Path


def rank_lines(run: Run, rank: int) -> str:
    prefix = f"[rank {rank}] "
    return "\n".join(line[len(prefix):] for line in run.output.splitlines() if line.startswith(prefix))


def value(text: str, label: str) -> str:
    m = re.search(re.escape(label) + r" (\S+)", text)
    assert m, text
    return m.group(1)


@pytest.fixture(scope="module", params=sorted(FRAMEWORKS))
def runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Runs:
    framework = request.param
    script = str((SCRIPTS / FRAMEWORKS[framework]).relative_to(ROOT))
    out = tmp_path_factory.mktemp(f"hvdize-{framework}")
    checkpoints = out / "checkpoints"
    checkpoints.mkdir()
    two = instrument_run(out, "-np", "2", "--horovodize", script, "--checkpoint-dir", str(checkpoints),
                         name="two")
    assert two.proc.returncode == 0, two.output
    one = instrument_run(out, "-np", "1", "--horovodize", script, name="one")
    assert one.proc.returncode == 0, one.output
    original = subprocess.run([sys.executable, script], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert original.returncode == 0, original.stderr
    return Runs(original, two, one, checkpoints)


def test_both_ranks_end_with_the_same_parameters(runs: Runs) -> None:
    digests = [value(rank_lines(runs.two, r), "parameters sha256") for r in (0, 1)]
    assert digests[0] == digests[1]
    # and they trained: not the one-rank result (each rank saw other samples, at twice the lr)
    assert digests[0] != value(runs.original.stdout, "parameters sha256")


def test_each_rank_saw_half_of_the_samples(runs: Runs) -> None:
    total = int(value(runs.original.stdout, "samples seen"))
    assert total == 256  # 128 synthetic samples, 2 epochs
    assert [int(value(rank_lines(runs.two, r), "samples seen")) for r in (0, 1)] == [total // 2, total // 2]


def test_exactly_one_checkpoint_is_written(runs: Runs) -> None:
    # the scripts put their process id in the file name, so two writers would leave two files
    assert len(list(runs.checkpoints.iterdir())) == 1


def test_the_trace_has_allreduces_on_both_ranks(runs: Runs) -> None:
    db = analyze.open(runs.two.run_dir)
    rows = db.execute("""SELECT c.rank, count(*), bool_and(r.name LIKE 'horovod.allreduce%')
                         FROM collectives c JOIN regions r USING (region_id)
                         WHERE c.op = 'allreduce' GROUP BY c.rank ORDER BY c.rank""").fetchall()
    assert [r[0] for r in rows] == [0, 1]
    assert all(count > 0 and horovod for _, count, horovod in rows)
    assert rows[0][1] == rows[1][1]  # the same allreduces on both ranks


def test_one_rank_reproduces_the_original(runs: Runs) -> None:
    original = STEP.findall(runs.original.stdout)
    converted = STEP.findall(runs.one.proc.stdout)  # one rank: Keras's progress bar splits its lines
    assert len(original) == 16 and converted == original  # 8 steps per epoch, 2 epochs
    assert value(rank_lines(runs.one, 0), "parameters sha256") == value(runs.original.stdout, "parameters sha256")


def test_run_json_records_the_conversion(runs: Runs) -> None:
    info = runs.two.info
    hvd = info["horovodize"]
    assert Path(hvd["source"]).parent == SCRIPTS
    assert Path(info["script"]) == runs.two.run_dir / Path(hvd["source"]).name.replace(".py", "_hvd.py")
    assert Path(info["script"]).read_text().count("hvd.init()  # added by instrument horovodize") == 1
    assert hvd["diff"].startswith("--- ") and "+hvd.init()  # added by instrument horovodize" in hvd["diff"]
    assert hvd["report"]["status"] == "converted" and "wrap_optimizer" in hvd["report"]["rules"]
    assert info["status"] == "ok" and info["framework"].startswith("horovod")


def test_horovodrun_runs_the_converted_script_too(tmp_path: Path) -> None:
    """``--launcher horovodrun`` instead of ours: the same conversion trains the same way."""
    script = str((SCRIPTS / FRAMEWORKS["pytorch"]).relative_to(ROOT))
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    run = instrument_run(tmp_path, "--launcher", "horovodrun", "-np", "2", "--horovodize", script,
                         "--checkpoint-dir", str(checkpoints), name="hr")
    assert run.proc.returncode == 0, run.output
    # horovodrun prefixes each rank's lines with [rank]<stdout>:
    per_rank = {r: "\n".join(line.split(":", 1)[1] for line in run.output.splitlines()
                             if f"[{r}]<stdout>:" in line) for r in (0, 1)}
    assert value(per_rank[0], "parameters sha256") == value(per_rank[1], "parameters sha256")
    assert [int(value(per_rank[r], "samples seen")) for r in (0, 1)] == [128, 128]
    assert len(list(checkpoints.iterdir())) == 1
    assert [r["steps"] for r in run.info["rank_info"]] == [8, 8]  # 4 steps per epoch on each rank
