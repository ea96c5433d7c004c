"""The run's tables: Parquet datasets under the run directory and the DuckDB database of views
over them, built from reader chunks by stages of independent tasks.

Owns the build (:mod:`.database`: a new tables directory and database per build, put in place
when complete, reused while current; where a run's archive and database are, :mod:`.runpath`), the on-disk layout (:mod:`.store`: one Parquet dataset
per table, the per-rank ones partitioned by rank), the stages and their tasks
(:mod:`.stages`, run by an engine from :mod:`analyze.engine`), and the derivation steps each
task runs: regions classified (:mod:`.regions`; by name with the pattern table
:mod:`.patterns`, a user's file :mod:`.pattern_set` and match names :mod:`.names`), steps
(:mod:`.steps`), communication recognized by name (:mod:`.named`), collectives and messages
matched across ranks (:mod:`.collectives`), the phase model (:mod:`.phases`) and its
counterpart on the accelerators' timeline (:mod:`.device_phases`).

May import: :mod:`analyze.readers`, :mod:`analyze.schema`, :mod:`analyze.errors`,
:mod:`analyze.engine`. Not the views, the CLI, ``reports`` or ``instrument``.
"""
