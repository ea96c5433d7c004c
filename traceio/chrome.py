"""Chrome trace JSON, the format of chrome://tracing, Perfetto and PyTorch's profiler (Kineto):
read into slices with integer nanosecond times, and written back.

A file is a JSON object whose ``traceEvents`` list holds the events (or, in the older "array
format", just that list), gzipped or not. Times (``ts``, ``dur``) are microseconds, integers
or floats with nanosecond decimals; newer Kineto files give ``ts`` relative to the top-level
``baseTimeNanoseconds``. What :func:`load` makes of the events:

- ``ph: "X"`` (complete events) and ``B``/``E`` pairs (matched per ``pid``/``tid``, innermost
  first) become :class:`Slice` objects at ``base + ts`` nanoseconds, in file order. A ``B`` left
  open is closed at the last time seen on its track (``truncated``); an ``E`` without a ``B``
  and negative durations (clipped to zero) are counted in :attr:`ChromeTrace.stats`.
- Every other event (metadata ``M``, instants ``i``, flows ``s``/``f``, counters ``C``...) is
  kept verbatim in :attr:`ChromeTrace.other`, so a file can be written back unchanged.

Conversion is exact: ``ts`` x 1000 rounded to the nearest integer gives the nanoseconds
written, for floats below 2^43 us (101 days from the base), which Kineto's relative times are;
:func:`us` writes nanoseconds back so that :func:`to_ns` recovers them.
"""

from __future__ import annotations

import gzip
import json
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SUFFIXES = (".json", ".json.gz")
# keys of a slice event that :class:`Slice` holds in fields of its own
SLICE_KEYS = ("ph", "name", "cat", "pid", "tid", "ts", "dur", "args")


class ChromeTraceError(Exception):
    """The file is not readable Chrome trace JSON; the message names it."""


@dataclass
class Slice:
    """One complete event: a span of time on the track (``pid``, ``tid``)."""

    pid: Any
    tid: Any
    name: str
    cat: str | None
    start_ns: int  # base + ts, in ns
    end_ns: int
    args: dict[str, Any] | None = None
    extra: dict[str, Any] | None = None  # any other keys of the event, as written
    truncated: bool = False  # a ``B`` without its ``E``


@dataclass
class ChromeTrace:
    path: Path
    header: dict[str, Any]  # every top-level key but traceEvents, in file order
    base_ns: int  # baseTimeNanoseconds, 0 when absent
    slices: list[Slice] = field(default_factory=list)
    other: list[dict[str, Any]] = field(default_factory=list)
    stats: Counter[str] = field(default_factory=Counter)

    @property
    def events(self) -> int:
        return len(self.slices) + len(self.other) + self.stats["unmatched_end"]


def is_trace_file(path: Path) -> bool:
    return path.name.endswith(SUFFIXES)


def to_ns(us_value: int | float) -> int:
    """Microseconds as written -> integer nanoseconds (exact for Kineto's 3-decimal floats)."""
    if isinstance(us_value, int):
        return us_value * 1000
    return int(round(us_value * 1000))


def us(ns: int) -> int | float:
    """Integer nanoseconds -> the microsecond value to write: an integer when whole, else the
    float nearest to the decimal (which :func:`to_ns` reads back as ``ns``)."""
    q, r = divmod(ns, 1000)
    return q if r == 0 else ns / 1000


def read_json(path: Path) -> Any:
    """The parsed JSON of ``path`` (gzipped when its name ends in .gz)."""
    try:
        raw = Path(path).read_bytes()
        if path.name.endswith(".gz") or raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        return json.loads(raw)
    except (OSError, EOFError, gzip.BadGzipFile) as e:
        raise ChromeTraceError(f"cannot read {path}: {e}") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise ChromeTraceError(f"{path} is not valid JSON ({e}); is the file complete?") from None


