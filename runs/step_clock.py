"""Per-step losses and wall times, printed the same way by every example (PyTorch and TensorFlow).

Rank 0 prints each step's loss at full precision (for comparing runs bit for bit), the mean
step time without the first step, and the list of losses; ``DLTRACE_EXAMPLE_RESULT`` names a
JSON file to write them to (the tests and ``instrument sweep`` read it).
"""

from __future__ import annotations

import json
import os
import time


class StepClock:
    """Per-step losses and wall times, printed as the PyTorch examples print them."""

    def __init__(self, rank: int):
        self.rank = rank
        self.losses: list[float] = []
        self.times: list[float] = []
        self.cpu_times: list[float] = []  # CPU time of the whole process (all threads) per step
        self._t0 = time.perf_counter()
        self._c0 = time.process_time()

    def start(self) -> None:
        self._t0 = time.perf_counter()
        self._c0 = time.process_time()

    def done(self, loss: float) -> None:
        self.times.append(time.perf_counter() - self._t0)
        self.cpu_times.append(time.process_time() - self._c0)
        self.losses.append(float(loss))
        if self.rank == 0:
            print(f"step {len(self.losses) - 1} loss {float(loss)!r}", flush=True)

    def report(self) -> None:
        if self.rank == 0:
            steady = self.times[1:] or self.times
            print(f"mean step time {1000 * sum(steady) / max(1, len(steady)):.2f} ms", flush=True)
            print("losses " + json.dumps(self.losses), flush=True)
            path = os.environ.get("DLTRACE_EXAMPLE_RESULT")
            if path:
                with open(path, "w") as f:
                    json.dump({"losses": self.losses, "step_times_s": self.times,
                               "step_cpu_s": self.cpu_times}, f)
        print(f"rank {self.rank} done: {len(self.losses)} steps", flush=True)
