"""bench/measure.py's own measuring: what the benches' memory columns rest on."""

from __future__ import annotations

import subprocess
import sys
import time

from bench import measure

MB = 300
INTERVAL = 0.02
# writes MB (so they are resident), says so, and holds them until its stdin closes
HOLD = f"import sys; b = b'\\x01' * ({MB} * 2**20); print('held', flush=True); sys.stdin.read()"


def _holder() -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "held\n"
    return proc


def _release(*procs: subprocess.Popen) -> None:
    time.sleep(10 * INTERVAL)  # sampled while held
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.close()
        assert proc.wait(timeout=60) == 0


def test_tree_peak_adds_processes_that_hold_memory_at_the_same_time() -> None:
    with measure.TreePeak(interval=INTERVAL) as tree:
        _release(_holder(), _holder())
    assert tree.mb >= 2 * MB


def test_tree_peak_does_not_add_peaks_that_came_one_after_the_other() -> None:
    """Two workers of 300 MB, one after the other: the summed peaks would say 600 MB more than
    this process; the tree never held more than one of them."""
    own = measure.peak_rss_mb()
    with measure.TreePeak(interval=INTERVAL) as tree:
        for _ in range(2):
            _release(_holder())
    assert MB <= tree.mb < own + 1.5 * MB
