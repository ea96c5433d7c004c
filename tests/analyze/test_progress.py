"""The progress of a long stage: redrawn on a terminal, a plain line now and then in a log."""

from __future__ import annotations

import os
import pty

import pytest

from analyze.engine import progress as mod


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def written(fd: int) -> bytes:
    os.set_blocking(fd, False)
    out = b""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except (BlockingIOError, OSError):
            return out
        if not chunk:
            return out
        out += chunk


def run(fd: int, clock: Clock, seconds: list[float]) -> None:
    p = mod.Progress("reading traces.otf2", 10_000_000, "events", fd)
    for s in seconds:
        clock.t = 1000.0 + s
        p.add(1_000_000)
    p.close()


def test_a_log_gets_a_line_every_log_every_seconds_of_a_long_stage(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    monkeypatch.setattr(mod.time, "monotonic", clock)
    r, w = os.pipe()
    run(w, clock, [1, 20, 31, 45, 62, 70])  # lines at 31 s and 62 s (30 s after the one before)
    assert written(r).decode().splitlines() == [
        "reading traces.otf2:  30% (3.0M of 10.0M events, 0.1M/s)",
        "reading traces.otf2:  50% (5.0M of 10.0M events, 0.1M/s)",
        "reading traces.otf2: done in 70 s"]
    run(w, clock, [0.6, 5, 29])  # a stage shorter than LOG_EVERY: nothing in the log
    assert written(r) == b""
    os.close(r)
    os.close(w)


def test_a_terminal_gets_one_line_redrawn_and_erased(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    monkeypatch.setattr(mod.time, "monotonic", clock)
    master, slave = pty.openpty()
    run(slave, clock, [0.1, 0.6, 0.7, 0.9])  # drawn at 0.6 and 0.9 s (0.2 s apart at most 5 a second)
    out = written(master)
    assert out.count(b"\r\x1b[K") == 3 and out.endswith(b"\r\x1b[K") and b"\n" not in out
    assert b"reading traces.otf2:  20% (2.0M of 10.0M events, 3.3M/s)" in out
    os.close(master)
    os.close(slave)
