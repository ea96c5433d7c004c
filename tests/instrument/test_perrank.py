"""Per-rank writing (instrument/tracer/perrank.py): each rank writes its own OTF2 event files,
the end step only definitions; the archive reads back exactly as the merged one does."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest

import analyze
from analyze import schema
from instrument.launch.job import build_archive
from instrument.tracer import merge, perrank
from instrument.tracer.builtin import Tracer
from tests.conftest import ROOT, instrument_run
from traceio import codec, records
from traceio.records import Device, Op, Role

pytestmark = pytest.mark.skipif(not codec.available(), reason="per-rank writing needs the native codec")


class Clock:
    def __init__(self, t: int) -> None:
        self.t = t

    def now(self) -> int:
        return self.t


def synthetic_rank(run: Path, rank: int, *, finalize: bool = True) -> Tracer:
    """A deterministic rank touching everything an archive holds: steps, collectives (sync,
    asynchronous on lanes, on a device stream), user regions defined in a rank-dependent
    order (so each rank's own region ids differ), a second communicator on odd ranks, a metric
    location, a clock offset, a trailing partial step (a tail), and with ``finalize=False``
    a rank killed after its last flush (regions left open)."""
    clock = Clock(10_000 + 13 * rank)
    tr = Tracer(rank, 4, run, clock=clock, capacity=64, flush_interval_s=None, write_otf2=finalize)
    names = [f"user {i}" for i in range(3)]
    user = [tr.region_id(n) for n in (names if rank % 2 == 0 else names[::-1])]
    fwd, opt = tr.region_id(records.FORWARD), tr.region_id(records.OPTIMIZER)
    ar = tr.region_id("torch.distributed.all_reduce", Role.COLL_ALL2ALL)
    odd = tr.comm_id("odd", (1, 3)) if rank % 2 else None  # defined first: own ids differ
    world = tr.comm_id("WORLD", (0, 1, 2, 3))
    comm = world if odd is None else odd
    stream = tr.named_loc("cuda stream 7", kind="accelerator_stream")
    kernel = tr.region_id("ncclKernel_AllReduce", Role.COLL_ALL2ALL)
    metric_loc = tr.named_loc("power", kind="metric") if rank % 2 == 0 else None
    channel = tr.metric_channel({"name": f"gpu {rank} energy", "description": "energy", "unit": "J",
                                 "exponent": -3, "mode": "ACCUMULATED_START", "device": Device.GPU,
                                 "index": rank, "loc": metric_loc}) if metric_loc is not None else None
    tr.meta["clock_samples"] = [{"label": "start", "local_ns": 10_000, "offset_ns": 100 * rank, "rtt_ns": 40}]
    for step in range(3):
        tr.enter(fwd)
        tr.enter(user[step % 3])
        clock.t += 100 + rank
        tr.leave(user[step % 3])
        tr.leave(fwd)
        tr.enter(ar)
        clock.t += 50
        tr.collective_end(clock.t, comm, Op.ALLREDUCE, -1, 4096, 4096)
        tr.leave(ar)
        tr.async_collective(ar, clock.t - 40, clock.t + 30, world, Op.ALLREDUCE, -1, 8, 8)
        tr.async_collective(ar, clock.t - 20, clock.t + 10, world, Op.ALLREDUCE, -1, 8, 8)
        tr.collective_interval(stream, kernel, clock.t - 45, clock.t - 5, world, Op.ALLREDUCE, -1, 64, 64)
        if channel is not None and metric_loc is not None:
            tr.metric_sample(metric_loc, channel, clock.t, 1000 * (step + 1))
        tr.enter(opt)
        clock.t += 20
        tr.leave(opt)
        tr.optimizer_done()
        clock.t += 5
    tr.enter(fwd)  # after the last optimizer step: a tail (or left open by a kill)
    clock.t += 30
    tr.enter(user[0])
    clock.t += 10
    if finalize:
        tr.finalize("ok")
    else:
        tr.buffer.flush()  # what the last periodic flush left before a SIGKILL
    return tr


def both_ways(tmp_path: Path, ranks: int, killed: tuple[int, ...] = ()) -> tuple[Path, Path]:
    """The same run, assembled per rank and merged in one process."""
    per_rank, merged = tmp_path / "per_rank" / "run", tmp_path / "merged" / "run"
    for rank in range(ranks):
        synthetic_rank(per_rank, rank, finalize=rank not in killed)
    shutil.copytree(per_rank, merged)
    build_archive(per_rank, ranks, "builtin")
    build_archive(merged, ranks, "builtin", merged=True)
    return per_rank, merged


def tables(run: Path) -> dict[str, list[tuple]]:
    analyze.build(run)
    db = duckdb.connect(str(run / "trace.duckdb"), read_only=True)
    present = {r[0] for r in db.execute("select table_name from information_schema.tables").fetchall()}
    out = {t.name: sorted((tuple(None if v is None else v.replace(str(run), "RUN") for v in row)
                           for row in db.execute(f"select columns(*)::varchar from {t.name}").fetchall()), key=repr)
           for t in schema.TABLES if t.name in present}
    db.close()
    return out


def test_per_rank_archive_reads_back_as_the_merged_one(tmp_path: Path) -> None:
    per_rank, merged = both_ways(tmp_path, 4, killed=(3,))
    # the global definitions (strings, regions, locations with their event counts, groups,
    # communicators, metrics, clock properties) are byte for byte the merge's
    assert (per_rank / "traces.def").read_bytes() == (merged / "traces.def").read_bytes()
    # ranks 0-2 wrote their own event files, with their own region numbering
    for rank in range(3):
        assert perrank.paths(per_rank / "ranks", rank)[1].is_file()
    a, b = tables(per_rank), tables(merged)
    assert a.keys() == b.keys() and {"intervals", "collectives", "phases", "metrics"} <= a.keys()
    assert a["intervals"] and a["collectives"] and a["metrics"]
    for name in a:
        assert a[name] == b[name], name


def test_a_killed_rank_is_converted_at_the_end_and_flagged(tmp_path: Path) -> None:
    per_rank, merged = both_ways(tmp_path, 2, killed=(1,))
    before = merge.collect(merged, expected_ranks=3)
    result, _ = build_archive(per_rank, 3, "builtin")
    assert perrank.paths(per_rank / "ranks", 1)[1].is_file()  # converted by the end step
    # flagged as the merge flags it: still running, its open step, forward and user region closed
    r1 = result.ranks[1]
    assert r1.status == "running" and r1.open_regions_closed == 3 and not r1.complete
    assert result.ranks[0].complete and result.missing_ranks == [2] and not result.complete
    assert result.ranks == before.ranks and result.events == before.events


def test_ranks_own_files_are_used_and_stale_ones_replaced(tmp_path: Path) -> None:
    run = tmp_path / "run"
    synthetic_rank(run, 0)
    events_dir, description = perrank.paths(run / "ranks", 0)
    written = description.stat().st_mtime_ns
    build_archive(run, 1, "builtin")
    assert description.stat().st_mtime_ns == written  # the end step did not convert again
    with open(run / "ranks" / "rank-00000.evt", "ab") as f:  # records appended after it wrote
        f.write(bytes(48))
    result, _ = build_archive(run, 1, "builtin")
    assert description.stat().st_mtime_ns != written and result.ranks[0].steps == 3


def test_otf2_print_reads_a_per_rank_archive(tmp_path: Path) -> None:
    per_rank, _ = both_ways(tmp_path, 2)
    tool = shutil.which("otf2-print")
    if tool is None:
        pytest.skip("otf2-print not found: the setup installs Debian's otf2-tools (make setup)")
    proc = subprocess.run([tool, str(per_rank / "traces.otf2")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "MPI_COLLECTIVE_END" in out and 'Communicator: "odd"' in out and "METRIC" in out
    # rank 0 enters "user 0" in its first step and its tail, rank 1 in its last step (it
    # defined the user regions in reverse order, so only the mapping tables make its own
    # region ids name the right regions): 3 instances, an Enter and a Leave each; "user 2" too
    assert out.count('Region: "user 0"') == out.count('Region: "user 2"') == 6


def test_no_rank_files_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(merge.MergeError, match="no per-rank trace files"):
        perrank.assemble(tmp_path)


SCRIPTS = Path(__file__).parent / "scripts"


def test_a_sigkilled_rank_keeps_at_least_half_of_its_steps_with_the_default_flush(tmp_path: Path) -> None:
    """100 ms steps, SIGKILL 2 s after the first one began: about 20 steps were done; with
    the default flush interval (0.5 s, checked every 0.125 s) at most about 6 are lost."""
    env = {k: v for k, v in os.environ.items() if k not in ("DLTRACE_FLUSH_INTERVAL_S", perrank.MODE_ENV)}
    p = subprocess.Popen([sys.executable, "-m", "instrument.cli", "run", "--out", str(tmp_path), "--name", "kill",
                          "-np", "1", str(SCRIPTS / "steps.py"), "--steps", "200", "--step-s", "0.1"],
                         cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert p.stdout is not None
    for line in p.stdout:
        if "started" in line:
            break
    time.sleep(2.0)
    meta = json.loads((tmp_path / "kill" / "ranks" / "rank-00000.json").read_text())
    os.kill(meta["pid"], signal.SIGKILL)
    out, err = p.communicate(timeout=120)
    assert "killed by SIGKILL" in err, out + err
    info = json.loads((tmp_path / "kill" / "run.json").read_text())
    assert info["rank_info"][0]["status"] == "killed" and info["complete"] is False
    steps = analyze.open(tmp_path / "kill").execute("select count(*) from steps where rank = 0").fetchone()[0]
    # at least 20 steps were done when it was killed (more when the "started" line came late)
    assert 10 <= steps < 100, steps


@pytest.mark.slow
def test_a_real_run_of_32_ranks_reads_back(tmp_path: Path) -> None:
    run = instrument_run(tmp_path, "-np", "32", str(SCRIPTS / "steps.py"), "--steps", "3", timeout=900)
    assert run.proc.returncode == 0, run.output
    # every rank wrote its own event files; the end step only assembled them
    for rank in range(32):
        assert perrank.paths(run.run_dir / "ranks", rank)[1].is_file(), rank
    assert run.info["complete"] is True
    db = analyze.open(run.run_dir)
    assert db.execute("select count(distinct rank), count(*) from steps").fetchone() == (32, 32 * 3)
    assert db.execute("select count(*) from intervals join regions using (region_id) "
                      "where name = 'compute'").fetchone() == (32 * 3,)


def test_the_python_reader_applies_the_mapping_tables_too(tmp_path: Path) -> None:
    per_rank, _ = both_ways(tmp_path, 2)
    native = tables(per_rank)
    analyze.build(per_rank, reader="python", force=True)
    python = tables(per_rank)
    assert python.pop("runs") != native.pop("runs")  # it names the reader
    assert python == native


def test_instrument_merge_rebuilds_both_ways(tmp_path: Path) -> None:
    run = tmp_path / "run"
    for rank in range(2):
        synthetic_rank(run, rank, finalize=rank == 0)
    for extra in ([], ["--merged"]):
        proc = subprocess.run([sys.executable, "-m", "instrument.cli", "merge", str(run), *extra], cwd=ROOT,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert "trace written:" in proc.stdout and "2 ranks" in proc.stdout and "[incomplete]" in proc.stdout
    assert perrank.paths(run / "ranks", 1)[1].is_file()  # the killed rank, converted by the first
