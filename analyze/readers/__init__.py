"""Readers: a trace into column chunks (intervals, collective records, messages).

Owns the per-location rules every reader applies (:mod:`.columns`), the OTF2 readers (the
portable one over the ``otf2`` package, :mod:`.otf2_python`, and the native one over
:mod:`traceio.codec`, :mod:`.otf2_native`, which give identical rows), and the choice
between them (:mod:`.dispatch`), and the reader of per-rank Kineto / Chrome trace JSON
files (:mod:`.kineto`), which gives the same kinds of rows plus the event args and launch
correlations those files carry.

May import: :mod:`traceio`, the ``otf2`` package, numpy. Not DuckDB (loading is
:mod:`analyze.tables`'), not ``instrument``.
"""
