"""Timing TensorFlow collectives where they run: inside ``tf.function`` graphs, or eagerly.

Inside a ``tf.function`` the Python code runs once, while the function is traced; afterwards
each call runs the traced graph in C++. :class:`CollectiveTimer` brackets each collective op
with two ``tf.timestamp`` ops and leaves their times, with the bytes, in a small variable of
its own, which the hooks read after each top-level call. Shared by the TensorFlow hooks
(MultiWorkerMirroredStrategy) and the Horovod TensorFlow hooks.
"""

from __future__ import annotations

import math
import os
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any

from instrument.tracer.clock import realtime_offset
from instrument.tracer.recorder import Recorder


class _Slot:
    """Where one traced collective leaves its last execution: a float64 variable holding
    (executions so far, begin, end, bytes sent, bytes received), times as ``tf.timestamp``."""

    __slots__ = ("handle", "record", "seen")

    def __init__(self, handle: Any, record: Callable[[int, int, int, int], None]):
        self.handle = handle
        self.record = record
        self.seen = 0


class _SlotGroup:
    """The slots of the collectives traced during one top-level ``tf.function``'s calls."""

    EAGER_READS = 16  # up to this many, reading each variable eagerly beats a function call

    def __init__(self) -> None:
        self.slots: list[_Slot] = []
        self._reader: Any = None
        self._reader_size = 0

    def read(self, tf: Any) -> list[list[float]]:
        from tensorflow.python.ops import resource_variable_ops as rv

        slots = list(self.slots)
        if len(slots) <= self.EAGER_READS:
            return [rv.read_variable_op(slot.handle, tf.float64).numpy().tolist() for slot in slots]
        if self._reader_size != len(slots):
            handles = [slot.handle for slot in slots]
            self._reader = tf.function(lambda: tf.stack([rv.read_variable_op(h, tf.float64) for h in handles]))
            self._reader_size = len(slots)
        return list(self._reader().numpy().tolist())


