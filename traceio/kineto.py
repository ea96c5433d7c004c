"""What PyTorch's profiler (Kineto) means by the events of a Chrome trace: streams and threads,
kernels and NCCL/RCCL collectives, bytes, process groups, steps, launch correlation.

Both sides use it: the analysis imports a directory of per-rank Kineto files
(:mod:`analyze.readers.kineto`), the instrumentation imports the file torch.profiler wrote
beside our tracer (:mod:`instrument.hooks.device_activity`). The rules, from the files
themselves (tests/fixtures/kineto/README.md has real examples):

- Tracks: GPU activity (``cat`` ``kernel`` or ``gpu_*``: ``gpu_memcpy``, ``gpu_memset``,
  ``gpu_user_annotation``; also ``cuda_sync``; MTIA's ``mtia_ccp_events``) sits on ``pid`` = device index, ``tid`` = stream
  (-1: the device itself): an accelerator stream. Tracks with an integer ``pid`` >= 0 are CPU threads; the rest (``pid`` "Spans",
  Kineto's own ``overhead`` on ``pid`` -1) are timelines.
- The main thread holds the ``ProfilerStep#N`` annotations (or our ``dltrace.step`` markers, in
  our traces exported per rank); without them it is the thread whose
  id is the process id (Linux's main thread), else the busiest CPU thread.
- A collective kernel is a ``kernel`` named ``nccl...`` or ``rccl...`` (``ncclKernel_*``,
  ``ncclDevKernel_*``, RCCL's names). Its operation comes from ``args["Collective name"]``,
  else from the kernel name (``AllReduce``, ``AllGather``...); ``SendRecv`` (NCCL's grouped
  point-to-point, used for all_to_all and send/recv) and RCCL's ``Generic`` say nothing: None.
- Args of a collective kernel: its own, completed by those of the ``record_param_comms`` CPU op
  with its External id.
- Bytes: ``In msg nelems`` (``Out msg nelems``) x the size of ``dtype``; None when an arg is
  missing or the dtype is unknown.
- On the CPU (gloo), a collective is a ``gloo:<op>`` slice on a CPU thread: the profiling title
  of the work item that one of gloo's worker threads runs from start to end (``gloo:all_reduce``,
  ``gloo:broadcast``, ...; ``gloo:send``/``recv`` are point-to-point, not collectives). Its bytes
  are its input tensors' (``Input Dims`` x the size of each ``Input type``), which torch.profiler
  writes only with ``record_shapes=True``; out bytes only for allreduce, broadcast and barrier
  (every rank ends with as many as it gave). No process group is named.
- Process group: ``Process Group Name`` with ``Process Group Ranks`` (a string "[0, 1]"), or
  the ranks of that group in ``distributedInfo.pg_config``; without a name, None (the caller
  uses a default group of all ranks).
- Launch correlation: a device slice and the CPU slice (a runtime call) with the same
  ``args.correlation``; where a device slice has none, the ``ac2g`` flow (older: ``async_gpu``,
  ``async_cpu_to_gpu``, ``async``) whose finish (``f``)
  sits at its start and whose start (``s``) sits at the start of a CPU slice.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from traceio.chrome import ChromeTrace, Slice, to_ns

ACCELERATOR_STREAM = "accelerator_stream"
CPU_THREAD = "cpu_thread"
TIMELINE = "timeline"

# the profiler's step annotations, and our own step marker (in our traces exported per rank)
STEP_NAME = re.compile(r"ProfilerStep#\d+|dltrace\.step")
# launch flows: ac2g (PyTorch 1.10+), async_cpu_to_gpu / async_gpu and async "launch" (older)
FLOW_CATS = ("ac2g", "async_cpu_to_gpu", "async_gpu", "async")
MEMORY_CATS = ("gpu_memcpy", "gpu_memset", "memcpy", "memset")
KERNEL_CAT = "kernel"
# Meta's MTIA accelerators: one category for the device's kernels, its DMA transfers
# (``dma_request``: memory, as HTA counts them) and its stream events (``event_record``,
# ``event_wait``: synchronization records, not activity, as CUDA's ``cuda_sync``)
MTIA_CAT = "mtia_ccp_events"
MTIA_EVENTS = ("event_record", "event_wait")

# torch's dtype names as Kineto writes them (ScalarType names) -> bytes per element
DTYPE_BYTES = {
    "Float": 4, "Float32": 4, "float": 4, "float32": 4, "Half": 2, "Float16": 2, "float16": 2,
    "BFloat16": 2, "bfloat16": 2, "Double": 8, "Float64": 8, "float64": 8, "Int": 4, "Int32": 4,
    "int32": 4, "Long": 8, "Int64": 8, "int64": 8, "Short": 2, "Int16": 2, "Byte": 1, "UInt8": 1,
    "Char": 1, "Int8": 1, "Bool": 1, "ComplexHalf": 4, "ComplexFloat": 8, "ComplexDouble": 16,
    "Float8_e4m3fn": 1, "Float8_e5m2": 1, "Float8_e4m3fnuz": 1, "Float8_e5m2fnuz": 1,
    "UInt16": 2, "UInt32": 4, "UInt64": 8,
}

# tensors' element types as ``record_shapes`` writes them (``Input type``: caffe2's TypeMeta
# names, read from torch 2.13.0's profiler on Linux for every dtype) -> bytes per element
TYPE_META_BYTES = {
    "float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "int": 4, "long int": 8, "short int": 2,
    "signed char": 1, "unsigned char": 1, "bool": 1, "c10::complex<float>": 8, "c10::complex<double>": 16,
    "c10::complex<c10::Half>": 4, "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1, "c10::Float8_e4m3fnuz": 1,
    "c10::Float8_e5m2fnuz": 1, "short unsigned int": 2, "unsigned int": 4, "long unsigned int": 8,
}

# gloo's profiling titles (``strings`` of torch 2.13.0's libtorch_cpu.so) -> OTF2's operation
# names; gloo:send and gloo:recv are point-to-point
GLOO_PREFIX = "gloo:"
GLOO_OPS = {"all_reduce": "allreduce", "sparse_all_reduce": "allreduce", "broadcast": "bcast", "reduce": "reduce",
            "all_gather": "allgather", "all_to_all": "alltoall", "gather": "gather", "scatter": "scatter",
            "barrier": "barrier"}
_SAME_OUT = ("allreduce", "bcast", "barrier")  # every rank ends with as many bytes as it gave

# c10d operation names (``Collective name``, lower case, without "_") and NCCL kernel name
# parts -> OTF2's operation names (what the ``collectives`` table says)
_OPS = {
    "allreduce": "allreduce", "allreducecoalesced": "allreduce",
    "broadcast": "bcast", "bcast": "bcast", "reduce": "reduce",
    "allgather": "allgather", "allgatherbase": "allgather", "allgathercoalesced": "allgather",
    "allgatherintotensor": "allgather", "allgatherintotensorcoalesced": "allgather",
    "reducescatter": "reduce_scatter", "reducescatterbase": "reduce_scatter",
    "reducescattertensor": "reduce_scatter", "reducescattertensorcoalesced": "reduce_scatter",
    "alltoall": "alltoall", "alltoallbase": "alltoall", "alltoallsingle": "alltoall",
    "gather": "gather", "scatter": "scatter", "barrier": "barrier",
}
# ncclKernel_AllReduce_RING_LL_Sum_float (NCCL 2.7-2.18), ncclDevKernel_AllGather_RING_LL (2.19+,
# RCCL), and any other ``nccl...Kernel_<Op>``; older NCCL (2.4-2.6): ncclAllReduceRingLLKernel_sum_f32
_KERNEL_OP = re.compile(r"^(?:nccl|rccl)[A-Za-z]*?Kernel_([A-Za-z]+)", re.IGNORECASE)
_OLD_KERNEL_OP = re.compile(r"^(?:nccl|rccl)(AllReduce|AllGather|ReduceScatter|Broadcast|Reduce|AllToAll|"
                            r"Gather|Scatter|SendRecv)[A-Z]")
_ROLE_OF_OP = {"bcast": "coll_one2all", "scatter": "coll_one2all", "reduce": "coll_all2one",
               "gather": "coll_all2one", "barrier": "barrier"}


def _cat(s: Slice) -> str:
    """The category in lower case (early Kineto versions wrote Kernel, Memcpy, Memset)."""
    return s.cat.lower() if isinstance(s.cat, str) else ""


def is_device(s: Slice) -> bool:
    """An event on the GPU's timeline: kernels, memory copies and sets, GPU-side annotations,
    and CUDA's synchronization records (``cuda_sync``: Stream Sync, Event Sync, Context Sync,
    on the stream or on ``tid`` -1 of the device; they are not activity); MTIA's events alike."""
    c = _cat(s)
    return c == KERNEL_CAT or c.startswith("gpu_") or c in ("memcpy", "memset", "cuda_sync", MTIA_CAT)


