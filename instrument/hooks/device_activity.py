"""``instrument run --device-activity``: PyTorch's profiler beside our tracer, its device
activities imported into the run's trace on the run's clock.

What runs. Each rank starts ``torch.profiler.profile`` before the training script, with only
the activity streams it needs (CPU, plus CUDA where a CUDA or ROCm device is present; ROCm
builds report HIP activity under the CUDA name) and none of the per-op extras: no input
shapes, no stacks, no memory, no FLOP counts, no module hierarchy. It stops at the rank's end
(or when the script destroys its process group: a profiler still running while gloo's threads
join at teardown can deadlock, bench/torch_profiled.py). Then the rank writes Kineto's file to
``<run>/device/rank-<r>.pt.trace.json.gz`` (a directory that ``analyze phases`` and Holistic
Trace Analysis read as it is) and imports it into its own trace:

- each GPU stream becomes a location of kind ``accelerator_stream`` (an OTF2
  ACCELERATOR_STREAM location of the rank), named ``GPU <device> stream <id>``: kernels
  (region role kernel), copies and sets (data_transfer), GPU-side annotations, and NCCL/RCCL
  kernels as complete collectives on their process group (``device <group>``, a communicator
  of its own, so they match across ranks without mixing with the host-side collectives our
  hooks record), with bytes from ``In/Out msg nelems`` x dtype (0 where the args are missing);
- the profiler's CPU threads become ``torch.profiler <thread>`` locations of kind timeline
  (their operators nest; they do not enter the host phase model, whose main thread is ours).

Slices that only partly overlap the one open before them on a track go onto an extra
location (``... (2)``), since OTF2 locations must nest; the counts are in the rank's metadata
(``extra.device_activity``). On a machine without a GPU only CPU activity is recorded, and
rank 0 says so once.

Clocks. Kineto writes ``baseTimeNanoseconds + ts`` on the wall clock (measured in torch
2.13: epoch times; internally a monotonic clock converted to the wall clock once, at start).
Our records use CLOCK_MONOTONIC, so an imported time is ``kineto - (CLOCK_REALTIME -
CLOCK_MONOTONIC)``, that offset measured (best of 20 readings) right after the profiler
starts. The check: just after starting and just before stopping, five ``dltrace.clock_check``
ranges are recorded through the profiler, each between two readings of our clock; each
imported start must lie between its two readings. The smallest margins on either side bound
the alignment error and are stored in the metadata (``check``; run.json has it per rank);
tests/instrument/test_device_activity.py asserts them, docs/gpu.md quotes measured values.
"""

from __future__ import annotations

import sys
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

from instrument.tracer.clock import realtime_offset
from instrument.tracer.recorder import Recorder
from traceio import chrome, kineto
from traceio.chrome import ChromeTrace, Slice
from traceio.records import Op, Role

OPT_IN = "DLTRACE_DEVICE_ACTIVITY"
DIRECTORY = "device"
CHECK = "dltrace.clock_check"
CHECKS = 5  # clock checks at the start and at the end (the first is slow: it warms the profiler up)
DEFAULT_GROUP = "default (all ranks)"
OPS = {"allreduce": Op.ALLREDUCE, "bcast": Op.BCAST, "allgather": Op.ALLGATHER, "reduce_scatter": Op.REDUCE_SCATTER,
       "alltoall": Op.ALLTOALL, "reduce": Op.REDUCE, "gather": Op.GATHER, "scatter": Op.SCATTER,
       "barrier": Op.BARRIER}

_state: dict[str, Any] = {}


def file_for(run_dir: Path, rank: int) -> Path:
    return Path(run_dir) / DIRECTORY / f"rank-{rank}.pt.trace.json.gz"


def request(env: MutableMapping[str, str], rec: Recorder, run_dir: Path, rank: int, world: int) -> bool:
    """In every rank before the script runs: start the profiler when ``DLTRACE_DEVICE_ACTIVITY=1``.
    Returns whether it runs. Problems are reported, never fatal."""
    if env.get(OPT_IN) != "1" or _state:
        return False
    _state.update(rank=rank, world=world, run_dir=Path(run_dir), rec=rec, done=False)
    try:
        import torch
        from torch.profiler import ProfilerActivity, profile
    except Exception as e:  # noqa: BLE001 -- no torch, or a broken one: trace without it
        _state["error"] = f"torch.profiler is not available ({type(e).__name__}: {e})"
        _say(rank, f"--device-activity: {_state['error']}; recording without it")
        return False
    gpu = bool(torch.cuda.is_available())
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])
    _state["activities"] = [a.name for a in activities]
    if not gpu:
        _say(rank, "--device-activity: no CUDA or ROCm device here; torch.profiler records CPU "
             "activities only")
    prof = profile(activities=activities, record_shapes=False, profile_memory=False, with_stack=False,
                   with_flops=False, with_modules=False)
    prof.start()
    _state["prof"] = prof
    _state["offset_start"] = realtime_offset(rec.now)
    _state["checks"] = [_clock_check(rec) for _ in range(CHECKS)]
    _stop_before_teardown(torch)
    return True


