"""The built-in tracer: a :class:`Recorder` that buffers records and spills them per rank.

One tracer runs in each rank. It writes ``<run>/ranks/rank-<r>.evt`` and ``.json`` (see
:mod:`instrument.tracer.spill`); the merge step turns all ranks' files into one OTF2 archive.
Tracing problems (an unwritable or full disk) never stop the training: the tracer prints one
clear message naming the directory, stops recording, and keeps what it already wrote.
"""

from __future__ import annotations

import os
import platform
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from instrument.tracer.buffer import EventBuffer
from instrument.tracer.clock import Clock, OffsetSample, measure_offset
from instrument.tracer.recorder import Recorder
from instrument.tracer.spill import SpillWriter
from traceio import records
from traceio.records import NO_LOC, Kind, Op, Role

DEFAULT_CAPACITY = 1 << 16  # records (3 MiB)
DEFAULT_FLUSH_INTERVAL_S = 10.0


class Tracer(Recorder):
    """Records one rank's events into a bounded buffer that drains into its spill file."""

    def __init__(
        self,
        rank: int,
        world_size: int,
        run_dir: Path,
        *,
        clock: Clock | None = None,
        capacity: int = DEFAULT_CAPACITY,
        flush_interval_s: float | None = DEFAULT_FLUSH_INTERVAL_S,
        clock_server: tuple[str, int] | None = None,
        local_rank: int | None = None,
    ):
        super().__init__(clock)
        self.rank = rank
        self.world_size = world_size
        self.run_dir = Path(run_dir)
        self.clock_server = clock_server
        self.enabled = True
        self._warned = False
        self._flush_rid = self.region_id(records.TRACER_FLUSH, Role.ARTIFICIAL)
        self._sync_rid = self.region_id(records.CLOCK_SYNC, Role.ARTIFICIAL)
        self.meta: dict[str, Any] = {
            "rank": rank,
            "world_size": world_size,
            "local_rank": local_rank,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "python": platform.python_version(),
            "argv": list(sys.argv),
            "start_realtime_ns": time.time_ns(),
            "start_ns": self.now(),
            "end_ns": None,
            "status": "running",
            "status_detail": None,
            "frameworks": [],
            "clock_samples": [],
            "extra": {},
        }
        interval = None if flush_interval_s is None else int(flush_interval_s * 1e9)
        self.buffer = EventBuffer(capacity, self._sink, interval, on_error=self._disable)
        # Flushes are recorded after the fact on a location of their own: a span inserted into
        # a thread's records could precede events whose times were taken before the flush.
        self._flush_spans: list[tuple[int, int]] = []
        self._flush_loc: int | None = None
        self._flush_lock = threading.Lock()
        # Seconds finalize waits for the buffer lock; a signal handler sets it (see finalize).
        self.flush_timeout_s: float = -1
        # Metric channels (the power sampler's), as the spill metadata lists them, and what
        # runs first when the rank finalizes (the sampler's last sample).
        self.metric_defs: list[dict[str, Any]] = []
        self._finalizers: list[Callable[[], None]] = []
        try:
            self.spill: SpillWriter | None = SpillWriter(self.run_dir / "ranks", rank)
            self._write_meta()
        except OSError as e:
            self.spill = None
            self._disable(e)
        self._stop_flusher = threading.Event()
        if flush_interval_s is not None:
            threading.Thread(target=self._flush_periodically, args=(flush_interval_s,),
                             name="dltrace-flusher", daemon=True).start()

    # -- emitters -----------------------------------------------------------------------
    def _append(self, t: int, kind: int, **fields: int) -> None:
        if self.enabled and self.buffer.append(t, kind, **fields):
            self._record_flushes()

    def _emit_enter(self, loc: int, rid: int, t: int) -> None:
        self._append(t, Kind.ENTER, region=rid, loc=loc)

    def _emit_leave(self, loc: int, rid: int, t: int) -> None:
        self._append(t, Kind.LEAVE, region=rid, loc=loc)

    def _emit_coll_end(
        self, loc: int, t: int, comm: int, op: Op, root: int, sent: int, recv: int
    ) -> None:
        self._append(t, Kind.COLL_END, loc=loc, comm=comm, op=op, root=root,
                     bytes_sent=sent, bytes_recv=recv)

    def _emit_async(
        self, rid: int, begin: int, end: int, comm: int, op: Op, root: int, sent: int, recv: int
    ) -> None:
        self._append(begin, Kind.ASYNC_COLL, region=rid, loc=NO_LOC, aux=end, comm=comm,
                     op=op, root=root, bytes_sent=sent, bytes_recv=recv)

    def _emit_step_discard(self, step_index: int, t: int) -> None:
        self._append(t, Kind.STEP_DISCARD, aux=step_index)

    # -- metrics --------------------------------------------------------------------------
    def metric_channel(self, definition: dict[str, Any]) -> int:
        """Define a metric channel (name, description, unit, exponent, mode, device fields);
        returns the id its samples refer to."""
        with self._lock:
            self.metric_defs.append(dict(definition))
            self._defs_changed = True
            return len(self.metric_defs) - 1

    def metric_sample(self, loc: int, channel: int, t: int, value: int) -> None:
        """One sample of ``channel`` at ``t`` on metric location ``loc`` (from
        ``named_loc(..., kind="metric")``): an integer in the channel's unit and exponent."""
        self._append(t, Kind.METRIC, region=channel, loc=loc, aux=value)

    def add_finalizer(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` when the rank finalizes, before the last flush (if the buffer is free)."""
        self._finalizers.append(fn)

    # -- spilling -----------------------------------------------------------------------
    def _sink(self, raw: memoryview) -> None:
        if self.spill is None:
            raise OSError("no spill file")
        t0 = self.now()
        self._write_meta()  # definitions first, and current counts for a merge after a kill
        self.spill.append(raw)
        self._flush_spans.append((t0, self.now()))

    def _record_flushes(self) -> None:
        """Record the flushes done so far as ``dltrace.flush`` regions on the rank's
        ``dltrace flushes`` location (kind ``tracer``), in time order."""
        with self._flush_lock:
            while self._flush_spans and self.enabled:
                spans, self._flush_spans = self._flush_spans, []
                if self._flush_loc is None:
                    self._flush_loc = self.named_loc("dltrace flushes", kind="tracer")
                for t0, t1 in spans:
                    self.buffer.append(t0, Kind.ENTER, region=self._flush_rid, loc=self._flush_loc)
                    self.buffer.append(t1, Kind.LEAVE, region=self._flush_rid, loc=self._flush_loc)

    def _flush_periodically(self, interval_s: float) -> None:
        """The flusher thread: spill records once they are an interval old, even while the
        training records nothing (so a SIGKILL loses at most about one interval)."""
        while not self._stop_flusher.wait(min(1.0, interval_s / 4)):
            if self.enabled and self.buffer.flush_if_due(self.now()):
                self._record_flushes()

    def _write_meta(self) -> None:
        if self.spill is None:
            return
        self._defs_changed = False
        meta = dict(self.meta)
        meta["regions"] = list(self.region_defs)
        meta["comms"] = list(self.comm_defs)
        meta["threads"] = list(self.thread_names)
        meta["thread_kinds"] = list(self.loc_kinds)
        meta["metrics"] = list(self.metric_defs)
        meta["records_appended"] = self.buffer.appended
        meta["records_dropped"] = self.buffer.dropped
        meta["steps_opened"] = self.steps_opened
        self.spill.write_meta(meta)

    def _disable(self, error: Exception) -> None:
        self.enabled = False
        if not self._warned:
            self._warned = True
            where = self.run_dir / "ranks"
            print(
                f"dltrace: rank {self.rank}: cannot write the trace to {where} ({error}); "
                "tracing stopped for this rank, training continues. Free disk space or "
                "choose another --out directory.",
                file=sys.stderr,
                flush=True,
            )

    # -- metadata -----------------------------------------------------------------------
    def add_framework(self, name: str) -> None:
        if name not in self.meta["frameworks"]:
            self.meta["frameworks"].append(name)
            self._defs_changed = True

    def set_meta(self, key: str, value: object) -> None:
        self.meta["extra"][key] = value
        self._defs_changed = True

    def sync_clock(self, label: str) -> OffsetSample | None:
        """Measure this rank's offset to the reference clock and keep the sample."""
        if self.clock_server is None:
            return None
        t0 = self.now()
        sample = measure_offset(self.clock_server, self.clock)
        if sample is not None:
            self.meta["clock_samples"].append({"label": label, **sample.as_dict()})
            self._defs_changed = True
        # Outside any step: clock sync is tracer overhead, not training.
        loc = self.loc()
        self._append(t0, Kind.ENTER, region=self._sync_rid, loc=loc)
        self._append(self.now(), Kind.LEAVE, region=self._sync_rid, loc=loc)
        return sample

    def finalize(self, status: str, detail: str | None = None) -> None:
        """Flush all records and write the final metadata; safe to call more than once.

        From a signal handler (``flush_timeout_s`` set), the handler may have interrupted an
        append on this thread that holds the buffer lock: if the lock stays taken, nothing
        more is recorded and the committed records are written without it.
        """
        if self.meta["status"] != "running":
            return
        self._stop_flusher.set()
        free = self.buffer.lock_free(self.flush_timeout_s)
        if free:
            for fn in self._finalizers:
                fn()
            self.end_steps()
            if threading.current_thread() is threading.main_thread():
                self.unwind(0)  # a step opened after the last optimizer step is balanced too
            self.sync_clock("end")
        self.meta["status"] = status
        self.meta["status_detail"] = detail
        self.meta["end_ns"] = self.now()
        self._defs_changed = True
        self.buffer.flush(-1 if free else 0)
        if free:
            self._record_flushes()
            self.buffer.flush()
        if self.enabled:
            try:
                self._write_meta()
            except OSError as e:
                self._disable(e)
        if self.spill is not None:
            self.spill.close()
