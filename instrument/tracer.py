"""The built-in tracer: a :class:`Recorder` that buffers records and spills them per rank.

One tracer runs in each rank. It writes ``<run>/ranks/rank-<r>.evt`` and ``.json`` (see
:mod:`instrument.spill`); the merge step turns all ranks' files into one OTF2 archive.
Tracing problems (an unwritable or full disk) never stop the training: the tracer prints one
clear message naming the directory, stops recording, and keeps what it already wrote.
"""

from __future__ import annotations

import os
import platform
import socket
import sys
import time
from pathlib import Path
from typing import Any

from instrument import events
from instrument.buffer import EventBuffer
from instrument.clock import Clock, OffsetSample, measure_offset
from instrument.events import NO_LOC, Kind, Op, Role
from instrument.recorder import Recorder
from instrument.spill import SpillWriter

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
        self._flush_rid = self.region_id(events.TRACER_FLUSH, Role.ARTIFICIAL)
        self._sync_rid = self.region_id(events.CLOCK_SYNC, Role.ARTIFICIAL)
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
        try:
            self.spill: SpillWriter | None = SpillWriter(self.run_dir / "ranks", rank)
            self._write_meta()
        except OSError as e:
            self.spill = None
            self._disable(e)

    # -- emitters -----------------------------------------------------------------------
    def _append(self, t: int, kind: int, **fields: int) -> None:
        if self.enabled and self.buffer.append(t, kind, **fields):
            self._mark_flush()

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

    # -- spilling -----------------------------------------------------------------------
    def _sink(self, raw: memoryview) -> None:
        if self.spill is None:
            raise OSError("no spill file")
        t0 = self.now()
        if self._defs_changed:
            self._write_meta()
        self.spill.append(raw)
        self._last_flush_span = (t0, self.now())

    def _mark_flush(self) -> None:
        """Record the flush that just happened as tracer overhead on the calling thread."""
        span = getattr(self, "_last_flush_span", None)
        if span is None or not self.enabled:
            return
        self._last_flush_span = None
        loc = self.loc()
        self.buffer.append(span[0], Kind.ENTER, region=self._flush_rid, loc=loc)
        self.buffer.append(span[1], Kind.LEAVE, region=self._flush_rid, loc=loc)

    def _write_meta(self) -> None:
        if self.spill is None:
            return
        self._defs_changed = False
        meta = dict(self.meta)
        meta["regions"] = list(self.region_defs)
        meta["comms"] = list(self.comm_defs)
        meta["threads"] = list(self.thread_names)
        meta["thread_kinds"] = list(self.loc_kinds)
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
        """Flush all records and write the final metadata; safe to call more than once."""
        if self.meta["status"] != "running":
            return
        self.end_steps()
        self.sync_clock("end")
        self.meta["status"] = status
        self.meta["status_detail"] = detail
        self.meta["end_ns"] = self.now()
        self._defs_changed = True
        self.buffer.flush(self.now())
        self._mark_flush()
        self.buffer.flush(self.now())
        if self.enabled:
            try:
                self._write_meta()
            except OSError as e:
                self._disable(e)
        if self.spill is not None:
            self.spill.close()
