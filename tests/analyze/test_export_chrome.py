"""``analyze export --format chrome``: round trips, HTA on the export, the merged file's tracks."""

from __future__ import annotations

import gzip
import json
import logging
import subprocess
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import analyze
from analyze.export import chrome as export
from analyze.schema import TABLES
from tests.analyze.conftest import KINETO_FIXTURES
from tests.analyze.test_kineto import FACTS, OTHER_LAYOUTS, hta_oracle, two_ranks
from tests.conftest import ROOT, Run
from tests.literal import write_literal
from traceio import chrome as chrome_format

US = 1000


def tables(con: duckdb.DuckDBPyConnection) -> dict[str, list[tuple[Any, ...]]]:
    """Every table's rows, sorted; without what names the files (run name, paths)."""
    out = {}
    for t in TABLES:
        cols = [f"CAST({c.name} AS VARCHAR)" if c.type == "TIMESTAMPTZ" else c.name for c in t.columns
                if (t.name, c.name) not in (("runs", "run_name"), ("runs", "path"), ("chrome_files", "path"))]
        out[t.name] = con.execute(f"SELECT {', '.join(cols)} FROM {t.name} ORDER BY ALL").fetchall()
    return out


@pytest.mark.parametrize("name", [*FACTS, *OTHER_LAYOUTS])
def test_import_export_import_gives_identical_tables(
        name: str, kineto_db: Callable[[str], duckdb.DuckDBPyConnection], tmp_path: Path) -> None:
    original = kineto_db(name)
    files = export.export(original, tmp_path / "export")
    assert len(files) == len(list((KINETO_FIXTURES / name).iterdir()))  # one file per rank
    again = analyze.open(tmp_path / "export", db=tmp_path / "again.duckdb")
    a, b = tables(original), tables(again)
    for table in a:
        assert a[table] == b[table], table
    assert any(a["chrome_events"]) and any(a["intervals"])


def run_hta(trace_dir: Path) -> dict[int, tuple[int, int, int, int]]:
    from hta.trace_analysis import TraceAnalysis

    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            df = TraceAnalysis(trace_dir=str(trace_dir)).get_temporal_breakdown(visualize=False)
    finally:
        logging.disable(logging.NOTSET)
    return {int(r["rank"]): (int(r["idle_time(us)"]), int(r["compute_time(us)"]), int(r["non_compute_time(us)"]),
                             int(r["kernel_time(us)"])) for r in df.to_dict("records")}


# tracelens_mi300_rccl is left out: HTA 0.5.0 cannot read it under pandas 3 (an int16 error,
# the original file too; tests/fixtures/kineto/README.md); test_kineto.py checks its numbers.
@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in FACTS if n != "tracelens_mi300_rccl"])
def test_hta_reads_the_export_and_gives_the_original_breakdown(
        name: str, kineto_db: Callable[[str], duckdb.DuckDBPyConnection], tmp_path: Path) -> None:
    export.export(kineto_db(name), tmp_path / "export")
    assert run_hta(tmp_path / "export") == hta_oracle(name)


def load(path: Path) -> dict[str, Any]:
    with gzip.open(path, "rt") as fh:
        return json.load(fh)  # type: ignore[no-any-return]


def tracks(doc: dict[str, Any]) -> dict[int, tuple[str, list[str]]]:
    """pid -> (process name, thread names in tid order) from the metadata events."""
    procs = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"}
    threads: dict[int, dict[int, str]] = {}
    for e in doc["traceEvents"]:
        if e["ph"] == "M" and e["name"] == "thread_name":
            threads.setdefault(e["pid"], {})[e["tid"]] = e["args"]["name"]
    return {pid: (procs[pid], [n for _, n in sorted(threads.get(pid, {}).items())]) for pid in procs}


