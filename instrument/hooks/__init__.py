"""Framework hooks: each module attaches markers to one framework when it is imported.

One module per framework (``torch_ddp``, ``horovod_torch``, ``horovod_tf``, ``tensorflow``,
``mpi4py``; :data:`instrument.bootstrap.HOOKS` says which import triggers which), plus the
post-import machinery (:mod:`.importer`), Horovod's timeline import and torch.profiler's
device activity import (:mod:`.device_activity`).

May import: :mod:`instrument.tracer` (the recorder, clocks, timers),
:mod:`instrument.launch.rank_env` and :mod:`traceio` (records; Chrome trace JSON and Kineto's
meaning for the device activity). Not the launcher, not ``analyze``.
"""
