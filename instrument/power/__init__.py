"""Power sources and the per-host sampler that records them into the run's trace.

Owns the small interface every source implements (:mod:`.sources`: channels with a device
kind and number, read on demand as a running energy total in joules, or a power reading in
watts), Linux powercap RAPL (:mod:`.rapl`), NVIDIA GPUs through NVML (:mod:`.nvml`), and the
sampler (:mod:`.sampler`): one per host, in a thread of the rank with local rank 0, writing
metric samples through the built-in tracer. A source that cannot be used is named with its
reason in the rank's metadata (and so in ``run.json``), never recorded as zeros.

May import: :mod:`instrument.tracer` (the tracer the samples go through), :mod:`traceio` (the
channel names both sides share), the standard library; ``pynvml`` only when NVML is tried.
Not the launcher, the hooks or ``analyze``.
"""
