"""Who supplies the begin and end times of a communication operation.

On CPUs (gloo, MPI, Horovod's CPU ops) the host clock at issue and at completion is the truth:
:class:`HostTimer`. On GPUs, NCCL collectives and kernels run asynchronously on streams, so
host timestamps only measure launches; there the times must come from CUDA events recorded
on the collective's stream, converted to the host clock: :class:`CudaEventTimer` with a
:class:`DeviceClockConverter`.

The tracer only talks to the :class:`OpTimer` interface, so a device clock can be plugged in
without touching the hooks. The conversion arithmetic is tested with injected fake events;
the CUDA path itself has not been run (no GPU on our machines) -- see docs/how-it-works.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from instrument.tracer.clock import Clock, HostClock


class OpTimer(Protocol):
    def begin(self, stream: Any = None) -> Any:
        """Mark the issue of an operation; returns a token."""
        ...

    def end(self, token: Any, stream: Any = None) -> Any:
        """Mark the completion point (host: now; device: an event queued on ``stream``)."""
        ...

    def resolve(self, token: Any) -> tuple[int, int] | None:
        """(begin_ns, end_ns) on the host clock, or None while the device is not done yet."""
        ...


class HostTimer:
    """Host timestamps: correct where the host observes completion (gloo, MPI on CPU)."""

    def __init__(self, clock: Clock | None = None):
        self._now = (clock or HostClock()).now

    def begin(self, stream: Any = None) -> list[int]:
        return [self._now(), -1]

    def end(self, token: list[int], stream: Any = None) -> list[int]:
        token[1] = self._now()
        return token

    def resolve(self, token: list[int]) -> tuple[int, int] | None:
        return (token[0], token[1]) if token[1] >= 0 else None


class DeviceEvent(Protocol):
    """The part of ``torch.cuda.Event`` the converter uses."""

    def query(self) -> bool: ...

    def elapsed_time(self, end_event: Any) -> float: ...  # milliseconds


@dataclass
class DeviceClockConverter:
    """Maps device events to host nanoseconds through calibration points.

    A calibration point is a device event known to have completed at host time ``host_ns``
    (recorded, then synchronized, with the host clock read right after). An event's host
    time is ``host_ns + elapsed_ms * 1e6`` from the nearest earlier calibration point; with two
    or more points, the device-to-host rate is fitted from the last two, which removes a
    constant drift between the two clocks.
    """

    points: list[tuple[int, Any]] = field(default_factory=list)  # (host_ns, device event)

    def add_point(self, host_ns: int, event: Any) -> None:
        self.points.append((host_ns, event))

    def _rate(self) -> float:
        if len(self.points) < 2:
            return 1.0
        (h0, e0), (h1, e1) = self.points[-2], self.points[-1]
        dev_ns = e0.elapsed_time(e1) * 1e6
        return (h1 - h0) / dev_ns if dev_ns > 0 else 1.0

    def to_host_ns(self, event: Any) -> int:
        if not self.points:
            raise RuntimeError("device clock has no calibration point yet")
        rate = self._rate()
        base_host, base_event = self.points[0]
        for host_ns, ev in self.points:
            # the latest calibration point not after the event
            if ev.elapsed_time(event) >= 0:
                base_host, base_event = host_ns, ev
        return base_host + round(base_event.elapsed_time(event) * 1e6 * rate)


class CudaEventTimer:
    """CUDA events on the collective's stream, converted to host time (unverified: no GPU here).

    ``event_factory`` makes timing-enabled events (``torch.cuda.Event(enable_timing=True)``);
    ``synchronize`` waits for one event. Both are injected so the logic runs in tests without
    a GPU.
    """

    def __init__(
        self,
        event_factory: Callable[[], Any],
        synchronize: Callable[[Any], None],
        clock: Clock | None = None,
        recalibrate_ns: int = 10_000_000_000,
    ):
        self._make = event_factory
        self._sync = synchronize
        self._now = (clock or HostClock()).now
        self._recalibrate_ns = recalibrate_ns
        self.converter = DeviceClockConverter()
        self._last_calibration = -(1 << 62)

    def calibrate(self, stream: Any = None) -> None:
        ev = self._make()
        ev.record(stream) if stream is not None else ev.record()
        self._sync(ev)
        self.converter.add_point(self._now(), ev)
        self._last_calibration = self.converter.points[-1][0]

    def _record(self, stream: Any) -> Any:
        ev = self._make()
        ev.record(stream) if stream is not None else ev.record()
        return ev

    def begin(self, stream: Any = None) -> list[Any]:
        if self._now() - self._last_calibration > self._recalibrate_ns:
            self.calibrate(stream)
        return [self._record(stream), None]

    def end(self, token: list[Any], stream: Any = None) -> list[Any]:
        token[1] = self._record(stream)
        return token

    def resolve(self, token: list[Any]) -> tuple[int, int] | None:
        begin, end = token
        if end is None or not end.query():
            return None
        return self.converter.to_host_ns(begin), self.converter.to_host_ns(end)
