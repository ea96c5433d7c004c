"""Write small Kineto (torch.profiler) trace files from literal event lists, so tests state their
ground truth. Times are microseconds from the file's base; the layout is Kineto's: the CPU
process ``pid`` = 1000 + rank with its main thread ``tid`` = pid, GPU events on ``pid`` = the
device (the rank), ``tid`` = stream.

    write_rank(tmp_path, 0, [
        step(1, 0, 100),
        cpu("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 0, 20),
        launch(21, 23, correlation=1), kernel("gemm", 25, 50, correlation=1),
        nccl("allreduce", 40, 80, nelems=1000),
    ])
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

BASE_NS = 1_700_000_000_000_000_000
COMPUTE_STREAM = 7
NCCL_STREAM = 20

Event = dict[str, Any]


def cpu_pid(rank: int) -> int:
    return 1000 + rank


def _x(cat: str, name: str, start: float, end: float, pid: Any = None, tid: Any = None,
       args: dict[str, Any] | None = None) -> Event:
    e: Event = {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": start,
                "dur": round(end - start, 3)}
    if args is not None:
        e["args"] = args
    return e


def cpu(name: str, start: float, end: float, cat: str = "cpu_op", tid: int | None = None, **args: Any) -> Event:
    """A CPU event on the main thread (or thread ``tid``)."""
    return _x(cat, name, start, end, None, tid, args or None)


def step(n: int, start: float, end: float) -> Event:
    return cpu(f"ProfilerStep#{n}", start, end, cat="user_annotation")


def launch(start: float, end: float, correlation: int, name: str = "cudaLaunchKernel") -> Event:
    return cpu(name, start, end, cat="cuda_runtime", correlation=correlation)


def kernel(name: str, start: float, end: float, stream: int = COMPUTE_STREAM,
           correlation: int | None = None, **args: Any) -> Event:
    a = {"stream": stream, **({"correlation": correlation} if correlation is not None else {}), **args}
    return _x("kernel", name, start, end, "gpu", stream, a)


def memcpy(start: float, end: float, stream: int = COMPUTE_STREAM) -> Event:
    return _x("gpu_memcpy", "Memcpy HtoD (Pageable -> Device)", start, end, "gpu", stream, {"stream": stream})


def nccl(collective: str, start: float, end: float, nelems: int | None = None, dtype: str = "Float",
         stream: int = NCCL_STREAM, ranks: tuple[int, ...] = (0, 1), name: str | None = None,
         correlation: int | None = None) -> Event:
    """An NCCL kernel; without ``nelems`` it carries no args (as older PyTorch wrote them)."""
    args: dict[str, Any] = {"stream": stream, **({"correlation": correlation} if correlation is not None else {})}
    if nelems is not None:
        args.update({"Collective name": collective, "In msg nelems": nelems, "Out msg nelems": nelems,
                     "Group size": len(ranks), "dtype": dtype, "Process Group Name": "0",
                     "Process Group Description": "default_pg", "Process Group Ranks": str(list(ranks))})
    kname = name or f"ncclDevKernel_{''.join(p.title() for p in collective.split('_'))}_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
    return _x("kernel", kname, start, end, "gpu", stream, args)


def write_rank(directory: Path, rank: int | None, events: list[Event], world: int = 2,
               name: str | None = None, base_ns: int = BASE_NS) -> Path:
    """Write one rank's file (``rank`` None: no distributedInfo) into ``directory``."""
    r = 0 if rank is None else rank
    out = []
    for e in events:
        e = dict(e)
        if e["pid"] == "gpu":
            e["pid"] = r
        elif e["pid"] is None:
            e["pid"] = cpu_pid(r)
            e["tid"] = cpu_pid(r) if e["tid"] is None else e["tid"]
        out.append(e)
    out.append({"name": "process_name", "ph": "M", "ts": 0, "pid": cpu_pid(r), "tid": 0, "args": {"name": "python"}})
    doc: dict[str, Any] = {"schemaVersion": 1, "deviceProperties": [], "traceEvents": out,
                           "displayTimeUnit": "ms", "baseTimeNanoseconds": base_ns}
    if rank is not None:
        doc["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": world}
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / (name or f"host_{cpu_pid(r)}.{r}.pt.trace.json.gz")
    with gzip.open(path, "wt") as fh:
        json.dump(doc, fh)
    return path


def late_kernels(directory: Path, second_step_start: float = 100) -> Path:
    """Two ranks, two steps of 100 us, an allreduce kernel a step, each launched from the main
    thread. Step 1: rank 1 launches a gemm at 2 and its allreduce at 8; the gemm runs [10, 60)
    and the allreduce kernel, behind it, starts at 60; rank 0 launches at 35 and its kernel
    waits from 40. Step 2 (rank 0's host begins it at ``second_step_start``): rank 0 loads data
    [115, 160) and launches at 165, its kernel starting at 170; rank 1 launches at 125 and its
    kernel waits from 130."""
    write_rank(directory, 0, [
        step(1, 0, 100), launch(35, 37, correlation=1), nccl("allreduce", 40, 80, nelems=1000, correlation=1),
        step(2, second_step_start, 200), cpu("dataloader", 115, 160),
        launch(165, 167, correlation=2), nccl("allreduce", 170, 190, nelems=1000, correlation=2)])
    write_rank(directory, 1, [
        step(1, 0, 100), launch(2, 4, correlation=1), kernel("gemm", 10, 60, correlation=1),
        launch(8, 9, correlation=2), nccl("allreduce", 60, 80, nelems=1000, correlation=2),
        step(2, 100, 200), launch(125, 127, correlation=3), nccl("allreduce", 130, 190, nelems=1000, correlation=3)])
    return directory
