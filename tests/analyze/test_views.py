"""The report tables' choices: which steps are steady state."""

from __future__ import annotations

import numpy as np

from analyze.views import warmup_end


def test_first_step_and_first_tenth_are_warm_up() -> None:
    assert warmup_end(np.array([])) == 0
    assert warmup_end(np.array([5.0])) == 0
    assert warmup_end(np.full(5, 1.0)) == 1
    assert warmup_end(np.full(40, 1.0)) == 4


def test_a_late_compile_extends_warm_up() -> None:
    # a custom loop synchronizing every 4th micro-step: its sync step is traced and compiled on
    # first use (step 3), later sync steps are only twice as long as the others
    d = np.array([30.0, 1, 1, 20.0] + [1, 1, 1, 2] * 4)
    assert warmup_end(d) == 4
    # a slow step late in the run is not warm-up
    d = np.array([30.0] + [1.0] * 10 + [20.0] + [1.0] * 8)
    assert warmup_end(d) == 2
