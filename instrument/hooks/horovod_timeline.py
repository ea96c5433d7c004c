"""Horovod's own timeline (``HOROVOD_TIMELINE``) imported into the run, on the run's clock.

What Horovod writes. The coordinator (rank 0) writes Chrome-trace JSON from a writer thread:
one "process" (``pid``) per tensor, named by a ``process_name`` metadata record; per tensor,
``B``/``E`` pairs for the negotiation (``NEGOTIATE_ALLREDUCE``: from the first rank's request
until every rank has asked for the tensor) and then the operation (``ALLREDUCE``,
``BROADCAST``...) with its activities nested inside (CPU/Gloo: ``MEMCPY_IN_FUSION_BUFFER``,
``GLOO_ALLREDUCE``, ``MEMCPY_OUT_FUSION_BUFFER``; GPUs add ``QUEUE``, ``WAIT_FOR_DATA``...).
``X`` records of zero length mark each rank's readiness during negotiation, ``i`` records
the background thread's cycles (``HOROVOD_TIMELINE_MARK_CYCLES=1``). Times (``ts``) are
microseconds since the timeline started, on ``std::chrono::steady_clock``. The file goes
through a buffered stream and is complete only once Horovod stops the timeline or shuts down;
a rank that dies leaves it truncated mid-record and without its closing bracket.
:func:`parse` reads whatever prefix is complete and closes still-open activities at the last
time seen.

Clock alignment. The only absolute time in the file is pid 0's
``start_time_since_epoch_in_micros``: Horovod reads ``system_clock`` (CLOCK_REALTIME) and
``steady_clock`` one after the other when the timeline starts and stores the wall-clock time
of the start. An event therefore happened at wall-clock ``start + ts`` microseconds. Our
records use CLOCK_MONOTONIC (``time.perf_counter_ns``), so we measure, in rank 0, the offset
``CLOCK_REALTIME - CLOCK_MONOTONIC`` (best of 20 back-to-back readings, uncertainty well under
1 us) and subtract it. Both clocks are slewed alike by NTP, so the offset is constant unless
the wall clock is stepped; it is measured at start and at import and the change is recorded.
The error budget is the file's microsecond resolution: ``ts`` and the start time are both
truncated to whole microseconds, so an imported time is within about -2..+1 us of the true
one. The imported intervals are then rank 0's local times and get rank 0's clock offsets in
the merge like every other rank-0 record, i.e. they land on the run's reference clock.

Measured check. Rank 0's hooks note, per tensor name, when Python enqueued each operation and
when it saw it complete. The operation's top-level activity (``ALLREDUCE``) cannot start
before rank 0 enqueued it, and it ends (Horovod writes ``E``) before the completion callback
that lets ``synchronize`` return. With the alignment error ``e``, the smallest observed
margins ``s1 = min(op start - enqueue)`` and ``s2 = min(completion - op end)`` bound it:
``-s2 <= e <= s1``. Both margins and the bound are stored in run metadata
(``extra.horovod_timeline.check``); docs/horovod.md quotes measured values.

Layout in the trace (extra locations of rank 0, kind ``timeline``): one location per tensor,
``horovod <tensor>``, with its negotiations and operations (region names
``horovod.NEGOTIATE_ALLREDUCE``, ``horovod.ALLREDUCE``...), and ``horovod activities`` with
what the background thread did: the activities of tensors fused into one operation are one
interval (from the first tensor's begin to the last tensor's end), since the thread performs
a fused operation once for all of them.

Cost: with ``HOROVOD_TIMELINE`` set, Horovod's writer thread polls its queue without sleeping,
and we measured about one extra core busy on rank 0 (and most of one on other ranks). The
timeline is therefore off unless asked for: ``DLTRACE_HOROVOD_TIMELINE=1`` (or set
``HOROVOD_TIMELINE`` to a file yourself).
"""

from __future__ import annotations

import bisect
import functools
import json
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from instrument.tracer.clock import realtime_offset
from instrument.tracer.recorder import Recorder
from traceio.records import Role

OPT_IN = "DLTRACE_HOROVOD_TIMELINE"
FILE_NAME = "horovod-timeline.json"
FLUSH_TIMEOUT_S = 5.0
# Horovod values of HOROVOD_TIMELINE that are not a file
_NOT_FILES = ("", "DYNAMIC", "DISABLED")
# Frameworks whose Horovod module can stop (flush and close) the timeline
_FRAMEWORKS = ("horovod.torch", "horovod.tensorflow")