def is_kernel(s: Slice) -> bool:
    c = _cat(s)
    return c == KERNEL_CAT or (c == MTIA_CAT and not s.name.startswith("dma") and s.name not in MTIA_EVENTS)


def is_memory(s: Slice) -> bool:
    c = _cat(s)
    return c in MEMORY_CATS or (c == MTIA_CAT and s.name.startswith("dma"))


def is_collective_kernel(s: Slice) -> bool:
    return is_kernel(s) and s.name[:4].lower() in ("nccl", "rccl")


def _gloo_op(name: str) -> str | None:
    """OTF2's name of the collective a gloo profiling title names (None: not one)."""
    return GLOO_OPS.get(name[len(GLOO_PREFIX):]) if name.startswith(GLOO_PREFIX) else None


def is_gloo_collective(s: Slice) -> bool:
    """A gloo collective's work item on the CPU thread that runs it (not on the device, not
    point-to-point)."""
    return _gloo_op(s.name) is not None and not is_device(s)


def gloo_payload(s: Slice) -> tuple[int | None, int | None]:
    """(bytes in, bytes out) of a gloo collective from its input tensors' shapes and element
    types (``record_shapes``); None where unknown: no shapes recorded, an unknown type, or out
    for an operation whose output size differs by rank or root."""
    args = s.args or {}
    dims, types = args.get("Input Dims"), args.get("Input type")
    if not isinstance(dims, list) or not isinstance(types, list) or len(dims) != len(types):
        return None, None
    total = 0
    for shape, kind in zip(dims, types, strict=True):
        size = TYPE_META_BYTES.get(kind) if isinstance(kind, str) else None
        if size is None or not isinstance(shape, list) or not all(_int(d) is not None and d >= 0 for d in shape):
            return None, None
        total += math.prod(shape) * size
    return total, total if _gloo_op(s.name) in _SAME_OUT else None