def test_merged_file_of_a_literal_trace(tmp_path: Path) -> None:
    con = analyze.open(two_ranks(tmp_path / "run"), db=tmp_path / "t.duckdb")
    (path,) = export.export(con, tmp_path / "out.json.gz")
    doc = load(path)
    assert tracks(doc) == {
        0: ("rank 0", ["thread 1000 (python)", "GPU 0 stream 7", "GPU 0 stream 20", "steps"]),
        1: ("rank 1", ["thread 1001 (python)", "GPU 1 stream 7", "GPU 1 stream 20", "steps"])}
    xs = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert len(xs) == con.execute("SELECT count(*) FROM intervals").fetchone()[0] + 2  # + one step per rank
    steps = [e for e in xs if e["cat"] == "dltrace.step"]
    assert [(e["pid"], e["name"], e["dur"]) for e in steps] == [(0, "step 0", 100), (1, "step 0", 100)]
    assert steps[0]["args"]["device_phases_ns"] == {"idle": 40 * US, "compute": 15 * US, "comm_hidden": 20 * US,
                                                    "comm_exposed": 20 * US, "memory": 5 * US}
    allreduce = [e for e in xs if "dltrace" in e.get("args", {})]
    assert [(e["pid"], e["tid"], e["args"]["dltrace"]["bytes"], e["args"]["dltrace"]["wait_ns"]) for e in allreduce] == [
        (0, 2, 4000, 15 * US), (1, 2, 4000, 0)]
    assert allreduce[0]["args"]["Collective name"] == "allreduce"  # the kernel's own args stay
    # the two launches as flow arrows from the main thread to stream 7, 4 us before each kernel
    flows = [(e["ph"], e["tid"], e["ts"]) for e in doc["traceEvents"] if e.get("cat") == "ac2g"]
    t0 = steps[0]["ts"]
    assert [(ph, tid, round(ts - t0, 3)) for ph, tid, ts in flows] == [
        ("s", 0, 21), ("f", 1, 25), ("s", 0, 55), ("f", 1, 60)]


def counters(doc: dict[str, Any]) -> dict[tuple[int, str], list[tuple[float, float]]]:
    """(pid, counter name) -> [(ts, value)] of the file's counter events, in file order."""
    out: dict[tuple[int, str], list[tuple[float, float]]] = {}
    for e in doc["traceEvents"]:
        if e["ph"] == "C":
            assert list(e["args"]) == ["value"]
            out.setdefault((e["pid"], e["name"]), []).append((e["ts"], e["args"]["value"]))
    return out


def test_metrics_as_counters(tmp_path: Path) -> None:
    """Samples as the power sampler writes them (uJ counters on a METRIC location): every
    sample a counter event of its rank, in J, and the mean power between samples beside it."""
    ms = 1_000_000
    anchor = write_literal(tmp_path / "run", [(0, "dltrace.step", 0, 100 * ms), (1, "dltrace.step", 0, 100 * ms)],
                           metrics=[
        # the host's package, recorded by rank 0: 2 J per 50 ms = 40 W, then 3 J = 60 W
        {"name": "cpu_package 0 energy", "samples": [(0, 7_000_000), (50 * ms, 9_000_000), (100 * ms, 12_000_000)]},
        # a GPU charged to rank 1 and recorded there: 10 J in 100 ms = 100 W
        {"name": "gpu 0 energy", "rank": 1, "recorder": 1, "samples": [(0, 0), (100 * ms, 10_000_000)]}])
    con = analyze.open(anchor, db=tmp_path / "t.duckdb")
    (path,) = export.export(con, tmp_path / "out.json.gz")
    doc = load(path)
    assert counters(doc) == {
        (0, "cpu_package 0 energy [J]"): [(0, 7.0), (50_000, 9.0), (100_000, 12.0)],
        (0, "cpu_package 0 energy [J] (power, W)"): [(0, pytest.approx(40.0)), (50_000, pytest.approx(60.0))],
        (1, "gpu 0 energy [J]"): [(0, 0.0), (100_000, 10.0)],
        (1, "gpu 0 energy [J] (power, W)"): [(0, pytest.approx(100.0))]}
    # the METRIC locations hold no slices: no empty thread tracks for them
    assert tracks(doc) == {0: ("rank 0", ["main thread", "steps"]), 1: ("rank 1", ["main thread", "steps"])}
    # the per-rank (Kineto) layout is for HTA, which reads slices only: no counters there
    files = export.export(con, tmp_path / "per-rank")
    assert not any(e["ph"] == "C" for f in files for e in load(f)["traceEvents"])


