"""Horovod (PyTorch) hooks: every collective a script or ``hvd.DistributedOptimizer`` issues.

Installed when the training script imports ``horovod.torch`` (the PyTorch hooks are already in
place then: Horovod imports torch first, and they record forward, backward and the optimizer
step, which closes each training step). What is recorded and how:

- Enqueue. Every public operation (``allreduce``, ``allreduce_async_``, ``grouped_allreduce``,
  ``allgather``, ``broadcast_``, ``alltoall``, ``reducescatter``, their async and grouped
  forms, and the ones the optimizer and ``broadcast_parameters`` call) ends in one of the
  private ``_<op>_async`` functions of ``horovod.torch.mpi_ops``, which the public functions
  look up in that module's globals. Wrapping those, rather than the public names, catches the
  calls of the optimizer module, which imported the public names into its own namespace, and
  of scripts that did ``from horovod.torch import allreduce_async_``. The issue time, tensor
  name, communicator (the process set) and bytes are kept per handle.
- Completion. Horovod's background thread does the reduction; Python learns that it finished
  only when ``synchronize(handle)`` returns (or ``poll(handle)`` first says True). Then the
  operation is recorded as an asynchronous collective from issue to that moment, on the rank's
  communication lanes. ``synchronize`` itself is a wait region (the main thread blocks on
  communication); the optimizer's ``synchronize()``, which ``step()`` calls and which waits
  for every gradient in turn, is one wait region. ``synchronize`` and ``poll`` are rebound in
  every ``horovod.torch`` module that imported them (``optimizer``, ``functions``,
  ``sync_batch_norm``, the package).
- ``barrier`` and ``join`` are blocking collectives on the calling thread (BARRIER).
- ``broadcast_optimizer_state`` runs a zero-gradient ``step()`` of the wrapped optimizer to
  create its state; that setup call does not end a training step (as setup broadcasts in DDP
  scripts, it belongs to step 0).

Region names carry the tensor name (``horovod.allreduce:layer1.0.conv1.weight``), so a trace
shows which tensor each collective moved and a reader can check that the n-th collectives of
two ranks are the same tensor. Unnamed operations (Horovod then names them by handle) and
names beyond :data:`~instrument.hooks.horovod_names.MAX_NAMED_REGIONS` use the plain
operation name.

Matching across ranks: the analysis pairs the n-th collective of each rank on a communicator
by issue order. The optimizer issues each gradient's allreduce from an autograd hook, in
autograd order, which is the same on every rank running the same model; Horovod's background
thread may then execute (and fuse) them in another order, which changes neither the issue
order nor the pairing. Parameters whose gradient is never computed are issued inside
``step()`` in set order, which can differ between ranks: their names tell.
"""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Callable
from typing import Any

from instrument.hooks import horovod_timeline
from instrument.hooks.horovod_names import TensorRegions
from instrument.hooks.torch_ddp import nbytes
from instrument.tracer.recorder import Recorder
from traceio.records import Op, Role

# mpi_ops function -> (region base name, op, argument holding the input(s), prefix of
# Horovod's tensor name for single-tensor ops; None where we cannot predict it)
_ENQUEUE: dict[str, tuple[str, Op, str, str | None]] = {
    "_allreduce_async": ("allreduce", Op.ALLREDUCE, "tensor", "allreduce"),
    "_grouped_allreduce_async": ("grouped_allreduce", Op.ALLREDUCE, "tensors", None),
    "_allgather_async": ("allgather", Op.ALLGATHER, "tensor", "allgather"),
    "_grouped_allgather_async": ("grouped_allgather", Op.ALLGATHER, "tensors", None),
    "_broadcast_async": ("broadcast", Op.BCAST, "tensor", "broadcast"),
    "_alltoall_async": ("alltoall", Op.ALLTOALL, "tensor", "alltoall"),
    "_reducescatter_async": ("reducescatter", Op.REDUCE_SCATTER, "tensor", "reducescatter"),
    "_grouped_reducescatter_async": ("grouped_reducescatter", Op.REDUCE_SCATTER, "tensors", None),
}


class _Pending:
    """An enqueued operation, until Python sees it complete."""

    __slots__ = ("rid", "issued", "done", "comm", "op", "root", "sent", "output", "tensor_name")

    def __init__(self, rid: int, issued: int, comm: int, op: Op, root: int, sent: int,
                 output: Any, tensor_name: str | None):
        self.rid, self.issued, self.comm, self.op, self.root = rid, issued, comm, op, root
        self.sent, self.output, self.tensor_name = sent, output, tensor_name
        self.done: int | None = None


