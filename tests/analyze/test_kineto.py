"""Importing Kineto (torch.profiler) Chrome trace JSON: literal traces with known answers, and the
real fixtures of tests/fixtures/kineto with exact counts."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from pathlib import Path

import duckdb
import numpy as np
import pytest

import analyze
from analyze.errors import AnalyzeError
from analyze.tables.causes.region_time import region_times
from analyze.tables.device_phases import _union, device_activity, device_breakdown, split
from tests.analyze.conftest import KINETO_FIXTURES
from tests.kineto_literal import NCCL_STREAM, cpu, kernel, launch, memcpy, nccl, step, write_rank
from traceio.kineto import nest, own_ends

US = 1000
DATALOADER = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"


def two_ranks(directory: Path) -> Path:
    """One step of 100 us per rank. Rank 0: the data loader runs for 20 us, two compute kernels
    [25, 50) and [60, 70) (launched at 21 and 55), an allreduce kernel [40, 80) of 1000
    floats, the optimizer [80, 95) and a copy [85, 90). Rank 1: a kernel [25, 50) and its
    allreduce kernel [55, 80), so rank 0 waits 15 us in it."""
    write_rank(directory, 0, [
        step(1, 0, 100), cpu(DATALOADER, 0, 20, cat="user_annotation"),
        launch(21, 23, correlation=1), kernel("gemm", 25, 50, correlation=1),
        launch(55, 57, correlation=2), kernel("relu", 60, 70, correlation=2),
        nccl("allreduce", 40, 80, nelems=1000), cpu("Optimizer.step#SGD.step", 80, 95, cat="user_annotation"),
        memcpy(85, 90),
    ])
    write_rank(directory, 1, [step(1, 0, 100), kernel("gemm", 25, 50), nccl("allreduce", 55, 80, nelems=1000)])
    return directory


@pytest.fixture
def literal(tmp_path: Path) -> duckdb.DuckDBPyConnection:
    return analyze.open(two_ranks(tmp_path / "run"), db=tmp_path / "t.duckdb")


def device(con: duckdb.DuckDBPyConnection, rank: int) -> dict[tuple[str, str], int]:
    rows = con.execute("SELECT phase, host, duration_ns FROM device_phases WHERE rank = ? AND step = 0",
                       [rank]).fetchall()
    return {(p, h): int(ns) // US for p, h, ns in rows}


def test_device_phases_of_a_literal_trace(literal: duckdb.DuckDBPyConnection) -> None:
    # rank 0, us: idle [0, 25) (data loader until 20) and [80, 85), [90, 100) (optimizer until 95);
    # compute [25, 40); hidden [40, 50) and [60, 70); exposed [50, 60) and [70, 80); memory [85, 90)
    assert device(literal, 0) == {
        ("idle", "dataloader"): 20, ("idle", "other"): 10, ("idle", "optimizer"): 10,
        ("compute", "other"): 15, ("comm_hidden", "other"): 20, ("comm_exposed", "other"): 20,
        ("memory", "optimizer"): 5}
    # rank 1: idle [0, 25), [50, 55), [80, 100); compute [25, 50); exposed [55, 80)
    assert device(literal, 1) == {("idle", "other"): 50, ("compute", "other"): 25, ("comm_exposed", "other"): 25}
    # the host side: no collective on the main thread, so the whole step is compute there
    assert literal.execute("SELECT phase, duration_ns FROM phases WHERE rank = 0 AND duration_ns > 0").fetchall() == [
        ("compute", 100 * US)]


def test_collectives_match_across_ranks_with_bytes_wait_and_group(literal: duckdb.DuckDBPyConnection) -> None:
    rows = literal.execute("""
        SELECT c.rank, c.op, c.bytes, c.bytes_recv, m.name, m.members, c.seq, c.is_async, c.wait_ns,
               c.transfer_ns, c.ranks_matched
        FROM collectives c JOIN communicators m USING (comm_id) ORDER BY rank""").fetchall()
    assert rows == [
        (0, "allreduce", 4000, 4000, "0 (default_pg)", [0, 1], 0, True, 15 * US, 25 * US, 2),
        (1, "allreduce", 4000, 4000, "0 (default_pg)", [0, 1], 0, True, 0, 25 * US, 2)]


def test_locations_steps_and_correlations(literal: duckdb.DuckDBPyConnection) -> None:
    assert literal.execute("SELECT rank, thread, name, kind, is_main FROM locations ORDER BY rank, thread").fetchall() == [
        (0, 0, "thread 1000 (python)", "cpu_thread", True),
        (0, 1, "GPU 0 stream 7", "accelerator_stream", False),
        (0, 2, "GPU 0 stream 20", "accelerator_stream", False),
        (1, 0, "thread 1001 (python)", "cpu_thread", True),
        (1, 1, "GPU 1 stream 7", "accelerator_stream", False),
        (1, 2, "GPU 1 stream 20", "accelerator_stream", False)]
    assert literal.execute("SELECT rank, step, start_ns, end_ns, source FROM steps ORDER BY rank").fetchall() == [
        (0, 0, 0, 100 * US, "marker"), (1, 0, 0, 100 * US, "marker")]
    assert literal.execute("""
        SELECT correlation, launch_start_ns, launch_end_ns, start_ns, end_ns, source FROM correlations
        ORDER BY correlation""").fetchall() == [
        (1, 21 * US, 23 * US, 25 * US, 50 * US, "correlation"), (2, 55 * US, 57 * US, 60 * US, 70 * US, "correlation")]
    notes = dict(literal.execute("SELECT key, value FROM build_info").fetchall())
    # rank 0's copy and allreduce, rank 1's kernel and allreduce have no launch in the files
    assert notes["device_slices_without_launch"] == "4"
    assert notes["ranks_from"] == "distributedInfo.rank"
    # regions of kernels and copies carry their roles; the allreduce kernel is a collective
    assert literal.execute("SELECT name, role, category FROM regions WHERE name IN ('gemm', 'Memcpy HtoD "
                           "(Pageable -> Device)') ORDER BY name").fetchall() == [
        ("Memcpy HtoD (Pageable -> Device)", "data_transfer", "memory"), ("gemm", "kernel", "kernel")]


def test_nesting_partial_overlaps_begin_end_pairs_and_what_is_counted(tmp_path: Path) -> None:
    events = [
        cpu("outer", 0, 100), cpu("inner", 10, 20),
        cpu("a", 50, 70), cpu("b", 60, 80),  # b only partly overlaps a: siblings, both kept
        {"ph": "B", "name": "be", "pid": None, "tid": None, "ts": 110, "args": {"x": 1}},
        {"ph": "E", "pid": None, "tid": None, "ts": 130, "args": {"y": 2}},
        {"ph": "E", "pid": None, "tid": None, "ts": 131},  # an end without a begin
        {"ph": "B", "name": "open", "pid": None, "tid": None, "ts": 140},  # never closed
        {"ph": "X", "name": "neg", "cat": "cpu_op", "pid": None, "tid": None, "ts": 150, "dur": -3},
        {"ph": "i", "name": "instant", "pid": None, "tid": None, "ts": 155, "s": "t"},
    ]
    write_rank(tmp_path / "run", None, events)
    con = analyze.open(tmp_path / "run", db=tmp_path / "t.duckdb")
    rows = con.execute("""
        SELECT r.name, i.idx, i.parent_idx, i.depth, i.start_ns // 1000, i.end_ns // 1000, i.truncated, e.args
        FROM intervals i JOIN regions r USING (region_id)
        LEFT JOIN chrome_events e ON e.location_id = i.location_id AND e.idx = i.idx ORDER BY i.idx""").fetchall()
    assert rows == [
        ("outer", 0, None, 0, 0, 100, False, None), ("inner", 1, 0, 1, 10, 20, False, None),
        ("a", 2, 0, 1, 50, 70, False, None), ("b", 3, 0, 1, 60, 80, False, None),
        ("be", 4, None, 0, 110, 130, False, '{"x": 1, "y": 2}'),
        ("open", 5, None, 0, 140, 150, True, None), ("neg", 6, 5, 1, 150, 150, False, None)]
    notes = dict(con.execute("SELECT key, value FROM build_info").fetchall())
    assert notes["ranks_from"].startswith("file order")
    assert (notes["chrome_partial_overlaps"], notes["chrome_unmatched_end"], notes["chrome_unclosed_begin"],
            notes["chrome_negative_duration_clipped"]) == ("1", "1", "1", "1")
    # the instant and the process_name metadata are kept verbatim
    assert notes["chrome_other_events"] == "2"
    other = json.loads(con.execute("SELECT other_events FROM chrome_files").fetchone()[0])
    assert [e["name"] for e in other] == ["instant", "process_name"]


def test_partly_overlapping_slices_count_each_instant_once(tmp_path: Path) -> None:
    # step 1 holds a [10, 50) with its child c [30, 45); b [40, 70) starts inside both and ends
    # after them, so it is their sibling-level neighbour; x [95, 105) starts 5 us before step 1
    # ends (as profiler.step does in tracelens_mi300_rccl) and step 2 starts inside x
    write_rank(tmp_path / "run", 0, [
        step(1, 0, 100), cpu("a", 10, 50), cpu("c", 30, 45), cpu("b", 40, 70), cpu("x", 95, 105),
        step(2, 100, 200), cpu("y", 120, 130)], world=1)
    con = analyze.open(tmp_path / "run", db=tmp_path / "t.duckdb")
    rows = con.execute("""
        SELECT r.name, i.start_ns // 1000, i.end_ns // 1000, i.exclusive_ns // 1000, e.own_end_ns // 1000
        FROM intervals i JOIN regions r USING (region_id) JOIN locations l USING (location_id)
        LEFT JOIN chrome_events e ON e.location_id = i.location_id AND e.idx = i.idx
        WHERE l.is_main ORDER BY i.idx""").fetchall()
    # recorded times are kept; the overlap is the later slice's time, as on a call stack
    assert rows == [("ProfilerStep#1", 0, 100, 35, 95), ("a", 10, 50, 20, 40), ("c", 30, 45, 10, 40),
                    ("b", 40, 70, 30, None), ("x", 95, 105, 5, 100),
                    ("ProfilerStep#2", 100, 200, 90, None), ("y", 120, 130, 10, None)]
    # the main thread's exclusive times add up to the time it spends in any slice, once
    assert sum(r[3] for r in rows) == 200
    assert con.execute("SELECT value FROM build_info WHERE key = 'chrome_partial_overlaps'").fetchone() == ("4",)
    # the steps keep their recorded bounds, and the critical path's regions add up to each step
    assert con.execute("SELECT step, start_ns // 1000, end_ns // 1000 FROM steps ORDER BY step").fetchall() == [
        (0, 0, 100), (1, 100, 200)]
    assert con.execute("""
        SELECT s.step, s.duration_ns, sum(r.duration_ns) FROM step_balance s
        JOIN critical_path_regions r USING (step) GROUP BY ALL ORDER BY s.step""").fetchall() == [
        (0, 100 * US, 100 * US), (1, 100 * US, 100 * US)]
    # a stretch that ends inside the overlap of a, c and b: [35, 40) is c's, [40, 42) b's
    names = dict(con.execute("SELECT region_id, name FROM regions").fetchall())
    got = region_times(con, np.array([0, 0]), np.array([0, 0]), np.array([35 * US, 90 * US]),
                       np.array([42 * US, 100 * US]))
    assert sorted((int(q), names.get(int(r), "-"), int(ns) // US) for q, r, ns in got.itertuples(index=False)) == [
        (0, "b", 2), (0, "c", 5), (1, "ProfilerStep#1", 5), (1, "x", 5)]


def test_own_ends_cut_partly_overlapped_subtrees() -> None:
    # nesting order (start, longest first): p [0, 100) holds a [10, 50) > c [30, 45), then b
    # [40, 70) partly overlaps c and a; d [80, 90) nests in p; q [100, 110) follows p
    starts, ends = [0, 10, 30, 40, 80, 100], [100, 50, 45, 70, 90, 110]
    parent, depth, overlaps = nest(starts, ends)
    assert (parent, depth, overlaps) == ([-1, 0, 1, 0, 0, -1], [0, 1, 2, 1, 1, 0], 2)
    assert own_ends(starts, ends, depth) == [100, 40, 40, 70, 90, 110]
    # properly nested intervals keep their ends
    assert own_ends([0, 1, 2, 5], [10, 4, 3, 6], nest([0, 1, 2, 5], [10, 4, 3, 6])[1]) == [10, 4, 3, 6]


@pytest.mark.parametrize(("kernel", "op"), [
    ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", "allreduce"),  # NCCL 2.7-2.18
    ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "allgather"),  # 2.19+
    ("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL", "reduce_scatter"),
    ("ncclAllReduceRingLLKernel_sum_f32(CollectiveArgs)", "allreduce"),  # NCCL 2.4-2.6
    ("ncclBroadcastRingLLKernel_copy_i8(CollectiveArgs)", "bcast"),
    ("ncclReduceScatterRingLLKernel_sum_f16", "reduce_scatter"),
    ("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclWorkElem)", None),  # point-to-point: says nothing
    ("ncclDevKernel_Generic_4(ncclDevKernelArgsStorage<4096ul>)", None),  # RCCL
])
def test_collective_operation_from_kernel_names_of_every_nccl_generation(kernel: str, op: str | None) -> None:
    from traceio.chrome import Slice
    from traceio.kineto import collective_op, is_collective_kernel

    s = Slice(0, 7, kernel, "Kernel", 0, 1)  # (early Kineto wrote "Kernel")
    assert is_collective_kernel(s) and collective_op(s) == op


@pytest.mark.parametrize(("title", "dims", "types", "expected"), [
    ("gloo:all_reduce", [[136714]], ["float"], (546856, 546856)),  # a DDP bucket
    ("gloo:broadcast", [[2, 3]], ["long int"], (48, 48)),
    ("gloo:all_reduce", [[4], [2]], ["c10::Half", "double"], (24, 24)),  # two tensors
    ("gloo:all_gather", [[10]], ["c10::BFloat16"], (20, None)),  # out: the group's, not in the event
    ("gloo:barrier", [], [], (0, 0)),
    ("gloo:all_reduce", None, None, (None, None)),  # recorded without record_shapes
    ("gloo:all_reduce", [[3]], ["c10::SomeNewType"], (None, None)),
    ("gloo:all_reduce", [[3]], ["float", "float"], (None, None)),  # dims and types disagree
])
def test_gloo_collective_bytes_from_recorded_shapes(title: str, dims: list | None, types: list | None,
                                                    expected: tuple[int | None, int | None]) -> None:
    from traceio.chrome import Slice
    from traceio.kineto import collective_op, gloo_payload, is_gloo_collective

    args = {} if dims is None else {"Input Dims": dims, "Input type": types}
    s = Slice(0, 7, title, "user_annotation", 0, 1, args=args)
    assert is_gloo_collective(s) and collective_op(s) is not None and gloo_payload(s) == expected


def test_gloo_point_to_point_and_other_names_are_not_collectives() -> None:
    from traceio.chrome import Slice
    from traceio.kineto import is_gloo_collective

    for name in ("gloo:send", "gloo:recv", "gloo::allreduce", "c10d::allreduce_", "gloo:all_reduce_x"):
        assert not is_gloo_collective(Slice(0, 7, name, "user_annotation", 0, 1)), name


@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
def test_element_type_names_are_those_torch_profiler_records() -> None:
    """Every dtype's ``Input type`` as torch.profiler writes it (record_shapes), and its size."""
    import torch

    from traceio.kineto import TYPE_META_BYTES

    dtypes = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64, torch.int16,
              torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128, torch.complex32,
              torch.float8_e4m3fn, torch.float8_e5m2, torch.uint16, torch.uint32, torch.uint64]
    recorded = {}
    for dtype in dtypes:
        t = torch.zeros(2, dtype=dtype)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
            torch.ops.aten.clone(t)
        (event,) = [e for e in prof.events() if e.name == "aten::clone"]
        recorded[event.input_dtypes[0]] = t.element_size()
    assert {name: TYPE_META_BYTES.get(name) for name in recorded} == recorded