def collective_role(op: str | None) -> str:
    """The region role (traceio.records.Role values) of a collective performing ``op``."""
    return _ROLE_OF_OP.get(op or "", "coll_all2all" if op else "coll_other")


def collective_op(s: Slice, args: dict[str, Any] | None = None) -> str | None:
    """OTF2's name of the operation a collective kernel (or gloo work item) performs, or None
    if unknown; from ``args`` (default the kernel's own, see :func:`collective_args`), else its
    name."""
    if s.name.startswith(GLOO_PREFIX):
        return _gloo_op(s.name)
    name = ((s.args if args is None else args) or {}).get("Collective name")
    if isinstance(name, str):
        op = _OPS.get(re.sub(r"[^a-z]", "", name.lower()))
        if op is not None or name.lower() in ("send", "recv", "sendrecv"):
            return op
    for pattern in (_KERNEL_OP, _OLD_KERNEL_OP):
        m = pattern.match(s.name)
        if m and m.group(1).lower() in _OPS:
            return _OPS[m.group(1).lower()]
    return None


PARAM_COMMS = "record_param_comms"
COLLECTIVE_KEYS = ("Collective name", "dtype", "In msg nelems", "Out msg nelems", "Group size",
                   "Process Group Name", "Process Group Description", "Process Group Ranks",
                   "Global rank start", "Global rank stride")


