"""``python -m instrument.scorep [SCORE-P OPTIONS] -- SCRIPT ARGS``: the per-rank entry of
``instrument run --scorep`` (see :func:`instrument.scorep.backend.main`)."""

from instrument.scorep.backend import main

main()