def test_kernel_without_args_takes_those_of_its_record_param_comms_op(tmp_path: Path) -> None:
    """Kineto copies the collective's args from c10d's ``record_param_comms`` CPU op onto the
    NCCL kernel only when all of them are known (and older versions never did): a kernel
    without them is read with those of the op with its External id; its own args win."""
    comms = {"External id": 42, "Collective name": "allreduce", "dtype": "BFloat16", "In msg nelems": 512,
             "Out msg nelems": 512, "Group size": 2, "Process Group Name": "0", "Global rank start": 0,
             "Global rank stride": 1}
    for rank in (0, 1):
        write_rank(tmp_path / "run", rank, [
            step(1, 0, 100), cpu("record_param_comms", 10, 20, **comms), launch(12, 14, correlation=7),
            {**nccl("allreduce", 30, 60, name="ncclKernel_AllReduce_RING_LL_Sum_bf16(ncclWorkElem)"),
             "args": {"stream": NCCL_STREAM, "correlation": 7, "External id": 42}},
            {**nccl("allreduce", 70, 80), "args": {"stream": NCCL_STREAM, "External id": 43}}])  # no such op
    con = analyze.open(tmp_path / "run", db=tmp_path / "t.duckdb")
    rows = con.execute("""SELECT c.rank, c.op, c.bytes_sent, c.bytes_recv, m.name, m.members, c.ranks_matched
                          FROM collectives c JOIN communicators m USING (comm_id) ORDER BY c.rank, c.interval_idx""")
    # 512 BFloat16 = 1024 B; the group from Global rank start/stride and Group size; the second
    # kernel has neither args nor an op to take them from: bytes unknown, the default group
    assert rows.fetchall() == [
        (0, "allreduce", 1024, 1024, "0", [0, 1], 2), (0, "allreduce", None, None, "default (all ranks)", [0, 1], 2),
        (1, "allreduce", 1024, 1024, "0", [0, 1], 2), (1, "allreduce", None, None, "default (all ranks)", [0, 1], 2)]
    notes = dict(con.execute("SELECT key, value FROM build_info").fetchall())
    assert notes["collective_kernels_with_args_of_record_param_comms"] == "2"
    assert notes["collective_kernels_without_bytes"] == "2"
    # the kernel's own args are kept as written (the export gives back the file)
    assert con.execute("SELECT count(*) FROM chrome_events WHERE args LIKE '%In msg nelems%'").fetchone() == (2,)


