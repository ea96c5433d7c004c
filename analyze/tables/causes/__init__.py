"""Why a step is slow: overlap, root causes of waiting, critical path, balance across ranks.

Derived tables of the run's database, built after the phase model (docs/causes.md has the
definitions and formulas):

- :mod:`.overlap`: per rank, step and collective kind, communication time (all lanes), the
  part hidden under compute and the exposed part (``overlap``);
- :mod:`.delays`: every idle interval of the phase model attributed to the rank that arrived
  last and to the regions of its step that made it late (``delays``, ``delay_totals``),
  after Scalasca's delay analysis;
- :mod:`.critical_path`: per step, the chain of stretches across ranks that sets the step's
  duration, and the step time perfect balance would give (``critical_path``,
  ``critical_path_regions``, ``step_balance``);
- :mod:`.balance`: per rank throughput and the shares of the global batch that would balance
  the step (``rank_balance``).

:mod:`.window` makes one pass over the steps, a few at a time (bounded memory), with what
the first three need (the phase labels of the sweep, each rank's innermost region over time,
the collectives and messages); :mod:`.build` drives it and writes the tables.

May import: :mod:`analyze.tables` (the phase model's sweep), :mod:`analyze.schema`. Not the
views, the CLI, ``reports`` or ``instrument``; the database build imports this package, never
the reverse.
"""

from __future__ import annotations

from analyze.tables.causes.build import build_causes

__all__ = ["build_causes"]