class HorovodTorchHooks:
    """The installed state of the Horovod hooks for one recorder."""

    def __init__(self, rec: Recorder, hvd: Any):
        self.rec = rec
        self.hvd = hvd
        self.mpi_ops = sys.modules["horovod.torch.mpi_ops"]
        self._pending: dict[int, _Pending] = {}
        self._comms: dict[int, tuple[int, tuple[int, ...]]] = {}
        self._region = TensorRegions(rec)
        self._tls = threading.local()
        self.r_sync = rec.region_id("horovod.synchronize", Role.WAIT)
        self.wrapped: list[str] = []

    # -- install --------------------------------------------------------------------------
    def install(self) -> None:
        ops = self.mpi_ops
        for fname, spec in _ENQUEUE.items():
            fn = getattr(ops, fname, None)
            if fn is not None:
                setattr(ops, fname, self._wrap_enqueue(fn, *spec))
                self.wrapped.append(fname)
        for fname, make in (("synchronize", self._wrap_synchronize), ("poll", self._wrap_poll),
                            ("barrier", self._wrap_blocking), ("join", self._wrap_blocking),
                            ("init", self._wrap_init)):
            fn = getattr(ops, fname, None)
            if fn is not None:
                self._rebind(fn, make(fn))
                self.wrapped.append(fname)
        optimizer = getattr(sys.modules.get("horovod.torch.optimizer"), "_DistributedOptimizer", None)
        if optimizer is not None and "synchronize" in vars(optimizer):
            # DistributedOptimizer() copies this class's dict into the class it makes
            optimizer.synchronize = self._wrap_optimizer_synchronize(optimizer.synchronize)
            self.wrapped.append("DistributedOptimizer.synchronize")
        functions = sys.modules.get("horovod.torch.functions")
        bos = getattr(functions, "broadcast_optimizer_state", None)
        if bos is not None:
            self._rebind(bos, self._wrap_setup(bos))
            self.wrapped.append("broadcast_optimizer_state")

    @staticmethod
    def _rebind(original: Callable[..., Any], wrapped: Callable[..., Any]) -> None:
        """Replace ``original`` wherever a horovod.torch module bound it to a name."""
        for name, module in list(sys.modules.items()):
            if module is None or not (name == "horovod.torch" or name.startswith("horovod.torch.")):
                continue
            for attr, value in list(vars(module).items()):
                if value is original:
                    setattr(module, attr, wrapped)

    # -- definitions ----------------------------------------------------------------------
    def _comm(self, process_set: Any) -> tuple[int, tuple[int, ...]]:
        psid = getattr(process_set, "process_set_id", None) or 0
        hit = self._comms.get(psid)
        if hit is None:
            ranks = getattr(process_set, "ranks", None)
            members = tuple(ranks) if ranks else tuple(range(self.hvd.size()))
            name = "horovod" if psid == 0 else f"horovod:ps{psid}"
            hit = self._comms[psid] = (self.rec.comm_id(name, members), members)
        return hit

    # -- enqueue and completion -------------------------------------------------------------
    def _wrap_enqueue(self, fn: Callable[..., Any], base: str, op: Op, input_arg: str,
                      prefix: str | None) -> Callable[..., Any]:
        params = fn.__code__.co_varnames[: fn.__code__.co_argcount]
        now, pending = self.rec.now, self._pending

        @functools.wraps(fn)
        def traced(*args: Any, **kwargs: Any) -> Any:
            issued = now()
            handle = fn(*args, **kwargs)
            a = dict(zip(params, args, strict=False))
            a.update(kwargs)
            name = a.get("name") or None
            comm, members = self._comm(a.get("process_set"))
            root = -1
            if op == Op.BCAST:
                src = a.get("root_rank")
                root = members.index(src) if src in members else -1
            output = a.get("outputs", a.get("output"))
            pending[handle] = _Pending(
                self._region(base, op, name), issued, comm, op, root, nbytes(a.get(input_arg)),
                output, f"{prefix}.{name}" if prefix and name else None)
            return handle

        traced.__dltrace_wrapped__ = fn  # type: ignore[attr-defined]
        return traced

    def _complete(self, handle: Any, t: int) -> None:
        p = self._pending.pop(handle, None) if isinstance(handle, int) else None
        if p is None:
            return
        end = p.done if p.done is not None else t
        # One-to-all: every rank receives the tensor; otherwise what arrived in the output
        # (allgather and alltoall outputs are sized by Horovod on completion).
        recv = p.sent if p.op in (Op.ALLREDUCE, Op.BCAST) else nbytes(p.output)
        self.rec.async_collective(p.rid, p.issued, end, p.comm, p.op, p.root, p.sent, recv)
        if p.tensor_name is not None:
            horovod_timeline.OBSERVED.add(p.tensor_name, p.issued, end)

    def _wrap_synchronize(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        rec, rid, tls = self.rec, self.r_sync, self._tls

        @functools.wraps(fn)
        def traced_synchronize(handle: Any) -> Any:
            if getattr(tls, "busy", False):  # inside a region that already says "waiting"
                out = fn(handle)
                self._complete(handle, rec.now())
                return out
            rec.enter(rid)
            try:
                out = fn(handle)
            except BaseException:
                self._pending.pop(handle, None)
                rec.leave(rid)
                raise
            t = rec.now()
            rec.leave(rid, t)
            self._complete(handle, t)
            return out

        traced_synchronize.__dltrace_wrapped__ = fn  # type: ignore[attr-defined]
        return traced_synchronize

    def _wrap_optimizer_synchronize(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """The optimizer's ``synchronize()`` (also inside ``step()``) waits for every gradient:
        one wait region, instead of one per handle, keeps the cost at one record per tensor."""
        rec, tls = self.rec, self._tls
        rid = rec.region_id("horovod.DistributedOptimizer.synchronize", Role.WAIT)

        @functools.wraps(fn)
        def traced(opt: Any, *args: Any, **kwargs: Any) -> Any:
            if getattr(tls, "busy", False):
                return fn(opt, *args, **kwargs)
            rec.enter(rid)
            tls.busy = True
            try:
                return fn(opt, *args, **kwargs)
            finally:
                tls.busy = False
                rec.leave(rid)

        traced.__dltrace_wrapped__ = fn  # type: ignore[attr-defined]
        return traced

    def _wrap_poll(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        now, pending = self.rec.now, self._pending

        @functools.wraps(fn)
        def traced_poll(handle: Any) -> Any:
            done = fn(handle)
            p = pending.get(handle) if done and isinstance(handle, int) else None
            if p is not None and p.done is None:
                p.done = now()  # the earliest moment Python saw it complete
            return done

        traced_poll.__dltrace_wrapped__ = fn  # type: ignore[attr-defined]
        return traced_poll

    def _wrap_blocking(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``barrier(process_set)`` / ``join(device)``: a blocking BARRIER region."""
        rec, tls = self.rec, self._tls
        rid = rec.region_id(f"horovod.{fn.__name__}", Role.BARRIER)

        @functools.wraps(fn)
        def traced(*args: Any, **kwargs: Any) -> Any:
            process_set = kwargs.get("process_set", args[0] if args and fn.__name__ == "barrier" else None)
            comm, _ = self._comm(process_set)
            rec.enter(rid)
            busy, tls.busy = getattr(tls, "busy", False), True
            try:
                return fn(*args, **kwargs)
            finally:
                tls.busy = busy
                rec.collective_end(rec.now(), comm, Op.BARRIER, -1, 0, 0)
                rec.leave(rid)

        traced.__dltrace_wrapped__ = fn  # type: ignore[attr-defined]
        return traced

    def _wrap_init(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        rec, hvd = self.rec, self.hvd

        @functools.wraps(fn)
        def traced_init(*args: Any, **kwargs: Any) -> Any:
            out = fn(*args, **kwargs)
            self._comms.clear()  # process sets are renumbered by every init
            rec.add_framework("horovod-pytorch")
            rec.set_meta("horovod", {
                "rank": hvd.rank(), "size": hvd.size(), "local_size": hvd.local_size(),
                "controller": "gloo" if hvd.gloo_enabled() else "mpi",
                "hooked": list(self.wrapped),
            })
            return out

        traced_init.__dltrace_wrapped__ = fn  # type: ignore[attr-defined]
        return traced_init

    def _wrap_setup(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        rec = self.rec

        @functools.wraps(fn)
        def traced_setup(*args: Any, **kwargs: Any) -> Any:
            if threading.get_ident() != threading.main_thread().ident or "optimizer_done" in vars(rec):
                return fn(*args, **kwargs)
            # The zero-gradient optimizer step inside is not a training step: while it runs,
            # the end of an optimizer step does not end the recorder's step.
            rec.optimizer_done = _not_a_training_step  # type: ignore[method-assign]
            try:
                return fn(*args, **kwargs)
            finally:
                del rec.optimizer_done

        traced_setup.__dltrace_wrapped__ = fn  # type: ignore[attr-defined]
        return traced_setup


def _not_a_training_step(t: int | None = None) -> None:
    return None


def install(rec: Recorder, hvd: Any) -> HorovodTorchHooks:
    """Attach the Horovod hooks to ``rec``; call once, right after horovod.torch is imported."""
    hooks = HorovodTorchHooks(rec, hvd)
    hooks.install()
    return hooks