def _say(rank: int, message: str) -> None:
    if rank == 0:
        print(f"dltrace: {message}", file=sys.stderr, flush=True)


def _clock_check(rec: Recorder) -> tuple[int, int]:
    """Our clock just before and just after a profiler range starts (see the module docstring)."""
    from torch.profiler import record_function

    before = rec.now()
    with record_function(CHECK):
        after = rec.now()
    return before, after


def _stop_before_teardown(torch: Any) -> None:
    dist = getattr(torch, "distributed", None)
    if dist is None or not dist.is_available():
        return
    destroy = dist.destroy_process_group

    def destroy_process_group(*args: Any, **kwargs: Any) -> Any:
        stop()
        return destroy(*args, **kwargs)

    destroy_process_group.__wrapped__ = destroy  # type: ignore[attr-defined]
    dist.destroy_process_group = destroy_process_group
    dist.distributed_c10d.destroy_process_group = destroy_process_group


def stop() -> None:
    """Stop the profiler (once); the rank's end imports what it recorded."""
    prof = _state.get("prof")
    if prof is None or _state.get("stopped"):
        return
    _state["stopped"] = True
    try:
        _state["checks"] += [_clock_check(_state["rec"]) for _ in range(CHECKS)]
        prof.stop()
    except Exception as e:  # noqa: BLE001 -- the training is done; keep what we can
        _state["error"] = f"stopping torch.profiler failed: {type(e).__name__}: {e}"


def import_at_exit(rec: Recorder, skip: bool = False) -> None:
    """At the rank's end: stop the profiler, keep Kineto's file, import it into ``rec``.
    Problems are reported in the metadata and on stderr; they never fail the rank. ``skip``
    (a rank stopped by a signal): record only that nothing was imported."""
    if not _state or _state.get("done"):
        return
    _state["done"] = True
    summary: dict[str, Any] = {"activities": _state.get("activities")}
    try:
        if "prof" not in _state:
            summary["error"] = _state.get("error", "the profiler did not start")
            return
        if skip:
            summary["error"] = "not imported: the rank was stopped by a signal"
            return
        stop()
        path = file_for(_state["run_dir"], _state["rank"])
        path.parent.mkdir(parents=True, exist_ok=True)
        raw = path.with_name(f".{path.name}.raw.json")
        t0 = rec.now()
        _state["prof"].export_chrome_trace(str(raw))
        trace = chrome.load(raw)
        trace.header.setdefault("distributedInfo", {"rank": _state["rank"], "world_size": _state["world"]})
        chrome.dump(path, trace.header, [*(chrome.slice_event(s, trace.base_ns) for s in trace.slices), *trace.other])
        raw.unlink()
        offset, uncertainty = _state["offset_start"]
        summary.update(file=str(path), realtime_offset_ns=offset, realtime_offset_uncertainty_ns=uncertainty,
                       realtime_offset_change_ns=realtime_offset(rec.now)[0] - offset)
        summary.update(record(rec, trace, offset, _state["world"]))
        summary["check"] = check(trace, offset, _state["checks"])
        summary["import_ns"] = rec.now() - t0
        if "error" in _state:
            summary["error"] = _state["error"]
    except Exception as e:  # noqa: BLE001 -- never fail the rank for this
        summary["error"] = f"{type(e).__name__}: {e}"
        print(f"dltrace: rank {_state.get('rank')}: could not import torch.profiler's trace: {e}",
              file=sys.stderr, flush=True)
    finally:
        rec.set_meta("device_activity", summary)