@dataclass(frozen=True)
class Activity:
    """One ``B``/``E`` pair of a tensor; times in microseconds since the timeline start."""

    tensor: str
    name: str
    start_us: int
    end_us: int
    depth: int  # 0: negotiation or operation; 1: an activity inside the operation
    closed: bool = True  # False: still open where the file ends


@dataclass
class Timeline:
    start_epoch_us: int | None = None
    activities: list[Activity] = field(default_factory=list)
    # (tensor, rank, us): the coordinator has rank's request for tensor (uncached negotiations)
    ready: list[tuple[str, int, int]] = field(default_factory=list)
    records: int = 0
    truncated: bool = False  # the file does not end with a complete JSON array
    unmatched_ends: int = 0

    @property
    def unclosed(self) -> int:
        return sum(not a.closed for a in self.activities)


# -- parsing ------------------------------------------------------------------------------
def _records(text: str) -> tuple[Iterator[dict[str, Any]], list[bool]]:
    """The JSON objects of a possibly unterminated array, and a flag set if it was cut."""
    cut = [False]
    stripped = text.rstrip()
    if stripped.endswith("]"):
        try:
            whole = json.loads(stripped)
            if isinstance(whole, list):
                return iter(r for r in whole if isinstance(r, dict)), cut
        except json.JSONDecodeError:
            pass

    def incremental() -> Iterator[dict[str, Any]]:
        decoder = json.JSONDecoder()
        i, n = 0, len(text)
        while True:
            while i < n and text[i] in " \t\r\n,[]":
                i += 1
            if i >= n:
                cut[0] = not stripped.endswith("]")
                return
            try:
                obj, i = decoder.raw_decode(text, i)
            except json.JSONDecodeError:
                cut[0] = True
                return
            if isinstance(obj, dict):
                yield obj

    return incremental(), cut


def parse(text: str) -> Timeline:
    """A timeline from the text of a HOROVOD_TIMELINE file (complete or truncated)."""
    tl = Timeline()
    names: dict[int, str] = {}
    stacks: dict[int, list[tuple[str, int]]] = defaultdict(list)
    last = 0
    records, cut = _records(text)
    for r in records:
        tl.records += 1
        ph, pid, ts = r.get("ph"), r.get("pid", 0), r.get("ts")
        if ph == "M":
            args = r.get("args") or {}
            if r.get("name") == "process_name":
                if "start_time_since_epoch_in_micros" in args:
                    tl.start_epoch_us = int(args["start_time_since_epoch_in_micros"])
                elif "name" in args:
                    names[pid] = str(args["name"])
            continue
        if not isinstance(ts, int | float):
            continue
        ts = int(ts)
        last = max(last, ts)
        if ph == "B":
            stacks[pid].append((str(r.get("name", "?")), ts))
        elif ph == "X" and str(r.get("name", "")).isdigit():
            tl.ready.append((names.get(pid, f"pid {pid}"), int(r["name"]), ts))
        elif ph == "E":
            stack = stacks[pid]
            if not stack:
                tl.unmatched_ends += 1
                continue
            name, start = stack.pop()
            tl.activities.append(Activity(names.get(pid, f"pid {pid}"), name, start, ts, len(stack)))
    for pid, stack in stacks.items():
        for depth, (name, start) in enumerate(stack):
            tl.activities.append(Activity(names.get(pid, f"pid {pid}"), name, start, last, depth,
                                          closed=False))
    tl.truncated = cut[0]
    return tl


def read(path: Path) -> Timeline:
    return parse(Path(path).read_text(errors="replace"))


# -- clock alignment ----------------------------------------------------------------------
def to_local_ns(us: int, start_epoch_us: int, offset_ns: int) -> int:
    """Timeline microseconds -> our clock's nanoseconds (``offset_ns``: realtime - ours)."""
    return (start_epoch_us + us) * 1000 - offset_ns


# -- layout -------------------------------------------------------------------------------
Span = tuple[str, int, int]  # (activity name, start, end)


