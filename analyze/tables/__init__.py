"""The run's DuckDB database: reader chunks loaded, then the tables derived from them.

Owns the build (:mod:`.database`: a temporary file renamed when complete, reused while
current), the loading of chunks (:mod:`.loading`), and the derivation steps, each a function
of the database: regions classified (:mod:`.regions`; by name with the pattern table
:mod:`.patterns`, a user's file :mod:`.pattern_set` and match names :mod:`.names`), steps
(:mod:`.steps`), communication recognized by name (:mod:`.named`), collectives and messages
matched across ranks (:mod:`.collectives`), the phase model (:mod:`.phases`) and its
counterpart on the accelerators' timeline (:mod:`.device_phases`).

May import: :mod:`analyze.readers`, :mod:`analyze.schema`, :mod:`analyze.errors`. Not the
views, the CLI, ``reports`` or ``instrument``.
"""