def test_pytorch_1_8_layout_and_cuda_sync_tracks(tmp_path: Path) -> None:
    """What early Kineto (PyTorch 1.8) wrote: categories Operator / Runtime / Kernel / Memcpy,
    thread ids as strings (GPU: "stream 7"), launch flows of category "async" (named "launch")
    whose start gives the thread id as an integer; no distributedInfo, no baseTimeNanoseconds.
    And what newer Kineto writes for CUDA synchronization: ``cuda_sync`` events on the device's
    ``tid`` -1 (not a CPU thread, and not device activity)."""
    pid = 25738
    events = [
        {"ph": "X", "cat": "Operator", "name": "ProfilerStep#5", "pid": pid, "tid": str(pid), "ts": 0, "dur": 100},
        {"ph": "X", "cat": "Runtime", "name": "cudaLaunchKernel", "pid": pid, "tid": str(pid), "ts": 10, "dur": 5},
        {"ph": "X", "cat": "Kernel", "name": "gemm", "pid": 0, "tid": "stream 7", "ts": 20, "dur": 30,
         "args": {"device": 0, "stream": 7}},
        {"ph": "X", "cat": "Memcpy", "name": "Memcpy DtoH (Device -> Pageable)", "pid": 0, "tid": "stream 7",
         "ts": 60, "dur": 10, "args": {"device": 0, "stream": 7}},
        {"ph": "X", "cat": "cuda_sync", "name": "Context Sync", "pid": 0, "tid": -1, "ts": 70, "dur": 20,
         "args": {"stream": -1, "device": 0}},
        {"ph": "s", "id": 9, "pid": pid, "tid": pid, "ts": 10, "cat": "async", "name": "launch"},
        {"ph": "f", "id": 9, "pid": 0, "tid": "stream 7", "ts": 20, "cat": "async", "name": "launch", "bp": "e"},
    ]
    run = tmp_path / "run"
    run.mkdir()
    (run / "worker0.1623143089861.pt.trace.json").write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    con = analyze.open(run, db=tmp_path / "t.duckdb")
    assert con.execute("SELECT thread, name, kind, is_main FROM locations ORDER BY thread").fetchall() == [
        (0, "thread 25738", "cpu_thread", True), (1, "GPU 0 stream -1", "accelerator_stream", False),
        (2, "GPU 0 stream 7", "accelerator_stream", False)]
    assert con.execute("SELECT source, start_ns - launch_start_ns FROM correlations").fetchall() == [("flow", 10 * US)]
    assert con.execute("SELECT count(*), min(source) FROM steps").fetchone() == (1, "marker")
    # 30 us computing, 10 us copying; the 20 us Context Sync is a wait, not work
    assert dict(con.execute("SELECT phase, sum(duration_ns) // 1000 FROM device_phases GROUP BY ALL").fetchall()) == {
        "compute": 30, "memory": 10, "idle": 60}


