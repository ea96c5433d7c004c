"""The Score-P backend: ranks under Score-P's Python bindings, our markers as its user regions.

Owns the per-rank entry (``python -m instrument.scorep``, :mod:`.backend`) and the merge of
Score-P experiments with our side files into the archive ``analyze`` reads (:mod:`.merge`).

May import: :mod:`instrument.tracer`, :mod:`instrument.launch.rank_env`,
:mod:`instrument.errors` and :mod:`traceio`. Not the launcher's job, not ``analyze``.
"""
