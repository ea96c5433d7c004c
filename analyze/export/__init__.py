"""Exports: a run's tables written in other tools' formats.

Owns :mod:`.chrome` (Chrome trace JSON for Perfetto, chrome://tracing and Holistic Trace
Analysis). Works from the run's database, so it exports whatever the readers read (our OTF2,
Score-P's, imported Kineto files).

May import: :mod:`analyze.tables`, :mod:`analyze.schema`, :mod:`analyze.errors` and
:mod:`traceio` (the JSON writing). Not the CLI, ``reports`` or ``instrument``.
"""
