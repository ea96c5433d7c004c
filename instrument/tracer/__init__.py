"""The tracer inside each rank, and the merge of all ranks' records after the run.

Owns: the backend-independent recorder that hooks and markers talk to (regions, per-thread
stacks, training steps: :mod:`.recorder`, :mod:`.markers`), the built-in tracer that buffers
fixed-size records and spills them per rank (:mod:`.builtin`, :mod:`.buffer`,
:mod:`.spill`), clocks and their alignment (:mod:`.clock`, :mod:`.timing`), and the merge of
the spill files into one :class:`traceio.archive.ArchiveSpec` (:mod:`.merge`), or per-rank
writing: each rank's own OTF2 event files and the end step's definitions (:mod:`.perrank`).

May import: :mod:`traceio` (record layout, the codec's replay loops) and the standard library
and numpy. Not the launcher, the hooks, the Score-P backend or ``analyze``.
"""
