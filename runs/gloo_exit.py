"""A workaround for an abort at exit of PyTorch gloo programs (seen with torch 2.13 on CPU).

A gloo worker thread (``pt_gloo_runloop``) drops its reference to the last collective a moment
after the collective completes. When that moment falls into interpreter shutdown (the main
thread has returned from the script), destroying the work needs the GIL, the thread is made
to exit, and the process dies with "terminate called without an active exception" (SIGABRT)
after all the training is done. On a loaded machine it happened in about 2 of 100 two-rank
runs here, with or without dltrace's tracer. ``destroy_process_group`` does not join these
threads while DDP's C++ side still holds the group.

:func:`settle` is called after ``destroy_process_group``: it waits (at most ``limit_s``) until
no gloo worker thread is runnable in two looks 10 ms apart, sleeping meanwhile so that they
can take the GIL and finish. Linux only (it reads /proc); elsewhere it returns at once.
"""

from __future__ import annotations

import os
import time

WORKER_NAMES = ("pt_gloo_runloop", "gloo_tcp_loop")


def _busy_workers() -> int:
    busy = 0
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/stat") as f:
                stat = f.read()
        except OSError:
            continue  # the thread ended
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        state = stat[stat.rindex(")") + 2]
        busy += name in WORKER_NAMES and state == "R"
    return busy


def settle(limit_s: float = 2.0) -> None:
    if not os.path.isdir("/proc/self/task"):
        return
    deadline = time.monotonic() + limit_s
    quiet = 0
    while quiet < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
        quiet = quiet + 1 if _busy_workers() == 0 else 0
