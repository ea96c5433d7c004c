"""``--device-activity``: torch.profiler's trace imported into ours. The GPU path runs on literal
and real Kineto files (no GPU here); a 2-rank DDP run checks the CPU path and the clocks."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest

import analyze
from analyze.tables.device_phases import device_breakdown
from instrument.hooks import device_activity as da
from instrument.tracer import merge
from instrument.tracer.builtin import Tracer
from tests.analyze.conftest import KINETO_FIXTURES
from tests.analyze.test_kineto import DATALOADER
from tests.conftest import Run, instrument_run
from tests.instrument.test_merge import Clock
from tests.kineto_literal import BASE_NS, cpu, kernel, launch, memcpy, nccl, step, write_rank
from traceio import chrome, records
from traceio.otf2_writer import write_archive

US = 1000
T0 = 1_000_000  # our clock when Kineto says 0 us
OFFSET = BASE_NS - T0  # Kineto (epoch) minus ours


def literal_rank(directory: Path, rank: int) -> chrome.ChromeTrace:
    """Rank 0 as in tests/analyze/test_kineto.py (two kernels, an allreduce kernel [40, 80), a
    copy), plus two CPU ops that only partly overlap; rank 1's allreduce starts at 55 us."""
    if rank == 0:
        events = [step(1, 0, 100), cpu(DATALOADER, 0, 20, cat="user_annotation"),
                  launch(21, 23, correlation=1), kernel("gemm", 25, 50, correlation=1),
                  kernel("relu", 60, 70), nccl("allreduce", 40, 80, nelems=1000), memcpy(85, 90),
                  cpu("a", 30, 40), cpu("b", 35, 45)]
    else:
        events = [step(1, 0, 100), kernel("gemm", 25, 50), nccl("allreduce", 55, 80, nelems=1000)]
    return chrome.load(write_rank(directory, rank, events))


def traced(run: Path, rank: int, trace: chrome.ChromeTrace) -> dict[str, int]:
    """A rank whose own main thread loads data [0, 20) and steps the optimizer [80, 95) us,
    with the Kineto trace imported: its counts."""
    clock = Clock()
    tr = Tracer(rank, 2, run, clock=clock, capacity=64, flush_interval_s=None)
    data, opt = tr.region_id(records.DATALOADER), tr.region_id(records.OPTIMIZER)
    for rid, start, end in ((data, 0, 20), (opt, 80, 95)):
        clock.t = T0 + start * US
        tr.enter(rid)
        clock.t = T0 + end * US
        tr.leave(rid)
    tr.optimizer_done(clock.t)
    counts = da.record(tr, trace, OFFSET, world=2)
    tr.finalize("ok")
    return counts


