"""mpi4py collectives for the hook tests (run on 2 ranks): two steps, each with a Bcast from
rank 1, a pickled bcast, an Allreduce on a communicator made by Split, a Reduce to rank 0 with
MPI.IN_PLACE at the root, an Allgather and a Barrier."""

import numpy as np
from mpi4py import MPI

from instrument.tracer.markers import end_step

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
sub = comm.Split(color=0, key=-rank)  # same members, reversed order
sub.Set_name("reversed")
for _ in range(2):
    buf = np.full(100, rank, dtype=np.float64)  # 800 bytes
    comm.Bcast(buf, root=1)
    assert buf[0] == 1
    assert comm.bcast({"step": 1} if rank == 0 else None, root=0) == {"step": 1}
    out = np.empty(10, dtype=np.int32)  # 40 bytes
    sub.Allreduce(np.ones(10, dtype=np.int32), out)
    assert out[0] == 2
    red = np.ones(4, dtype=np.float32)  # 16 bytes
    comm.Reduce(MPI.IN_PLACE if rank == 0 else red, red if rank == 0 else None, root=0)
    gathered = np.empty(2 * 3, dtype=np.int64)
    comm.Allgather(np.full(3, rank, dtype=np.int64), gathered)  # 24 bytes out, 48 in
    comm.Barrier()
    end_step()
print(f"rank {rank} ok", flush=True)