def first_fit(spans: list[Span]) -> list[list[Span]]:
    """Spans -> lanes of non-overlapping spans, each in time order (first lane that is free)."""
    lanes: list[list[Span]] = []
    for span in sorted(spans, key=lambda s: (s[1], -s[2])):
        lane = next((ln for ln in lanes if ln[-1][2] <= span[1]), None)
        if lane is None:
            lanes.append([span])
        else:
            lane.append(span)
    return lanes


def fused(spans: list[Span]) -> list[Span]:
    """Merge overlapping spans of the same activity: the tensors of one fused operation each
    get their own ``B``/``E`` a microsecond or so apart, for one piece of work."""
    out: list[Span] = []
    for name, start, end in sorted(spans, key=lambda s: (s[1], s[2])):
        if out and out[-1][0] == name and start <= out[-1][2]:
            out[-1] = (name, out[-1][1], max(out[-1][2], end))
        else:
            out.append((name, start, end))
    return out


def layout(tl: Timeline, offset_ns: int) -> dict[str, list[list[Span]]]:
    """Location name -> lanes of spans in our clock's ns: one location per tensor (top-level
    activities) and ``horovod activities`` (nested activities, fused operations merged)."""
    if tl.start_epoch_us is None:
        raise ValueError("the timeline has no start time (pid 0 metadata missing)")
    per_tensor: dict[str, list[Span]] = {}
    inner: list[Span] = []
    for a in tl.activities:
        span = (a.name, to_local_ns(a.start_us, tl.start_epoch_us, offset_ns),
                to_local_ns(a.end_us, tl.start_epoch_us, offset_ns))
        if a.depth == 0:
            per_tensor.setdefault(a.tensor, []).append(span)
        else:
            inner.append(span)
    out = {f"horovod {tensor}": first_fit(spans) for tensor, spans in per_tensor.items()}
    if inner:
        out["horovod activities"] = first_fit(fused(inner))
    return out


# -- the alignment check ------------------------------------------------------------------
class Observed:
    """Rank 0's enqueue and completion times per Horovod tensor name (bounded)."""

    def __init__(self, limit: int = 200_000):
        self.enabled = False
        self.limit = limit
        self.count = 0
        self.by_name: dict[str, list[tuple[int, int]]] = defaultdict(list)

    def add(self, tensor: str, issued: int, done: int) -> None:
        if self.enabled and self.count < self.limit:
            self.count += 1
            self.by_name[tensor].append((issued, done))


OBSERVED = Observed()


