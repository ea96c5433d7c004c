"""Run a training script under torch.profiler with its default settings: bench.overhead's reference.

    instrument run -np 2 --tracer none bench/torch_profiled.py runs/ddp_resnet.py --steps 30

The profiler records every operator for the whole run with its defaults (every supported
activity: CPU here, CPU and CUDA on a GPU machine; no shapes, stacks or memory), as a user
profiling a training run would; its trace is not exported (that happens after training, like
our merge).

When the script destroys its process group (the last thing runs/ddp_resnet.py does, after
writing its results), the profiler stops and the process ends at once: at teardown, the
profiler's thread-local state held by gloo's worker threads and the DDP reducer joining those
threads with the GIL held can deadlock (seen here in about one run of five).
"""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path

import torch.distributed as dist
from torch.profiler import profile

if __name__ == "__main__":
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    sys.path.insert(0, str(Path(script).resolve().parent))  # as `python script` would
    prof = profile()
    destroy = dist.destroy_process_group

    def destroy_and_exit(*args: object, **kwargs: object) -> None:
        prof.stop()
        destroy(*args, **kwargs)  # type: ignore[arg-type]
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)

    dist.destroy_process_group = destroy_and_exit
    prof.start()
    runpy.run_path(script, run_name="__main__")
    prof.stop()
