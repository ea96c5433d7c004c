"""Clocks: the host clock every rank records with, and offset measurement against a reference.

Every rank timestamps with its host's CLOCK_MONOTONIC in nanoseconds. Ranks on different
hosts have unrelated clocks, so each rank measures its offset to one reference clock at start
and at end: a few UDP ping-pongs to a :class:`ClockServer`, keeping the sample with the
smallest round trip (the true offset lies within half of it). The merge stores both samples
as OTF2 ClockOffset records, and OTF2 readers interpolate linearly between them, which also
corrects a constant drift.

The reference is the launcher's clock when ``instrument run`` starts the ranks (it runs the
server), otherwise rank 0's (its tracer starts the server and publishes the address in the
shared run directory). UDP rather than the framework's process group: the measurement must
work for any framework, before the process group exists and after a peer rank died, without
risking a hang in a collective.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

_PING = struct.Struct("<Q")  # request id
_PONG = struct.Struct("<Qq")  # request id, server time ns


class Clock(Protocol):
    def now(self) -> int:
        """Current time in integer nanoseconds."""
        ...


class HostClock:
    """CLOCK_MONOTONIC in nanoseconds (what ``time.perf_counter_ns`` reads on Linux)."""

    now = staticmethod(time.perf_counter_ns)


@dataclass(frozen=True)
class OffsetSample:
    """``reference_time = local_time + offset_ns``, measured at ``local_ns``."""

    local_ns: int
    offset_ns: int
    rtt_ns: int

    def as_dict(self) -> dict[str, int]:
        return {"local_ns": self.local_ns, "offset_ns": self.offset_ns, "rtt_ns": self.rtt_ns}


class ClockServer:
    """Answers each UDP datagram with the current reference time; runs in a daemon thread."""

    def __init__(self, host: str = "0.0.0.0", port: int = 0, clock: Clock | None = None):
        self._clock = clock or HostClock()
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._sock.bind((host, port))
        self._sock.settimeout(0.2)
        self.port = self._sock.getsockname()[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="dltrace-clock", daemon=True)

    def start(self) -> ClockServer:
        self._thread.start()
        return self

    def _serve(self) -> None:
        now = self._clock.now
        while not self._stop.is_set():
            try:
                data, addr = self._sock.recvfrom(64)
            except TimeoutError:
                continue
            except OSError:
                return
            if len(data) == _PING.size:
                (req,) = _PING.unpack(data)
                with contextlib.suppress(OSError):
                    self._sock.sendto(_PONG.pack(req, now()), addr)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=1)
        self._sock.close()


def measure_offset(
    address: tuple[str, int],
    clock: Clock | None = None,
    rounds: int = 20,
    timeout_s: float = 0.25,
) -> OffsetSample | None:
    """Ping the clock server ``rounds`` times; return the minimum-round-trip sample.

    Returns None when no answer arrives (server gone, network blocked): the caller records
    that the clock was not aligned instead of failing.
    """
    now = (clock or HostClock()).now
    best: OffsetSample | None = None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(timeout_s)
        for req in range(rounds):
            t0 = now()
            try:
                sock.sendto(_PING.pack(req), address)
                while True:
                    data = sock.recv(64)
                    if len(data) == _PONG.size and _PONG.unpack(data)[0] == req:
                        break
            except OSError:  # includes timeouts
                continue
            t1 = now()
            server_ns = _PONG.unpack(data)[1]
            mid = (t0 + t1) // 2
            sample = OffsetSample(local_ns=mid, offset_ns=server_ns - mid, rtt_ns=t1 - t0)
            if best is None or sample.rtt_ns < best.rtt_ns:
                best = sample
    return best


def realtime_offset(mono: Callable[[], int], real: Callable[[], int] = time.time_ns,
                    tries: int = 20) -> tuple[int, int]:
    """(``CLOCK_REALTIME - mono`` in ns, uncertainty in ns): the tightest of ``tries``
    realtime-mono-realtime readings."""
    best: tuple[int, int] | None = None
    for _ in range(tries):
        r0 = real()
        m = mono()
        r1 = real()
        if best is None or r1 - r0 < best[1]:
            best = ((r0 + r1) // 2 - m, r1 - r0)
    assert best is not None
    return best


def parse_address(text: str) -> tuple[str, int]:
    """``host:port`` -> (host, port)."""
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"clock server address must be host:port, got {text!r}")
    return host, int(port)