def test_rank_given_as_digits(tmp_path: Path) -> None:
    for rank in (1, 0):
        path = write_rank(tmp_path / "run", rank, [step(1, 0, 10)], name=f"z{rank}.json.gz")
        import gzip

        doc = json.loads(gzip.decompress(path.read_bytes()))
        doc["distributedInfo"]["rank"] = str(rank)
        path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    con = analyze.open(tmp_path / "run", db=tmp_path / "t.duckdb")
    assert con.execute("SELECT rank, path FROM chrome_files ORDER BY rank").fetchall()[0][1].endswith("z0.json.gz")
    assert dict(con.execute("SELECT key, value FROM build_info").fetchall())["ranks_from"] == "distributedInfo.rank"


def test_two_files_of_one_rank_is_one_clear_error(tmp_path: Path) -> None:
    write_rank(tmp_path / "run", 0, [step(1, 0, 10)], name="a.json.gz")
    write_rank(tmp_path / "run", 0, [step(1, 0, 10)], name="b.json.gz")
    with pytest.raises(AnalyzeError, match=r"a.json.gz and b.json.gz both say they are rank 0"):
        analyze.build(tmp_path / "run", db=tmp_path / "t.duckdb")


def test_a_directory_without_traces_and_a_broken_file_are_clear_errors(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "run.json").write_text("{}")
    with pytest.raises(AnalyzeError, match="no OTF2 archive .* and no Chrome trace JSON files"):
        analyze.build(tmp_path / "empty", db=tmp_path / "e.duckdb")
    bad = tmp_path / "bad" / "x.pt.trace.json"
    bad.parent.mkdir()
    bad.write_text('{"traceEvents": [{"ph": "X"')
    with pytest.raises(AnalyzeError, match=r"x.pt.trace.json is not valid JSON .*is the file complete\?$"):
        analyze.build(tmp_path / "bad", db=tmp_path / "b.duckdb")


def test_split_sums_to_the_step_and_prefers_compute_over_copies() -> None:
    a = np.array
    totals = split(a([0, 5, 8]), a([10, 20, 30]), a([0, 1, 2]), a([], dtype=np.int64), a([], dtype=np.int64),
                   a([], dtype=np.int64), a([0, 40]), a([40, 50]))
    # step 0 [0, 40): compute [0, 5), hidden [5, 10), exposed [10, 20) (the copy under it), memory [20, 30)
    assert totals[0].sum(axis=1).tolist() == [5, 5, 10, 10, 10]
    assert totals[1].sum() == 10 and totals[1, 4].sum() == 10  # step 1: idle


# -- the real fixtures (tests/fixtures/kineto/README.md) ----------------------------------
# Every number below is from tests/fixtures/kineto/facts.json, written by facts.py from the raw
# JSON with the standard library only: per rank "events_total" (events), "kernels" (events
# with cat kernel), "nccl_per_collective" (NCCL kernels by args "Collective name", "<no
# Collective name>" where the args are missing), "nccl_in_bytes_total" / "nccl_out_bytes_total"
# (In/Out msg nelems x dtype size), len("streams"), "profiler_steps".by_cat.user_annotation.
FACTS = {
    # fixture: (events per rank, kernels per rank, {op: NCCL kernels per rank}, bytes in, bytes out,
    #           streams per rank, steps per rank)
    "param_dlrm_v100_8rank": ([3290, 3424, 3268, 3474, 3310, 3250, 3272, 3250],
                              [245, 310, 246, 315, 251, 245, 246, 246],
                              {"allreduce": 3, None: 5}, None, None, 3, 1),  # 3 AllReduce, 5 SendRecv kernels
    "hta_sampled_2rank": ([4855, 4720], [1154, 1104], {None: 10}, None, None, 4, 2),  # SendRecv kernels
    "hta_nccl_a100_rank0": ([40573], [2700], {"allreduce": 15, "bcast": 6}, 307_323_096, 307_323_096, 2, 3),
    "tracelens_b200_ncclDevKernel": ([24656], [768], {"allgather": 1}, 50_272, 402_176, 1, None),
    "tracelens_mi300_rccl": ([56451], [2995], {"allreduce": 6, "bcast": 6, None: 5}, 70_195_152, 70_195_152, 2, 3),
    "hta_amd_mi250": ([220], [14], {}, None, None, 1, 2),
}


@pytest.mark.parametrize("name", FACTS)
def test_real_traces_counts_exactly(name: str, kineto_db: Callable[[str], duckdb.DuckDBPyConnection]) -> None:
    events, kernels, ops, bytes_in, bytes_out, streams, steps = FACTS[name]
    con = kineto_db(name)
    assert con.execute("SELECT events FROM runs").fetchone() == (sum(events),)
    per_rank = con.execute("""
        SELECT l.rank, count(*) FILTER (WHERE e.cat = 'kernel'),
               count(*) FILTER (WHERE r.category IN ('kernel', 'collective'))
        FROM intervals i JOIN locations l USING (location_id) JOIN regions r USING (region_id)
        JOIN chrome_events e ON e.location_id = i.location_id AND e.idx = i.idx
        WHERE l.kind = 'accelerator_stream' GROUP BY l.rank ORDER BY l.rank""").fetchall()
    assert [k for _, k, _ in per_rank] == kernels
    assert [k for _, _, k in per_rank] == kernels  # every kernel is a kernel or a collective region
    got = con.execute("SELECT rank, op, count(*) FROM collectives GROUP BY ALL").fetchall()
    assert {(r, op): n for r, op, n in got} == {(r, op): n for r in range(len(events)) for op, n in ops.items()}
    assert con.execute("SELECT sum(bytes_sent), sum(bytes_recv) FROM collectives").fetchone() == (bytes_in, bytes_out)
    assert con.execute("""SELECT count(DISTINCT location_id) FROM chrome_events
                          WHERE cat = 'kernel'""").fetchone() == (streams * len(events),)  # streams with kernels
    if steps is None:  # no ProfilerStep in the file: one step over the whole trace
        assert con.execute("SELECT DISTINCT source FROM steps").fetchall() == [("whole_run",)]
    else:
        assert con.execute("SELECT DISTINCT source FROM steps").fetchall() == [("marker",)]
        assert con.execute("SELECT count(*) FROM steps").fetchone() == (steps * len(events),)


def test_dlrm_collectives_match_across_all_eight_ranks(kineto_db: Callable[[str], duckdb.DuckDBPyConnection]) -> None:
    # facts.json: nccl_sequences_identical_across_ranks is true for both multi-rank fixtures
    con = kineto_db("param_dlrm_v100_8rank")
    assert con.execute("SELECT DISTINCT ranks_matched FROM collectives").fetchall() == [(8,)]
    assert con.execute("SELECT count(DISTINCT seq) FROM collectives").fetchone() == (8,)
    # the kernels carry no process group: a default group of all 8 ranks (distributedInfo.world_size)
    assert con.execute("SELECT name, members FROM communicators").fetchall() == [("default (all ranks)", list(range(8)))]
    assert kineto_db("hta_sampled_2rank").execute("SELECT DISTINCT ranks_matched FROM collectives").fetchall() == [(2,)]