def _external_id(args: dict[str, Any] | None) -> Any:
    args = args or {}
    return args.get("External id", args.get("external id"))


def param_comms(trace: ChromeTrace) -> dict[Any, dict[str, Any]]:
    """External id -> the collective args of the CPU op ``record_param_comms`` with that id
    (c10d records them there; Kineto copies them onto the NCCL kernel it launches only when
    all of name, counts, group size and dtype are known, and older versions never do)."""
    out: dict[Any, dict[str, Any]] = {}
    for s in trace.slices:
        if s.name == PARAM_COMMS and s.args and not is_device(s):
            found = {k: s.args[k] for k in COLLECTIVE_KEYS if k in s.args}
            ext = _external_id(s.args)
            if found and ext is not None:
                out.setdefault(ext, found)
    return out


def collective_args(s: Slice, comms: dict[Any, dict[str, Any]]) -> tuple[dict[str, Any], bool]:
    """The args a collective kernel is read with: its own, completed by those of the
    ``record_param_comms`` op with its External id (:func:`param_comms`); and whether any
    came from there."""
    own = s.args or {}
    cpu = comms.get(_external_id(own)) if comms else None
    if not cpu:
        return own, False
    extra = {k: v for k, v in cpu.items() if k not in own}
    return ({**own, **extra}, True) if extra else (own, False)


def payload(args: dict[str, Any] | None) -> tuple[int | None, int | None]:
    """(bytes in, bytes out) of a collective kernel from its args; None where unknown."""
    args = args or {}
    size = DTYPE_BYTES.get(args.get("dtype"))  # type: ignore[arg-type]
    if size is None:
        return None, None

    def nbytes(key: str) -> int | None:
        n = args.get(key)
        return n * size if isinstance(n, int) and not isinstance(n, bool) and n >= 0 else None

    return nbytes("In msg nelems"), nbytes("Out msg nelems")


def parse_ranks(value: Any) -> list[int] | None:
    """``"[0, 1]"`` or ``[0, 1]`` -> [0, 1]; None when it is not a list of ranks."""
    if isinstance(value, list):
        items: Iterable[Any] = value
    elif isinstance(value, str) and value.strip().startswith("[") and value.strip().endswith("]"):
        items = [v for v in value.strip()[1:-1].split(",") if v.strip()]
    else:
        return None
    try:
        return [int(v) for v in items]
    except (TypeError, ValueError):
        return None


def process_group(args: dict[str, Any] | None, dist_info: dict[str, Any]) -> tuple[str, list[int]] | None:
    """(name, member ranks) of the process group a collective kernel ran in, or None."""
    args = args or {}
    name = args.get("Process Group Name")
    if name is None:
        return None
    members = parse_ranks(args.get("Process Group Ranks"))
    if members is None:
        for pg in dist_info.get("pg_config") or []:
            if isinstance(pg, dict) and str(pg.get("pg_name")) == str(name):
                members = parse_ranks(pg.get("ranks"))
                break
    if members is None:  # c10d's record_param_comms: a strided group
        start, stride, size = (_int(args.get(k)) for k in ("Global rank start", "Global rank stride", "Group size"))
        if start is not None and stride is not None and size is not None and size > 0:
            members = [start + i * stride for i in range(size)]
    if members is None:
        return None
    desc = args.get("Process Group Description")
    return (f"{name} ({desc})" if desc else str(name)), members


def role(s: Slice, op: str | None = None) -> str:
    """The region role (traceio.records.Role values) a slice is recorded with."""
    if is_collective_kernel(s):
        return collective_role(op)
    if is_kernel(s):
        return "kernel"
    if is_memory(s):
        return "data_transfer"
    return "function"


# a Python object's address in a profiler name (with_stack's "<built-in method get of dict
# object at 0x7fd67404ebc0>"): different in every process, so one function would be a region
# of its own on every rank
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+(?=>)")


