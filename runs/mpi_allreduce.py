"""A tiny mpi4py program without a deep-learning framework: per step, some numpy "compute",
an ``Allreduce`` of a gradient-sized array and an ``allreduce`` of a Python float.

    instrument run -np 2 --launcher mpirun runs/mpi_allreduce.py --steps 5 --size 65536

Steps are marked with ``instrument.tracer.markers.end_step`` (there is no optimizer for the hooks to
see); the script also runs without dltrace. Rank 0 prints each step's global sum.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from mpi4py import MPI

try:
    from instrument.tracer.markers import end_step, region
except ImportError:  # run without dltrace installed
    import contextlib

    def end_step() -> None:
        pass

    def region(name: str) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--size", type=int, default=65536, help="float64 elements reduced per step")
    parser.add_argument("--straggle", type=float, default=0.02, metavar="SECONDS",
                        help="extra time per step and rank number (a straggler for the traces to show)")
    args = parser.parse_args()

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    rng = np.random.default_rng(rank)
    weights = rng.standard_normal((256, 256))
    grad = np.empty(args.size)
    total = np.empty(args.size)
    comm.Barrier()  # start together (part of the first step: the first traced activity opens it)
    for step in range(args.steps):
        with region("compute"):
            x = weights
            for _ in range(4):
                x = np.tanh(x @ weights / 16.0)
            grad[:] = np.resize(x.ravel(), args.size)
            time.sleep(args.straggle * rank)  # higher ranks are slower: the others wait for them
        comm.Allreduce(grad, total, op=MPI.SUM)
        loss = comm.allreduce(float(total[:16].sum()), op=MPI.SUM)
        end_step()
        if rank == 0:
            print(f"step {step} sum {loss:.6g}", flush=True)
    print(f"rank {rank} done: {args.steps} steps, {size} ranks", flush=True)


if __name__ == "__main__":
    main()