def check(trace: ChromeTrace, offset_ns: int, brackets: list[tuple[int, int]]) -> dict[str, Any]:
    """Where the imported ``dltrace.clock_check`` starts fall within our readings around them:
    ``min_after_ns`` (import - before) and ``min_before_ns`` (after - import) must both be
    >= 0; the alignment error lies in [-min_after_ns, min_before_ns]."""
    starts = sorted(s.start_ns - offset_ns for s in trace.slices if s.name == CHECK)
    pairs = list(zip(starts, sorted(brackets), strict=False))
    if not pairs:
        return {"pairs": 0}
    return {"pairs": len(pairs), "min_after_ns": min(t - b for t, (b, _) in pairs),
            "min_before_ns": min(a - t for t, (_, a) in pairs),
            "bracket_ns": max(a - b for _, (b, a) in pairs)}


# -- the import ---------------------------------------------------------------------------
class _Open:
    """A slice entered on a lane: its region, local times, and whether it is a collective
    (written whole when it closes, so it stays a leaf)."""

    def __init__(self, rid: int, start: int, end: int, s: Slice, collective: bool):
        self.rid, self.start, self.end, self.slice, self.collective = rid, start, end, s, collective

    def contains(self, start: int, end: int) -> bool:
        return self.start <= start and end <= self.end


class _Importer:
    def __init__(self, rec: Recorder, trace: ChromeTrace, offset_ns: int, world: int):
        self.rec, self.trace, self.offset, self.world = rec, trace, offset_ns, world
        self.info = trace.header.get("distributedInfo") or {}
        self.rids: dict[tuple[str, str], int] = {}
        self.counts = {"slices": 0, "kernels": 0, "collectives": 0, "streams": 0, "threads": 0,
                       "extra_lanes": 0}

    def track(self, track: kineto.Track) -> None:
        device = track.kind == kineto.ACCELERATOR_STREAM
        self.counts["streams" if device else "threads"] += 1
        base = track.name if device else f"torch.profiler {track.name}"
        kind = "accelerator_stream" if device else "timeline"
        lanes: list[tuple[int, list[_Open]]] = []
        for i in track.slices:
            s = self.trace.slices[i]
            start, end = s.start_ns - self.offset, s.end_ns - self.offset
            lane = self._fit(lanes, start, end)
            if lane is None:
                lane = (self.rec.named_loc(base if not lanes else f"{base} ({len(lanes) + 1})", kind), [])
                lanes.append(lane)
            coll = device and kineto.is_collective_kernel(s)
            key = (s.name, kineto.role(s, kineto.collective_op(s) if coll else None))
            rid = self.rids.get(key)
            if rid is None:
                rid = self.rids[key] = self.rec.region_id(s.name, Role(key[1]))
            if not coll:
                self.rec.enter_on(lane[0], rid, start)
            lane[1].append(_Open(rid, start, end, s, coll))
            self.counts["slices"] += 1
            self.counts["kernels"] += kineto.is_kernel(s)
            self.counts["collectives"] += coll
        for lane in lanes:
            while lane[1]:
                self._close(lane)
        self.counts["extra_lanes"] += max(0, len(lanes) - 1)

    def _fit(self, lanes: list[tuple[int, list[_Open]]], start: int, end: int) -> tuple[int, list[_Open]] | None:
        """The first lane where [start, end) nests, after closing there what ended before it."""
        for lane in lanes:
            stack = lane[1]
            while stack and not stack[-1].contains(start, end) and stack[-1].end <= start:
                self._close(lane)
            if not stack or (stack[-1].contains(start, end) and not stack[-1].collective):
                return lane
        return None

    def _close(self, lane: tuple[int, list[_Open]]) -> None:
        o = lane[1].pop()
        if not o.collective:
            self.rec.leave_on(lane[0], o.rid, o.end)
            return
        group = kineto.process_group(o.slice.args, self.info) or (DEFAULT_GROUP, list(range(self.world)))
        comm = self.rec.comm_id(f"device {group[0]}", tuple(group[1]))
        sent, recv = kineto.payload(o.slice.args)
        op = OPS.get(kineto.collective_op(o.slice) or "", Op.ALLTOALLV)
        self.rec.collective_interval(lane[0], o.rid, o.start, o.end, comm, op, -1, sent or 0, recv or 0)


def record(rec: Recorder, trace: ChromeTrace, offset_ns: int, world: int) -> dict[str, int]:
    """Write ``trace``'s slices into ``rec`` (times: Kineto's minus ``offset_ns``); returns counts."""
    importer = _Importer(rec, trace, offset_ns, world)
    tracks, _ = kineto.tracks(trace)
    for track in tracks:
        importer.track(track)
    return importer.counts