def load(path: Path) -> ChromeTrace:
    """Read ``path`` into slices and verbatim other events (see the module docstring)."""
    path = Path(path)
    doc = read_json(path)
    if isinstance(doc, list):
        header: dict[str, Any] = {}
        events = doc
    elif isinstance(doc, dict) and isinstance(doc.get("traceEvents"), list):
        header = {k: v for k, v in doc.items() if k != "traceEvents"}
        events = doc["traceEvents"]
    else:
        raise ChromeTraceError(f"{path} holds no traceEvents list; it is not a Chrome trace "
                               "(torch.profiler's export_chrome_trace or tensorboard_trace_handler writes one)")
    base = header.get("baseTimeNanoseconds")
    trace = ChromeTrace(path, header, int(base) if isinstance(base, int | float) else 0)
    open_: dict[tuple[Any, Any], list[dict[str, Any]]] = {}
    last: dict[tuple[Any, Any], int] = {}
    for e in events:
        if not isinstance(e, dict):
            trace.stats["not_an_object"] += 1
            continue
        ph = e.get("ph")
        if ph not in ("X", "B", "E"):
            trace.other.append(e)
            continue
        ts = e.get("ts")
        if isinstance(ts, bool) or not isinstance(ts, int | float):
            trace.stats["slice_without_ts"] += 1
            trace.other.append(e)
            continue
        t = trace.base_ns + to_ns(ts)
        track = (e.get("pid"), e.get("tid"))
        last[track] = max(last.get(track, t), t)
        if ph == "X":
            dur = e.get("dur", 0)
            d = to_ns(dur) if isinstance(dur, int | float) and not isinstance(dur, bool) else 0
            if d < 0:
                trace.stats["negative_duration_clipped"] += 1
                d = 0
            last[track] = max(last[track], t + d)
            trace.slices.append(_slice(e, t, t + d))
        elif ph == "B":
            open_.setdefault(track, []).append(e)
        else:
            stack = open_.get(track)
            if not stack:
                trace.stats["unmatched_end"] += 1
                continue
            b = stack.pop()
            start = trace.base_ns + to_ns(b["ts"])
            args = {**(b.get("args") or {}), **(e.get("args") or {})} or None
            trace.slices.append(_slice({**b, "args": args}, start, t))
    for track, stack in open_.items():
        for b in stack:
            s = _slice(b, trace.base_ns + to_ns(b["ts"]), last[track])
            s.truncated = True
            trace.stats["unclosed_begin"] += 1
            trace.slices.append(s)
    return trace


def _slice(e: dict[str, Any], start: int, end: int) -> Slice:
    extra = {k: v for k, v in e.items() if k not in SLICE_KEYS}
    args = e.get("args")
    return Slice(e.get("pid"), e.get("tid"), str(e.get("name", "")), e.get("cat"), start, end,
                 args if isinstance(args, dict) else None, extra or None)


def slice_event(s: Slice, base_ns: int) -> dict[str, Any]:
    """``s`` as a complete (``X``) event with times relative to ``base_ns``."""
    e: dict[str, Any] = {"ph": "X"}
    if s.cat is not None:
        e["cat"] = s.cat
    e.update(name=s.name, pid=s.pid, tid=s.tid, ts=us(s.start_ns - base_ns), dur=us(s.end_ns - s.start_ns))
    if s.args is not None:
        e["args"] = s.args
    if s.extra:
        e.update(s.extra)
    return e


DUMP_BATCH = 20_000  # events encoded and written at a time


class Encoded(str):
    """Events already encoded as JSON (as :func:`json.dumps` writes them) and joined by ", ",
    which :func:`dump` writes as they are, in their place among the others."""


def _batches(items: Iterable[dict[str, Any] | Encoded], n: int) -> Iterator[list[dict[str, Any]] | Encoded]:
    """Runs of at most ``n`` events to encode, and the :class:`Encoded` pieces between them."""
    batch: list[dict[str, Any]] = []
    for item in items:
        if isinstance(item, Encoded):
            if batch:
                yield batch
                batch = []
            if item:
                yield item
            continue
        batch.append(item)
        if len(batch) == n:
            yield batch
            batch = []
    if batch:
        yield batch


def dump(path: Path, header: dict[str, Any], events: Iterable[dict[str, Any] | Encoded]) -> Path:
    """Write ``{**header, "traceEvents": events}`` to ``path``, gzipped when it ends in .gz
    (deterministically: no time stamp or name in the gzip header). Events are written as they
    come, a batch at a time, so an iterator of a long run's events is never held whole; an
    :class:`Encoded` item is events already encoded."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    # json's default separators: Holistic Trace Analysis finds a file's rank with the pattern
    # '"rank":\s+(\d+)', which needs the space after the colon
    head = json.dumps({k: v for k, v in header.items() if k != "traceEvents"})
    head = (head[:-1] + ", " if len(head) > 2 else "{") + '"traceEvents": ['
    try:
        with open(tmp, "wb") as raw:
            out = gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=6) \
                if path.name.endswith(".gz") else raw
            try:
                out.write(head.encode())
                first = True
                for batch in _batches(events, DUMP_BATCH):
                    # a list's JSON is its items' joined by ", ": one call of the C encoder a batch
                    text = batch if isinstance(batch, Encoded) else json.dumps(batch)[1:-1]
                    out.write(((", " if not first else "") + text).encode())
                    first = False
                out.write(b"]}")
            finally:
                if out is not raw:
                    out.close()
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    tmp.replace(path)
    return path
