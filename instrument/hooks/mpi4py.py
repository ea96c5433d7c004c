"""mpi4py hooks: each collective call on a communicator is a region with its operation and bytes.

Installed when the script imports ``mpi4py.MPI``. mpi4py's communicators are extension types
whose methods cannot be replaced, so the hook swaps in traced subclasses: ``MPI.COMM_WORLD``
becomes a traced communicator over the same MPI handle, and communicators made from a traced
one (``Dup``, ``Split``, ``Create``...) are traced too. Communicators a script builds from raw
handles are not seen.

- Regions are named ``mpi4py.Comm.<method>`` (``mpi4py.Comm.Allreduce``, ``mpi4py.Comm.bcast``)
  with the role of their operation, like the ``torch.distributed`` ones.
- Bytes: the buffer methods (capitalized) count their buffers (``MPI.IN_PLACE`` counts the
  receive buffer); the lower-case methods pickle Python objects of unknown size: 0 bytes.
- Non-blocking collectives (``Iallreduce``...) are not recorded.
"""

from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import Callable
from typing import Any

from instrument.tracer.recorder import Recorder
from traceio import records
from traceio.records import Op

# method -> (operation, send buffer argument, receive buffer argument, root argument)
_COLLECTIVES: dict[str, tuple[Op, str | None, str | None, str | None]] = {
    "barrier": (Op.BARRIER, None, None, None),
    "Barrier": (Op.BARRIER, None, None, None),
    "bcast": (Op.BCAST, None, None, "root"),
    "Bcast": (Op.BCAST, "buf", "buf", "root"),
    "allreduce": (Op.ALLREDUCE, None, None, None),
    "Allreduce": (Op.ALLREDUCE, "sendbuf", "recvbuf", None),
    "reduce": (Op.REDUCE, None, None, "root"),
    "Reduce": (Op.REDUCE, "sendbuf", "recvbuf", "root"),
    "allgather": (Op.ALLGATHER, None, None, None),
    "Allgather": (Op.ALLGATHER, "sendbuf", "recvbuf", None),
    "Allgatherv": (Op.ALLGATHER, "sendbuf", "recvbuf", None),
    "gather": (Op.GATHER, None, None, "root"),
    "Gather": (Op.GATHER, "sendbuf", "recvbuf", "root"),
    "Gatherv": (Op.GATHER, "sendbuf", "recvbuf", "root"),
    "scatter": (Op.SCATTER, None, None, "root"),
    "Scatter": (Op.SCATTER, "sendbuf", "recvbuf", "root"),
    "Scatterv": (Op.SCATTER, "sendbuf", "recvbuf", "root"),
    "alltoall": (Op.ALLTOALL, None, None, None),
    "Alltoall": (Op.ALLTOALL, "sendbuf", "recvbuf", None),
    "Alltoallv": (Op.ALLTOALL, "sendbuf", "recvbuf", None),
    "Reduce_scatter": (Op.REDUCE_SCATTER, "sendbuf", "recvbuf", None),
    "Reduce_scatter_block": (Op.REDUCE_SCATTER, "sendbuf", "recvbuf", None),
}
# Methods returning a new communicator, which must be traced as well.
_DERIVING = ("Dup", "Clone", "Split", "Split_type", "Create", "Create_group")


def _nbytes(spec: Any) -> int:
    """Bytes of an mpi4py buffer specification: a buffer, or [buffer, (count,) datatype]."""
    if isinstance(spec, list | tuple):
        spec = spec[0] if spec else None
    try:
        return int(memoryview(spec).nbytes)
    except TypeError:
        return 0  # None, MPI.IN_PLACE, MPI.BOTTOM, or a buffer we cannot inspect


class MpiHooks:
    """The installed state of the mpi4py hooks for one recorder."""

    def __init__(self, rec: Recorder, mpi: Any):
        self.rec = rec
        self.mpi = mpi
        self._tls = threading.local()
        self._comm_cache: dict[int, int] = {}
        self._classes: dict[type, type] = {}

    def install(self) -> None:
        mpi = self.mpi
        self.rec.add_framework("mpi4py")
        mpi.COMM_WORLD = self.traced(mpi.COMM_WORLD)

    def traced(self, comm: Any) -> Any:
        """``comm`` as a traced communicator (same MPI handle); null communicators unchanged."""
        if comm is None or comm == self.mpi.COMM_NULL or type(comm) in self._classes.values():
            return comm
        base = type(comm)
        cls = self._classes.get(base)
        if cls is None:
            namespace = {name: self._wrap(name, getattr(base, name), spec)
                         for name, spec in _COLLECTIVES.items() if hasattr(base, name)}
            namespace.update({name: self._wrap_deriving(getattr(base, name))
                              for name in _DERIVING if hasattr(base, name)})
            cls = self._classes[base] = type(f"Traced{base.__name__}", (base,), namespace)
        return cls(comm)

    def _comm(self, comm: Any) -> int:
        """Our communicator id for ``comm``: its name and members as COMM_WORLD ranks."""
        key = comm.py2f()
        cid = self._comm_cache.get(key)
        if cid is None:
            mpi = self.mpi
            size = comm.Get_size()
            if comm == mpi.COMM_WORLD:
                members = tuple(range(size))
            else:
                world = mpi.COMM_WORLD.Get_group()
                members = tuple(mpi.Group.Translate_ranks(comm.Get_group(), list(range(size)), world))
            name = comm.Get_name() or f"comm {key}"
            cid = self._comm_cache[key] = self.rec.comm_id(name, members)
        return cid

    def _wrap(self, name: str, fn: Callable[..., Any],
              spec: tuple[Op, str | None, str | None, str | None]) -> Callable[..., Any]:
        op, send_arg, recv_arg, root_arg = spec
        rec, tls = self.rec, self._tls
        rid = rec.region_id(f"mpi4py.Comm.{name}", records.ROLE_OF_OP[op])
        try:
            sig: inspect.Signature | None = inspect.signature(fn)
        except (TypeError, ValueError):
            sig = None

        @functools.wraps(fn)
        def traced(comm: Any, *args: Any, **kwargs: Any) -> Any:
            if getattr(tls, "busy", False):
                return fn(comm, *args, **kwargs)
            sent = recv = 0
            root = -1
            if sig is not None:
                try:
                    bound = sig.bind(comm, *args, **kwargs)
                    bound.apply_defaults()
                    a = bound.arguments
                except TypeError:
                    return fn(comm, *args, **kwargs)  # let mpi4py raise its own error
                if recv_arg:
                    recv = _nbytes(a.get(recv_arg))
                if send_arg:
                    sent = recv if a.get(send_arg) is self.mpi.IN_PLACE else _nbytes(a.get(send_arg))
                if root_arg and isinstance(a.get(root_arg), int):
                    root = a[root_arg]
            cid = self._comm(comm)
            rec.enter(rid)
            tls.busy = True
            try:
                return fn(comm, *args, **kwargs)
            finally:
                tls.busy = False
                rec.collective_end(rec.now(), cid, op, root, sent, recv)
                rec.leave(rid)

        traced.__dltrace_wrapped__ = fn  # type: ignore[attr-defined]
        return traced

    def _wrap_deriving(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def deriving(comm: Any, *args: Any, **kwargs: Any) -> Any:
            return self.traced(fn(comm, *args, **kwargs))

        return deriving


def install(rec: Recorder, mpi: Any) -> MpiHooks:
    """Attach the mpi4py hooks to ``rec``; call once, right after ``mpi4py.MPI`` is imported."""
    hooks = MpiHooks(rec, mpi)
    hooks.install()
    return hooks
