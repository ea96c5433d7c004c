"""bench/measure.py's own measuring: what the benches' memory columns rest on."""

from __future__ import annotations

import subprocess
import sys

from bench import measure

MB = 300
# holds MB of written (so resident) memory for 0.6 s
HOLD = f"import time; b = b'\\x01' * ({MB} * 2**20); time.sleep(0.6)"


def _holder() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", HOLD])


def test_tree_peak_adds_processes_that_hold_memory_at_the_same_time() -> None:
    with measure.TreePeak(interval=0.02) as tree:
        both = [_holder(), _holder()]
        for proc in both:
            assert proc.wait(timeout=60) == 0
    assert tree.mb >= 2 * MB


def test_tree_peak_does_not_add_peaks_that_came_one_after_the_other() -> None:
    """Two workers of 300 MB, one after the other: the summed peaks would say 600 MB more than
    this process; the tree never held more than one of them."""
    own = measure.peak_rss_mb()
    with measure.TreePeak(interval=0.02) as tree:
        for _ in range(2):
            assert _holder().wait(timeout=60) == 0
    assert MB <= tree.mb < own + 1.5 * MB
