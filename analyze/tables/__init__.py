"""The run's DuckDB database: reader chunks loaded, then the tables derived from them.

Owns the build (:mod:`.database`: a temporary file renamed when complete, reused while
current), the loading of chunks (:mod:`.loading`), and the derivation steps, each a function
of the database: regions classified (:mod:`.regions`), steps (:mod:`.steps`), collectives and
messages matched across ranks (:mod:`.collectives`), the phase model (:mod:`.phases`) and
its counterpart on the accelerators' timeline (:mod:`.device_phases`).

May import: :mod:`analyze.readers`, :mod:`analyze.schema`, :mod:`analyze.errors`. Not the
views, the CLI, ``reports`` or ``instrument``.
"""
