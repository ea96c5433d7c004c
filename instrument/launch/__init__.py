"""Starting a run: the ranks, their environment, the run directory and its ``run.json``.

Owns ``instrument run`` from the command line to the merged archive (:mod:`.job`), the
environment each rank gets and reads (:mod:`.rank_env`), run names and directories
(:mod:`.rundir`) and the run's metadata file (:mod:`.runinfo`).

May import: :mod:`instrument.tracer` (the clock server, the merge), :mod:`instrument.scorep`,
:mod:`instrument.errors` and :mod:`traceio`. Not the hooks, not ``analyze``.
"""
