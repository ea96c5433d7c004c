"""One progress line on the terminal (stderr) for long work: silent when stderr is not a
terminal or the work ends within half a second."""

from __future__ import annotations

import os
import time


class Progress:
    """``label: 45% (4.5M of 10.0M events, 3.1M/s)``, redrawn at most five times a second."""

    def __init__(self, label: str, total: int = 0, unit: str = "events", terminal: int | None = None):
        self.label = label
        self.total = total
        self.unit = unit
        self.done = 0
        self._t0 = time.monotonic()
        self._drawn = 0.0
        self._fd = os.dup(terminal) if terminal is not None else None

    @staticmethod
    def terminal() -> int | None:
        """A duplicate of stderr if it is a terminal, to draw on later: taken before anything
        captures stderr (the OTF2 library's messages are captured while reading)."""
        return os.dup(2) if os.isatty(2) else None

    def add(self, n: int) -> None:
        self.done += n
        now = time.monotonic()
        if self._fd is None or now - self._t0 < 0.5 or now - self._drawn < 0.2:
            return
        self._drawn = now
        share = f"{100 * self.done / self.total:3.0f}% " if self.total else ""
        if self.unit == "events":
            what = (f"{self.done / 1e6:.1f}M of {self.total / 1e6:.1f}M events, "
                    f"{self.done / (now - self._t0) / 1e6:.1f}M/s")
        else:
            what = f"{self.done} of {self.total} {self.unit}"
        os.write(self._fd, f"\r\x1b[K{self.label}: {share}({what})".encode())

    def close(self) -> None:
        if self._fd is not None:
            if self._drawn:
                os.write(self._fd, b"\r\x1b[K")
            os.close(self._fd)
            self._fd = None
