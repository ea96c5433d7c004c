"""PyTorch DDP over gloo with many tiny operators per step, on CPU: where a profiler's
per-operator cost shows (bench/overhead.py --workload small-ops).

    instrument run -np 2 runs/ddp_small_ops.py --steps 30 [--blocks 8 --ops 25 --width 16]

The model is a stack of ``--blocks`` blocks; each applies ``--ops`` residual steps
``x = tanh(x @ W) + x`` with a ``--width`` x ``--width`` parameter W to a batch of 8 vectors,
so one training step runs a few thousand operators of a few microseconds each (forward,
autograd's backward, SGD with momentum parameter by parameter) in only ``--blocks`` + 1
module calls. The data come through a DataLoader over synthetic tensors, so steps have our
data-loading marker too. Rank 0 prints losses and step times like the other examples.
"""

from __future__ import annotations

import argparse

import gloo_exit
import torch
import torch.distributed as dist
from step_clock import StepClock
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


class Block(nn.Module):
    def __init__(self, width: int, ops: int):
        super().__init__()
        self.weights = nn.ParameterList(nn.Parameter(0.1 * torch.randn(width, width)) for _ in range(ops))
        self.bias = nn.Parameter(torch.zeros(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for w in self.weights:
            x = torch.tanh(x @ w) + x
        return x + self.bias


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--blocks", type=int, default=8)
    p.add_argument("--ops", type=int, default=25, help="residual steps per block (3 operators each)")
    p.add_argument("--width", type=int, default=16)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)
    model = nn.Sequential(*(Block(args.width, args.ops) for _ in range(args.blocks)))
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9, foreach=False)
    g = torch.Generator().manual_seed(args.seed)
    n = args.batch_size * args.steps * world
    data = TensorDataset(torch.randn(n, args.width, generator=g), torch.randn(n, args.width, generator=g))
    loader = iter(DataLoader(data, batch_size=args.batch_size,
                             sampler=DistributedSampler(data, num_replicas=world, rank=rank, shuffle=False)))
    if rank == 0:
        print(f"world {world}, {args.blocks} blocks x {args.ops} ops, width {args.width}", flush=True)

    clock = StepClock(rank)
    for _ in range(args.steps):
        clock.start()
        x, y = next(loader)
        loss = ((ddp(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        clock.done(loss.item())
    clock.report()
    dist.destroy_process_group()
    gloo_exit.settle()


if __name__ == "__main__":
    main()
