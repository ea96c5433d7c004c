"""The name-pattern table: every default classifies its own example and no near miss, match
names come from demangled canonical names, and a user's pattern file is read or refused
with one sentence."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from analyze.errors import AnalyzeError
from analyze.schema import Category, Rule
from analyze.tables import pattern_set
from analyze.tables.names import demangle, match_name
from analyze.tables.pattern_set import DEFAULT_SET
from analyze.tables.patterns import DEFAULTS, OPS, Kind, Pattern
from analyze.tables.regions import KIND_CATEGORY, explain


@pytest.mark.parametrize("p", DEFAULTS, ids=lambda p: f"{p.library}:{p.example}")
def test_every_default_classifies_its_example(p: Pattern) -> None:
    # the first matching row is this one: no earlier row shadows it
    assert DEFAULT_SET.match(match_name(p.example)) is p
    c = explain(p.example, "user", "function")  # as Score-P writes a compiler-instrumented function
    assert (c.category, c.rule, c.op) == (KIND_CATEGORY[p.kind], Rule.PATTERN, p.op)


@pytest.mark.parametrize("p", DEFAULTS, ids=lambda p: f"{p.library}:{p.example}")
def test_every_default_cites_a_source_and_names_a_known_op(p: Pattern) -> None:
    # a repository at a commit, or the pinned wheel the name was read from
    assert re.search(r"\w/[\w.-]+@[0-9a-f]{8}|\d\.\d+\.\d+ wheel", p.source), p.source
    assert p.op is None or p.op in OPS
    assert p.kind != Kind.ALLREDUCE or p.op == "allreduce"
    assert p.kind != Kind.COLLECTIVE or p.op is not None  # collectives rows always have an op


# Names a careless pattern would misread, each with what it must be (None: no pattern matches,
# so the region is compute). Sources: docs/research/comm-names.md, "Near misses".
NEAR_MISSES = [
    ("void Al::internal::trace::record_op<Al::NCCLBackend, float>(char const*)", None),  # Al.hpp:127
    ("MPIAllreduce", None),  # Aluminum's progress-engine NVTX range, not MPI_Allreduce
    ("Al::NCCLBackend::Name", None),
    ("lbann::lbann_comm::get_count", None),
    ("lbann::lbann_comm::lbann_comm_abort", None),
    ("void lbann::(anonymous namespace)::allreduce_impl<float, (El::Device)0>(float*)", None),
    ("gaspi_allreduce_buf_size", Kind.RUNTIME),
    ("gaspi_allreduce_elem_max", Kind.RUNTIME),
    ("gaspi_notify_reset", Kind.RUNTIME),
    ("pgaspi_allreduce", None),  # the profiling interface: a wrapper's inner call
    ("tarantella.collectives.TensorAllreducer.TensorAllreducer:_", None),
    ("tarantella.strategy.SynchCommunicator.SynchCommunicator:reduce_gradients", None),  # graph building
    ("tarantella.strategy.SynchCommunicator.SynchCommunicator:setup_infrastructure", None),
    ("ncclRedOpCreatePreMulSum", Kind.RUNTIME),
    ("ncclGroupEnd", Kind.RUNTIME),
    ("ncclGetUniqueId", Kind.RUNTIME),
    ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", None),  # a GPU kernel, not a host call
    ("ncclDevKernelDebug_Generic", None),
    ("mscclFuncAllReduce", None),
    ("ccl::v1::allreduce_attr::allreduce_attr()", None),
    ("ccl::v1::create_operation_attr<ccl::v1::allreduce_attr>()", Kind.RUNTIME),
    ("gloo::AllreduceOptions::setInputs<float>(std::vector<float*, std::allocator<float*> >, unsigned long)",
     Kind.RUNTIME),
    ("gloo::AllreduceLocal<float>::run()", None),
    ("gloo::transport::tcp::UnboundBuffer::abortWaitRecv()", Kind.RUNTIME),
    ("gloo::transport::tcp::UnboundBuffer::handleRecvCompletion(int)", None),
    ("torch.distributed.distributed_c10d:_check_single_tensor", None),
    ("torch.distributed.distributed_c10d:_object_to_tensor", None),
    ("torch.distributed.c10d_logger:wrapper", None),
    ("typing_extensions:wrapper", None),
    ("torch.distributed.distributed_c10d:get_backend", Kind.RUNTIME),
    ("torch.nn.parallel.distributed.DistributedDataParallel:forward", None),
    ("c10d::ProcessGroupNCCL::allreduce_impl(at::Tensor&, c10d::AllreduceOptions const&)", None),
    ("c10d::ProcessGroupNCCL::collective", None),
    ("c10d::Reducer::register_comm_hook(std::unique_ptr<c10d::CommHookInterface>)", None),
    ("c10d::Reducer::autograd_hook(unsigned long)", None),  # bucket bookkeeping inside backward
    ("horovod.torch.mpi_ops:_allreduce_function_factory", None),
    ("horovod.torch.optimizer.SGD:step", None),
    ("MPI_ALLREDUCE", None),  # a Horovod timeline activity, not the MPI function
    ("horovod::common::OperationManager::ExecuteOperation", None),
    ("cudaStreamSynchronize", None),
]


@pytest.mark.parametrize(("name", "kind"), NEAR_MISSES, ids=[n for n, _ in NEAR_MISSES])
def test_near_misses(name: str, kind: Kind | None) -> None:
    p = DEFAULT_SET.match(match_name(name))
    assert (p.kind if p else None) == kind, p


# Names whose operation a loose pattern would get wrong (a prefix or substring of another).
@pytest.mark.parametrize(("name", "op"), [
    ("ncclReduce", "reduce"), ("ncclReduceScatter", "reduce_scatter"), ("RCCL_Reduce", "reduce"),
    ("torch.distributed.distributed_c10d:reduce", "reduce"),
    ("torch.distributed.distributed_c10d:reduce_scatter", "reduce_scatter"),
    ("torch.distributed.distributed_c10d:all_reduce_coalesced", "allreduce"),
    ("void Al::Reduce<Al::MPIBackend, float>(float const*, float*, unsigned long, Al::ReductionOperator, int, "
     "Al::MPIBackend::comm_type&)", "reduce"),
    ("void Al::Reduce_scatter<Al::MPIBackend, float>(float const*, float*, unsigned long)", "reduce_scatter"),
    ("lbann::lbann_comm::reduce<float>", "reduce"), ("gloo::reduce(gloo::ReduceOptions&)", "reduce"),
    ("ccl::v1::reduce_scatter", "reduce_scatter"),
])
def test_prefixes_keep_their_operation(name: str, op: str) -> None:
    p = DEFAULT_SET.match(match_name(name))
    assert p is not None and p.op == op


def test_gpu_stream_backends_only_start_the_operation() -> None:
    nccl = DEFAULT_SET.match("Al::Allreduce<Al::NCCLBackend, float>")
    mpi = DEFAULT_SET.match("Al::Allreduce<Al::MPIBackend, float>")
    assert nccl is not None and mpi is not None and not nccl.blocking and mpi.blocking
    assert not DEFAULT_SET.match("ncclAllReduce").blocking  # type: ignore[union-attr]


# Mangled names from a g++ 12.2 mock of the libraries' declarations (g++ -c; nm), the form
# Score-P's compiler instrumentation stores as the canonical name.
MANGLED = [
    ("_ZN2Al9AllreduceINS_11NCCLBackendEfEEvPKT0_PS2_mNS_17ReductionOperatorERNT_9comm_typeENS7_19allreduce_algo_typeE",
     "Al::Allreduce<Al::NCCLBackend, float>"),
    ("_ZN2Al4WaitINS_10MPIBackendEEEvRNT_8req_typeE", "Al::Wait<Al::MPIBackend>"),
    ("_ZN5lbann10lbann_comm9allreduceIfEEvPT_i", "lbann::lbann_comm::allreduce<float>"),
    ("_ZN5lbann12_GLOBAL__N_114allreduce_implIfLN2El6DeviceE0EEEvPT_",
     "lbann::(anonymous namespace)::allreduce_impl<float, (El::Device)0>"),
    ("_ZN5gaspi11collectives9AllreduceIfLNS0_13AllreduceInfo9AlgorithmE0EE5startEPKv",
     "gaspi::collectives::Allreduce<float, (gaspi::collectives::AllreduceInfo::Algorithm)0>::start"),
    ("_ZN3ccl2v15event4waitEv", "ccl::v1::event::wait"),
]


@pytest.mark.parametrize(("mangled", "expected"), MANGLED, ids=[e for _, e in MANGLED])
def test_match_name_demangles_the_canonical_name(mangled: str, expected: str) -> None:
    # GCC's plugin writes its printable name as the name and the mangled one as canonical
    assert match_name("Al::Allreduce", mangled) == expected


@pytest.mark.parametrize(("name", "expected"), [
    ("void Al::Allreduce(const T*, T*, size_t, ReductionOperator, typename Backend::comm_type&, typename "
     "Backend::allreduce_algo_type) [with Backend = NCCLBackend; T = float]", "Al::Allreduce"),
    ("gloo::allreduce(gloo::AllreduceOptions const&) [clone .cold]", "gloo::allreduce"),
    ("c10d::Work::wait(std::chrono::duration<long, std::ratio<1l, 1000l> >)", "c10d::Work::wait"),
    ("ccl::v1::event ccl::v1::allreduce<float, void>(float const*, float*, unsigned long)",
     "ccl::v1::allreduce<float, void>"),
    ("torch.distributed.distributed_c10d:all_reduce", "torch.distributed.distributed_c10d:all_reduce"),
    ("HTSend d2h", "HTSend d2h"),  # an NVTX range name with a space: not a signature
    ("gaspi_allreduce", "gaspi_allreduce"),
])
def test_match_name_of_written_names(name: str, expected: str) -> None:
    assert match_name(name) == expected


def test_demangle_refuses_what_is_not_a_symbol() -> None:
    assert demangle("ncclAllReduce") is None and demangle("_Znot a symbol") is None


def test_otf2_definitions_win_over_names() -> None:
    # a collective role or the MPI paradigm decides before any pattern is tried
    assert explain("ncclAllReduce", "user", "coll_all2all").rule == Rule.ROLE
    assert explain("gaspi_barrier", "mpi", "function").category == Category.RUNTIME
    assert explain("ncclAllReduce", "openmp", "function").rule == Rule.PARADIGM
    assert explain("dltrace.step", "user", "function").category == Category.STEP
    assert explain("user:dltrace.backward", "user", "function").category == Category.BACKWARD
    assert explain("ncclAllReduce", "cuda", "function").rule == Rule.PATTERN  # Score-P's NVTX regions


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "mine.toml"
    path.write_text(text)
    return path


def test_pattern_file_comes_before_the_defaults(tmp_path: Path) -> None:
    path = write(tmp_path, """
        [[pattern]]
        library = "mylib"
        glob = "mylib::sum_gradients*"
        category = "allreduce"
        source = "mylib/comm.h:12"

        [[pattern]]
        regex = 'ncclAllReduce'
        category = "compute"
    """)
    names = pattern_set.load(path)
    mine = names.match("mylib::sum_gradients<float>")
    assert mine is not None and (mine.library, mine.kind, mine.op, mine.blocking) == ("mylib", Kind.ALLREDUCE,
                                                                                     "allreduce", True)
    off = names.match("ncclAllReduce")
    assert off is not None and off.kind == Kind.COMPUTE and off.library == "mine"
    assert explain("ncclAllReduce", "cuda", "function", patterns=names).category == Category.FUNCTION
    assert names.match("ncclBroadcast") is DEFAULT_SET.match("ncclBroadcast")  # the defaults follow
    assert names.digest() != DEFAULT_SET.digest()


@pytest.mark.parametrize(("text", "says"), [
    ("[[pattern]]\nglob = 'x'\ncategory = 'allreduc'\n", "pattern 1: category 'allreduc' is not one of"),
    ("[[pattern]]\ncategory = 'wait'\n", "pattern 1: give exactly one of glob"),
    ("[[pattern]]\nglob = 'x'\nregex = 'y'\ncategory = 'wait'\n", "give exactly one of glob"),
    ("[[pattern]]\nregex = 'a('\ncategory = 'wait'\n", "does not compile"),
    ("[[pattern]]\nglob = 'x'\ncategory = 'wait'\nop = 'sum'\n", "op 'sum' is not one of"),
    ("[[pattern]]\nglob = 'x'\ncategory = 'wait'\nblocking = 'no'\n", "blocking must be true or false"),
    ("[[pattern]]\nglob = 'x'\ncategory = 'wait'\ncolour = 1\n", "unknown key colour"),
    ("[[pattern]]\nglob = 'x'\ncategory = 'collective'\n", "a collective needs op"),
    ("[patterns]\nglob = 'x'\n", "must hold [[pattern]] tables only"),
    ("[[pattern]\n", "is not a valid TOML file"),
])
def test_bad_pattern_files_say_what_is_wrong(tmp_path: Path, text: str, says: str) -> None:
    with pytest.raises(AnalyzeError) as e:
        pattern_set.load(write(tmp_path, text))
    assert says in str(e.value) and "\n" not in str(e.value)


def test_missing_pattern_file(tmp_path: Path) -> None:
    with pytest.raises(AnalyzeError, match="cannot read the patterns file"):
        pattern_set.load(tmp_path / "nope.toml")


def test_generated_pattern_docs_are_current() -> None:
    doc = Path(__file__).resolve().parents[2] / "docs" / "patterns.md"
    assert doc.read_text(encoding="utf-8") == pattern_set.markdown(), "run `make docs`"
