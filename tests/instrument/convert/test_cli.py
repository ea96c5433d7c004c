"""``instrument horovodize`` as a user runs it: what it writes, prints, and its exit status."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from instrument.cli import main

SCRIPTS = Path(__file__).parent / "scripts"
TORCH = SCRIPTS / "torch_mnist_style.py"


def test_output_file_and_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, report = tmp_path / "train_hvd.py", tmp_path / "report.json"
    assert main(["horovodize", str(TORCH), "-o", str(out), "--report", str(report)]) == 0
    text = out.read_text()
    assert "hvd.init()  # added by instrument horovodize" in text
    printed = capsys.readouterr().out
    assert "pytorch script" in printed and f"written: {out}" in printed
    data = json.loads(report.read_text())
    assert data["status"] == "converted" and data["exit_status"] == 0 and data["framework"] == "pytorch"
    assert data["rules"] == ["init", "pin_device", "scale_lr", "wrap_optimizer", "broadcast_state",
                             "shard_data", "rank0_only"]
    # line 109 of the script: `optimizer = optim.Adadelta(model.parameters(), lr=args.lr)`
    assert {"rule": "wrap_optimizer", "line": 109,
            "detail": "`optimizer` wrapped in hvd.DistributedOptimizer with model.named_parameters()"} in data["applied"]
    assert [c["code"] for c in data["cannot_see"]] == ["eval_not_sharded", "fresh_optimizer_state"]
    assert data["warnings"] == [] and data["refusals"] == []
    # the output converts to itself
    assert main(["horovodize", str(out), "--check"]) == 0
    assert "already converted" in capsys.readouterr().out


def test_diff_and_check_write_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "train.py"
    script.write_text(TORCH.read_text())
    assert main(["horovodize", str(script), "--diff"]) == 0
    out = capsys.readouterr()
    assert out.out.startswith("--- train.py\n+++ train_hvd.py\n") and "+import horovod.torch as hvd" in out.out
    assert main(["horovodize", str(script), "--check"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.py"]


def test_without_output_the_script_goes_to_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["horovodize", str(TORCH)]) == 0
    out = capsys.readouterr()
    assert out.out.startswith('"""A single-device PyTorch') and "hvd.init()" in out.out
    assert "pytorch script" in out.err


def test_refused_writes_nothing_and_says_one_sentence(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "ddp.py"
    script.write_text("import torch\nimport torch.distributed as dist\ndist.init_process_group('gloo')\n")
    out, report = tmp_path / "ddp_hvd.py", tmp_path / "r.json"
    assert main(["horovodize", str(script), "-o", str(out), "--report", str(report)]) == 2
    assert not out.exists()
    err = capsys.readouterr().err.strip()
    assert err == (f"instrument horovodize: {script}: refused: line 2: the script is already distributed "
                   "(it uses torch.distributed); convert the single-process version instead.")
    data = json.loads(report.read_text())
    assert data["status"] == "refused" and data["refusals"][0]["code"] == "already_distributed"
    assert main(["horovodize", str(script), "--check"]) == 2


def test_warnings_exit_3(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "dl.py"
    script.write_text(TORCH.read_text().replace("dataset1 = synthetic(args.samples, args.seed)",
                                                "dataset1 = datasets.MNIST('../data', download=True)"))
    out = tmp_path / "dl_hvd.py"
    assert main(["horovodize", str(script), "-o", str(out)]) == 3
    assert out.exists() and "warning: line 103:" in capsys.readouterr().out


def test_user_errors_are_one_sentence(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["horovodize", str(tmp_path / "missing.py")]) == 2
    assert capsys.readouterr().err.strip() == f"instrument: training script not found: {tmp_path / 'missing.py'}"
    script = tmp_path / "t.py"
    script.write_text(TORCH.read_text())
    assert main(["horovodize", str(script), "-o", str(script)]) == 2
    assert "names the script itself" in capsys.readouterr().err


def test_run_horovodize_refuses_before_anything_starts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "ddp.py"
    script.write_text("import torch\nmodel = torch.nn.parallel.DistributedDataParallel(net)\n")
    status = main(["run", "--out", str(tmp_path / "traces"), "-np", "2", "--horovodize", str(script)])
    assert status == 2 and not (tmp_path / "traces").exists()
    assert capsys.readouterr().err.strip() == (
        f"instrument: --horovodize: {script}: refused: line 2: the script is already distributed (it uses "
        "DistributedDataParallel); convert the single-process version instead.")