def check(tl: Timeline, offset_ns: int, observed: Observed) -> dict[str, Any]:
    """Margins between rank 0's enqueue/completion and the timeline (see the module
    docstring). An operation starts, and the coordinator registers rank 0's request (a ``X``
    mark), only after rank 0 enqueued it; it ends before rank 0 can see it complete. So
    ``-min_end_margin_ns <= alignment error <= min(min_start_margin_ns, min_ready_margin_ns)``.
    The k-th enqueue of a tensor name pairs with its k-th operation in the timeline."""
    assert tl.start_epoch_us is not None
    at = functools.partial(to_local_ns, start_epoch_us=tl.start_epoch_us, offset_ns=offset_ns)
    ops: dict[str, list[Activity]] = defaultdict(list)
    for a in tl.activities:
        if a.depth == 0 and a.closed and not a.name.startswith("NEGOTIATE"):
            ops[a.tensor].append(a)
    for tensor_ops in ops.values():
        tensor_ops.sort(key=lambda x: x.start_us)
    op_starts = {tensor: [a.start_us for a in tensor_ops] for tensor, tensor_ops in ops.items()}
    starts: list[int] = []
    ends: list[int] = []
    for tensor, times in observed.by_name.items():
        for (issued, done), a in zip(times, ops.get(tensor, []), strict=False):
            starts.append(at(a.start_us) - issued)
            ends.append(done - at(a.end_us))
    ready: list[int] = []
    for tensor, rank, us in tl.ready:
        times = observed.by_name.get(tensor, [])
        k = bisect.bisect_left(op_starts.get(tensor, []), us)  # the operation it negotiates
        if rank == 0 and k < len(times):
            ready.append(at(us) - times[k][0])
    if not starts:
        return {"pairs": 0}
    out = {"pairs": len(starts), "min_start_margin_ns": min(starts), "min_end_margin_ns": min(ends),
           "median_start_margin_ns": sorted(starts)[len(starts) // 2],
           "median_end_margin_ns": sorted(ends)[len(ends) // 2]}
    if ready:
        out.update(ready_pairs=len(ready), min_ready_margin_ns=min(ready))
    return out


# -- import -------------------------------------------------------------------------------
def import_timeline(rec: Recorder, tl: Timeline, offset_ns: int) -> dict[str, int]:
    """Write ``tl`` into ``rec`` as named locations of kind ``timeline``; returns counts."""
    intervals = 0
    lanes_total = 0
    rids: dict[str, int] = {}
    for loc_name, lanes in layout(tl, offset_ns).items():
        for i, lane in enumerate(lanes):
            loc = rec.named_loc(loc_name if i == 0 else f"{loc_name} ({i + 1})", kind="timeline")
            lanes_total += 1
            for name, start, end in lane:
                rid = rids.get(name)
                if rid is None:
                    role = Role.WAIT if name.startswith("NEGOTIATE") else Role.FUNCTION
                    rid = rids[name] = rec.region_id(f"horovod.{name}", role)
                rec.interval(loc, rid, start, end)
                intervals += 1
    return {"locations": lanes_total, "intervals": intervals}


_requested: dict[str, Any] = {}


def request(env: MutableMapping[str, str], run_dir: Path, rank: int,
            mono: Callable[[], int] = time.perf_counter_ns) -> Path | None:
    """In every rank before the script runs: with ``DLTRACE_HOROVOD_TIMELINE=1``, point
    ``HOROVOD_TIMELINE`` into the run directory (every rank must have it set alike; only the
    coordinator writes). Returns the file rank 0 will import, if any."""
    if env.get(OPT_IN) == "1" and not env.get("HOROVOD_TIMELINE"):
        env["HOROVOD_TIMELINE"] = str(Path(run_dir) / FILE_NAME)
    value = env.get("HOROVOD_TIMELINE", "")
    if rank != 0 or value in _NOT_FILES:
        return None
    _requested.update(path=Path(value), offset=realtime_offset(mono), mono=mono, done=False)
    OBSERVED.enabled = True
    return _requested["path"]


def stop_horovod_timeline(timeout_s: float = FLUSH_TIMEOUT_S) -> bool:
    """Ask Horovod to flush and close its timeline file; False if that did not finish in time
    (a stuck writer thread must not hang the rank's exit)."""
    for name in _FRAMEWORKS:
        module = sys.modules.get(name)
        if module is None or not hasattr(module, "stop_timeline"):
            continue
        try:
            if not module.is_initialized():
                continue
        except Exception:  # noqa: BLE001 -- a half-loaded framework: nothing to flush
            continue
        t = threading.Thread(target=module.stop_timeline, name="dltrace-hvd-timeline", daemon=True)
        t.start()
        t.join(timeout_s)
        if t.is_alive():
            return False
    return True


def import_at_exit(rec: Recorder) -> None:
    """Rank 0 at the end of the run: flush Horovod's timeline and import it into ``rec``.
    Problems are reported in the run metadata and on stderr; they never fail the rank."""
    if not _requested or _requested.get("done"):
        return
    _requested["done"] = True
    path: Path = _requested["path"]
    summary: dict[str, Any] = {"file": str(path)}
    try:
        summary["flushed"] = stop_horovod_timeline()
        if not path.exists():
            summary["error"] = "no timeline file (Horovod was not initialized?)"
            return
        tl = read(path)
        offset, uncertainty = realtime_offset(_requested["mono"])
        summary.update(records=tl.records, activities=len(tl.activities), truncated=tl.truncated,
                       unclosed=tl.unclosed, realtime_offset_ns=offset,
                       realtime_offset_uncertainty_ns=uncertainty,
                       realtime_offset_change_ns=offset - _requested["offset"][0])
        if tl.start_epoch_us is None:
            summary["error"] = "no start time in the file (cut before its first record)"
        else:
            summary.update(import_timeline(rec, tl, offset))
            summary["check"] = check(tl, offset, OBSERVED)
    except (OSError, ValueError) as e:
        summary["error"] = str(e)
        print(f"dltrace: could not import Horovod's timeline {path}: {e}", file=sys.stderr, flush=True)
    finally:
        rec.set_meta("horovod_timeline", summary)
