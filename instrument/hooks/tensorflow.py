"""TensorFlow hooks: training steps and MultiWorkerMirroredStrategy's cross-worker collectives.

Installed when the training script imports tensorflow. Inside a ``tf.function`` the Python
code runs once, while the function is traced; afterwards each call runs the traced graph
in C++. So runtime marks come from two places (docs/tensorflow.md has what each can and
cannot see):

- Steps, on the calling side in Python. ``Model.fit`` gets a Keras callback whose
  ``on_train_batch_begin``/``end`` bracket each batch (region ``keras.train_batch``). And
  every top-level call of a ``tf.function`` that computes gradients (its trace called
  ``GradientTape.gradient``) is one training step (region ``tf.function:<name>``), which is
  what a custom training loop's iteration calls. Calls of other functions are not recorded.
- Collectives, from inside the graph. When a collective is traced, the op is bracketed by two
  ``tf.timestamp`` ops: one that runs once the inputs are ready (the collective waits for it
  through a control dependency) and one that runs once the output exists (the result is
  passed on only after it). They run every time the graph runs and leave their times, with
  the bytes, in a small variable per collective, which is read after the call returns; each
  execution becomes an asynchronous collective (begin and end known) on our clock
  (:class:`~instrument.hooks.tf_markers.CollectiveTimer`). Executed eagerly, a collective is timed around the call.

MultiWorkerMirroredStrategy launches every dense all-reduce and all-gather through
``CollectiveReplicaLauncher``; those two methods are wrapped. The region name says why the
all-reduce was issued, as far as the code that traced it tells: ``.gradients`` (the Keras
optimizer's gradient aggregation), ``.input_sync`` (the distributed iterator checking that
every worker still has data), ``.sync_on_read`` (reading a variable summed over workers,
e.g. a metric) and ``.outputs`` (``Model.fit`` reducing the step's logs); a user's own
``ReplicaContext.all_reduce`` is plain ``tf.distribute.all_reduce``.

When ``TF_CONFIG`` is not set (ranks started by torchrun, mpirun or srun rather than by
``instrument run``), creating the strategy first writes this rank's address into the run
directory and builds ``TF_CONFIG`` from all ranks' addresses.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import json
import os
import socket
import sys
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from instrument.hooks.importer import PostImportHooks
from instrument.hooks.tf_markers import collective_timer
from instrument.tracer.recorder import Recorder
from traceio import records
from traceio.records import Op, Role

# Keras modules defining ``Model.fit`` (Keras 2 as TF 2.15 ships it, and its tf_keras twin).
KERAS_TRAINING = ("keras.src.engine.training", "tf_keras.src.engine.training")

# Function names on the stack while an all-reduce is traced -> why it is issued.
_PURPOSES = {
    "all_reduce_sum_gradients": "gradients",  # Keras optimizers
    "_all_reduce_sum_fn": "gradients",
    "aggregate_gradients": "gradients",
    "_aggregate_gradients": "gradients",
    "_calculate_replicas_with_values": "input_sync",  # distributed iterators
    "_get_cross_replica": "sync_on_read",  # SyncOnRead variables (metrics)
    "reduce_per_replica": "outputs",  # Model.fit's step logs
}
RENDEZVOUS_DIR = "tf-workers"
RENDEZVOUS_TIMEOUT_S = 300.0

_MAIN = threading.main_thread().ident


def purpose_from_stack(limit: int = 60) -> str | None:
    """Why the collective being traced is issued, from the nearest known caller."""
    frame: FrameType | None = sys._getframe(1)
    for _ in range(limit):
        if frame is None:
            return None
        purpose = _PURPOSES.get(frame.f_code.co_name)
        if purpose is not None:
            return purpose
        frame = frame.f_back
    return None


class TFHooks:
    """The installed state of the TensorFlow hooks for one recorder."""

    def __init__(self, rec: Recorder, tf: Any):
        self.rec = rec
        self.tf = tf
        self.timer = collective_timer(rec, tf)
        self._depth = 0  # top-level tf.function calls in progress on the main thread
        self._calling: Any = None  # the top-level tf.function the main thread is calling
        # tf.functions whose trace computed gradients -> their step region (-1: not yet defined)
        self._trains: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
        self._seen_training = False
        self._keras_hooks = PostImportHooks()
        self.r_batch = rec.region_id("keras.train_batch")

    def install(self) -> None:
        self._wrap_function_call()
        self._wrap_gradient()
        self._wrap_launcher()
        self._wrap_strategy()
        for name in KERAS_TRAINING:
            self._keras_hooks.on(name, self._patch_fit)

    # -- steps: tf.function calls ---------------------------------------------------------
    def _training_seen(self) -> None:
        if not self._seen_training:
            self._seen_training = True
            self.rec.add_framework("tensorflow")

    def _wrap_function_call(self) -> None:
        from tensorflow.python.eager import context
        from tensorflow.python.eager.polymorphic_function import polymorphic_function

        cls = polymorphic_function.Function
        call = cls.__call__
        rec, trains, timer = self.rec, self._trains, self.timer
        # Reading the collectives' slots is measurement overhead, as the tracer's flushes are.
        r_drain = rec.region_id(records.TRACER_FLUSH, Role.ARTIFICIAL)

        @functools.wraps(call)
        def traced_call(fn: Any, *args: Any, **kwargs: Any) -> Any:
            if self._depth or threading.get_ident() != _MAIN or not context.executing_eagerly():
                return call(fn, *args, **kwargs)
            known = fn in trains
            rid = self._step_region(fn) if known else -1
            self._depth += 1  # also keeps the drain's own tf.function call out of here
            self._calling = timer.owner = fn
            t0 = rec.now()
            if known:
                rec.enter(rid, t0)
            ok = False
            try:
                out = call(fn, *args, **kwargs)
                ok = True
                return out
            finally:
                self._calling = timer.owner = None
                t1 = rec.now()
                if not known and fn in trains:
                    # The first call traced the function and showed that it trains: its step
                    # is emitted now (nothing was recorded on the main thread meanwhile;
                    # Score-P, which stamps regions itself, sees it with zero length).
                    rid = self._step_region(fn)
                    rec.enter(rid, t0)
                if fn in trains:
                    rec.leave(rid, t1)
                    if ok:  # a call that raised did not complete its step
                        rec.optimizer_done(t1)
                        self._training_seen()
                if timer.owns(fn):
                    rec.enter(r_drain)
                    try:
                        timer.drain(fn)
                    finally:
                        rec.leave(r_drain)
                self._depth -= 1

        traced_call.__dltrace_wrapped__ = call  # type: ignore[attr-defined]
        cls.__call__ = traced_call

    def _step_region(self, fn: Any) -> int:
        rid = self._trains.get(fn, -1)
        if rid < 0:
            rid = self._trains[fn] = self.rec.region_id(f"tf.function:{getattr(fn, 'name', '?')}")
        return rid

    def _wrap_gradient(self) -> None:
        from tensorflow.python.eager import backprop

        gradient = backprop.GradientTape.gradient

        @functools.wraps(gradient)
        def traced_gradient(tape: Any, *args: Any, **kwargs: Any) -> Any:
            # Runs while the main thread's top-level call traces (possibly on a replica thread
            # of the strategy, hence not thread-local).
            fn = self._calling
            if fn is not None and fn not in self._trains:
                self._trains[fn] = -1
            return gradient(tape, *args, **kwargs)

        backprop.GradientTape.gradient = traced_gradient

    # -- steps: Model.fit ------------------------------------------------------------------
    def _patch_fit(self, training: Any) -> None:
        model_cls = training.Model
        fit = model_cls.fit
        if hasattr(fit, "__dltrace_wrapped__"):
            return
        callbacks = importlib.import_module(training.__name__.replace("engine.training", "callbacks"))
        callback = _batch_callback(callbacks.Callback, self)
        sig = inspect.signature(fit)

        @functools.wraps(fit)
        def traced_fit(model: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                bound = sig.bind(model, *args, **kwargs)
            except TypeError:
                return fit(model, *args, **kwargs)  # let Keras raise its own error
            given = bound.arguments.get("callbacks")
            mine = callback()
            if given is None:
                bound.arguments["callbacks"] = [mine]
            elif isinstance(given, list | tuple):
                bound.arguments["callbacks"] = [*given, mine]
            else:  # a CallbackList
                given.append(mine)
            self._training_seen()
            return fit(*bound.args, **bound.kwargs)

        traced_fit.__dltrace_wrapped__ = fit  # type: ignore[attr-defined]
        model_cls.fit = traced_fit

    # -- MultiWorkerMirroredStrategy -------------------------------------------------------
    def _wrap_strategy(self) -> None:
        from tensorflow.python.distribute import collective_all_reduce_strategy as mwms

        cls = mwms.CollectiveAllReduceStrategy
        init = cls.__init__
        rec = self.rec

        @functools.wraps(init)
        def traced_init(strategy: Any, cluster_resolver: Any = None, *args: Any, **kwargs: Any) -> None:
            if cluster_resolver is None and not os.environ.get("TF_CONFIG"):
                config = rendezvous_tf_config(os.environ)
                if config is not None:
                    os.environ["TF_CONFIG"] = config
            init(strategy, cluster_resolver, *args, **kwargs)
            rec.add_framework("tensorflow-mwms")
            rec.set_meta("tf_workers", int(strategy.extended._num_workers))

        cls.__init__ = traced_init

    def _wrap_launcher(self) -> None:
        from tensorflow.python.distribute import cross_device_utils

        cls = cross_device_utils.CollectiveReplicaLauncher
        all_reduce, all_gather = cls.all_reduce, cls._all_gather
        hooks = self

        @functools.wraps(all_reduce)
        def traced_all_reduce(launcher: Any, input_tensor: Any, control_input: Any = None,
                              options: Any = None) -> Any:
            comm = hooks._comm(launcher)
            if comm is None:
                return all_reduce(launcher, input_tensor, control_input, options)
            purpose = purpose_from_stack()
            name = "tf.distribute.all_reduce" + (f".{purpose}" if purpose else "")
            record = hooks._recorder(name, Op.ALLREDUCE, comm)
            return hooks.timer.run(
                [input_tensor], lambda ts: all_reduce(launcher, ts[0], control_input, options), record,
                after=lambda: _launch_order(launcher, control_input))

        @functools.wraps(all_gather)
        def traced_all_gather(launcher: Any, input_tensor: Any, options: Any) -> Any:
            comm = hooks._comm(launcher)
            if comm is None:
                return all_gather(launcher, input_tensor, options)
            record = hooks._recorder("tf.distribute.all_gather", Op.ALLGATHER, comm)
            return hooks.timer.run([input_tensor], lambda ts: all_gather(launcher, ts[0], options), record,
                                   received=lambda out: [out], after=lambda: _launch_order(launcher, None))

        cls.all_reduce = traced_all_reduce
        cls._all_gather = traced_all_gather

    def _comm(self, launcher: Any) -> int | None:
        """Our communicator for the launcher's collective group; None for the launchers of a
        worker's second and later devices (each worker records its collectives once)."""
        from tensorflow.python.framework import device as tf_device

        index = tf_device.DeviceSpec.from_string(launcher._device).device_index
        if index not in (None, 0):
            return None
        workers = max(1, launcher._group_size // max(1, _devices_per_worker(launcher)))
        return self.rec.comm_id(f"tf.collective.group{launcher._group_key}", tuple(range(workers)))

    def _recorder(self, name: str, op: Op, comm: int) -> Callable[[int, int, int, int], None]:
        rec = self.rec
        rid = rec.region_id(name, records.ROLE_OF_OP[op])

        def record(begin: int, end: int, sent: int, recv: int) -> None:
            rec.async_collective(rid, begin, end, comm, op, records.NO_ROOT, sent, recv)

        return record


def _launch_order(launcher: Any, control_input: Any) -> list[Any]:
    """What a launcher's next collective waits for besides its input: the previous collective.

    The launcher orders its collectives through a resource (the ordering token) that each one
    uses; automatic control dependencies run them in creation order. A read of that resource
    is ordered the same way, so a begin timestamp that waits for it fires when the collective
    may start, not when its input is ready (the loss metric's all-reduce of a ``model.fit``
    step has its input right after the forward pass but runs after the gradients').
    """
    from tensorflow.python.ops import resource_variable_ops as rv

    deps = [] if control_input is None else [control_input]
    token = getattr(launcher, "_ordering_token", None)
    if token is not None and launcher._use_ordering_token():
        deps.append(rv.read_variable_op(token.handle, token.dtype))
    return deps


def _devices_per_worker(launcher: Any) -> int:
    """Local devices in the launcher's group (1 on CPU-only workers)."""
    table = getattr(launcher._collective_keys, "_instance_key_table", {})
    return max(1, len(table.get(launcher._group_key, ())))


def _batch_callback(base: type, hooks: TFHooks) -> type:
    """A Keras callback class marking each training batch as a step."""
    rec, rid = hooks.rec, hooks.r_batch

    class DltraceBatches(base):  # type: ignore[misc,valid-type]
        # Keras need not convert the logs to numpy for us (no extra synchronization).
        _supports_tf_logs = True

        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            rec.enter(rid)

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            t = rec.now()
            rec.leave(rid, t)
            rec.optimizer_done(t)

    return DltraceBatches


def rendezvous_tf_config(env: dict[str, str] | os._Environ[str]) -> str | None:
    """``TF_CONFIG`` for this rank, built through the run directory: each rank writes
    ``host:port`` of a free port, then reads everyone's. None for a single rank."""
    from instrument.launch.rank_env import RankEnvError, rank_from_env

    try:
        rank, size, _ = rank_from_env(dict(env))
    except RankEnvError:
        return None
    run_dir = env.get("DLTRACE_RUN_DIR")
    if size < 2 or not run_dir:
        return None
    where = Path(run_dir) / RENDEZVOUS_DIR
    where.mkdir(parents=True, exist_ok=True)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    mine = where / f"worker-{rank}"
    tmp = mine.with_suffix(".tmp")
    tmp.write_text(f"{socket.gethostname()}:{port}")
    os.replace(tmp, mine)
    deadline = time.monotonic() + RENDEZVOUS_TIMEOUT_S
    addresses: list[str] = []
    while time.monotonic() < deadline:
        try:
            addresses = [(where / f"worker-{r}").read_text().strip() for r in range(size)]
            break
        except OSError:
            time.sleep(0.1)
    else:
        print(f"dltrace: rank {rank}: not every rank wrote its TensorFlow worker address into "
              f"{where} within {RENDEZVOUS_TIMEOUT_S:.0f} s; set TF_CONFIG yourself.",
              file=sys.stderr, flush=True)
        return None
    return json.dumps({"cluster": {"worker": addresses}, "task": {"type": "worker", "index": rank}})


def install(rec: Recorder, tf: Any) -> TFHooks:
    """Attach the TensorFlow hooks to ``rec``; call once, right after tensorflow is imported."""
    hooks = TFHooks(rec, tf)
    hooks.install()
    return hooks
