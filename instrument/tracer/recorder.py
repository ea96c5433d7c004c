"""What framework hooks and user markers talk to: the backend-independent recorder.

A :class:`Recorder` keeps one region stack per thread and turns hook calls into properly
nested regions, whatever backend stores them (the built-in tracer's buffer, Score-P user
regions). It also owns the training-step structure, so both backends produce the same steps:

- A step region opens lazily at the first activity on the main thread after the previous
  step ended (data loading, forward, a collective, a user region...), and closes when the
  outermost optimizer step returns. Time between two steps that touches nothing traced
  belongs to neither.
- If a region opened inside the step is still open when the optimizer returns, the step
  closes as soon as that region does, so regions always nest.
- A step still open at the end that never reached an optimizer step (evaluation, shutdown)
  is reported as discarded and written as ``dltrace.tail``.
- Loops that update the weights by hand (no optimizer was ever made, no :func:`end_step`
  marker was called): a step that has run a backward pass ends where the next forward pass
  or data-loader batch begins, so the hand-written update stays in the step. The last such
  step ends with the last region it contains (under Score-P, which records only "now", at
  shutdown), and is kept.

Subclasses implement the ``_emit_*`` methods.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from instrument.tracer.clock import Clock, HostClock
from traceio import records
from traceio.records import Op, Role

# Where the next step of a loop without an optimizer begins (see the module docstring).
_NEXT_STEP_STARTS = frozenset({records.FORWARD, records.DATALOADER})


class Recorder:
    """Region registry, per-thread stacks and step detection over abstract emitters."""

    def __init__(self, clock: Clock | None = None):
        self.clock = clock or HostClock()
        self.now = self.clock.now
        self._lock = threading.Lock()
        self._region_ids: dict[tuple[str, str], int] = {}
        self.region_defs: list[dict[str, str]] = []
        self._comm_ids: dict[tuple[str, tuple[int, ...]], int] = {}
        self.comm_defs: list[dict[str, object]] = []
        self._locs: dict[int, int] = {threading.main_thread().ident or 0: 0}
        self.thread_names: list[str] = ["main thread"]
        self.loc_kinds: list[str] = ["main"]
        self._stacks: list[list[int]] = [[]]
        self._step = self.region_id(records.STEP)
        self._step_open = False
        self._step_saw_optimizer = False
        self._step_close_pending = False
        # Steps of loops without an optimizer (see the module docstring).
        # an optimizer was made (set by hooks) or stepped, or an end_step marker was called
        self.optimizer_expected = False
        self._step_saw_backward = False
        self._last_child_leave = 0
        self.steps_opened = 0
        self.steps_discarded = 0
        self._defs_changed = True

    # -- definitions --------------------------------------------------------------------
    def region_id(self, name: str, role: Role = Role.FUNCTION) -> int:
        """The id of region ``name`` with ``role``, defining it on first use."""
        key = (name, str(role))
        rid = self._region_ids.get(key)
        if rid is None:
            with self._lock:
                rid = self._region_ids.get(key)
                if rid is None:
                    rid = len(self.region_defs)
                    self.region_defs.append({"name": name, "role": str(role)})
                    self._region_ids[key] = rid
                    self._defs_changed = True
        return rid

    def comm_id(self, name: str, members: tuple[int, ...]) -> int:
        """The id of the communicator ``name`` over global ``members`` (ranks, in comm order)."""
        key = (name, tuple(members))
        cid = self._comm_ids.get(key)
        if cid is None:
            with self._lock:
                cid = self._comm_ids.get(key)
                if cid is None:
                    cid = len(self.comm_defs)
                    self.comm_defs.append({"name": name, "members": list(members)})
                    self._comm_ids[key] = cid
                    self._defs_changed = True
        return cid

    def loc(self) -> int:
        """The thread-location index of the calling thread (0: the main thread)."""
        ident = threading.get_ident()
        loc = self._locs.get(ident)
        if loc is None:
            with self._lock:
                loc = len(self.thread_names)
                self._locs[ident] = loc
                self.thread_names.append(f"thread {threading.current_thread().name}")
                self.loc_kinds.append("thread")
                self._stacks.append([])
                self._defs_changed = True
        return loc

    def named_loc(self, name: str, kind: str = "timeline") -> int:
        """A location not bound to a thread, for activities imported from another clock-aligned
        source (Horovod's timeline; torch.profiler's threads, and its device streams with kind
        ``accelerator_stream``). Fill it with :meth:`interval`, :meth:`enter_on` /
        :meth:`leave_on` and :meth:`collective_interval`, in time order."""
        with self._lock:
            loc = len(self.thread_names)
            self.thread_names.append(name)
            self.loc_kinds.append(kind)
            self._stacks.append([])
            self._defs_changed = True
        return loc

    def interval(self, loc: int, rid: int, start: int, end: int) -> None:
        """A complete region instance on a named location (never opens a step)."""
        self._emit_enter(loc, rid, start)
        self._emit_leave(loc, rid, end)

    def enter_on(self, loc: int, rid: int, t: int) -> None:
        """Enter ``rid`` on a named location, for imported activities that nest: each
        location's enters and leaves must come in time order and nest properly."""
        self._emit_enter(loc, rid, t)

    def leave_on(self, loc: int, rid: int, t: int) -> None:
        """Leave ``rid`` on a named location (see :meth:`enter_on`)."""
        self._emit_leave(loc, rid, t)

    def collective_interval(
        self, loc: int, rid: int, start: int, end: int, comm: int, op: Op, root: int,
        bytes_sent: int, bytes_recv: int,
    ) -> None:
        """A complete collective performed by region ``rid`` on a named location from
        ``start`` to ``end`` (a communication kernel on an accelerator stream)."""
        self._emit_enter(loc, rid, start)
        self._emit_coll_end(loc, end, comm, op, root, bytes_sent, bytes_recv)
        self._emit_leave(loc, rid, end)

    # -- regions ------------------------------------------------------------------------
    def enter(self, rid: int, t: int | None = None) -> None:
        loc = self.loc()
        if t is None:
            t = self.now()
        stack = self._stacks[loc]
        if loc == 0 and self._step_saw_backward and not self.optimizer_expected and self._step_open \
                and len(stack) == 1 and self.region_defs[rid]["name"] in _NEXT_STEP_STARTS:
            self._close_step(t)
        if loc == 0 and not self._step_open and rid != self._step and self._opens_step(rid):
            self._step_open = True
            self._step_saw_optimizer = False
            self._step_saw_backward = False
            self._step_close_pending = False
            self.steps_opened += 1
            stack.append(self._step)
            self._emit_enter(loc, self._step, t)
        stack.append(rid)
        self._emit_enter(loc, rid, t)

    def leave(self, rid: int, t: int | None = None) -> None:
        """Leave ``rid``; regions opened inside it and still open are left first."""
        loc = self.loc()
        if t is None:
            t = self.now()
        stack = self._stacks[loc]
        if rid not in stack:
            return  # entered before tracing started, or already closed by an unwind
        while stack:
            top = stack.pop()
            self._emit_leave(loc, top, t)
            if top == self._step:
                self._step_open = False
            if top == rid:
                break
        if loc == 0 and not self.optimizer_expected and self._step_open and len(stack) == 1:
            self._last_child_leave = t
            if self.region_defs[rid]["name"] == records.BACKWARD:
                self._step_saw_backward = True
        if loc == 0 and self._step_close_pending and stack and stack[-1] == self._step:
            self._close_step(t)

    def depth(self) -> int:
        return len(self._stacks[self.loc()])

    def unwind(self, depth: int, t: int | None = None) -> None:
        """Leave every region above ``depth`` on the calling thread's stack."""
        stack = self._stacks[self.loc()]
        if len(stack) > depth:
            self.leave(stack[depth], t)

    @contextmanager
    def region(self, rid: int) -> Iterator[None]:
        self.enter(rid)
        try:
            yield
        finally:
            self.leave(rid)

    # -- training structure -------------------------------------------------------------
    def _opens_step(self, rid: int) -> bool:
        return self.region_defs[rid]["role"] != Role.ARTIFICIAL

    def optimizer_done(self, t: int | None = None) -> None:
        """The outermost optimizer step returned: the current step ends (now or when its
        inner regions close)."""
        self.optimizer_expected = True
        if not self._step_open:
            return
        self._step_saw_optimizer = True
        stack = self._stacks[0]
        if stack and stack[-1] == self._step:
            self._close_step(self.now() if t is None else t)
        else:
            self._step_close_pending = True

    def _close_step(self, t: int) -> None:
        self._step_close_pending = False
        self._stacks[0].pop()
        self._step_open = False
        self._emit_leave(0, self._step, t)

    def end_steps(self, t: int | None = None) -> None:
        """At shutdown: a step that never reached an optimizer step is discarded, unless it is
        a complete step of a loop without an optimizer (it then ends with its last region)."""
        if self._step_open and self._step_saw_backward and not self.optimizer_expected \
                and self._stacks[0] == [self._step]:
            self._close_step(self._last_child_leave)
            return
        if self._step_open and not self._step_saw_optimizer:
            self.steps_discarded += 1
            self._emit_step_discard(self.steps_opened - 1, self.now() if t is None else t)

    # -- communication ------------------------------------------------------------------
    def collective_end(
        self, t: int, comm: int, op: Op, root: int, bytes_sent: int, bytes_recv: int
    ) -> None:
        """Describe the collective the innermost open region performs (call before leave)."""
        self._emit_coll_end(self.loc(), t, comm, op, root, bytes_sent, bytes_recv)

    def async_collective(
        self, rid: int, begin: int, end: int, comm: int, op: Op, root: int,
        bytes_sent: int, bytes_recv: int,
    ) -> None:
        """A completed asynchronous collective issued at ``begin``, done at ``end``."""
        self._emit_async(rid, begin, end, comm, op, root, bytes_sent, bytes_recv)

    # -- backend ------------------------------------------------------------------------
    def _emit_enter(self, loc: int, rid: int, t: int) -> None:
        raise NotImplementedError

    def _emit_leave(self, loc: int, rid: int, t: int) -> None:
        raise NotImplementedError

    def _emit_coll_end(
        self, loc: int, t: int, comm: int, op: Op, root: int, sent: int, recv: int
    ) -> None:
        raise NotImplementedError

    def _emit_async(
        self, rid: int, begin: int, end: int, comm: int, op: Op, root: int, sent: int, recv: int
    ) -> None:
        raise NotImplementedError

    def _emit_step_discard(self, step_index: int, t: int) -> None:
        raise NotImplementedError

    # -- metadata and lifecycle (backends override what they support) --------------------
    def add_framework(self, name: str) -> None:
        """Note a framework the hooks saw in use (for run.json)."""

    def set_meta(self, key: str, value: object) -> None:
        """Attach a fact about this rank to the run's metadata."""

    def finalize(self, status: str, detail: str | None = None) -> None:
        """Flush everything; ``status`` is ok, exception or signal."""


_current: Recorder | None = None


def current() -> Recorder | None:
    """The recorder of this process, or None when tracing is off."""
    return _current


def install(recorder: Recorder | None) -> None:
    global _current
    _current = recorder
