"""The default name patterns: which region names are communication, for libraries whose calls
reach a trace only as names (no OTF2 collective record, no MPI paradigm).

Each :class:`Pattern` says what a region is when its *match name* (the demangled function
name without return type and parameters, see :mod:`analyze.tables.names`) matches: a
regular expression or a glob, matched against the whole name, case-sensitively. The first
matching pattern wins: a user's ``--patterns`` file comes before this table, and within the
table more specific rows come first. What an OTF2 record says (a collective record, an MPI
paradigm, a region role) is decided before any pattern is tried (:mod:`analyze.tables.regions`).

Every row cites where its names come from: the library's public header, source or
documentation, as ``owner/repo@commit path:line`` (docs/research/comm-names.md has the
reading notes), and gives one real name it must classify (the tests check each).
``blocking=False`` marks calls that only start an operation (non-blocking starts, and GPU
libraries that enqueue on a stream): their own time counts as communication, but they are
not matched across ranks, because their enter times say nothing about waiting.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Kind(StrEnum):
    """What a pattern says a region is."""

    ALLREDUCE = "allreduce"  # an allreduce collective
    COLLECTIVE = "collective"  # any other collective
    P2P = "p2p"  # point-to-point, one-sided or remote atomic
    WAIT = "wait"  # completes something started earlier
    RUNTIME = "runtime"  # setup, teardown, queries, grouping
    COMPUTE = "compute"  # not communication (for user files that switch a default off)


# Operations a pattern may name: OTF2's collective operations we use, and point-to-point.
OPS = ("allreduce", "bcast", "reduce", "allgather", "reduce_scatter", "alltoall", "gather",
       "scatter", "barrier", "send", "recv", "sendrecv")


@dataclass(frozen=True)
class Pattern:
    library: str
    pattern: str
    kind: Kind
    op: str | None = None  # the operation the name says, if it says one
    blocking: bool = True  # False: the call only starts the operation (see the module doc)
    syntax: str = "regex"  # regex or glob; both must match the whole match name
    source: str = ""  # where the name comes from
    example: str = ""  # a name from that source which this row classifies

    @property
    def label(self) -> str:
        return f"{self.library}: {self.pattern}"


# Every default pattern's names contain one of these (the tests check each row's example):
# names without any are not compared with the table at all.
ANCHORS = ("Al::", "lbann::", "gaspi", "tarantella", "AllreduceOp::", "BarrierOp::", "nccl", "RCCL_",
           "ccl::", "gloo:", "torch.", "c10d::", "horovod.")

A, C, P, W, RT = Kind.ALLREDUCE, Kind.COLLECTIVE, Kind.P2P, Kind.WAIT, Kind.RUNTIME
T = "<.*>"  # template arguments, as the demangled name shows them

# --- sources (docs/research/comm-names.md lists what was read at each commit) ---------------
AL = "LLNL/Aluminum@e9bfa94e include/Al.hpp"
AL_STREAM = ("LLNL/Aluminum@0e7f12c6 README.md, 'GPU-centric Communication': NCCL and "
             "HostTransfer operations do not block the host thread")
LB = "LLNL/lbann@04c297bd include/lbann/comm.hpp"
GA = "cc-hpc-itwm/GPI-2@9eae0f24 src/include/GASPI.h"
TA = "cc-hpc-itwm/tarantella@67b364e9 src/gpi_comm_lib"
TAPY = "cc-hpc-itwm/tarantella@67b364e9 src/tarantella"
GC = "cc-hpc-itwm/GaspiCxx@b4a1d5a9 include/GaspiCxx"
NC = "NVIDIA/nccl@5067397c src/collectives.cc"
NC_HOST = "; an NVTX range around the host-side enqueue (src/include/nvtx.h:125-142)"
RC = "ROCm/rccl@0cbce2a7 src/collectives.cc"
CCL = "oneapi-src/oneCCL@5f701048 include/oneapi/ccl/api_functions.hpp"
CCL_EVENT = "; returns a ccl::event to wait on (l. 890)"
GL = "facebookincubator/gloo@cc441984 gloo"
TORCH = "torch 2.13.0 wheel, torch/distributed/distributed_c10d.py (pytorch/pytorch@6170845e)"
TORCH_SO = "torch 2.13.0 wheel, torch/lib/libtorch_cpu.so (nm -DC)"
TORCH_SO_STRINGS = "torch 2.13.0 wheel, torch/lib/libtorch_cpu.so (strings)"
TORCH_HPP = "torch 2.13.0 wheel, torch/include/torch/csrc/distributed/c10d"
HVD = "horovod 0.28.1 wheel, horovod/torch"


def R(library: str, pattern: str, kind: Kind, op: str | None, source: str, example: str,
      blocking: bool = True) -> Pattern:
    return Pattern(library, pattern, kind, op, blocking, "regex", source, example)


def G(library: str, pattern: str, kind: Kind, op: str | None, source: str, example: str,
      blocking: bool = True) -> Pattern:
    return Pattern(library, pattern, kind, op, blocking, "glob", source, example)


def _aluminum(name: str, kind: Kind, op: str, line: int, nb_line: int, types: str = ", float") -> list[Pattern]:
    """Al::<Name>, its Nonblocking form, and both on a GPU backend (stream-ordered: a start)."""
    return [
        R("Aluminum", rf"Al::(?:Nonblocking)?{name}<Al::(?:NCCL|HostTransfer)Backend\b.*>", kind, op,
          f"{AL}:{line}; {AL_STREAM}", f"Al::{name}<Al::NCCLBackend{types}>", blocking=False),
        R("Aluminum", rf"Al::Nonblocking{name}(?:{T})?", kind, op, f"{AL}:{nb_line}",
          f"Al::Nonblocking{name}<Al::MPIBackend{types}>", blocking=False),
        R("Aluminum", rf"Al::{name}(?:{T})?", kind, op, f"{AL}:{line}", f"Al::{name}<Al::MPIBackend{types}>"),
    ]


def _lbann(methods: str) -> str:
    return rf"lbann::lbann_comm::(?:{methods})(?:{T})?"


def _nccl(name: str, kind: Kind, op: str | None, line: int) -> Pattern:
    # pncclXxx: the profiling alias every NCCL API function has (NCCL_API macro)
    return R("NCCL", rf"p?nccl{name}", kind, op, f"{NC}:{line}{NC_HOST}", f"nccl{name}", blocking=False)


def _rccl(name: str, kind: Kind, op: str, line: int) -> Pattern:
    # rocTX ranges RCCL_<Op> on AMD; the API bodies nccl<Op>_impl elsewhere (collectives.cc:45)
    return R("RCCL", rf"RCCL_{name}|nccl{name}_impl", kind, op, f"{RC}:{line}", f"RCCL_{name}", blocking=False)


def _ccl(names: str, kind: Kind, op: str, lines: str, example: str) -> Pattern:
    return R("oneCCL", rf"ccl::(?:v1::)?(?:{names})(?:{T})?", kind, op, f"{CCL}:{lines}{CCL_EVENT}", example,
             blocking=False)


def _c10d(names: str, kind: Kind, op: str | None, lines: str, example: str, blocking: bool = True) -> Pattern:
    return R("PyTorch c10d", rf"torch\.distributed\.distributed_c10d:(?:{names})", kind, op, f"{TORCH}:{lines}",
             f"torch.distributed.distributed_c10d:{example}", blocking)


def _pg(names: str, kind: Kind, op: str, example: str) -> Pattern:
    # ProcessGroup methods enqueue the work and return a Work to wait on
    return R("PyTorch c10d", rf"c10d::ProcessGroup(?:Gloo|NCCL|MPI)::(?:{names})", kind, op,
             f"{TORCH_SO}; {TORCH_HPP}/ProcessGroupNCCL.hpp:829-939, ProcessGroupMPI.hpp:154-232",
             f"c10d::ProcessGroupGloo::{example}", blocking=False)


def _dispatch(names: str, kind: Kind, op: str, lines: str, example: str) -> Pattern:
    # the dispatcher ops ProcessGroup's methods call (torch.profiler records them as cpu_op
    # events): they enqueue the work on the backend and return a Work to wait on
    return R("PyTorch c10d", rf"c10d::(?:{names})", kind, op, f"{TORCH_HPP}/ProcessGroup.hpp:{lines}",
             f"c10d::{example}", blocking=False)


def _gloo(names: str, kind: Kind, op: str, example: str) -> Pattern:
    # the profiling titles of gloo's work items, recorded on the worker thread that runs the
    # whole collective (torch.profiler: user_annotation events on a gloo thread)
    return R("PyTorch gloo", rf"gloo:(?:{names})", kind, op, f"{TORCH_SO_STRINGS}; {TORCH_HPP}/"
             "ProcessGroupGlooDetail.hpp:282, 398", f"gloo:{example}")


def _hvd(names: str, kind: Kind, op: str | None, lines: str, example: str, blocking: bool = True) -> Pattern:
    return R("Horovod", rf"horovod\.torch\.mpi_ops:(?:{names})", kind, op, f"{HVD}/mpi_ops.py:{lines}",
             f"horovod.torch.mpi_ops:{example}", blocking)


DEFAULTS: tuple[Pattern, ...] = (
    # --- Aluminum (LBANN's communication library): function templates in namespace Al ----------
    *_aluminum("Allreduce", A, "allreduce", 119, 166),
    *_aluminum("Reduce", C, "reduce", 223, 273),
    *_aluminum("Reduce_scatter", C, "reduce_scatter", 330, 380),
    *_aluminum("Reduce_scatterv", C, "reduce_scatter", 436, 491),
    *_aluminum("Allgather", C, "allgather", 551, 596),
    *_aluminum("Allgatherv", C, "allgather", 647, 698),
    *_aluminum("Barrier", C, "barrier", 752, 768, types=""),
    *_aluminum("Bcast", C, "bcast", 792, 816),
    *_aluminum("Alltoall", C, "alltoall", 842, 887),
    *_aluminum("Alltoallv", C, "alltoall", 943, 1009),
    *_aluminum("Gather", C, "gather", 1081, 1134),
    *_aluminum("Gatherv", C, "gather", 1192, 1251),
    *_aluminum("Scatter", C, "scatter", 1321, 1375),
    *_aluminum("Scatterv", C, "scatter", 1435, 1500),
    *_aluminum("Send", P, "send", 1565, 1584),
    *_aluminum("Recv", P, "recv", 1606, 1625),
    *_aluminum("SendRecv", P, "sendrecv", 1650, 1700),
    *_aluminum("MultiSendRecv", P, "sendrecv", 1759, 1812),
    R("Aluminum", rf"Al::(?:Put|Notify)(?:{T})?", P, "send", f"{AL}:1995, 1950 (MPI-CUDA RMA)",
      "Al::Put<Al::MPICUDABackend, float>"),
    R("Aluminum", rf"Al::(?:Wait|Test|Sync)(?:{T})?", W, None, f"{AL}:1883, 1867, 1970",
      "Al::Wait<Al::MPIBackend>"),
    R("Aluminum", rf"Al::(?:Initialize|Finalize|Initialized|RegisterMemory|UnregisterMemory|"
      rf"AttachRemoteBuffer|DetachRemoteBuffer)(?:{T})?", RT, None, f"{AL}:73, 98, 104, 1896-1939",
      "Al::Initialize"),
    # --- LBANN: methods of lbann::lbann_comm (they call Aluminum or Hydrogen, nested inside) ---
    # intertrainer_*: one rank per trainer, a communicator names cannot reveal -> not matched
    R("LBANN", _lbann("intertrainer_allreduce|intertrainer_sum_matrix"), A, "allreduce", f"{LB}:562, 257",
      "lbann::lbann_comm::intertrainer_allreduce<float>", blocking=False),
    R("LBANN", _lbann("intertrainer_broadcast|intertrainer_broadcast_matrix"), C, "bcast", f"{LB}:265-356, 260",
      "lbann::lbann_comm::intertrainer_broadcast<int>", blocking=False),
    R("LBANN", _lbann("intertrainer_gather"), C, "gather", f"{LB}:414-467",
      "lbann::lbann_comm::intertrainer_gather<float>", blocking=False),
    R("LBANN", _lbann("intertrainer_reduce"), C, "reduce", f"{LB}:484-554",
      "lbann::lbann_comm::intertrainer_reduce<float>", blocking=False),
    R("LBANN", _lbann("intertrainer_barrier"), C, "barrier", f"{LB}:647-653",
      "lbann::lbann_comm::intertrainer_barrier", blocking=False),
    R("LBANN", _lbann("allreduce|trainer_allreduce"), A, "allreduce", f"{LB}:574-600, 565",
      "lbann::lbann_comm::allreduce<float>"),
    R("LBANN", _lbann("nb_allreduce"), A, "allreduce", f"{LB}:608, 617, 627", "lbann::lbann_comm::nb_allreduce<float>",
      blocking=False),
    R("LBANN", _lbann("broadcast|world_broadcast|trainer_broadcast|broadcast_custom|broadcast_native"), C, "bcast",
      f"{LB}:265-356", "lbann::lbann_comm::trainer_broadcast<int>"),
    R("LBANN", _lbann("all_gather|trainer_all_gather|world_all_gather"), C, "allgather", f"{LB}:360-410",
      "lbann::lbann_comm::all_gather<int>"),
    R("LBANN", _lbann("gather|trainer_gather|trainer_gatherv"), C, "gather", f"{LB}:414-467",
      "lbann::lbann_comm::gather<float>"),
    R("LBANN", _lbann("scatter"), C, "scatter", f"{LB}:474, 477", "lbann::lbann_comm::scatter<float>"),
    R("LBANN", _lbann("reduce|trainer_reduce"), C, "reduce", f"{LB}:484-554", "lbann::lbann_comm::reduce<float>"),
    R("LBANN", _lbann("barrier|global_barrier|trainer_barrier"), C, "barrier", f"{LB}:647-653",
      "lbann::lbann_comm::trainer_barrier"),
    R("LBANN", _lbann("send"), P, "send", f"{LB}:657-712", "lbann::lbann_comm::send<float>"),
    R("LBANN", _lbann("nb_send|nb_tagged_send"), P, "send", f"{LB}:657-712", "lbann::lbann_comm::nb_send<float>",
      blocking=False),
    R("LBANN", _lbann("recv"), P, "recv", f"{LB}:721-787", "lbann::lbann_comm::recv<float>"),
    R("LBANN", _lbann("nb_recv|nb_tagged_recv"), P, "recv", f"{LB}:721-787", "lbann::lbann_comm::nb_recv<float>",
      blocking=False),
    R("LBANN", _lbann("sendrecv"), P, "sendrecv", f"{LB}:791-818", "lbann::lbann_comm::sendrecv<float>"),
    R("LBANN", _lbann("wait|wait_all|test"), W, None, f"{LB}:635-644", "lbann::lbann_comm::wait"),
    R("LBANN", _lbann("split_trainers|split_trainer_grid|setup_node_comm|get_packed_group_comm"), RT, None,
      "LLNL/lbann@04c297bd src/comm.cpp:99, 141, 809, 881", "lbann::lbann_comm::split_trainers"),
    # --- GPI-2 (GASPI, Tarantella's transport): a C API, names as they are -----------------------
    R("GPI-2", r"gaspi_allreduce(?:_user)?", A, "allreduce", f"{GA}:493, 501", "gaspi_allreduce"),
    R("GPI-2", r"gaspi_barrier", C, "barrier", f"{GA}:476", "gaspi_barrier"),
    # one-sided writes and reads are posted to a queue (completed by gaspi_wait): starts
    R("GPI-2", r"gaspi_(?:write|write_notify|write_list|write_list_notify|notify)", P, "send",
      f"{GA}:366, 665, 416, 696, 609", "gaspi_write_notify", blocking=False),
    R("GPI-2", r"gaspi_(?:read|read_notify|read_list|read_list_notify)", P, "recv",
      f"{GA}:390, 726, 444, 755", "gaspi_read", blocking=False),
    R("GPI-2", r"gaspi_passive_send", P, "send", f"{GA}:569", "gaspi_passive_send"),
    R("GPI-2", r"gaspi_passive_receive", P, "recv", f"{GA}:587", "gaspi_passive_receive"),
    R("GPI-2", r"gaspi_atomic_(?:fetch_add|compare_swap)", P, None, f"{GA}:526, 546", "gaspi_atomic_fetch_add"),
    R("GPI-2", r"gaspi_(?:notify_waitsome|wait)", W, None, f"{GA}:628, 462", "gaspi_notify_waitsome"),
    R("GPI-2", r"gaspi_(?:proc_init|proc_term|connect|disconnect|group_\w+|segment_\w+|queue_\w+|notify_reset|"
      r"allreduce_buf_size|allreduce_elem_max|notification_num|transfer_size_max|atomic_max|statistic_\w+|"
      r"proc_ping|initialized|proc_local_rank|proc_num|proc_rank)", RT, None,
      f"{GA}:64-300, 643, 792-1049, 824, 835, 907, 916; src/include/GASPI_Ext.h:46, 55, 132", "gaspi_proc_init"),
    # --- Tarantella and GaspiCxx (its collectives library) ------------------------------------
    R("Tarantella", r"tarantella::SynchCommunicator::start_allreduce_impl", A, "allreduce",
      f"{TA}/SynchCommunicator.hpp:35", "tarantella::SynchCommunicator::start_allreduce_impl", blocking=False),
    R("Tarantella", r"tarantella::SynchCommunicator::finish_allreduce_impl", W, "allreduce",
      f"{TA}/SynchCommunicator.hpp:36", "tarantella::SynchCommunicator::finish_allreduce_impl"),
    R("Tarantella", r"(?:\w+::)*StartAllreduceOp::compute_impl", A, "allreduce", f"{TA}/tf_ops/AllreduceOps.cpp:11, 69",
      "tarantella::StartAllreduceOp::compute_impl", blocking=False),
    R("Tarantella", r"(?:\w+::)*FinishAllreduceOp::compute_impl", W, "allreduce", f"{TA}/tf_ops/AllreduceOps.cpp:20",
      "tarantella::FinishAllreduceOp::compute_impl"),
    R("Tarantella", r"(?:\w+::)*BarrierOp::compute_impl", C, "barrier", f"{TA}/tf_ops/AllreduceOps.cpp:30",
      "tarantella::BarrierOp::compute_impl"),
    R("Tarantella", r"tarantella::PipelineCommunicator::(?:send|recv)", P, None, f"{TA}/PipelineCommunicator.hpp:30-31",
      "tarantella::PipelineCommunicator::send"),
    R("Tarantella", r"tarantella\.collectives\.TensorAllreducer\.TensorAllreducer:allreduce", A, "allreduce",
      f"{TAPY}/collectives/TensorAllreducer.py:109", "tarantella.collectives.TensorAllreducer.TensorAllreducer:allreduce"),
    R("Tarantella", r"tarantella\.collectives\.TensorAllreducer\.TensorAllreducer:start", A, "allreduce",
      f"{TAPY}/collectives/TensorAllreducer.py:54", "tarantella.collectives.TensorAllreducer.TensorAllreducer:start",
      blocking=False),
    R("Tarantella", r"tarantella\.collectives\.TensorAllreducer\.TensorAllreducer:wait_for_completion", W, "allreduce",
      f"{TAPY}/collectives/TensorAllreducer.py:79",
      "tarantella.collectives.TensorAllreducer.TensorAllreducer:wait_for_completion"),
    R("Tarantella", r"tarantella\.collectives\.TensorBroadcaster\.TensorBroadcaster:broadcast", C, "bcast",
      f"{TAPY}/collectives/TensorBroadcaster.py:99", "tarantella.collectives.TensorBroadcaster.TensorBroadcaster:broadcast"),
    R("Tarantella", r"tarantella\.collectives\.TensorAllgatherer\.TensorAllgatherer:allgather", C, "allgather",
      f"{TAPY}/collectives/TensorAllgatherer.py:69", "tarantella.collectives.TensorAllgatherer.TensorAllgatherer:allgather"),
    R("Tarantella", r"tarantella\.strategy\.PipelineCommunicator\.PipelineCommunicator:(?:send|recv)", P, None,
      f"{TAPY}/strategy/PipelineCommunicator.py:47, 53", "tarantella.strategy.PipelineCommunicator.PipelineCommunicator:recv"),
    R("GaspiCxx", rf"gaspi::collectives::Allreduce{T}::start", A, "allreduce",
      f"{GC}/collectives/non_blocking/Allreduce.hpp:40, 52",
      "gaspi::collectives::Allreduce<float, (gaspi::collectives::AllreduceInfo::Algorithm)0>::start", blocking=False),
    R("GaspiCxx", rf"gaspi::collectives::Allreduce{T}::waitForCompletion", W, "allreduce",
      f"{GC}/collectives/non_blocking/Allreduce.hpp:55",
      "gaspi::collectives::Allreduce<float, (gaspi::collectives::AllreduceInfo::Algorithm)0>::waitForCompletion"),
    R("GaspiCxx", rf"gaspi::collectives::Broadcast{T}::start", C, "bcast",
      f"{GC}/collectives/non_blocking/Broadcast.hpp; Collective.hpp:33-44",
      "gaspi::collectives::Broadcast<float, (gaspi::collectives::BroadcastInfo::Algorithm)0>::start", blocking=False),
    R("GaspiCxx", rf"gaspi::collectives::Allgatherv{T}::start", C, "allgather",
      f"{GC}/collectives/non_blocking/Allgatherv.hpp; Collective.hpp:33-44",
      "gaspi::collectives::Allgatherv<float, (gaspi::collectives::AllgathervInfo::Algorithm)0>::start", blocking=False),
    R("GaspiCxx", rf"gaspi::collectives::(?:Broadcast|Allgatherv){T}::waitForCompletion", W, None,
      f"{GC}/collectives/non_blocking/Collective.hpp:33-44",
      "gaspi::collectives::Broadcast<float, (gaspi::collectives::BroadcastInfo::Algorithm)0>::waitForCompletion"),
    R("GaspiCxx", r"gaspi::collectives::blocking::Barrier::execute", C, "barrier", f"{GC}/collectives/Barrier.hpp:34-46",
      "gaspi::collectives::blocking::Barrier::execute"),
    R("GaspiCxx", rf"gaspi::collectives::allgatherv?(?:{T})?", C, "allgather", f"{GC}/collectives/Allgather.hpp:35, 44",
      "gaspi::collectives::allgather<float>"),
    R("GaspiCxx", rf"gaspi::collectives::alltoall(?:{T})?", C, "alltoall", f"{GC}/collectives/Alltoall.hpp:35",
      "gaspi::collectives::alltoall<float>"),
    R("GaspiCxx", r"gaspi::singlesided::write::SourceBuffer::initTransfer(?:Part)?", P, "send",
      f"{GC}/singlesided/write/SourceBuffer.hpp:90-103", "gaspi::singlesided::write::SourceBuffer::initTransfer"),
    R("GaspiCxx", r"gaspi::singlesided::write::(?:TargetBuffer::waitForCompletion|SourceBuffer::waitForTransferAck)",
      W, None, f"{GC}/singlesided/write/TargetBuffer.hpp:83, SourceBuffer.hpp:113",
      "gaspi::singlesided::write::TargetBuffer::waitForCompletion"),
    R("GaspiCxx", r"gaspi::collectives::CollectiveLowLevel::triggerProgress", W, None,
      f"{GC}/collectives_lowlevel/CollectiveLowLevel.hpp:77", "gaspi::collectives::CollectiveLowLevel::triggerProgress"),
    # --- NCCL: NVTX ranges (domain NCCL) named after the API function; Score-P's CUDA adapter
    # records them as regions (msmania/Score-P@f3a9b984 src/adapters/cuda/scorep_cuda_nvtx.c)
    _nccl("AllReduce", A, "allreduce", 170),
    _nccl("Broadcast", C, "bcast", 184),
    _nccl("Bcast", C, "bcast", 202),
    _nccl("Reduce", C, "reduce", 226),
    _nccl("AllGather", C, "allgather", 134),
    _nccl("ReduceScatter", C, "reduce_scatter", 240),
    _nccl("AlltoAll", C, "alltoall", 156),
    _nccl("Gather", C, "gather", 213),
    _nccl("Scatter", C, "scatter", 262),
    _nccl("Send", P, "send", 275),
    _nccl("Recv", P, "recv", 297),
    R("NCCL", r"p?ncclPutSignal|p?ncclSignal", P, "send", f"{NC}:321, 349{NC_HOST}", "ncclPutSignal", blocking=False),
    R("NCCL", r"p?ncclWaitSignal", W, None, f"{NC}:376{NC_HOST}", "ncclWaitSignal"),
    R("NCCL", r"p?nccl(?:Group(?:Start|End|SimulateEnd)|Comm\w+|GetUniqueId|GetVersion|GetErrorString|"
      r"GetLastError|MemAlloc|MemFree|RedOpCreatePreMulSum|RedOpDestroy)", RT, None,
      "NVIDIA/nccl@5067397c src/group.cc:99-119, src/init.cc:2564-3513, src/allocator.cc:18, 111",
      "ncclCommInitRank"),
    # --- RCCL (ROCm's NCCL): rocTX ranges RCCL_<Op>, API bodies nccl<Op>_impl ------------------
    _rccl("AllGather", C, "allgather", 26),
    _rccl("AllReduce", A, "allreduce", 58),
    _rccl("AllToAll", C, "alltoall", 84),
    _rccl("AllToAllv", C, "alltoall", 133),
    _rccl("Broadcast", C, "bcast", 178),
    _rccl("Gather", C, "gather", 215),
    _rccl("Reduce", C, "reduce", 256),
    _rccl("ReduceScatter", C, "reduce_scatter", 287),
    _rccl("Scatter", C, "scatter", 317),
    _rccl("Send", P, "send", 357),
    _rccl("Recv", P, "recv", 382),
    R("RCCL", r"p?ncclAllToAllv?", C, "alltoall", f"{RC}:84, 133 (RCCL's own spelling)", "ncclAllToAllv",
      blocking=False),
    # --- oneCCL: C++ API in namespace ccl::v1; every operation returns an event -----------------
    _ccl("allreduce", A, "allreduce", "890", "ccl::v1::allreduce"),
    _ccl("allgatherv?", C, "allgather", "444, 653", "ccl::v1::allgatherv"),
    _ccl("alltoallv?", C, "alltoall", "1001, 1206", "ccl::v1::alltoall"),
    _ccl("barrier", C, "barrier", "1408", "ccl::v1::barrier"),
    _ccl("broadcast", C, "bcast", "1441", "ccl::v1::broadcast<float>"),
    _ccl("reduce", C, "reduce", "1866", "ccl::v1::reduce"),
    _ccl("reduce_scatter", C, "reduce_scatter", "1981", "ccl::v1::reduce_scatter"),
    _ccl("send", P, "send", "1761", "ccl::v1::send"),
    _ccl("recv", P, "recv", "1659", "ccl::v1::recv"),
    R("oneCCL", r"ccl::(?:v1::)?event::(?:wait|test)", W, None, "oneapi-src/oneCCL@5f701048 "
      "include/oneapi/ccl/event.hpp:72, 79", "ccl::v1::event::wait"),
    R("oneCCL", rf"ccl::(?:v1::)?(?:init|create_\w+|register_datatype|deregister_datatype|group_start|group_end)"
      rf"(?:{T})?", RT, None, f"{CCL}:48-417", "ccl::v1::create_communicator"),
    # --- Gloo (also inside PyTorch): free functions taking an options object ------------------
    R("Gloo", r"gloo::allreduce", A, "allreduce", f"{GL}/allreduce.h:193", "gloo::allreduce"),
    R("Gloo", r"gloo::\(anonymous namespace\)::(?:ring|bcube)", A, "allreduce", f"{GL}/allreduce.cc:29, 35",
      "gloo::(anonymous namespace)::ring"),
    R("Gloo", r"gloo::broadcast", C, "bcast", f"{GL}/broadcast.h:89", "gloo::broadcast"),
    R("Gloo", r"gloo::barrier", C, "barrier", f"{GL}/barrier.h:51", "gloo::barrier"),
    R("Gloo", r"gloo::allgatherv?", C, "allgather", f"{GL}/allgather.h:71, allgatherv.h:92", "gloo::allgather"),
    R("Gloo", r"gloo::reduce", C, "reduce", f"{GL}/reduce.h:112", "gloo::reduce"),
    R("Gloo", r"gloo::gatherv?", C, "gather", f"{GL}/gather.h:78, gatherv.h:99", "gloo::gather"),
    R("Gloo", r"gloo::scatter", C, "scatter", f"{GL}/scatter.h:96", "gloo::scatter"),
    R("Gloo", r"gloo::alltoallv?", C, "alltoall", f"{GL}/alltoall.h:73, alltoallv.h:104", "gloo::alltoallv"),
    R("Gloo", rf"gloo::(?:AllreduceRing|AllreduceRingChunked|AllreduceHalvingDoubling|AllreduceBcube|"
      rf"CudaAllreduce\w*){T}::run", A, "allreduce",
      f"{GL}/allreduce_ring.h:69, allreduce_ring_chunked.h:83, allreduce_halving_doubling.h:225, allreduce_bcube.h:348",
      "gloo::AllreduceRing<float>::run"),
    R("Gloo", rf"gloo::ReduceScatterHalvingDoubling{T}::run", C, "reduce_scatter", f"{GL}/reduce_scatter.h:329",
      "gloo::ReduceScatterHalvingDoubling<float>::run"),
    R("Gloo", rf"gloo::BroadcastOneToAll{T}::run", C, "bcast", f"{GL}/broadcast_one_to_all.h:41",
      "gloo::BroadcastOneToAll<float>::run"),
    R("Gloo", rf"gloo::AllgatherRing{T}::run", C, "allgather", f"{GL}/allgather_ring.h:57", "gloo::AllgatherRing<float>::run"),
    R("Gloo", r"gloo::BarrierAllTo(?:All|One)::run", C, "barrier", f"{GL}/barrier_all_to_all.h:20, barrier_all_to_one.h:22",
      "gloo::BarrierAllToAll::run"),
    R("Gloo", r"gloo::PairwiseExchange::run", C, "alltoall", f"{GL}/pairwise_exchange.h:54", "gloo::PairwiseExchange::run"),
    R("Gloo", r"gloo::transport::(?:\w+::)?UnboundBuffer::abortWait(?:Recv|Send)", RT, None,
      f"{GL}/transport/unbound_buffer.h", "gloo::transport::tcp::UnboundBuffer::abortWaitRecv"),
    R("Gloo", r"gloo::transport::(?:\w+::)?(?:Unbound)?Buffer::wait(?:Recv|Send)", W, None,
      f"{GL}/transport/unbound_buffer.h:42, 46; transport/buffer.h:33, 34",
      "gloo::transport::tcp::UnboundBuffer::waitRecv"),
    R("Gloo", r"gloo::transport::(?:\w+::)?(?:Unbound)?Buffer::send", P, "send",
      f"{GL}/transport/unbound_buffer.h:104; transport/buffer.h:26", "gloo::transport::tcp::UnboundBuffer::send"),
    R("Gloo", r"gloo::transport::(?:\w+::)?UnboundBuffer::recv", P, "recv", f"{GL}/transport/unbound_buffer.h:110, 116",
      "gloo::transport::tcp::UnboundBuffer::recv"),
    R("Gloo", r"gloo::(?:rendezvous::.*|transport::tcp::Device::.*|transport::tcp::Pair::connect\w*|"
      r"Context::connectFullMesh|\w+Options::set\w+(?:<.*>)?)", RT, None,
      f"{GL}/rendezvous/, transport/tcp/, allreduce.h:89-190", "gloo::rendezvous::Context::connectFullMesh"),
    # --- PyTorch c10d as Score-P's Python bindings name it (module:function) --------------------
    _c10d("all_reduce|all_reduce_coalesced", A, "allreduce", "3156, 3263", "all_reduce"),
    _c10d("broadcast|broadcast_object_list", C, "bcast", "3086, 3925", "broadcast"),
    _c10d("reduce", C, "reduce", "3337", "reduce"),
    _c10d("all_gather|all_gather_single|all_gather_into_tensor|_all_gather_base|all_gather_coalesced|"
          "all_gather_object", C, "allgather", "4192-4453, 3439", "all_gather_into_tensor"),
    _c10d("reduce_scatter|reduce_scatter_single|reduce_scatter_tensor|_reduce_scatter_base", C, "reduce_scatter",
          "4790-4970", "reduce_scatter_tensor"),
    _c10d("all_to_all|all_to_all_single", C, "alltoall", "5145, 4996", "all_to_all_single"),
    _c10d("gather|gather_object", C, "gather", "4568, 3534", "gather"),
    _c10d("scatter|scatter_object_list", C, "scatter", "4672, 4057", "scatter"),
    _c10d("barrier|monitored_barrier", C, "barrier", "5284, 5360", "barrier"),
    _c10d("send|send_object_list", P, "send", "2713, 3665", "send"),
    _c10d("recv|recv_object_list", P, "recv", "2757, 3783", "recv"),
    _c10d("isend", P, "send", "2598", "isend", blocking=False),
    _c10d("irecv", P, "recv", "2655", "irecv", blocking=False),
    _c10d("batch_isend_irecv", P, "sendrecv", "2990", "batch_isend_irecv", blocking=False),
    R("PyTorch c10d", r"torch\.distributed\.distributed_c10d\._CoalescingManager:wait", W, None, f"{TORCH}:2831",
      "torch.distributed.distributed_c10d._CoalescingManager:wait"),
    _c10d("init_process_group|destroy_process_group|new_group|split_group|new_subgroups|get_rank|get_world_size|"
          "get_backend|is_initialized|_get_default_group|_coalescing_manager", RT, None,
          "1666, 2361, 5745, 5517, 6103, 2552, 2579, 1471, 1394, 1420, 2837", "init_process_group"),
    R("PyTorch c10d", r"torch\.nn\.parallel\.distributed\.\w+:(?:_sync_buffers|_sync_module_buffers|"
      r"_default_broadcast_coalesced|_distributed_broadcast_coalesced)", C, "bcast",
      "torch 2.13.0 wheel, torch/nn/parallel/distributed.py:2405, 2427, 2437, 2360",
      "torch.nn.parallel.distributed.DistributedDataParallel:_sync_buffers"),
    R("PyTorch c10d", r"torch\.distributed\.algorithms\.ddp_comm_hooks\.default_hooks:(?:allreduce_hook|_allreduce_fut)",
      A, "allreduce", "torch 2.13.0 wheel, torch/distributed/algorithms/ddp_comm_hooks/default_hooks.py:18-35",
      "torch.distributed.algorithms.ddp_comm_hooks.default_hooks:allreduce_hook", blocking=False),
    # --- PyTorch c10d in C++ (a compiler-instrumented libtorch, or sampling profiles) ----------
    _pg("allreduce|allreduce_coalesced|allreduce_sparse", A, "allreduce", "allreduce"),
    _pg("broadcast", C, "bcast", "broadcast"),
    _pg("reduce", C, "reduce", "reduce"),
    _pg("allgather|_allgather_base|allgather_coalesced|allgather_into_tensor_coalesced", C, "allgather",
        "_allgather_base"),
    _pg("reduce_scatter|_reduce_scatter_base|reduce_scatter_tensor_coalesced", C, "reduce_scatter", "reduce_scatter"),
    _pg("alltoall|alltoall_base", C, "alltoall", "alltoall_base"),
    _pg("gather", C, "gather", "gather"),
    _pg("scatter", C, "scatter", "scatter"),
    _pg("barrier", C, "barrier", "barrier"),
    _pg("send", P, "send", "send"),
    _pg("recv|recvAnysource", P, "recv", "recv"),
    R("PyTorch c10d", r"c10d::(?:Work|ProcessGroupNCCL::WorkNCCL|ProcessGroupGloo::(?:AsyncWork|SendWork|RecvWork)|"
      r"ProcessGroupMPI::AsyncWork)::(?:wait|synchronize)", W, None,
      f"{TORCH_SO}; {TORCH_HPP}/ProcessGroupNCCL.hpp:355, 365, ProcessGroupGloo.hpp:66-237, ProcessGroupMPI.hpp:127",
      "c10d::Work::wait"),
    R("PyTorch c10d", r"c10d::Reducer::run_comm_hook", A, "allreduce", TORCH_SO, "c10d::Reducer::run_comm_hook",
      blocking=False),
    R("PyTorch c10d", r"c10d::Reducer::finalize_backward", W, "allreduce", TORCH_SO, "c10d::Reducer::finalize_backward"),
    # --- PyTorch c10d as torch.profiler (Kineto) records it ----------------------------------
    _dispatch("allreduce_|allreduce_coalesced_", A, "allreduce", "246, 276", "allreduce_"),
    _dispatch("broadcast_", C, "bcast", "213", "broadcast_"),
    _dispatch("reduce_", C, "reduce", "303", "reduce_"),
    _dispatch("allgather_|_allgather_base_|allgather_coalesced_|allgather_into_tensor_coalesced_", C, "allgather",
              "334, 371, 412, 444", "_allgather_base_"),
    _dispatch("reduce_scatter_|_reduce_scatter_base_|reduce_scatter_tensor_coalesced_", C, "reduce_scatter",
              "544, 576, 618", "reduce_scatter_"),
    _dispatch("alltoall_base_|alltoall_", C, "alltoall", "662, 706", "alltoall_base_"),
    _dispatch("gather_", C, "gather", "481", "gather_"),
    _dispatch("scatter_", C, "scatter", "513", "scatter_"),
    _dispatch("barrier|monitored_barrier_", C, "barrier", "883, 733", "barrier"),
    _dispatch("send", P, "send", "792", "send"),
    _dispatch("recv_|recv_any_source_", P, "recv", "816, 839", "recv_"),
    _gloo("all_reduce|sparse_all_reduce", A, "allreduce", "all_reduce"),
    _gloo("broadcast", C, "bcast", "broadcast"),
    _gloo("reduce", C, "reduce", "reduce"),
    _gloo("all_gather", C, "allgather", "all_gather"),
    _gloo("all_to_all", C, "alltoall", "all_to_all"),
    _gloo("gather", C, "gather", "gather"),
    _gloo("scatter", C, "scatter", "scatter"),
    _gloo("barrier", C, "barrier", "barrier"),
    _gloo("send", P, "send", "send"),
    _gloo("recv", P, "recv", "recv"),
    # --- Horovod as Score-P's Python bindings name it ----------------------------------------
    _hvd("allreduce|allreduce_|grouped_allreduce|grouped_allreduce_", A, "allreduce", "215, 296, 444, 529", "allreduce"),
    _hvd("allreduce_async|allreduce_async_|grouped_allreduce_async|grouped_allreduce_async_|sparse_allreduce_async|"
         "_allreduce_async", A, "allreduce", "157, 260, 382, 491, 567, 110", "allreduce_async_", blocking=False),
    _hvd("allgather|grouped_allgather", C, "allgather", "652, 746", "allgather"),
    _hvd("allgather_async|grouped_allgather_async", C, "allgather", "607, 696", "allgather_async", blocking=False),
    _hvd("broadcast|broadcast_", C, "bcast", "831, 883", "broadcast_"),
    _hvd("broadcast_async|broadcast_async_", C, "bcast", "788, 859", "broadcast_async_", blocking=False),
    _hvd("alltoall", C, "alltoall", "983", "alltoall"),
    _hvd("alltoall_async", C, "alltoall", "927", "alltoall_async", blocking=False),
    _hvd("reducescatter|grouped_reducescatter", C, "reduce_scatter", "1094, 1209", "reducescatter"),
    _hvd("reducescatter_async|grouped_reducescatter_async", C, "reduce_scatter", "1035, 1148", "reducescatter_async",
         blocking=False),
    _hvd("barrier", C, "barrier", "1315", "barrier"),
    _hvd("join", C, "barrier", "1293 (returns once every rank has joined)", "join"),
    _hvd("synchronize|poll", W, None, "1269, 1253", "synchronize"),
    _hvd("init|shutdown", RT, None, "69, 65", "init"),
    R("Horovod", r"horovod\.torch\.functions:(?:broadcast_parameters|broadcast_optimizer_state|broadcast_object)",
      C, "bcast", f"{HVD}/functions.py:30, 62, 201", "horovod.torch.functions:broadcast_parameters"),
    R("Horovod", r"horovod\.torch\.functions:allgather_object", C, "allgather", f"{HVD}/functions.py:246",
      "horovod.torch.functions:allgather_object"),
    # DistributedOptimizer() makes a subclass named after the wrapped optimizer (optimizer.py:599)
    R("Horovod", r"horovod\.torch\.optimizer\.\w+:_allreduce_grad_async", A, "allreduce", f"{HVD}/optimizer.py:255",
      "horovod.torch.optimizer.SGD:_allreduce_grad_async", blocking=False),
    R("Horovod", r"horovod\.torch\.optimizer\.\w+:synchronize", W, None, f"{HVD}/optimizer.py:176",
      "horovod.torch.optimizer.SGD:synchronize"),
)