class CollectiveTimer:
    """Times collective ops when they run, in graph mode (``tf.function``) or eagerly.

    In a graph, two ``tf.timestamp`` ops (C++, a few microseconds each) bracket the op: the
    first runs once the inputs are ready and the op's inputs wait for it; the second runs once
    the outputs exist and they are passed on only after it. Both go, with the bytes, into a
    small variable of the collective's own (:class:`_Slot`); no Python runs inside the graph.
    Slots are grouped by :attr:`owner`, the top-level ``tf.function`` whose call traced them;
    :meth:`drain`, called on the main thread after each call of an owner, reads its slots and
    records each execution since the last drain through the slot's ``record(begin_ns,
    end_ns, bytes_sent, bytes_received)``. An op that ran more than once between two drains (a
    loop inside one call) keeps only its last execution; the others are counted in
    :attr:`lost`. Eagerly, a collective is timed around the call and recorded at once.
    """

    def __init__(self, rec: Recorder, tf: Any):
        self.rec = rec
        self.tf = tf
        self.lost = 0
        self.owner: Any = None  # set by the caller around top-level tf.function calls
        self._warned_xla = False
        self._groups: weakref.WeakKeyDictionary[Any, _SlotGroup] = weakref.WeakKeyDictionary()
        self._orphans = _SlotGroup()  # slots traced outside any owner's call
        self._made = 0
        self._lock = threading.Lock()

    def owns(self, fn: Any) -> bool:
        """Whether calls of ``fn`` ran traced collectives (and need :meth:`drain`)."""
        return fn in self._groups or bool(self._orphans.slots)

    def _in_xla(self) -> bool:
        from tensorflow.python.framework import ops
        from tensorflow.python.ops import control_flow_util

        return bool(control_flow_util.GraphOrParentsInXlaContext(ops.get_default_graph()))

    def _slot(self, record: Callable[[int, int, int, int], None]) -> Any:
        """A new slot's variable handle, initialized to zeros.

        It is made with the raw variable ops, outside the function being traced, so that no
        distribution strategy turns it into a mirrored variable. Being a resource of its own
        also keeps the collectives unordered: inside a function, TensorFlow's automatic control
        dependencies run the stateful ops that use no resource in program order (and a
        ``cond`` whose branch holds one becomes one), which would serialize every collective
        behind the previous one (Horovod's per-tensor allreduces could no longer run together
        and be fused); ops on a resource are ordered only with that resource's other users.
        """
        from tensorflow.python.ops import resource_variable_ops as rv

        tf = self.tf
        with self._lock:
            self._made += 1
            name = f"dltrace_collective_{os.getpid()}_{id(self)}_{self._made}"
        with tf.init_scope(), tf.device("/cpu:0"):
            handle = rv.var_handle_op(dtype=tf.float64, shape=[5], shared_name=name)
            rv.assign_variable_op(handle, tf.zeros([5], tf.float64))
        with self._lock:
            owner = self.owner
            group = self._orphans if owner is None else self._groups.setdefault(owner, _SlotGroup())
            group.slots.append(_Slot(handle, record))
        return handle

    def _timestamp(self) -> Any:
        """A ``tf.timestamp`` that automatic control dependencies leave unordered."""
        stamp = self.tf.timestamp()
        manager = getattr(stamp.graph, "experimental_acd_manager", None)
        if manager is not None:
            manager.run_independently(stamp.op)
        return stamp

    def run(
        self,
        inputs: list[Any],
        launch: Callable[[list[Any]], Any],
        record: Callable[[int, int, int, int], None],
        received: Callable[[Any], list[Any]] | None = None,
        after: Callable[[], list[Any]] | None = None,
    ) -> Any:
        """``launch(inputs)``, timed. ``inputs`` are the tensors the collective sends; the
        bytes received are those of ``received(outputs)``, or as many as were sent. In a
        graph, ``after()`` makes the ops, besides the inputs, that the collective must wait
        for (an ordering among collectives); the begin waits for them too."""
        from tensorflow.python.ops import resource_variable_ops as rv

        tf = self.tf
        if tf.executing_eagerly():
            t0 = self.rec.now()
            out = launch(inputs)
            t1 = self.rec.now()
            sent = _static_bytes(inputs) or 0
            recv = sent if received is None else _static_bytes(received(out)) or 0
            record(t0, t1, sent, recv)
            return out
        if self._in_xla():
            # tf.timestamp has no XLA kernel: leave jit-compiled collectives unmarked.
            if not self._warned_xla:
                self._warned_xla = True
                print("dltrace: collectives inside jit_compile=True functions are not traced",
                      file=sys.stderr, flush=True)
            return launch(inputs)
        # A control dependency on a function's or a cond branch's input does not wait for the
        # input's value (measured: in a cond the timestamp fired as the branch started, before
        # its input was computed); one on an op that reads the value does.
        ready = [tf.identity(t) for t in inputs]
        with tf.control_dependencies(ready + (after() if after is not None else [])):
            begin = self._timestamp()
        with tf.control_dependencies([begin]):
            gated = [tf.identity(t) for t in ready]
        out = launch(gated)
        outputs = [t for t in tf.nest.flatten(out) if t is not None]
        with tf.control_dependencies(outputs):
            end = self._timestamp()
        sent = _bytes_tensor(tf, inputs)
        recv = sent if received is None else _bytes_tensor(tf, received(out))
        slot = self._slot(record)
        count = rv.read_variable_op(slot, tf.float64)[0] + 1.0
        rv.assign_variable_op(slot, tf.stack([count, begin, end, tf.cast(sent, tf.float64),
                                              tf.cast(recv, tf.float64)]))
        with tf.control_dependencies([end]):
            return tf.nest.map_structure(lambda t: None if t is None else tf.identity(t), out)

    def drain(self, owner: Any = None) -> None:
        """Record the executions since the last drain of ``owner``'s collectives and of those
        traced outside any owner (main thread, outside any ``tf.function``)."""
        groups = [self._groups.get(owner), self._orphans] if owner is not None else [self._orphans]
        offset = realtime_offset(self.rec.now, tries=3)[0]
        lost = self.lost
        for group in groups:
            if group is None or not group.slots:
                continue
            for slot, (count, begin, end, sent, recv) in zip(group.slots, group.read(self.tf), strict=False):
                new = int(count) - slot.seen
                if new <= 0:
                    continue
                slot.seen = int(count)
                self.lost += new - 1
                slot.record(seconds_to_ns(begin) - offset, seconds_to_ns(end) - offset, int(sent), int(recv))
        if self.lost != lost:
            self.rec.set_meta("tf_collective_executions_lost", self.lost)


_TIMERS: dict[int, CollectiveTimer] = {}


def collective_timer(rec: Recorder, tf: Any) -> CollectiveTimer:
    """The one :class:`CollectiveTimer` of ``rec``, shared by the TensorFlow and Horovod hooks:
    the TensorFlow hooks drain it after each top-level ``tf.function`` call."""
    timer = _TIMERS.get(id(rec))
    if timer is None or timer.rec is not rec:
        timer = _TIMERS[id(rec)] = CollectiveTimer(rec, tf)
    return timer


def seconds_to_ns(seconds: float) -> int:
    """Integer nanoseconds of a float number of seconds, exact to the float's resolution
    (``seconds * 1e9`` would round epoch times to 256 ns)."""
    whole = math.floor(seconds)
    return whole * 1_000_000_000 + round((seconds - whole) * 1e9)


def _static_bytes(tensors: list[Any]) -> int | None:
    """Bytes of ``tensors`` if their shapes are known (at trace time), else None."""
    total = 0
    for t in tensors:
        n = t.shape.num_elements()
        if n is None:
            return None
        total += int(n) * t.dtype.size
    return total


def _bytes_tensor(tf: Any, tensors: list[Any]) -> Any:
    """Bytes of ``tensors`` as an int64 scalar: a constant where shapes are static."""
    static = _static_bytes(tensors)
    if static is not None:
        return tf.constant(static, tf.int64)
    return tf.add_n([tf.size(t, out_type=tf.int64) * t.dtype.size for t in tensors])
