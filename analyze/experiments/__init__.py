"""Across runs: ``analyze compare`` over a sweep's runs (:mod:`.compare`) and the statistics
it uses (:mod:`.scaling`: confidence intervals, allocation of variation, fits, the allreduce
model).

May import: :mod:`analyze.tables` (each run's database), :mod:`analyze.views`,
:mod:`analyze.schema`, :mod:`analyze.errors`. Not ``reports`` or ``instrument``.
"""
