"""Designs and sweeps: parsing, the seeded order, resuming, failures, the CLI.

The sweeps here run a one-line script without a tracer (a run takes a fraction of a second)
through the real launcher; the traced end-to-end sweep is in tests/reports/test_sweep_report.py.
"""

from __future__ import annotations

import fcntl
import io
import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from instrument.errors import UsageError
from instrument.experiments import design, sweep
from instrument.launch import runinfo
from tests.conftest import ROOT

DESIGNS = ROOT / "runs" / "designs"
JOB = """import sys
print("job args", sys.argv[1:], flush=True)
sys.exit(3 if "--fail" in sys.argv else 0)
"""


def parse(text: str) -> design.Design:
    import tomllib
    return design.parse(tomllib.loads(text), Path("t.toml"))


@pytest.fixture()
def job(tmp_path: Path) -> Path:
    path = tmp_path / "job.py"
    path.write_text(JOB)
    return path


def job_design(job: Path, factors: str, replications: int = 2, seed: int = 3) -> design.Design:
    return parse(f'script = "{job}"\ntracer = "none"\nreplications = {replications}\nseed = {seed}\n'
                 f"[factors]\n{factors}")


def test_the_shipped_designs_parse() -> None:
    sizes = {}
    for path in sorted(DESIGNS.glob("*.toml")):
        d = design.load(path)
        sizes[path.stem] = (len(d.configs), d.replications, len(d.plan()))
        assert all(Path(ROOT / s.script).is_file() for s in d.plan())
    assert sizes["tiny"] == (2, 2, 4)
    assert sizes["quick"] == (16, 3, 48)  # 2 x 2 x 2 x 2 configurations
    assert sizes["sync_vs_accum"] == (24, 5, 120)  # 2 x 2 x 3 x 2


def test_levels_become_script_arguments_ranks_and_settings() -> None:
    d = parse("""
        name = "x"
        script = "a.py"
        args = ["--steps", "5"]
        [factors.sync]
        levels.plain = { args = ["--accumulate", "1"] }
        levels.accum = { args = ["--accumulate", "4"], env = { A = "1" }, script = "b.py" }
        [factors]
        batch_size = [16, 32]
        verbose = [false, true]
        lr = { arg = "--learning-rate", levels = [0.1] }
        ranks = [1, 2]
    """)
    assert [f.name for f in d.factors] == ["sync", "batch_size", "verbose", "lr", "ranks"]
    assert len(d.configs) == 2 * 2 * 2 * 1 * 2
    specs = {s.name: s for s in d.plan()}
    s = specs["sync=accum,batch_size=32,verbose=true,lr=0.1,ranks=2,rep=1"]
    assert s.args == ["--steps", "5", "--accumulate", "4", "--batch-size", "32", "--verbose",
                      "--learning-rate", "0.1"]
    assert (s.script, s.nprocs, s.env) == ("b.py", 2, {"A": "1"})
    assert s.factors == {"sync": "accum", "batch_size": 32, "verbose": True, "lr": 0.1, "ranks": 2}
    plain = specs["sync=plain,batch_size=16,verbose=false,lr=0.1,ranks=1,rep=1"]
    assert plain.args == ["--steps", "5", "--accumulate", "1", "--batch-size", "16", "--learning-rate", "0.1"]
    assert (plain.script, plain.nprocs) == ("a.py", 1)


def test_nodes_fill_the_launcher_arguments() -> None:
    d = parse("""
        script = "a.py"
        launcher = "srun"
        launcher_args = ["--nodes={nodes}", "--ntasks-per-node={ranks_per_node}"]
        ranks_per_node = 4
        [factors]
        nodes = [1, 2, 4]
    """)
    got = sorted((s.nprocs, tuple(s.launcher_args)) for s in d.plan())
    assert got == [(4, ("--nodes=1", "--ntasks-per-node=4")), (8, ("--nodes=2", "--ntasks-per-node=4")),
                   (16, ("--nodes=4", "--ntasks-per-node=4"))]
    assert {s.launcher for s in d.plan()} == {"srun"}