@pytest.fixture
def gpu_run(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    counts = [traced(run, r, literal_rank(tmp_path / "kineto", r)) for r in (0, 1)]
    assert counts[0] == {"slices": 9, "kernels": 3, "collectives": 1, "streams": 2, "threads": 1, "extra_lanes": 1}
    write_archive(merge.collect(run, expected_ranks=2).spec, run)
    return run


def test_device_streams_collectives_and_phases_in_our_archive(gpu_run: Path) -> None:
    con = analyze.open(gpu_run)
    assert con.execute("SELECT name, kind FROM locations WHERE rank = 0 AND kind <> 'tracer' ORDER BY thread").fetchall() == [
        ("main thread", "cpu_thread"), ("torch.profiler thread 1000 (python)", "timeline"),
        ("torch.profiler thread 1000 (python) (2)", "timeline"),  # "b" only partly overlaps "a"
        ("GPU 0 stream 7", "accelerator_stream"), ("GPU 0 stream 20", "accelerator_stream")]
    rows = con.execute("""
        SELECT c.rank, c.op, c.bytes, m.name, m.members, c.enter_ns, c.wait_ns, c.ranks_matched
        FROM collectives c JOIN communicators m USING (comm_id) ORDER BY rank""").fetchall()
    assert rows == [(0, "allreduce", 4000, "device 0 (default_pg)", [0, 1], 40 * US, 15 * US, 2),
                    (1, "allreduce", 4000, "device 0 (default_pg)", [0, 1], 55 * US, 0, 2)]
    # our step runs from the data loader to the optimizer's end, [0, 95) us; in it, on the device:
    # idle [0, 25), [80, 85), [90, 95); compute [25, 40); hidden [40, 50), [60, 70);
    # exposed [50, 60), [70, 80); memory [85, 90)
    phases = dict(((p, h), ns // US) for p, h, ns in con.execute(
        "SELECT phase, host, duration_ns FROM device_phases WHERE rank = 0").fetchall())
    assert phases == {("idle", "dataloader"): 20, ("idle", "other"): 5, ("idle", "optimizer"): 10,
                      ("compute", "other"): 15, ("comm_hidden", "other"): 20, ("comm_exposed", "other"): 20,
                      ("memory", "optimizer"): 5}
    # the host phases see none of it: the device's collectives are not the main thread's
    assert con.execute("SELECT sum(duration_ns) FROM phases WHERE rank = 0 AND phase <> 'compute'").fetchone() == (0,)


def test_per_rank_export_of_our_archive_reads_ranks_in_batches(
        gpu_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from analyze.export import chrome as export

    con = analyze.open(gpu_run)
    texts = []
    for most in (1, export.EXPORT_RANKS):  # a query per rank, both ranks in one
        monkeypatch.setattr(export, "EXPORT_RANKS", most)
        files = export.export(con, tmp_path / f"by{most}")
        texts.append([gzip.decompress(f.read_bytes()) for f in files])
    assert len(export._rank_batches(con, [0, 1])) == 1 and texts[0] == texts[1]
    kernels = [sum(e.get("cat") == "kernel" for e in json.loads(t)["traceEvents"]) for t in texts[1]]
    assert kernels == [3, 2]  # each rank's own (rank 0: gemm, relu, the allreduce)


def test_a_real_gpu_trace_survives_our_archive(tmp_path: Path) -> None:
    """The A100 fixture through the tracer, the merge and OTF2: the same kernels, collectives,
    bytes and device timeline as importing the file directly."""
    trace = chrome.load(KINETO_FIXTURES / "hta_nccl_a100_rank0" / "nccl_data.json.gz")
    tr = Tracer(0, 2, tmp_path / "run", clock=Clock(), capacity=1 << 12, flush_interval_s=None)
    counts = da.record(tr, trace, trace.base_ns, world=2)
    tr.finalize("ok")
    write_archive(merge.collect(tmp_path / "run", expected_ranks=1).spec, tmp_path / "run")
    ours = analyze.open(tmp_path / "run")
    direct = analyze.open(KINETO_FIXTURES / "hta_nccl_a100_rank0", db=tmp_path / "direct.duckdb")
    # facts.json: 2700 kernels, 21 NCCL kernels, 307,323,096 bytes in
    assert (counts["kernels"], counts["collectives"], counts["streams"]) == (2700, 21, 2)
    assert ours.execute("SELECT count(*), sum(bytes), any_value(op) FILTER (WHERE op = 'bcast') FROM collectives"
                        ).fetchone() == (21, 307_323_096, "bcast")
    kernels = """SELECT count(*) FROM intervals i JOIN locations l USING (location_id) JOIN regions r USING (region_id)
                 WHERE l.kind = 'accelerator_stream' AND r.category IN ('kernel', 'collective')"""
    assert ours.execute(kernels).fetchone() == direct.execute(kernels).fetchone() == (2700,)
    a, b = device_breakdown(ours), device_breakdown(direct)
    assert a.drop(columns="rank").to_dict("records") == b.drop(columns="rank").to_dict("records")


def test_check_bounds_the_alignment_from_both_sides(tmp_path: Path) -> None:
    trace = chrome.load(write_rank(tmp_path, 0, [cpu(da.CHECK, 10, 11), cpu(da.CHECK, 50, 52)]))
    brackets = [(T0 + 9 * US, T0 + 12 * US), (T0 + 49_500, T0 + 50_250)]
    assert da.check(trace, OFFSET, brackets) == {"pairs": 2, "min_after_ns": 500, "min_before_ns": 250,
                                                "bracket_ns": 3000}
    # an offset 1 us off shows as a negative margin
    assert da.check(trace, OFFSET - US, brackets)["min_before_ns"] == -750


def test_off_without_the_option_and_a_refusal_with_another_tracer(tmp_path: Path) -> None:
    assert da.request({}, None, tmp_path, 0, 1) is False  # type: ignore[arg-type]
    run = instrument_run(tmp_path, "--tracer", "none", "--device-activity", "runs/ddp_resnet.py")
    assert run.proc.returncode == 2
    assert "--device-activity needs the built-in tracer, not --tracer none" in run.proc.stderr


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    out = tmp_path_factory.mktemp("device-activity")
    run = instrument_run(out, "-np", "2", "--device-activity", "runs/ddp_resnet.py", "--steps", "3",
                         "--batch-size", "8", name="da")
    assert run.proc.returncode == 0, run.output
    return run


@pytest.mark.slow
def test_cpu_only_run_says_so_once_and_keeps_kinetos_files(cpu_run: Run) -> None:
    assert len(re.findall(r"no CUDA or ROCm device here", cpu_run.output)) == 1
    assert "[rank 0] dltrace: --device-activity: no CUDA or ROCm device here" in cpu_run.output
    for entry in cpu_run.info["rank_info"]:
        summary = entry["device_activity"]
        assert summary["activities"] == ["CPU"] and summary["streams"] == 0 and summary["threads"] >= 1
        assert "error" not in summary
    device = analyze.open(cpu_run.run_dir / "device")  # the kept files are a Kineto run of their own
    assert device.execute("SELECT DISTINCT rank FROM locations ORDER BY rank").fetchall() == [(0,), (1,)]


@pytest.mark.slow
def test_cpu_only_run_is_aligned_with_our_own_markers(cpu_run: Run) -> None:
    """Kineto's ranges against ours on the same thread: the profiler's Optimizer.step range
    encloses our optimizer region (the step hooks run inside it), our data-loader region
    encloses its enumerate(DataLoader) range (we wrap __next__ outside it); and the clock
    checks fall between our readings."""
    for entry in cpu_run.info["rank_info"]:
        check = entry["device_activity"]["check"]
        assert check["pairs"] == 2 * da.CHECKS and check["min_after_ns"] >= 0 and check["min_before_ns"] >= 0
    con = analyze.open(cpu_run.run_dir)
    assert con.execute("SELECT count(*) FROM locations WHERE kind = 'timeline' AND name LIKE 'torch.profiler thread %'"
                       ).fetchone()[0] >= 2  # type: ignore[index]

    def pairs(ours: str, theirs: str) -> list[tuple[int, int, int, int]]:
        return con.execute("""
            WITH o AS (SELECT i.rank, i.start_ns, i.end_ns, row_number() OVER (PARTITION BY i.rank ORDER BY i.start_ns) AS n
                       FROM intervals i JOIN regions r USING (region_id) JOIN locations l USING (location_id)
                       WHERE l.is_main AND r.name = $ours),
                 t AS (SELECT i.rank, i.start_ns, i.end_ns, row_number() OVER (PARTITION BY i.rank ORDER BY i.start_ns) AS n
                       FROM intervals i JOIN regions r USING (region_id) JOIN locations l USING (location_id)
                       WHERE l.kind = 'timeline' AND r.name LIKE $theirs)
            SELECT o.start_ns, o.end_ns, t.start_ns, t.end_ns FROM o JOIN t USING (rank, n)""",
                           {"ours": ours, "theirs": theirs}).fetchall()

    optimizer = pairs(records.OPTIMIZER, "Optimizer.step#%")
    assert len(optimizer) == 2 * 3
    assert all(ts <= os_ and oe <= te for os_, oe, ts, te in optimizer), optimizer
    data = pairs(records.DATALOADER, "enumerate(DataLoader)#%")
    assert len(data) >= 2 * 3
    assert all(os_ <= ts and te <= oe for os_, oe, ts, te in data), data
    margins = [ts - os_ for os_, _, ts, _ in data] + [os_ - ts for os_, _, ts, _ in optimizer]
    print("alignment margins (ns):", sorted(margins)[:4], json.dumps(cpu_run.info["rank_info"][0]["device_activity"]["check"]))


@pytest.mark.slow
def test_the_profilers_copy_of_the_host_adds_no_collectives(cpu_run: Run) -> None:
    """The torch.profiler timelines hold gloo's and c10d's events (gloo:all_reduce on its worker
    threads) that our hooks record already: the run's collectives are our hooks' alone, while
    the kept Kineto files, read as a run of their own, hold gloo's collectives (its work items,
    in gloo's group of all ranks)."""
    con = analyze.open(cpu_run.run_dir)
    names = {n for (n,) in con.execute("""SELECT DISTINCT r.name FROM intervals i JOIN regions r USING (region_id)
                                          JOIN locations l USING (location_id) WHERE l.kind = 'timeline'""").fetchall()}
    assert "gloo:all_reduce" in names
    assert con.execute("""SELECT count(*) FROM collectives c JOIN locations l USING (location_id)
                          WHERE l.kind = 'timeline'""").fetchone() == (0,)
    assert con.execute("SELECT count(*) FROM communicators WHERE name LIKE 'name-only:%'").fetchone() == (0,)
    device = analyze.open(cpu_run.run_dir / "device")
    per_rank = device.execute("""SELECT rank, count(*) FROM collectives c JOIN communicators m USING (comm_id)
                                 WHERE m.name = 'gloo: default (all ranks)' AND c.op = 'allreduce'
                                 GROUP BY rank ORDER BY rank""").fetchall()
    assert len(per_rank) == 2 and per_rank[0][1] == per_rank[1][1] > 0, per_rank


def test_a_rank_stopped_by_a_signal_records_why_nothing_was_imported(monkeypatch: pytest.MonkeyPatch) -> None:
    class Rec:
        meta: dict[str, object] = {}

        def set_meta(self, key: str, value: object) -> None:
            self.meta[key] = value

    monkeypatch.setattr(da, "_state", {"prof": object(), "activities": ["CPU"]})
    rec = Rec()
    da.import_at_exit(rec, skip=True)  # type: ignore[arg-type]
    da.import_at_exit(rec)  # type: ignore[arg-type]  # once only
    assert rec.meta["device_activity"] == {"activities": ["CPU"],
                                           "error": "not imported: the rank was stopped by a signal"}
