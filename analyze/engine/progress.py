"""Progress of long work on stderr: one redrawn line on a terminal; in a log (stderr a file
or pipe, as in a Slurm job) a plain line every :data:`LOG_EVERY` seconds of a stage that runs
that long. Silent for work that ends sooner (half a second on a terminal)."""

from __future__ import annotations

import os
import time

LOG_EVERY = 30.0  # seconds between the lines of a stage in a log


class Progress:
    """``label: 45% (4.5M of 10.0M events, 3.1M/s)``, redrawn at most five times a second on a
    terminal; written as a line of its own every :data:`LOG_EVERY` seconds elsewhere."""

    def __init__(self, label: str, total: int = 0, unit: str = "events", stderr: int | None = None):
        self.label = label
        self.total = total
        self.unit = unit
        self.done = 0
        self._t0 = time.monotonic()
        self._drawn = 0.0
        self._fd = os.dup(stderr) if stderr is not None else None
        self._tty = self._fd is not None and os.isatty(self._fd)

    @staticmethod
    def stderr() -> int | None:
        """A duplicate of stderr, to write on later: taken before anything captures stderr
        (the OTF2 library's messages are captured while reading). None if it is closed."""
        try:
            return os.dup(2)
        except OSError:
            return None

    def add(self, n: int) -> None:
        self.done += n
        now = time.monotonic()
        if self._fd is None:
            return
        if self._tty:
            if now - self._t0 < 0.5 or now - self._drawn < 0.2:
                return
        elif now - max(self._t0, self._drawn) < LOG_EVERY:
            return
        self._drawn = now
        share = f"{100 * self.done / self.total:3.0f}% " if self.total else ""
        if self.unit == "events":
            what = (f"{self.done / 1e6:.1f}M of {self.total / 1e6:.1f}M events, "
                    f"{self.done / (now - self._t0) / 1e6:.1f}M/s")
        else:
            what = f"{self.done} of {self.total} {self.unit}"
        line = f"{self.label}: {share}({what})"
        os.write(self._fd, f"\r\x1b[K{line}".encode() if self._tty else f"{line}\n".encode())

    def close(self) -> None:
        if self._fd is not None:
            if self._drawn and self._tty:
                os.write(self._fd, b"\r\x1b[K")
            elif self._drawn:  # a log that has this stage's lines: say when it ended
                os.write(self._fd, f"{self.label}: done in {time.monotonic() - self._t0:.0f} s\n".encode())
            os.close(self._fd)
            self._fd = None
