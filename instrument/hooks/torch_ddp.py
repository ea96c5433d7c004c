"""PyTorch hooks: steps, forward, backward, optimizer, data loading and every collective.

Installed when the training script imports torch. What is recorded and how:

- forward: global module forward pre/post hooks; only the outermost module call is a region.
- backward: ``torch.autograd.backward`` (which ``Tensor.backward`` calls) is wrapped.
- optimizer: global optimizer step pre/post hooks; the outermost step ends the training step.
  ``Optimizer.__init__`` is wrapped only to tell the recorder that the script has an optimizer:
  without one (weights updated by hand), a step ends where the next forward pass begins
  after a backward pass (:mod:`instrument.tracer.recorder`).
- data loading: each ``DataLoader`` iterator ``__next__``.
- collectives: the ``torch.distributed`` functions (all_reduce, broadcast, all_gather, ...) are
  wrapped in both ``torch.distributed`` and ``distributed_c10d``, so calls from torch's own
  helpers are seen too; a call made while another traced collective runs on the same thread
  is not recorded twice. Blocking calls are regions on the calling thread; ``async_op=True``
  calls are recorded when their future completes, and ``Work.wait`` is a wait region.
- DDP: DDP reduces gradients in C++, invisible to Python. Unless the script registers its
  own communication hook, we register torch's default allreduce hook (same arithmetic: divide
  by the group size, then sum), so every bucket goes through the wrapped ``all_reduce``. After
  the last bucket is issued, the rest of ``backward`` is DDP waiting for the buckets: a wait
  region until backward returns. The broadcast of module buffers at the start of each forward
  (``broadcast_buffers``) is a blocking ``ddp.broadcast_buffers`` collective.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
from collections.abc import Callable
from typing import Any

from instrument.tracer import recorder
from instrument.tracer.recorder import Recorder
from instrument.tracer.timing import HostTimer
from traceio import records
from traceio.records import Op, Role

# torch.distributed function -> (op, how to find bytes sent/received, root argument)
_COLLECTIVES: dict[str, tuple[Op, str, str | None]] = {
    "all_reduce": (Op.ALLREDUCE, "tensor", None),
    "all_reduce_coalesced": (Op.ALLREDUCE, "tensors", None),
    "broadcast": (Op.BCAST, "tensor", "src"),
    "reduce": (Op.REDUCE, "tensor", "dst"),
    "all_gather": (Op.ALLGATHER, "tensor>tensor_list", None),
    "all_gather_into_tensor": (Op.ALLGATHER, "input_tensor>output_tensor", None),
    "all_gather_coalesced": (Op.ALLGATHER, "input_tensor_list>output_tensor_lists", None),
    "reduce_scatter": (Op.REDUCE_SCATTER, "input_list>output", None),
    "reduce_scatter_tensor": (Op.REDUCE_SCATTER, "input>output", None),
    "gather": (Op.GATHER, "tensor>gather_list", "dst"),
    "scatter": (Op.SCATTER, "scatter_list>tensor", "src"),
    "all_to_all": (Op.ALLTOALL, "input_tensor_list>output_tensor_list", None),
    "all_to_all_single": (Op.ALLTOALL, "input>output", None),
    "barrier": (Op.BARRIER, "", None),
    "monitored_barrier": (Op.BARRIER, "", None),
}


def nbytes(x: Any) -> int:
    """Bytes of a tensor or (nested) list of tensors; 0 for anything else."""
    if x is None:
        return 0
    if isinstance(x, list | tuple):
        return sum(nbytes(v) for v in x)
    try:
        return int(x.numel()) * int(x.element_size())
    except AttributeError:
        return 0


class TorchHooks:
    """The installed state of the PyTorch hooks for one recorder."""

    def __init__(self, rec: Recorder, torch: Any):
        self.rec = rec
        self.torch = torch
        self.dist = torch.distributed
        self.timer = HostTimer(rec.clock)
        self._tls = threading.local()
        self._comm_cache: dict[int, tuple[int, tuple[int, ...]]] = {}
        self._fwd_depth = 0
        self._opt_depth = 0
        self._has_params: dict[int, bool] = {}
        r = rec.region_id
        self.r_forward = r(records.FORWARD)
        self.r_backward = r(records.BACKWARD)
        self.r_optimizer = r(records.OPTIMIZER)
        self.r_data = r(records.DATALOADER)
        self.r_wait = r("torch.distributed.Work.wait", Role.WAIT)
        self.r_ddp_wait = r("ddp.wait_for_buckets", Role.WAIT)

    # -- install --------------------------------------------------------------------------
    def install(self) -> None:
        torch = self.torch
        from torch.nn.modules import module as nn_module
        from torch.optim import optimizer as optim_module

        nn_module.register_module_forward_pre_hook(self._forward_pre)
        nn_module.register_module_forward_hook(self._forward_post, always_call=True)
        optim_module.register_optimizer_step_pre_hook(self._opt_pre)
        optim_module.register_optimizer_step_post_hook(self._opt_post)
        torch.autograd.backward = self._wrap_backward(torch.autograd.backward)
        self._wrap_optimizer_init(optim_module.Optimizer)
        self._wrap_dataloader()
        if self.dist.is_available():
            self._wrap_distributed()

    # -- forward / optimizer / backward / data ----------------------------------------------
    def _is_model(self, module: Any) -> bool:
        """Parameter-free root modules (loss functions, activations) are not a forward pass."""
        key = id(module)
        known = self._has_params.get(key)
        if known is None:
            known = self._has_params[key] = next(module.parameters(), None) is not None
        return known

    def _forward_pre(self, module: Any, args: Any) -> None:
        if threading.get_ident() != _MAIN:
            return
        if self._fwd_depth == 0:
            if not self._is_model(module):
                return
            self.rec.enter(self.r_forward)
        self._fwd_depth += 1

    def _forward_post(self, module: Any, args: Any, output: Any) -> None:
        if threading.get_ident() != _MAIN or self._fwd_depth == 0:
            return
        self._fwd_depth -= 1
        if self._fwd_depth == 0:
            self.rec.leave(self.r_forward)

    def _opt_pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if threading.get_ident() != _MAIN:
            return
        if self._opt_depth == 0:
            self.rec.enter(self.r_optimizer)
        self._opt_depth += 1

    def _opt_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if threading.get_ident() != _MAIN or self._opt_depth == 0:
            return
        self._opt_depth -= 1
        if self._opt_depth == 0:
            t = self.rec.now()
            self.rec.leave(self.r_optimizer, t)
            self.rec.optimizer_done(t)

    def _wrap_optimizer_init(self, cls: Any) -> None:
        init = cls.__init__
        if hasattr(init, "__dltrace_wrapped__"):
            return

        @functools.wraps(init)
        def traced_init(optimizer: Any, *args: Any, **kwargs: Any) -> None:
            rec = recorder.current()
            if rec is not None:
                rec.optimizer_expected = True
            init(optimizer, *args, **kwargs)

        traced_init.__dltrace_wrapped__ = init  # type: ignore[attr-defined]
        cls.__init__ = traced_init

    def _wrap_backward(self, backward: Callable[..., Any]) -> Callable[..., Any]:
        rec, rid = self.rec, self.r_backward

        @functools.wraps(backward)
        def traced_backward(*args: Any, **kwargs: Any) -> Any:
            rec.enter(rid)
            try:
                return backward(*args, **kwargs)
            finally:
                rec.leave(rid)  # also leaves a DDP wait region opened inside

        traced_backward.__dltrace_wrapped__ = backward  # type: ignore[attr-defined]
        return traced_backward

    def _wrap_dataloader(self) -> None:
        from torch.utils.data import dataloader

        cls = dataloader._BaseDataLoaderIter
        nxt = cls.__next__
        rec, rid = self.rec, self.r_data

        @functools.wraps(nxt)
        def traced_next(it: Any) -> Any:
            rec.enter(rid)
            try:
                return nxt(it)
            finally:
                rec.leave(rid)

        cls.__next__ = traced_next  # type: ignore[method-assign,assignment]

    # -- torch.distributed ------------------------------------------------------------------
    def _comm(self, group: Any) -> tuple[int, tuple[int, ...]]:
        dist = self.dist
        if group is None:
            group = dist.group.WORLD
        key = id(group)
        hit = self._comm_cache.get(key)
        if hit is None:
            members = tuple(dist.get_process_group_ranks(group))
            name = "WORLD" if group is dist.group.WORLD else f"pg:{getattr(group, 'group_name', key)}"
            hit = (self.rec.comm_id(name, members), members)
            self._comm_cache[key] = hit
        return hit

    def _wrap_distributed(self) -> None:
        dist = self.dist
        c10d = dist.distributed_c10d
        for name, spec in _COLLECTIVES.items():
            fn = getattr(c10d, name, None)
            if fn is None or hasattr(fn, "__dltrace_wrapped__"):
                continue
            wrapped = self._wrap_collective(name, fn, spec)
            setattr(c10d, name, wrapped)
            if getattr(dist, name, None) is fn:
                setattr(dist, name, wrapped)
        self._wrap_init(dist, c10d)
        self._wrap_work_wait(dist)
        self._wrap_ddp()

    def _wrap_init(self, dist: Any, c10d: Any) -> None:
        init = c10d.init_process_group
        rec = self.rec

        @functools.wraps(init)
        def traced_init(*args: Any, **kwargs: Any) -> Any:
            out = init(*args, **kwargs)
            rec.add_framework("pytorch")
            rec.set_meta("torch_backend", str(dist.get_backend()))
            return out

        c10d.init_process_group = traced_init
        if dist.init_process_group is init:
            dist.init_process_group = traced_init

    def _wrap_collective(
        self, name: str, fn: Callable[..., Any], spec: tuple[Op, str, str | None]
    ) -> Callable[..., Any]:
        op, byte_args, root_arg = spec
        sent_arg, _, recv_arg = byte_args.partition(">")
        recv_arg = recv_arg or sent_arg
        sig = inspect.signature(fn)
        rec, tls, timer = self.rec, self._tls, self.timer
        rid = rec.region_id(f"torch.distributed.{name}", records.ROLE_OF_OP[op])

        @functools.wraps(fn)
        def traced(*args: Any, **kwargs: Any) -> Any:
            if getattr(tls, "busy", False):
                return fn(*args, **kwargs)
            try:
                bound = sig.bind(*args, **kwargs)
            except TypeError:
                return fn(*args, **kwargs)  # let torch raise its own error
            a = bound.arguments
            comm, members = self._comm(a.get("group"))
            sent = nbytes(a.get(sent_arg)) if sent_arg else 0
            recv = nbytes(a.get(recv_arg)) if recv_arg else 0
            root = -1
            if root_arg is not None:
                src = a.get(root_arg, a.get("group_" + root_arg))
                root = members.index(src) if src in members else -1
            if a.get("async_op"):
                token = timer.begin()
                tls.busy = True
                try:
                    work = fn(*args, **kwargs)
                finally:
                    tls.busy = False
                if work is not None:
                    self._on_complete(work, token, rid, comm, op, root, sent, recv)
                return work
            rec.enter(rid)
            tls.busy = True
            try:
                return fn(*args, **kwargs)
            finally:
                tls.busy = False
                rec.collective_end(rec.now(), comm, op, root, sent, recv)
                rec.leave(rid)

        traced.__dltrace_wrapped__ = fn  # type: ignore[attr-defined]
        return traced

    def _on_complete(
        self, work: Any, token: Any, rid: int, comm: int, op: Op, root: int, sent: int, recv: int
    ) -> None:
        rec, timer = self.rec, self.timer

        def done(_fut: Any) -> None:
            span = timer.resolve(timer.end(token))
            if span is not None:
                rec.async_collective(rid, span[0], span[1], comm, op, root, sent, recv)

        # a backend without futures: the issue time is all we could know
        with contextlib.suppress(AttributeError, RuntimeError):
            work.get_future().add_done_callback(done)

    def _wrap_work_wait(self, dist: Any) -> None:
        work_cls = dist.Work
        wait = work_cls.wait
        rec, rid = self.rec, self.r_wait

        @functools.wraps(wait)
        def traced_wait(work: Any, *args: Any, **kwargs: Any) -> Any:
            rec.enter(rid)
            try:
                return wait(work, *args, **kwargs)
            finally:
                rec.leave(rid)

        work_cls.wait = traced_wait

    # -- DDP ----------------------------------------------------------------------------------
    def _wrap_ddp(self) -> None:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        from torch.nn.parallel import DistributedDataParallel as DDP

        rec, r_wait = self.rec, self.r_ddp_wait

        # No annotations: DDP rejects a hook whose annotations are not GradBucket / Future,
        # and under ``from __future__ import annotations`` they would be strings.
        def traced_allreduce_hook(process_group, bucket):  # type: ignore[no-untyped-def]
            issued = rec.now()
            fut = default_hooks.allreduce_hook(process_group, bucket)
            if bucket.is_last() and threading.get_ident() == _MAIN:
                # All gradients are computed once the last bucket is issued: from then on,
                # backward waits for the buckets (the wait region is left when backward returns).
                rec.enter(r_wait, issued)
            return fut

        register = DDP.register_comm_hook
        register_builtin = DDP._register_builtin_comm_hook

        @functools.wraps(register)
        def user_register(ddp: Any, *args: Any, **kwargs: Any) -> Any:
            ddp._dltrace_user_hook = True
            return register(ddp, *args, **kwargs)

        @functools.wraps(register_builtin)
        def user_register_builtin(ddp: Any, *args: Any, **kwargs: Any) -> Any:
            ddp._dltrace_user_hook = True
            return register_builtin(ddp, *args, **kwargs)

        forward = DDP.forward

        @functools.wraps(forward)
        def traced_forward(ddp: Any, *args: Any, **kwargs: Any) -> Any:
            if not getattr(ddp, "_dltrace_user_hook", False):
                ddp._dltrace_user_hook = True
                register(ddp, ddp.process_group, traced_allreduce_hook)
                rec.add_framework("pytorch-ddp")
            return forward(ddp, *args, **kwargs)

        DDP.register_comm_hook = user_register  # type: ignore[method-assign,assignment]
        DDP._register_builtin_comm_hook = user_register_builtin  # type: ignore[method-assign,assignment]
        DDP.forward = traced_forward  # type: ignore[method-assign,assignment]
        self._wrap_ddp_buffers(DDP)

    def _wrap_ddp_buffers(self, DDP: Any) -> None:  # noqa: N803 -- the class
        """DDP broadcasts its module buffers (BatchNorm statistics) from rank 0 at the start
        of every forward, through ``dist._broadcast_coalesced`` in C++, which the wrappers
        above do not see. Unrecorded, a rank waiting there for a late peer looked like
        forward computing; recorded, it is a broadcast the phase model can call idle."""
        broadcast = getattr(DDP, "_distributed_broadcast_coalesced", None)
        if broadcast is None:
            return
        rec, tls = self.rec, self._tls
        rid = rec.region_id("ddp.broadcast_buffers", records.ROLE_OF_OP[Op.BCAST])

        @functools.wraps(broadcast)
        def traced_broadcast(ddp: Any, tensors: Any, buffer_size: Any, authoritative_rank: int = 0) -> Any:
            if getattr(tls, "busy", False):
                return broadcast(ddp, tensors, buffer_size, authoritative_rank)
            comm, _ = self._comm(ddp.process_group)
            root = int(authoritative_rank)  # already a rank within the process group
            size = nbytes(list(tensors))
            rec.enter(rid)
            tls.busy = True
            try:
                return broadcast(ddp, tensors, buffer_size, authoritative_rank)
            finally:
                tls.busy = False
                rec.collective_end(rec.now(), comm, Op.BCAST, root, size, size)
                rec.leave(rid)

        DDP._distributed_broadcast_coalesced = traced_broadcast  # type: ignore[method-assign]


_MAIN = threading.main_thread().ident


def install(rec: Recorder, torch: Any) -> TorchHooks:
    """Attach the PyTorch hooks to ``rec``; call once, right after torch is imported."""
    hooks = TorchHooks(rec, torch)
    hooks.install()
    return hooks