def test_include_and_exclude_choose_a_subset() -> None:
    base = 'script = "a.py"\n[factors]\nranks = [1, 2]\nbatch_size = [16, 32, 64]\n'
    only = parse(base.replace("[factors]", "include = [{ ranks = 2 }, { batch_size = 16 }]\n[factors]"))
    assert sorted((c["ranks"].value, c["batch_size"].value) for c in only.configs) == [
        (1, 16), (2, 16), (2, 32), (2, 64)]
    without = parse(base.replace("[factors]", 'exclude = [{ ranks = 1, batch_size = "64" }]\n[factors]'))
    assert len(without.configs) == 5
    assert not any(c["ranks"].value == 1 and c["batch_size"].value == 64 for c in without.configs)


@pytest.mark.parametrize(("text", "words"), [
    ('script = "a.py"\nreplicates = 2\n[factors]\nranks = [1]', "unknown key 'replicates'"),
    ('script = "a.py"', "no [factors] table"),
    ('script = "a.py"\nreplications = 0\n[factors]\nranks = [1]', "replications must be a positive integer"),
    ('script = "a.py"\n[factors]\nranks = [0, 2]', "levels must be positive integers"),
    ('script = "a.py"\n[factors]\nbatch_size = [16, 16]', "lists a level twice"),
    ('script = "a.py"\n[factors]\nbatch_size = []', "has no levels"),
    ('[factors]\nranks = [1]', "no script"),
    ('script = "a.py"\ninclude = [{ model = "x" }]\n[factors]\nranks = [1]', "'model', which is not a factor"),
    ('script = "a.py"\ninclude = [{ ranks = 3 }]\n[factors]\nranks = [1]', "3 is not a level of ranks"),
    ('script = "a.py"\nexclude = [{ ranks = 1 }]\n[factors]\nranks = [1]', "leave no configuration"),
    ('script = "a.py"\nlauncher_args = ["--n={nodes}"]\n[factors]\nranks = [1]', "cannot fill in 'nodes'"),
    ('script = "a.py"\n[factors]\nnodes = [1]', "needs ranks_per_node"),
    ('script = "a.py"\n[factors.s]\nlevels.a = { argz = [] }', "unknown setting 'argz'"),
    ('script = "a.py"\n[baselines]\ncpu = { device = "cpu" }\n[factors]\nranks = [1]',
     "'device', which is not a factor"),
])
def test_design_mistakes_are_one_sentence(text: str, words: str) -> None:
    with pytest.raises(UsageError, match=words.replace("[", r"\[").replace("(", r"\(")):
        parse(text)


