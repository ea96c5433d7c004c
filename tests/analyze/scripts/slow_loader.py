"""A 2-rank DDP run whose ``--slow-rank`` sleeps ``--sleep-ms`` in every batch's data loading.

The model has no buffers (no BatchNorm), so DDP broadcasts nothing at the start of forward and
the only synchronization is the gradient allreduce: the other rank's idle time there is the
straggler's sleep. (With buffers, rank 0 waits in DDP's buffer broadcast, which the phase
model counts as a broadcast root's transfer, not idle; see docs/causes.md.)
"""

import argparse
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset, default_collate

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=4)
p.add_argument("--slow-rank", type=int, default=1)
p.add_argument("--sleep-ms", type=float, default=300)
args = p.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
data = TensorDataset(torch.randn(8 * args.steps, 64), torch.randint(0, 10, (8 * args.steps,)))


def collate(batch):  # type: ignore[no-untyped-def]
    if rank == args.slow_rank:
        time.sleep(args.sleep_ms / 1000)  # inside the DataLoader's __next__: data loading
    return default_collate(batch)


for x, y in DataLoader(data, batch_size=8, collate_fn=collate):
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
print(f"rank {rank} done", flush=True)
