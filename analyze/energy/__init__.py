"""Power and energy from metric samples: pure functions of arrays and tables.

Owns what a metric channel measures (:mod:`.channels`: energy or power, its unit and device,
from the unit or, for Score-P plugins that write none, the name), running energy totals from
counters and from integrated power readings (:mod:`.series`), the energy of time windows and
the lag of power readings behind a counter (:mod:`.attribution`), and the energy-delay product
across experiments (:mod:`.edp`). The DuckDB steps that use them are in
:mod:`analyze.tables.metrics` and :mod:`analyze.tables.energy`; docs/energy.md explains the
choices.

May import: numpy, pandas, :mod:`analyze.schema` and :mod:`traceio` (the device names our
sampler writes). Not DuckDB, not the other rooms of ``analyze``.
"""