def region_name(name: str) -> str:
    """The name a slice's region goes by: ``name`` without Python object addresses."""
    return _ADDRESS.sub("", name) if " at 0x" in name else name


def is_step(s: Slice) -> bool:
    return STEP_NAME.fullmatch(s.name) is not None and not is_device(s)


# -- tracks -------------------------------------------------------------------------------
@dataclass
class Track:
    pid: Any
    tid: Any
    kind: str
    name: str
    slices: list[int] = field(default_factory=list)  # indices into trace.slices, nesting order
    parent: list[int] = field(default_factory=list)  # per position: parent position or -1
    depth: list[int] = field(default_factory=list)


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _names(trace: ChromeTrace) -> tuple[dict[Any, str], dict[tuple[Any, Any], str]]:
    procs: dict[Any, str] = {}
    threads: dict[tuple[Any, Any], str] = {}
    for e in trace.other:
        if e.get("ph") != "M":
            continue
        name = (e.get("args") or {}).get("name")
        if not isinstance(name, str):
            continue
        if e.get("name") == "process_name":
            procs[e.get("pid")] = name
        elif e.get("name") == "thread_name":
            threads[(e.get("pid"), e.get("tid"))] = name.strip()
    return procs, threads


def nest(starts: list[int], ends: list[int]) -> tuple[list[int], list[int], int]:
    """Parents and depths of intervals given in nesting order (start, then longest first):
    an interval's parent is the innermost earlier one that contains it. One that only
    partly overlaps the interval open before it is not its child but follows it at the same
    level; returns (parent positions (-1 at the top), depths, how many partly overlapped)."""
    parent, depth = [-1] * len(starts), [0] * len(starts)
    stack: list[int] = []
    overlaps = 0
    for i, (s, e) in enumerate(zip(starts, ends, strict=True)):
        while stack and not (starts[stack[-1]] <= s and e <= ends[stack[-1]]):
            if ends[stack[-1]] > s:
                overlaps += 1
            stack.pop()
        parent[i] = stack[-1] if stack else -1
        depth[i] = len(stack)
        stack.append(i)
    return parent, depth, overlaps


def own_ends(starts: list[int], ends: list[int], depth: list[int]) -> list[int]:
    """Where each interval (in nesting order, with :func:`nest`'s depths) stops being the
    innermost one: its end, or the start of the first later interval outside its subtree if
    that starts first (a partly overlapping sibling of it or of an ancestor). An interval's
    time then goes to the one that started last, as on a call stack, and the intervals cut
    at these ends nest, with the same parents: a track's exclusive times add up to the time
    it spends in any interval, once."""
    out = list(ends)
    open_: list[int] = []  # intervals whose first later interval outside the subtree is not yet seen
    for i, d in enumerate(depth):
        while open_ and depth[open_[-1]] >= d:  # a subtree's members are contiguous after it
            j = open_.pop()
            out[j] = min(ends[j], starts[i])
        open_.append(i)
    return out