def test_our_steps_survive_the_per_rank_layout(tmp_path: Path) -> None:
    """Our trace written per rank and read back: the main thread is the one with our step
    markers (not the busiest thread, here an imported profiler timeline), so the steps are
    the same."""
    ms = 1_000_000
    items: list[tuple] = []
    for rank in (0, 1):
        for k in range(3):
            items += [(rank, "dltrace.step", k * 10 * ms, (k + 1) * 10 * ms),
                      (rank, "dltrace.forward", k * 10 * ms + ms, k * 10 * ms + 5 * ms)]
        items += [(rank, f"aten::op{j}", j * ms, j * ms + ms // 2, {"timeline": "torch.profiler thread 1"})
                  for j in range(20)]
    con = analyze.open(write_literal(tmp_path / "run", items), db=tmp_path / "t.duckdb")
    export.export(con, tmp_path / "per-rank")
    again = analyze.open(tmp_path / "per-rank", db=tmp_path / "again.duckdb")
    steps = "SELECT rank, step, start_ns - min(start_ns) OVER (), duration_ns, source FROM steps ORDER BY ALL"
    assert again.execute(steps).fetchall() == con.execute(steps).fetchall()
    assert len(again.execute(steps).fetchall()) == 6
    assert again.execute("SELECT DISTINCT name FROM locations WHERE is_main").fetchall() == [("main thread",)]


def test_papi_counters_of_a_scorep_trace(tmp_path: Path) -> None:
    """Score-P's PAPI counters (tests/fixtures/scorep-metrics, facts.json there: 42 Metric events
    per location, each with the 3 members, ACCUMULATED_START) as counters of their rank."""
    fixture = ROOT / "tests" / "fixtures" / "scorep-metrics"
    facts = json.loads((fixture / "facts.json").read_text())["pipit-pingpong-papi"]
    con = analyze.open(fixture / "pipit-pingpong-papi", db=tmp_path / "p.duckdb")
    (path,) = export.export(con, tmp_path / "p.json.gz")
    got = counters(load(path))
    clock = facts["clock"]
    expected = {}
    for member, sample in facts["metric_samples"].items():
        for loc, by in sample["by_location"].items():  # location i is rank i's master thread
            first, last = by["first"], by["last"]
            expected[(int(loc), member)] = (by["events"], first["value"], last["value"],
                                            (first["time"] - clock["global_offset"]) / clock["timer_resolution"] * 1e6)
    assert {k: (len(v), v[0][1], v[-1][1], v[0][0]) for k, v in got.items()} == {
        k: (n, first, last, pytest.approx(t, abs=1e-3)) for k, (n, first, last, t) in expected.items()}
    assert sum(map(len, got.values())) == 84 * 3  # facts: metric_events_total x members


def test_export_of_a_scorep_trace_both_layouts(scorep_fixtures: Path, tmp_path: Path) -> None:
    con = analyze.open(scorep_fixtures / "casita-2_cuda_simple", db=tmp_path / "c.duckdb")
    (merged,) = export.export(con, tmp_path / "c.json.gz")
    doc = load(merged)
    assert tracks(doc) == {r: (f"rank {r}", ["Master thread", "OMP thread 1", "CUDA[0:7]", "steps"]) for r in (0, 1)}
    n_intervals = con.execute("SELECT count(*) FROM intervals").fetchone()[0]  # type: ignore[index]
    assert sum(e["ph"] == "X" for e in doc["traceEvents"]) == n_intervals + 2
    # the MPI collectives carry what we matched
    n_coll = con.execute("SELECT count(*) FROM collectives").fetchone()[0]  # type: ignore[index]
    assert sum("dltrace" in e.get("args", {}) for e in doc["traceEvents"]) == n_coll > 0
    files = export.export(con, tmp_path / "per-rank")
    assert [f.name for f in files] == ["rank-0.pt.trace.json.gz", "rank-1.pt.trace.json.gz"]
    rank1 = load(files[1])
    assert rank1["distributedInfo"] == {"rank": 1, "world_size": 2}
    kernels = [e for e in rank1["traceEvents"] if e.get("cat") == "kernel"]
    # Score-P's CUDA kernels on the stream become Kineto kernels with their stream
    assert kernels and {e["args"]["stream"] for e in kernels} == {e["tid"] for e in kernels}
    again = analyze.open(tmp_path / "per-rank", db=tmp_path / "again.duckdb")
    assert again.execute("SELECT count(*) FROM intervals").fetchone() == (n_intervals,)


def test_cli_export(tmp_path: Path) -> None:
    run = two_ranks(tmp_path / "run")
    proc = subprocess.run([sys.executable, "-m", "analyze.cli", "export", str(run), "--db", str(tmp_path / "t.duckdb"),
                           "-o", str(tmp_path / "x.json")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith("x.json")
    assert json.loads((tmp_path / "x.json").read_text())["otherData"]["ranks"] == 2
    (tmp_path / "taken").write_text("")
    proc = subprocess.run([sys.executable, "-m", "analyze.cli", "export", str(run), "--db", str(tmp_path / "t.duckdb"),
                           "-o", str(tmp_path / "taken")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "taken exists and is not a directory" in proc.stderr
    assert "Traceback" not in proc.stderr
    # a directory that cannot be made (its parent is a file): the path and the system's reason
    proc = subprocess.run([sys.executable, "-m", "analyze.cli", "export", str(run), "--db", str(tmp_path / "t.duckdb"),
                           "-o", str(tmp_path / "taken" / "out")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip() == f"analyze: {tmp_path / 'taken' / 'out'}: Not a directory; check the path and its permissions"


@pytest.mark.slow
def test_export_of_a_two_rank_ddp_run(ddp_run: Run, tmp_path: Path) -> None:
    """Our own trace as one Chrome trace file: a process per rank, the main thread and the
    communication lane as tracks, each step a slice, each bucket allreduce with its bytes."""
    con = analyze.open(ddp_run.run_dir)
    (path,) = export.export(con, tmp_path / "ddp.json.gz")
    doc = load(path)
    t = tracks(doc)
    assert sorted(t) == [0, 1]
    for rank in (0, 1):
        name, threads = t[rank]
        assert name == f"rank {rank}"
        assert threads[0] == "main thread" and threads[-1] == "steps"
        assert "comm lane 0" in threads
    xs = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    steps = [e for e in xs if e["cat"] == "dltrace.step"]
    assert len(steps) == 2 * 4  # DDP_STEPS per rank
    assert all(sum(e["args"]["phases_ns"].values()) == round(e["dur"] * US) for e in steps)
    buckets = [e for e in xs if e.get("args", {}).get("dltrace", {}).get("op") == "allreduce"]
    expected = con.execute("SELECT count(*), sum(bytes) FROM collectives WHERE op = 'allreduce'").fetchone()
    assert (len(buckets), sum(e["args"]["dltrace"]["bytes"] for e in buckets)) == expected
    assert all(e["args"]["dltrace"]["wait_ns"] >= 0 for e in buckets)


def test_a_window_of_steps_holds_what_overlaps_them(tmp_path: Path) -> None:
    from bench import synth

    run, _ = synth.write(10_000, tmp_path / "run")  # 45 steps of 2 ranks
    full = json.loads(gzip.decompress(export.export(analyze.open(run), tmp_path / "all.json.gz")[0].read_bytes()))
    cli = subprocess.run([sys.executable, "-m", "analyze.cli", "export", str(run), "--steps", "10:12",
                          "-o", str(tmp_path / "w.json.gz")], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert cli.returncode == 0, cli.stderr
    part = json.loads(gzip.decompress((tmp_path / "w.json.gz").read_bytes()))
    steps = [e for e in part["traceEvents"] if e.get("cat") == "dltrace.step"]
    assert sorted((e["pid"], e["name"]) for e in steps) == [(r, f"step {s}") for r in (0, 1) for s in (10, 11)]
    t0 = min(e["ts"] for e in steps)
    t1 = max(e["ts"] + e["dur"] for e in steps)
    # every slice of the full export that overlaps the two steps, and nothing else
    want = [e for e in full["traceEvents"] if e.get("ph") == "X" and e["ts"] <= t1 and e["ts"] + e["dur"] >= t0]
    got = [e for e in part["traceEvents"] if e.get("ph") == "X"]
    key = json.dumps
    assert sorted(map(key, got)) == sorted(map(key, want)) and 0 < len(got) < len(full["traceEvents"]) / 10
    bad = subprocess.run([sys.executable, "-m", "analyze.cli", "export", str(run), "--steps", "50:60"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0 and "has no steps 50:60 (it has steps 0-44)" in bad.stderr


def test_the_merged_file_reads_ranks_in_batches_and_writes_them_as_one_rank_at_a_time(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from bench import synth

    run, _ = synth.write(12_000, tmp_path / "run", ranks=8)
    con = analyze.open(run, db=tmp_path / "r.duckdb")
    per_rank = con.execute("SELECT count(*) FROM intervals GROUP BY rank").fetchall()
    texts = {}
    for batch in (0, 3 * max(n for (n,) in per_rank), export.EXPORT_BATCH):
        monkeypatch.setattr(export, "EXPORT_BATCH", batch)
        queries = export._rank_batches(con, list(range(8)))
        (path,) = export.export(con, tmp_path / f"b{batch}.json.gz")
        texts[len(queries)] = gzip.decompress(path.read_bytes())
    few, some, every = sorted(texts)  # all ranks in one query, about three at a time, one at a time
    assert (few, every) == (1, 8) and 1 < some < 8
    assert texts[1] == texts[some] == texts[8]
    doc = json.loads(texts[1])
    assert {e["pid"] for e in doc["traceEvents"] if e.get("ph") == "X"} == set(range(8))
    # a batch's queries read its ranks' files only (the run's views list every rank's files)
    export._scope(con, (2, 3), export._store(con))
    assert con.execute("SELECT DISTINCT rank FROM _dltrace_export_intervals ORDER BY rank").fetchall() == [(2,), (3,)]
    assert "rank=5" not in con.execute("SELECT sql FROM duckdb_views() WHERE view_name = "
                                       "'_dltrace_export_collectives'").fetchone()[0]  # type: ignore[index]
    export._unscope(con)


def test_flows_of_a_range_of_ranks_go_to_their_own_rank(tmp_path: Path) -> None:
    con = analyze.open(two_ranks(tmp_path / "run"), db=tmp_path / "t.duckdb")
    locations = export._locations(con)
    track = {loc["location_id"]: (loc["rank"], int(loc["thread"])) for loc in locations}
    export._scope(con, (0, 1), export._store(con))  # as the export does for each batch of ranks
    both = export._flows(con, (0, 1), track, 0, 0, export.Window())
    alone = {r: export._flows(con, (r, r), track, 0, 0, export.Window()) for r in (0, 1)}
    assert dict(both) == {**alone[0], **alone[1]}
    # rank 0's two launches (the literal trace's only ones), each a start and a finish on rank 0
    assert [(r, [(e["ph"], e["pid"]) for e in flows]) for r, flows in both.items()] == [
        (0, [("s", 0), ("f", 0), ("s", 0), ("f", 0)])]


# -- DuckDB writes the plain events itself: the same bytes as Python ----------------------
@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.integers(-(export.EXACT_NS - 1), export.EXACT_NS - 1),
                          st.sampled_from([0, 1, -1, 999, 1000, 1001, -999, -1000, -1001, 10**15 + 7,
                                           export.EXACT_NS - 1, 1 - export.EXACT_NS])), min_size=1, max_size=200))
def test_duckdb_writes_times_as_python_does(values: list[int]) -> None:
    got = duckdb.connect().execute(f"SELECT list({export._us_sql('x')} ORDER BY i) FROM "
                                   "(SELECT unnest($v::BIGINT[]) AS x, generate_subscripts($v::BIGINT[], 1) AS i)",
                                   {"v": values}).fetchone()[0]  # type: ignore[index]
    assert got == [json.dumps(chrome_format.us(v)) for v in values]


@pytest.mark.parametrize("text", ["allreduce", "world", "pg 0:1 (x)", "", "a'b", 'say "hi"', "back\\slash",
                                  "wörld", "tab\there", "del\x7f", "emoji \U0001f600", None])
def test_duckdb_writes_strings_as_python_does_or_leaves_them_to_it(text: str | None) -> None:
    (got,) = duckdb.connect().execute(f"SELECT {export._str_sql('$s::VARCHAR')}", {"s": text}).fetchone()  # type: ignore[misc]
    plain = text is None or all(" " <= ch <= "~" and ch not in '"\\' for ch in text)
    assert got == (json.dumps(text) if plain else None)


def _python_only(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Make every interval's event in Python; count the rows DuckDB had encoded."""
    seen = {"rows": 0, "encoded": 0}
    original = export._encoded

    def python(batch: Any, event: Callable[[dict[str, Any]], dict[str, Any]]) -> Any:
        i = batch.schema.get_field_index("encoded")
        seen["rows"] += batch.num_rows
        seen["encoded"] += batch.num_rows - batch.column(i).null_count
        return original(batch.set_column(i, "encoded", pa.nulls(batch.num_rows, pa.string())), event)

    monkeypatch.setattr(export, "_encoded", python)
    return seen


def odd_names(directory: Path) -> Path:
    """Two ranks whose names need JSON escapes: quotes, backslashes, non-ASCII, a control
    character; a collective on a communicator with a plain and one with an odd name."""
    write_literal(directory, [
        (0, "dltrace.step", 0, 200_000_000), (1, "dltrace.step", 0, 200_000_000),
        (0, 'forward "x"', 1_000, 50_000_001), (1, "forward \\ wörld", 1_001, 49_999_999),
        (0, "tab\there \U0001f600", 60_000_000, 60_000_500),
        (0, "MPI_Allreduce", 100_000_000, 150_000_000, {"op": "allreduce", "bytes": 4096}),
        (1, "MPI_Allreduce", 50_000_000, 150_000_000, {"op": "allreduce", "bytes": 4096}),
        (0, "MPI_Bcast", 160_000_000, 170_000_000, {"op": "bcast", "bytes": 8, "root": 0, "comm": 'grüppe "2"'}),
        (1, "MPI_Bcast", 165_000_000, 170_000_000, {"op": "bcast", "bytes": 8, "root": 0, "comm": 'grüppe "2"'}),
    ])
    return directory


@pytest.mark.parametrize("source", ["odd_names", "two_ranks", "hta_sampled_2rank", "casita-2_cuda_simple"])
def test_duckdb_encoding_gives_the_bytes_python_writes(source: str, tmp_path: Path, scorep_fixtures: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    run = {"odd_names": lambda: odd_names(tmp_path / "run"), "two_ranks": lambda: two_ranks(tmp_path / "run"),
           "hta_sampled_2rank": lambda: KINETO_FIXTURES / source,
           "casita-2_cuda_simple": lambda: scorep_fixtures / source}[source]()
    con = analyze.open(run, db=tmp_path / "t.duckdb")

    def both(out: Path) -> list[Path]:
        return [*export.export(con, out / "all.json.gz"), *export.export(con, out / "ranks")]

    con.execute("SET disabled_optimizers = 'top_n'")  # the user's settings come back as they were
    fast = both(tmp_path / "fast")
    assert con.execute("SELECT current_setting('disabled_optimizers')").fetchone() == ("top_n",)
    assert not con.execute("SELECT table_name FROM duckdb_tables() WHERE table_name LIKE '_dltrace_export%' "
                           "UNION ALL SELECT view_name FROM duckdb_views() WHERE view_name LIKE '_dltrace_export%'"
                           ).fetchall()
    seen = _python_only(monkeypatch)
    slow = both(tmp_path / "slow")
    assert [p.relative_to(tmp_path / "fast") for p in fast] == [p.relative_to(tmp_path / "slow") for p in slow]
    assert len(fast) >= 3
    for a, b in zip(fast, slow, strict=True):
        assert a.read_bytes() == b.read_bytes(), a.name
    if source in ("odd_names", "casita-2_cuda_simple"):  # (imported Kineto events keep their args: Python)
        assert seen["encoded"] > seen["rows"] / 2, seen
    if source == "odd_names":  # the bcast's communicator needs escapes: Python writes those two
        assert seen["encoded"] < seen["rows"], seen
