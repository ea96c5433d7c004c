"""What ``instrument run`` accepts for ``--tracer`` and ``--launcher`` (a module of its own so
that the command line can offer the choices without loading the launcher)."""

TRACERS = ("builtin", "scorep", "none")
LAUNCHERS = ("local", "torchrun", "horovodrun", "mpirun", "srun")