def test_a_file_that_is_not_toml_or_missing(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("factors = [1,\n")
    with pytest.raises(UsageError, match="is not valid TOML"):
        design.load(bad)
    with pytest.raises(UsageError, match="design file not found"):
        design.load(tmp_path / "nope.toml")


def test_the_seed_fixes_the_randomized_order() -> None:
    text = 'script = "a.py"\nreplications = 3\nseed = {}\n[factors]\nranks = [1, 2]\nbatch_size = [16, 32, 64]'
    first = [s.name for s in parse(text.format(11)).plan()]
    assert first == [s.name for s in parse(text.format(11)).plan()]
    assert first != [s.name for s in parse(text.format(12)).plan()]
    # every configuration x replication exactly once, and not in factorial order
    assert len(first) == len(set(first)) == 18
    factorial = [s.name for s in sorted(parse(text.format(11)).plan(), key=lambda s: (s.config, s.replication))]
    assert first != factorial and sorted(first) == sorted(factorial)
    assert [s.order for s in parse(text.format(11)).plan()] == list(range(1, 19))


def test_runs_record_their_factors_and_resume_skips_complete_runs(job: Path, tmp_path: Path) -> None:
    d = job_design(job, "x = [1, 2]")
    out = tmp_path / "sweeps"
    log = io.StringIO()
    first = sweep.run(d, out, progress=log)
    assert first.exit_status == 0 and len(first.ran) == 4 and not first.skipped
    root = out / d.name
    info = runinfo.read(root / "x=2,rep=1")
    assert info["status"] == "ok" and info["factors"] == {"x": 2}
    assert info["sweep"]["name"] == d.name and info["sweep"]["replication"] == 1
    assert info["params"] == {"x": 2}
    assert "job args ['--x', '2']" in (root / "x=2,rep=1" / "output.log").read_text()
    plan = json.loads((root / "sweep.json").read_text())["plan"]
    assert [p["name"] for p in plan] == first.ran  # run in plan order
    assert "[4/4]" in log.getvalue() and "left)" in log.getvalue()

    # a sweep killed during a run leaves status "running"; an interrupted run says so
    killed, interrupted = root / plan[1]["name"], root / plan[3]["name"]
    runinfo.write(killed, {**runinfo.read(killed), "status": "running"})
    runinfo.write(interrupted, {**runinfo.read(interrupted), "status": "interrupted"})
    (killed / "stale-file").write_text("from the killed attempt")
    again = sweep.run(d, out, progress=io.StringIO())
    assert again.ran == [plan[1]["name"], plan[3]["name"]]
    assert sorted(again.skipped) == sorted([plan[0]["name"], plan[2]["name"]])
    assert not (killed / "stale-file").exists()  # the partial directory was replaced
    assert sweep.run(d, out, progress=io.StringIO()).ran == []


def test_a_failing_run_is_recorded_and_the_sweep_goes_on(job: Path, tmp_path: Path) -> None:
    d = job_design(job, "fail = [false, true]", replications=2)
    out = tmp_path / "sweeps"
    log = io.StringIO()
    result = sweep.run(d, out, progress=log)
    assert len(result.ran) == 4 and result.exit_status == 1
    assert sorted(result.failed) == ["fail=true,rep=1", "fail=true,rep=2"]
    info = runinfo.read(out / d.name / "fail=true,rep=1")
    assert info["status"] == "failed" and info["factors"] == {"fail": True}
    assert info["exit_status"] == {"0": 3}
    assert "failed: rank 0 (exit status 3)" in log.getvalue()
    # failed runs are kept on resume unless asked
    assert sweep.run(d, out, progress=io.StringIO()).ran == []
    retried = sweep.run(d, out, retry_failed=True, progress=io.StringIO())
    assert sorted(retried.ran) == ["fail=true,rep=1", "fail=true,rep=2"]


def test_a_changed_design_or_a_second_sweep_is_refused(job: Path, tmp_path: Path) -> None:
    out = tmp_path / "sweeps"
    d = job_design(job, "x = [1]", replications=1)
    sweep.run(d, out, progress=io.StringIO())
    changed = job_design(job, "x = [1, 2]", replications=1)
    with pytest.raises(UsageError, match="holds a sweep of a different design"):
        sweep.run(changed, out, progress=io.StringIO())
    assert sweep.run(changed, out, name="other", progress=io.StringIO()).exit_status == 0
    with open(out / d.name / ".lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(UsageError, match="another sweep is running"):
            sweep.run(d, out, progress=io.StringIO())


def test_cli_dry_run_and_errors(job: Path, tmp_path: Path) -> None:
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "instrument.cli", "sweep", *args], cwd=ROOT,
                              capture_output=True, text=True, timeout=120)

    dry = cli(str(DESIGNS / "quick.toml"), "--dry-run")
    assert dry.returncode == 0 and len(dry.stdout.splitlines()) == 48
    assert "-np 2 runs/ddp_resnet.py --steps 5" in dry.stdout
    path = tmp_path / "d.toml"
    path.write_text(f'script = "{tmp_path / "missing.py"}"\n[factors]\nranks = [1]\n')
    missing = cli(str(path), "--out", str(tmp_path / "o"))
    assert missing.returncode == 2 and "training script not found" in missing.stderr
    assert "Traceback" not in missing.stderr
    path.write_text(f'script = "{job}"\ntracer = "none"\n[factors]\nfail = [true]\n')
    failed = cli(str(path), "--out", str(tmp_path / "o"))
    assert failed.returncode == 1 and "0 of 1 runs complete, 1 failed" in failed.stdout
    assert "--retry-failed" in failed.stderr


def test_ctrl_c_stops_the_sweep_and_the_same_command_resumes(tmp_path: Path) -> None:
    script = tmp_path / "slow.py"
    script.write_text("import time\ntime.sleep(1)\n")
    path = tmp_path / "d.toml"
    path.write_text(f'script = "{script}"\ntracer = "none"\nreplications = 3\n[factors]\nranks = [1]\n')
    cmd = [sys.executable, "-m", "instrument.cli", "sweep", str(path), "--out", str(tmp_path / "o")]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    lines = [proc.stdout.readline(), proc.stdout.readline()]  # the header, then the first run's line
    assert lines[1].startswith("[1/3]"), lines
    proc.send_signal(signal.SIGINT)  # during the second run (or between runs: the same result)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, out + err
    assert "1 of 3 runs complete" in out and "run the same command again to resume" in err
    resumed = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert resumed.returncode == 0 and "1 already done, 2 to run" in resumed.stdout
    assert "3 of 3 runs complete" in resumed.stdout
