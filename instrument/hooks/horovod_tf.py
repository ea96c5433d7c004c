"""Horovod (TensorFlow) hooks: every collective op Horovod creates, timed when it runs.

Installed when the training script imports ``horovod.tensorflow`` (the TensorFlow hooks are
in place then: Horovod imports tensorflow first; they record the steps). Every public
operation -- ``hvd.allreduce``, ``grouped_allreduce``, ``allgather``, ``broadcast``,
``alltoall``, ``reducescatter``, and what ``DistributedGradientTape``, the Keras
``DistributedOptimizer``, ``broadcast_variables`` and the ``horovod.tensorflow.keras``
callbacks call -- ends in one op constructor of Horovod's op library
(``horovod.tensorflow.mpi_ops.MPI_LIB.horovod_<op>``), looked up on that object at each call.
Those constructors are wrapped, so scripts need no change whichever way they import Horovod.

Each op is timed by :class:`instrument.hooks.tf_markers.CollectiveTimer`: inside a
``tf.function`` by two ``tf.timestamp`` ops around the op (inputs ready -> output available),
read after each call of the function; eagerly around the call. It is recorded as an
asynchronous collective with the operation, the bytes sent (the inputs) and received (the
outputs; for allreduce and broadcast as many as were sent), and the broadcast root. The region
name carries Horovod's tensor name, as the PyTorch hooks do
(``horovod.allreduce:HorovodAllreduce_grads_0``); past
:data:`~instrument.hooks.horovod_names.MAX_NAMED_REGIONS` names, or for unnamed eager ops, the
plain operation name.

Matching across ranks: inside a graph, TensorFlow's executor runs independent ops in whatever
order their inputs become ready, so the n-th Horovod op of two ranks need not be the same
tensor (Horovod itself pairs them by name). Graph-mode ops therefore get one communicator per
tensor name (``horovod:<name>`` over the process set's ranks), whose n-th collectives are the
n-th executions of that op on each rank. Eager ops run in program order and share the
process set's communicator (``horovod``, ``horovod:ps<id>``), as in the PyTorch hooks.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

from instrument.hooks import horovod_timeline
from instrument.hooks.horovod_names import TensorRegions
from instrument.hooks.tf_markers import collective_timer
from instrument.tracer.recorder import Recorder
from traceio import records
from traceio.records import Op

# MPI_LIB op constructor -> (region base name, op, what was received: "sent" (as many bytes as
# were sent), "outputs" (all outputs) or "first" (the first output; alltoall's second output
# is the received splits, not data))
_OPS: dict[str, tuple[str, Op, str]] = {
    "horovod_allreduce": ("allreduce", Op.ALLREDUCE, "sent"),
    "horovod_grouped_allreduce": ("grouped_allreduce", Op.ALLREDUCE, "sent"),
    "horovod_allgather": ("allgather", Op.ALLGATHER, "outputs"),
    "horovod_grouped_allgather": ("grouped_allgather", Op.ALLGATHER, "outputs"),
    "horovod_broadcast": ("broadcast", Op.BCAST, "sent"),
    "horovod_alltoall": ("alltoall", Op.ALLTOALL, "first"),
    "horovod_reducescatter": ("reducescatter", Op.REDUCE_SCATTER, "outputs"),
    "horovod_grouped_reducescatter": ("grouped_reducescatter", Op.REDUCE_SCATTER, "outputs"),
}
_RECEIVED: dict[str, Callable[[Any], list[Any]] | None] = {
    "sent": None,
    "outputs": lambda out: list(out) if isinstance(out, list | tuple) else [out],
    "first": lambda out: [out[0]],
}


class HorovodTFHooks:
    """The installed state of the Horovod TensorFlow hooks for one recorder."""

    def __init__(self, rec: Recorder, tf: Any, mpi_ops: Any):
        self.rec = rec
        self.tf = tf
        self.mpi_ops = mpi_ops
        self.timer = collective_timer(rec, tf)  # the TensorFlow hooks drain it
        self._members: dict[int, tuple[int, ...]] = {}
        self._region = TensorRegions(rec)
        self.wrapped: list[str] = []

    def install(self) -> None:
        lib = self.mpi_ops.MPI_LIB
        for fname, spec in _OPS.items():
            fn = getattr(lib, fname, None)
            if fn is not None and not hasattr(fn, "__dltrace_wrapped__"):
                setattr(lib, fname, self._wrap(fn, *spec))
                self.wrapped.append(fname)

    # -- definitions ----------------------------------------------------------------------
    def _process_set(self, psid: int) -> tuple[int, ...]:
        members = self._members.get(psid)
        if members is None:
            basics = self.mpi_ops._basics
            if psid == 0:
                members = tuple(range(basics.size()))
            else:
                members = tuple(basics._get_process_set_ids_and_ranks().get(psid, ()))
            self._members[psid] = members
        return members

    def _comm(self, psid: int, tensor_name: str | None) -> tuple[int, tuple[int, ...]]:
        members = self._process_set(psid)
        name = "horovod" if psid == 0 else f"horovod:ps{psid}"
        if tensor_name is not None:
            name = f"{name}:{tensor_name}"
        return self.rec.comm_id(name, members), members

    # -- the wrapper ----------------------------------------------------------------------
    def _wrap(self, fn: Callable[..., Any], base: str, op: Op, received: str) -> Callable[..., Any]:
        rec, tf, timer = self.rec, self.tf, self.timer
        outputs = _RECEIVED[received]

        @functools.wraps(fn)
        def traced(tensors: Any, *args: Any, **kwargs: Any) -> Any:
            grouped = isinstance(tensors, list | tuple)
            inputs = list(tensors) if grouped else [tensors]
            graph_mode = not tf.executing_eagerly()
            name = kwargs.get("name") or None
            psid = int(kwargs.get("process_set_id") or 0)
            comm, members = self._comm(psid, name if graph_mode else None)
            root = records.NO_ROOT
            if op == Op.BCAST:
                src = kwargs.get("root_rank")
                root = members.index(src) if src in members else records.NO_ROOT
            rid = self._region(base, op, name)
            # Horovod's tensor name (its timeline's), known once the op exists.
            op_name: list[str] = []

            def record(begin: int, end: int, sent: int, recv: int) -> None:
                rec.async_collective(rid, begin, end, comm, op, root, sent, recv)
                if op_name:
                    horovod_timeline.OBSERVED.add(op_name[0], begin, end)

            def launch(ts: list[Any]) -> Any:
                out = fn(ts if grouped else ts[0], *args, **kwargs)
                first = tf.nest.flatten(out)[0] if graph_mode else None
                if first is not None and hasattr(first, "op"):
                    label = first.op.name
                    op_name.append(label.rsplit("/", 1)[-1] if kwargs.get("ignore_name_scope") else label)
                return out

            rec.add_framework("horovod-tensorflow")
            return timer.run(inputs, launch, record, outputs)

        traced.__dltrace_wrapped__ = fn  # type: ignore[attr-defined]
        return traced


def install(rec: Recorder, hvd: Any) -> HorovodTFHooks:
    """Attach the Horovod TensorFlow hooks to ``rec``; call right after horovod.tensorflow is
    imported."""
    hooks = HorovodTFHooks(rec, sys.modules["tensorflow"], sys.modules["horovod.tensorflow.mpi_ops"])
    hooks.install()
    return hooks