def tracks(trace: ChromeTrace) -> tuple[list[Track], int]:
    """The trace's tracks, main thread first, then CPU threads, timelines and streams (each
    by pid, tid), with their slices in nesting order; and how many slices partly overlap
    the one open before them on their track (kept, as siblings)."""
    by_track: dict[tuple[Any, Any], list[int]] = {}
    device: set[tuple[Any, Any]] = set()
    steps: dict[tuple[Any, Any], int] = {}
    for i, s in enumerate(trace.slices):
        key = (s.pid, s.tid)
        by_track.setdefault(key, []).append(i)
        if is_device(s):
            device.add(key)
        elif is_step(s):
            steps[key] = steps.get(key, 0) + 1
    procs, threads = _names(trace)

    def kind(key: tuple[Any, Any]) -> str:
        if key in device:
            return ACCELERATOR_STREAM
        pid = _int(key[0])
        return CPU_THREAD if pid is not None and pid >= 0 else TIMELINE

    cpu = [k for k in by_track if kind(k) == CPU_THREAD]
    stepped = [k for k in cpu if k in steps]
    main: tuple[Any, Any] | None
    if stepped:
        main = min(stepped, key=lambda k: (-steps[k], _order(k)))
    else:
        pool = [k for k in cpu if str(k[0]) == str(k[1])] or cpu  # (1.8: tid as a string)
        main = min(pool, key=lambda k: (-len(by_track[k]), _order(k)), default=None)
    rank_of_kind = {CPU_THREAD: 0, TIMELINE: 1, ACCELERATOR_STREAM: 2}
    keys = sorted(by_track, key=lambda k: (k != main, rank_of_kind[kind(k)], _order(k)))
    out: list[Track] = []
    overlaps = 0
    for key in keys:
        k = kind(key)
        if k == ACCELERATOR_STREAM:  # PyTorch 1.8 wrote tid "stream 7"
            stream = key[1][7:] if isinstance(key[1], str) and key[1].startswith("stream ") else key[1]
            name = f"GPU {key[0]} stream {stream}"
        elif key in threads:
            name = threads[key]
        elif k == CPU_THREAD:
            name = f"thread {key[1]} ({procs[key[0]]})" if key[0] in procs else f"thread {key[1]}"
        else:
            name = f"{key[0]} {key[1]}"
        idx = sorted(by_track[key], key=lambda i: (trace.slices[i].start_ns, -trace.slices[i].end_ns, i))
        parent, depth, n = nest([trace.slices[i].start_ns for i in idx], [trace.slices[i].end_ns for i in idx])
        overlaps += n
        out.append(Track(key[0], key[1], k, name, idx, parent, depth))
    return out, overlaps


def _id(value: Any) -> int:
    """A correlation or flow id as an integer (-1 when it is not one)."""
    v = _int(value)
    return -1 if v is None else v


def _order(key: tuple[Any, Any]) -> tuple[int, ...]:
    """Sort key for (pid, tid): integers first by value, then strings."""
    return tuple(v for x in key for v in ((0, x) if _int(x) is not None else (1, 0)))


# -- launch correlation -------------------------------------------------------------------
def correlations(trace: ChromeTrace, device_slices: Iterable[int],
                 cpu_slices: Iterable[int]) -> tuple[list[tuple[int, int, int, str]], int]:
    """[(launch slice, device slice, correlation id, how)] and the number of device slices
    left without a launch. ``how`` is ``correlation`` (args.correlation) or ``flow`` (ac2g)."""
    launch_of: dict[Any, int] = {}
    cpu_at: dict[tuple[Any, Any, int], int] = {}
    for i in cpu_slices:
        s = trace.slices[i]
        c = (s.args or {}).get("correlation")
        if c is not None and c not in launch_of:
            launch_of[c] = i
        cpu_at.setdefault((str(s.pid), str(s.tid), s.start_ns), i)  # (1.8: tid int here, string there)
    flow_start: dict[Any, tuple[Any, Any, int]] = {}
    flow_end: dict[tuple[Any, Any, int], Any] = {}
    for e in trace.other:
        if e.get("cat") not in FLOW_CATS or not isinstance(e.get("ts"), int | float):
            continue
        where = (str(e.get("pid")), str(e.get("tid")), trace.base_ns + to_ns(e["ts"]))
        if e.get("ph") == "s":
            flow_start[e.get("id")] = where
        elif e.get("ph") == "f":
            flow_end[where] = e.get("id")
    out: list[tuple[int, int, int, str]] = []
    missing = 0
    for i in device_slices:
        s = trace.slices[i]
        if not (is_kernel(s) or is_memory(s)):
            continue  # annotations are not launched
        c = (s.args or {}).get("correlation")
        if c is not None and c in launch_of:
            out.append((launch_of[c], i, _id(c), "correlation"))
            continue
        fid = flow_end.get((str(s.pid), str(s.tid), s.start_ns))
        at = flow_start.get(fid) if fid is not None else None
        if at is not None and at in cpu_at:
            out.append((cpu_at[at], i, _id(fid), "flow"))
        else:
            missing += 1
    return out, missing