def test_mi300_bytes_per_collective_and_ranks_from_file_order(kineto_db: Callable[[str], duckdb.DuckDBPyConnection]) -> None:
    # facts.json nccl_per_collective: allreduce 70,137,072 B, broadcast 58,080 B (In msg nelems x
    # dtype size); the 5 kernels without args have NULL bytes
    con = kineto_db("tracelens_mi300_rccl")
    assert con.execute("SELECT op, sum(bytes), count(bytes), count(*) FROM collectives GROUP BY op ORDER BY op").fetchall() == [
        ("allreduce", 70_137_072, 6, 6), ("bcast", 58_080, 6, 6), (None, None, 0, 5)]
    # mi250 has no distributedInfo: rank 0 by file order, and the build says so
    notes = dict(kineto_db("hta_amd_mi250").execute("SELECT key, value FROM build_info").fetchall())
    assert notes["ranks_from"].startswith("file order")


# -- Holistic Trace Analysis's temporal breakdown, recomputed from our tables ----------------
HTA_COMM = re.compile(r"^nccl.*Kernel")
HTA_NOT_COMPUTE = re.compile(r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)|(^dma)")


def hta_like(con: duckdb.DuckDBPyConnection) -> dict[int, tuple[int, int, int, int]]:
    """HTA 0.5.0's get_temporal_breakdown (hta/analyzers/breakdown_analysis.py) applied to our
    tables: its "GPU kernels" are the events with args.stream; float times are rounded as its
    parser does (start up, end down, to whole us; integer times kept); with several
    ProfilerSteps only events launched (correlation) before the last step's start count;
    compute = kernels whose name does not match its not-compute pattern."""
    offset = con.execute("SELECT global_offset FROM runs").fetchone()[0]  # type: ignore[index]
    out = {}
    for rank, base in con.execute("SELECT rank, base_time_ns FROM chrome_files ORDER BY rank").fetchall():
        rows = con.execute("""
            SELECT i.start_ns, i.end_ns, r.name, k.launch_start_ns
            FROM intervals i JOIN regions r USING (region_id)
            JOIN chrome_events e ON e.location_id = i.location_id AND e.idx = i.idx
            LEFT JOIN correlations k ON k.location_id = i.location_id AND k.idx = i.idx
                                    AND k.source = 'correlation'
            WHERE i.rank = ? AND json_exists(e.args, '$.stream')""", [rank]).fetchall()
        steps = con.execute("""SELECT max(i.start_ns), count(DISTINCT r.name) FROM intervals i
                               JOIN regions r USING (region_id)
                               WHERE i.rank = ? AND r.name LIKE 'ProfilerStep#%'""", [rank]).fetchone()
        if steps[1] > 1:  # type: ignore[index]
            rows = [r for r in rows if r[3] is not None and r[3] < steps[0]]  # type: ignore[index]
        start = np.array([r[0] for r in rows], dtype=np.int64) + offset - base
        end = np.array([r[1] for r in rows], dtype=np.int64) + offset - base
        ts, stop = (-((-start) // US), end // US) if base else (start // US, end // US)
        compute = np.array([not HTA_NOT_COMPUTE.match(r[2]) for r in rows])
        span, busy = int(stop.max() - ts.min()), _union(ts, stop)
        comp = _union(ts[compute], stop[compute])
        out[rank] = (span - busy, comp, busy - comp, span)
    return out


def hta_oracle(name: str) -> dict[int, tuple[int, int, int, int]]:
    """hta_oracle.json: HTA 0.5.0 run on the original files (tests/fixtures/kineto/README.md)."""
    csv = json.loads((KINETO_FIXTURES / "hta_oracle.json").read_text())["fixtures"][name]["get_temporal_breakdown_csv"]
    return {int(r[0]): tuple(int(float(v)) for v in r[1:5])  # type: ignore[misc]
            for r in (line.split(",") for line in csv.splitlines()[1:])}


@pytest.mark.parametrize("name", FACTS)
def test_htas_breakdown_from_our_tables_equals_hta_on_the_files(
        name: str, kineto_db: Callable[[str], duckdb.DuckDBPyConnection]) -> None:
    """The import keeps every GPU event, its times to the nanosecond and its launch: HTA's own
    definitions applied to our tables give HTA's numbers exactly, on every fixture (mi300
    included, which HTA itself cannot read under pandas 3: see the README)."""
    assert hta_like(kineto_db(name)) == hta_oracle(name)


def test_device_breakdown_is_htas_where_its_definitions_agree(kineto_db: Callable[[str], duckdb.DuckDBPyConnection]) -> None:
    # DLRM: one ProfilerStep (HTA filters nothing), integer us, no Triton op with a stream: our
    # own breakdown (device activity, first to last) is HTA's to the microsecond
    b = device_breakdown(kineto_db("param_dlrm_v100_8rank"))
    ours = {int(r.rank): (r.idle_ns // US, r.compute_ns // US, r.non_compute_ns // US, r.span_ns // US)
            for r in b.itertuples()}
    assert ours == hta_oracle("param_dlrm_v100_8rank")


def test_mtia_kernels_transfers_and_stream_events(kineto_db: Callable[[str], duckdb.DuckDBPyConnection]) -> None:
    """MTIA (hta_mtia_inference, README): its one category holds kernels, DMA transfers and
    stream events. Raw JSON (json.load): 1,313 mtia_ccp_events on 12 tracks of pid 17, 877
    dma_request, 291 event_record, 48 event_wait (352,569.592 us), 97 others."""
    con = kineto_db("hta_mtia_inference")
    assert con.execute("""SELECT count(*), count(DISTINCT location_id) FROM chrome_events e
                          JOIN locations l USING (location_id)
                          WHERE e.cat = 'mtia_ccp_events' AND l.kind = 'accelerator_stream'""").fetchone() == (1313, 12)
    activity = device_activity(con)  # kernels and transfers; the stream events are not activity
    assert (int((activity.kind == 0).sum()), int((activity.kind == 2).sum()), len(activity)) == (97, 877, 974)
    # every event kept to the nanosecond: HTA's rules on our tables give HTA's numbers
    assert hta_like(con) == hta_oracle("hta_mtia_inference")
    # ours differ by the 48 event_wait only, which HTA counts as computation
    ours = device_breakdown(con).iloc[0]
    idle, compute, non_compute, span = hta_oracle("hta_mtia_inference")[0]
    assert ours.idle_ns + ours.compute_ns + ours.non_compute_ns == ours.span_ns
    assert 0 < compute * US - ours.compute_ns <= 352_569_592 + US
    assert 0 < span * US - ours.span_ns <= 1_000 * US  # HTA's span takes in the stream events too


def test_device_phases_add_up_to_every_step(kineto_db: Callable[[str], duckdb.DuckDBPyConnection]) -> None:
    for name in ("hta_nccl_a100_rank0", "param_dlrm_v100_8rank"):
        con = kineto_db(name)
        assert con.execute("""
            SELECT count(*) FROM steps s JOIN (SELECT rank, step, sum(duration_ns) AS ns FROM device_phases
                                               GROUP BY ALL) d USING (rank, step)
            WHERE d.ns <> s.duration_ns""").fetchone() == (0,)
        assert con.execute("SELECT count(*) FROM device_phases").fetchone()[0] > 0  # type: ignore[index]


# Three small files other Kineto versions wrote (tests/fixtures/kineto/README.md, "Older and
# other layouts"). Every number below is a count of the raw JSON with the standard library
# (json.load, then counting events by ph, cat, pid/tid and args.correlation), as the README says.
OTHER_LAYOUTS = {
    # PyTorch 1.8: 340 events (254 X, 32 s, 32 f, 20 M, 2 i); Kernel 30 and Memcpy 2 on
    # (0, "stream 7"), each with an args.correlation that a Runtime event on the CPU also has;
    # CPU threads (24572, "24572") 116 X and (24572, "24610") 105 X; one ProfilerStep#2; no distributedInfo
    "kineto_pt18_v100": (340, 0, {"thread 24572 (python)": 116, "thread 24610 (python)": 105,
                                  "GPU 0 stream 7": 32}, 30, 2, 32, 1),
    # 149 events (57 X); kernel 3, gpu_memset 3 on streams 20, 24, 28 and cuda_sync 5 (4 on tid -1,
    # 1 on stream 24); the 6 kernels and sets each have a CPU launch by correlation; no ProfilerStep
    "hta_cuda_sync": (149, 0, {"thread 3727853 (pt_main_thread)": 45, "GPU 0 stream -1": 4, "GPU 0 stream 20": 2,
                               "GPU 0 stream 24": 3, "GPU 0 stream 28": 2}, 3, 3, 6, None),
    # 54 events (13 X); cat "Kernel" 4 on (0, 7) with correlations; flows "async_gpu";
    # distributedInfo {"rank": 1} without world_size
    "hta_kernel_async_gpu": (54, 1, {"thread 1010370 (python)": 8, "GPU 0 stream 7": 4}, 4, 0, 4, None),
}


@pytest.mark.parametrize("name", OTHER_LAYOUTS)
def test_older_and_other_layouts_count_exactly(name: str, tmp_path: Path) -> None:
    events, rank, tracks, kernels, memory, launched, steps = OTHER_LAYOUTS[name]
    con = analyze.open(KINETO_FIXTURES / name, db=tmp_path / "t.duckdb")
    assert con.execute("SELECT events FROM runs").fetchone() == (events,)
    got = dict(con.execute("SELECT name, events FROM locations WHERE kind <> 'timeline'").fetchall())
    assert got == tracks
    assert con.execute("SELECT DISTINCT rank FROM locations").fetchall() == [(rank,)]
    assert con.execute("SELECT name FROM locations WHERE is_main").fetchone()[0] == next(iter(tracks))  # type: ignore[index]
    streams = [n for n in tracks if n.startswith("GPU ")]
    assert con.execute("SELECT list(name ORDER BY name) FROM locations WHERE kind = 'accelerator_stream'"
                       ).fetchone() == (sorted(streams),)
    # device activity: the kernels and the copies/sets, never the synchronizations
    activity = device_activity(con)
    assert (int((activity.kind == 0).sum()), int((activity.kind == 2).sum())) == (kernels, memory)
    assert con.execute("SELECT count(*) FROM correlations").fetchone() == (launched,)
    if steps is None:
        assert con.execute("SELECT source, count(*) FROM steps GROUP BY ALL").fetchall() == [("whole_run", 1)]
    else:
        assert con.execute("SELECT source, count(*) FROM steps GROUP BY ALL").fetchall() == [("marker", steps)]


def test_device_summary_says_how_long_the_host_waited_for_its_device(
        kineto_db: Callable[[str], duckdb.DuckDBPyConnection]) -> None:
    """host_wait%: the share of each rank's step its main thread spent in a wait region (in
    DLRM's step: cudaStreamSynchronize 64 times, cudaDeviceSynchronize 8), which the hosts'
    phases count as compute: the ranks whose devices waited for rank 7's kernels wait 8-33%."""
    from analyze.tables import device_phases

    con = kineto_db("param_dlrm_v100_8rank")
    got = device_phases.summary(con).set_index("rank")["host_wait%"]
    waits = dict(con.execute("""
        SELECT i.rank, 100.0 * sum(least(i.end_ns, s.end_ns) - greatest(i.start_ns, s.start_ns)) / any_value(s.duration_ns)
        FROM intervals i JOIN regions r USING (region_id) JOIN locations l USING (location_id)
             JOIN steps s ON s.rank = i.rank AND i.end_ns > s.start_ns AND i.start_ns < s.end_ns
        WHERE l.is_main AND r.category = 'wait' GROUP BY i.rank""").fetchall())
    assert sorted(waits) == list(range(8))
    for rank, pct in waits.items():  # the wait regions do not nest in one another here
        assert got[rank] == pytest.approx(pct, abs=0.051)
    assert [r for r in range(8) if got[r] > 5] == [0, 1, 3, 4, 5] and got.max() == pytest.approx(33.2, abs=0.05)
    assert device_phases.summary(con, 4)["host_wait%"].notna().all()


def test_groups_of_ranks_sum_their_ranks_time(kineto_db: Callable[[str], duckdb.DuckDBPyConnection]) -> None:
    """`analyze phases` of many ranks prints groups of consecutive ranks: each group's phase
    shares are of the group's total step time, host and device alike."""
    from analyze.tables import device_phases, phases

    con = kineto_db("param_dlrm_v100_8rank")
    for table, summary, names in (("phases", phases.summary, phases.PHASE_NAMES),
                                  ("device_phases", device_phases.summary, device_phases.DEVICE_PHASES)):
        got = summary(con, 4)
        assert list(got.iloc[:, 0]) == ["0-3", "4-7"]
        for g, row in enumerate(got.to_dict("records")):
            (total,) = con.execute("SELECT sum(duration_ns) FROM steps WHERE rank // 4 = $g", {"g": g}).fetchone()
            for p in names:
                (ns,) = con.execute(f"SELECT coalesce(sum(duration_ns), 0) FROM {table} WHERE rank // 4 = $g "
                                    "AND phase = $p", {"g": g, "p": str(p)}).fetchone()
                assert row[f"{p}%"] == pytest.approx(round(100 * ns / total, 1), abs=0.051), (table, g, p)
        per_rank = summary(con)
        assert list(per_rank["rank"]) == list(range(8))


# -- CPU runs: gloo collectives on worker threads -----------------------------------------
GLOO_THREAD = 77


def gloo_ranks(directory: Path, **gloo_args: object) -> Path:
    """One DDP step of 100 us per rank on the CPU. Rank 0: forward [0, 20), backward [20, 40)
    with DDP's ``c10d::allreduce_`` call [35, 38) in it (it only enqueues), gloo's worker thread
    runs the allreduce [38, 90) while the main thread, after backward, waits outside any op;
    optimizer [90, 100). Rank 1 is slow before backward: forward [0, 20), nothing recorded
    [20, 60), backward [60, 75) with its call [72, 74) and gloo's allreduce [74, 90)."""
    bwd = "autograd::engine::evaluate_function: AddmmBackward0"
    gloo = dict(cat="user_annotation", tid=GLOO_THREAD, **gloo_args)
    common = [step(1, 0, 100), cpu("DistributedDataParallel.forward", 0, 20, cat="user_annotation"),
              cpu("Optimizer.step#SGD.step", 90, 100, cat="user_annotation")]
    write_rank(directory, 0, [*common, cpu(bwd, 20, 40), cpu("c10d::allreduce_", 35, 38),
                              cpu("gloo:all_reduce", 38, 90, **gloo)])
    write_rank(directory, 1, [*common, cpu(bwd, 60, 75), cpu("c10d::allreduce_", 72, 74),
                              cpu("gloo:all_reduce", 74, 90, **gloo)])
    return directory


def phases_us(con: duckdb.DuckDBPyConnection, rank: int) -> dict[str, int]:
    rows = con.execute("SELECT phase, sum(duration_ns) FROM phases WHERE rank = ? GROUP BY phase", [rank]).fetchall()
    return {p: int(ns) // US for p, ns in rows if ns}


def test_gloo_collectives_on_worker_threads_are_matched_and_waited_for(tmp_path: Path) -> None:
    con = analyze.open(gloo_ranks(tmp_path / "run"), db=tmp_path / "t.duckdb")
    # gloo's allreduces match across ranks (one group, by order); rank 0 entered 36 us early
    rows = con.execute("""SELECT rank, seq, op, is_async, wait_ns, transfer_ns, bytes_sent FROM collectives c
                          JOIN communicators USING (comm_id) ORDER BY rank""").fetchall()
    assert rows == [(0, 0, "allreduce", True, 36 * US, 16 * US, None), (1, 0, "allreduce", True, 0, 16 * US, None)]
    # the c10d calls only enqueue: their own time is allreduce, they are not matched
    # rank 0: forward 20 + backward 15 + 2 (the gloo allreduce hidden under backward) + optimizer
    # 10; allreduce 3 (the call) + 16; idle [40, 74) waiting for rank 1 after backward
    assert phases_us(con, 0) == {"compute": 47, "allreduce": 19, "idle": 34}
    # rank 1: the 40 us before backward are its own (compute); nobody is late for it
    assert phases_us(con, 1) == {"compute": 83, "allreduce": 17}
    # why rank 0 waited: rank 1's 40 us outside any op in its step (the step's own time), the
    # one region in which it took longer; the c10d calls only start the allreduce, so the
    # synchronization intervals run from the step starts, not from those calls' ends
    assert con.execute("SELECT rank, cause_rank, cause_kind, cause_region, excess_ns, idle_ns FROM delays"
                       ).fetchall() == [(0, 1, "region", "ProfilerStep#1", 40 * US, 34 * US)]
    regions = dict(con.execute("SELECT name, category FROM regions").fetchall())
    assert regions["DistributedDataParallel.forward"] == "forward"
    assert regions["autograd::engine::evaluate_function: AddmmBackward0"] == "backward"
    assert regions["c10d::allreduce_"] == regions["gloo:all_reduce"] == "collective"


def _gloo_fixture_facts() -> dict[int, list[tuple[int, int, str]]]:
    """Per rank (distributedInfo.rank), the (start, end, name) of its gloo:* events in ns from the
    earliest slice of any rank (baseTimeNanoseconds + ts), in start order, from the raw JSON
    with the standard library."""
    import gzip

    raw: dict[int, list[tuple[int, int, str]]] = {}
    first = []
    for f in sorted((KINETO_FIXTURES / "torch_gloo_ddp_cpu").glob("*.json.gz")):
        doc = json.loads(gzip.decompress(f.read_bytes()))
        base = doc["baseTimeNanoseconds"]
        ns = [(base + round(e["ts"] * US), base + round((e["ts"] + e["dur"]) * US), e["name"])
              for e in doc["traceEvents"] if e.get("ph") == "X"]
        first.append(min(a for a, _, _ in ns))
        raw[doc["distributedInfo"]["rank"]] = sorted(e for e in ns if e[2].startswith("gloo:"))
    t0 = min(first)
    return {rank: [(a - t0, b - t0, name) for a, b, name in v] for rank, v in raw.items()}


def test_a_real_cpu_gloo_ddp_trace_shows_the_straggler(kineto_db: Callable[[str], duckdb.DuckDBPyConnection]) -> None:
    # tests/fixtures/kineto/torch_gloo_ddp_cpu: torch 2.13.0, 2 ranks, rank 1 sleeps 25 ms per step
    # before backward; before gloo's worker-thread collectives were recognized every rank was
    # 100% compute. Each rank: DDP's 2 broadcasts, then 2 allreduces a step (DDP's bucket, the
    # metric), on gloo's two worker threads, matched in start order.
    con = kineto_db("torch_gloo_ddp_cpu")
    facts = _gloo_fixture_facts()
    assert [[name for *_, name in v] for v in facts.values()] == [["gloo:broadcast"] * 2 + ["gloo:all_reduce"] * 6] * 2
    got = con.execute("""SELECT rank, seq, r.name, enter_ns, leave_ns, wait_ns FROM collectives
                         JOIN regions r USING (region_id) ORDER BY rank, seq""").fetchall()
    assert len(got) == 16
    for rank, seq, name, enter, leave, wait in got:
        start, end, raw_name = facts[rank][seq]
        # microseconds with nanosecond decimals (float): within 2 ns
        assert name == raw_name and abs(enter - start) <= 2 and abs(leave - end) <= 2
        if name == "gloo:all_reduce":  # a broadcast's root is unknown: no waiting
            other = facts[1 - rank][seq][0]
            assert abs(wait - min(max(other - start, 0), end - start)) <= 4
    # rank 0 waits for rank 1's sleep in every step; rank 1 waits for nobody
    per_step = con.execute("""SELECT rank, step, sum(duration_ns) FILTER (WHERE phase = 'idle') / 1e6
                              FROM phases GROUP BY ALL ORDER BY ALL""").fetchall()
    assert len(per_step) == 6
    assert all(idle > 20 for rank, _, idle in per_step if rank == 0), per_step
    assert all((idle or 0) < 1 for rank, _, idle in per_step if rank == 1), per_step


def test_analyze_phases_says_how_to_get_gloos_bytes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The fixture was recorded without shapes: its 16 gloo collectives have no bytes, and the
    summary says so once, with the profiler option that records them."""
    import shutil

    from analyze.cli import main

    shutil.copytree(KINETO_FIXTURES / "torch_gloo_ddp_cpu", tmp_path / "run", ignore=shutil.ignore_patterns("*.py"))
    assert main(["phases", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    assert out.count("bytes: 16 gloo collectives have none") == 1 and "record_shapes=True" in out
    gloo_ranks(tmp_path / "literal")  # no gloo event there has args at all: the same
    assert main(["phases", str(tmp_path / "literal")]) == 0
    assert "bytes: 2 gloo collectives have none" in capsys.readouterr().out
    # shapes recorded, with an element type we do not know: build_info names it, no hint
    shapes = {"Input Dims": [[3]], "Input type": ["c10::SomeNewType"]}
    gloo_ranks(tmp_path / "typed", **shapes)
    assert main(["phases", str(tmp_path / "typed")]) == 0
    assert "bytes:" not in capsys.readouterr().out
    con = analyze.open(tmp_path / "typed")
    notes = dict(con.execute("SELECT key, value FROM build_info").fetchall())
    assert notes["unknown_dtype:c10::SomeNewType"] == notes["gloo_collectives_without_bytes"] == "2"


@pytest.mark.slow
def test_a_fresh_torch_profiler_run_on_gloo_shows_its_straggler(tmp_path: Path) -> None:
    """The fixture's script, run now with this machine's torch: rank 1 sleeps 40 ms a step, and
    the profiler records shapes, so gloo's collectives have their bytes."""
    import subprocess
    import sys

    import torch

    script = KINETO_FIXTURES / "torch_gloo_ddp_cpu" / "make_trace.py"
    subprocess.run([sys.executable, str(script), str(tmp_path / "run"), "--straggle-ms", "40", "--record-shapes"],
                   check=True, capture_output=True, timeout=300)
    con = analyze.open(tmp_path / "run", db=tmp_path / "t.duckdb")
    assert con.execute("SELECT count(DISTINCT rank), count(*) FROM steps").fetchall() == [(2, 6)]
    per_rank = dict(con.execute("""SELECT rank, count(*) FROM collectives WHERE op = 'allreduce'
                                   GROUP BY rank""").fetchall())
    assert per_rank == {0: 6, 1: 6}  # DDP's bucket and the metric in each of 3 steps
    # DDP's one bucket holds every parameter of the script's MLP (float32), the metric one float
    mlp = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
    bucket = 4 * sum(p.numel() for p in mlp.parameters())
    sizes = con.execute("""SELECT rank, bytes_sent, bytes_recv, count(*) FROM collectives WHERE op = 'allreduce'
                           GROUP BY ALL ORDER BY ALL""").fetchall()
    assert sizes == [(0, 4, 4, 3), (0, bucket, bucket, 3), (1, 4, 4, 3), (1, bucket, bucket, 3)], sizes
    notes = dict(con.execute("SELECT key, value FROM build_info").fetchall())
    assert "gloo_collectives_without_bytes" not in notes and notes["gloo_collectives"] == "16", notes
    assert "gloo_collectives_without_shapes" not in notes
    idle = dict(con.execute("""SELECT rank, coalesce(sum(duration_ns) FILTER (WHERE phase = 'idle'), 0) / 3e6
                               FROM phases GROUP BY rank""").fetchall())
    assert idle[0] > 25 and idle[1] < 0.25 * idle[0], idle  # ms per step


def test_htas_cpu_only_trace_shows_its_gloo_allreduces(kineto_db: Callable[[str], duckdb.DuckDBPyConnection]) -> None:
    # HTA's tests/data/cpu_only: rank 34 of a 300-rank gloo job, one ProfilerStep with no operator
    # on the main thread but 4 aten::empty at its end, 10 gloo:all_reduce on two worker threads.
    # Alone in the trace, the rank waits for nobody: the step is allreduce wherever one of them
    # runs (the union, from the raw JSON) and compute elsewhere.
    import gzip

    (path,) = (KINETO_FIXTURES / "hta_cpu_only").glob("*.json.gz")
    doc = json.loads(gzip.decompress(path.read_bytes()))
    xs = [e for e in doc["traceEvents"] if e.get("ph") == "X"]

    def ns(us: float) -> int:
        return round(us * US)
    (step_ev,) = [e for e in xs if e["name"].startswith("ProfilerStep#")]
    lo, hi = ns(step_ev["ts"]), ns(step_ev["ts"] + step_ev["dur"])
    gloo = sorted((ns(e["ts"]), ns(e["ts"] + e["dur"])) for e in xs if e["name"] == "gloo:all_reduce")
    assert len(gloo) == 10
    union, end = 0, lo
    for a, b in gloo:
        a, b = max(a, end), min(b, hi)
        if b > a:
            union, end = union + b - a, b
    con = kineto_db("hta_cpu_only")
    assert con.execute("SELECT count(*), count(DISTINCT location_id), bool_and(op = 'allreduce'), max(wait_ns) "
                       "FROM collectives").fetchone() == (10, 2, True, 0)
    # the trace recorded shapes: each allreduce moves its float tensor's bytes, in start order
    sizes = [4 * math.prod(e["args"]["Input Dims"][0]) for e in sorted(xs, key=lambda e: e["ts"])
             if e["name"] == "gloo:all_reduce" and e["args"]["Input type"] == ["float"]]
    assert len(sizes) == 10 and len(set(sizes)) == 2
    assert con.execute("SELECT bytes_sent, bytes_recv FROM collectives ORDER BY seq").fetchall() == [
        (n, n) for n in sizes]
    got = dict(con.execute("SELECT phase, duration_ns FROM phases WHERE duration_ns > 0").fetchall())
    assert set(got) == {"allreduce", "compute"}
    assert abs(got["allreduce"] - union) <= 10 and abs(sum(got.values()) - (hi - lo)) <= 2, (got, union, hi - lo)


def test_python_functions_are_one_region_on_every_rank_whatever_their_address(tmp_path: Path) -> None:
    # with_stack writes built-in methods with their object's address, different in each process
    from analyze.export import chrome as export

    def method(address: str) -> str:
        return f"<built-in method run_backward of torch._C._EngineBase object at {address}>"

    for rank, address in ((0, "0x7fd691c6fa00"), (1, "0x7f1099f6c3d0")):
        write_rank(tmp_path / "run", rank, [step(1, 0, 100), cpu(method(address), 10, 60, cat="python_function")])
    con = analyze.open(tmp_path / "run", db=tmp_path / "t.duckdb")
    assert con.execute("SELECT DISTINCT r.name FROM intervals i JOIN regions r USING (region_id) "
                       "WHERE r.name LIKE '<built-in%'").fetchall() == [
        ("<built-in method run_backward of torch._C._EngineBase object>",)]
    # the names as written are kept, and exported again
    assert con.execute("SELECT e.extra->>'name' FROM chrome_events e JOIN locations l USING (location_id) "
                       "WHERE e.cat = 'python_function' ORDER BY l.rank").fetchall() == [
        (method("0x7fd691c6fa00"),), (method("0x7f1099f6c3d0"),)]
    files = export.export(con, tmp_path / "out")
    written = sorted(e["name"] for f in files for e in json.loads(gzip_text(f))["traceEvents"]
                     if e.get("cat") == "python_function")
    assert written == sorted([method("0x7fd691c6fa00"), method("0x7f1099f6c3d0")])


def gzip_text(path: Path) -> str:
    import gzip

    data = path.read_bytes()
    return (gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data).decode()
