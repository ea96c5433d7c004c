"""The trace formats both sides speak: dltrace's record layout, OTF2 writing, the native codec.

Owns: the fixed-size event record and the names of our markers (:mod:`traceio.records`), the
description of an archive to write (:mod:`traceio.archive`), the two OTF2 writers
(:mod:`traceio.otf2_writer` with the ``otf2`` package, :mod:`traceio.native_writer` with the C
codec) and the C codec itself (``native/``, loaded by :mod:`traceio.codec`), whose reader the
analysis side wraps; Chrome trace JSON read and written (:mod:`traceio.chrome`) and what
PyTorch's profiler means by its events (:mod:`traceio.kineto`), for the Kineto import on
both sides and the export.

May import: the standard library, numpy and the ``otf2`` package. Never ``instrument``,
``analyze`` or ``reports``: both the instrumentation and the analysis import this package, so
it must not depend on either.
"""
