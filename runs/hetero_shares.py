"""PyTorch DDP over gloo with ranks of unequal speed taking unequal shares of each global batch.

    instrument run -np 2 runs/hetero_shares.py --global-batch 64 --shares 0.7,0.3 --extra-forwards 0,2
    analyze balance traces/<run>        # throughput per rank, the shares that would balance

Hybrid training splits each batch across unequal devices (a GPU and the CPU) in proportion
to their speed. Here the ranks are made unequal on one machine in one of two ways:
``--extra-forwards 0,2`` makes rank 1 a slower device by running its model twice more per
batch, without gradients, inside forward (its cost per sample grows and it computes on one
core of its own, so the ranks do not slow each other down); ``--threads 2,1`` gives each rank
its own number of torch threads (closer to real unequal hardware, but on a machine whose cores
the ranks share, a rank computes faster while the other waits). Rank r takes its share of every
global batch (``--shares``; samples split in whole numbers by largest remainders, as
``analyze balance`` splits them). Each rank's loss is the sum over its samples divided by the
global batch, times the world size: DDP averages gradients over ranks, so the update is the
global batch's mean, whatever the shares.
"""

from __future__ import annotations

import argparse
import os

# Threads that wait at OpenMP barriers spin by default, taking the core from the other rank;
# on a machine whose cores the ranks share, that makes the thread count's effect erratic.
# Passive waiting must be chosen before torch (and its OpenMP runtime) is loaded.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import gloo_exit  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from step_clock import StepClock  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402
from workload import SyntheticImages, make_model  # noqa: E402


class SlowerDevice(nn.Module):
    """The model, run ``extra`` more times per batch without gradients before the pass that
    counts: a device slower per sample, with the same parameters and the same gradients."""

    def __init__(self, inner: nn.Module, extra: int):
        super().__init__()
        self.inner, self.extra = inner, extra

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            for _ in range(self.extra):
                self.inner(x)
        return self.inner(x)


def numbers(kind: type, text: str) -> list:
    try:
        return [kind(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list such as 0.7,0.3, not {text!r}") from None


def split_batch(total: int, shares: list[float]) -> list[int]:
    """``total`` samples in proportion to ``shares``, whole (largest remainders, ties to the lower rank)."""
    s = np.asarray(shares, float) / float(sum(shares))
    exact = s * total
    base = np.floor(exact).astype(int)
    order = np.argsort(-(exact - base), kind="stable")
    base[order[: total - int(base.sum())]] += 1
    return [int(v) for v in base]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--global-batch", type=int, default=64, help="samples per step over all ranks")
    p.add_argument("--shares", type=lambda t: numbers(float, t), help="each rank's share (default equal)")
    p.add_argument("--threads", type=lambda t: numbers(int, t), help="torch threads per rank (default torch's)")
    p.add_argument("--extra-forwards", type=lambda t: numbers(int, t),
                   help="extra gradient-free passes of the model per batch, per rank (default none)")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--model", default="compact")
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    shares = args.shares or [1.0] * world
    if len(shares) != world or any(v and len(v) != world for v in (args.threads, args.extra_forwards)):
        raise SystemExit(f"give one --shares, --threads and --extra-forwards value per rank ({world} ranks)")
    counts = split_batch(args.global_batch, shares)
    if min(counts) < 1:
        raise SystemExit(f"--shares {args.shares} gives a rank no sample of a batch of {args.global_batch}")
    if args.threads:
        torch.set_num_threads(args.threads[rank])
    torch.manual_seed(args.seed)
    model = make_model(args.model)
    if args.extra_forwards and args.extra_forwards[rank] > 0:
        model = SlowerDevice(model, args.extra_forwards[rank])
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss(reduction="sum")

    data = SyntheticImages(args.global_batch * args.steps, args.image_size, seed=args.seed)
    offset = sum(counts[:rank])
    mine = [list(range(k * args.global_batch + offset, k * args.global_batch + offset + counts[rank]))
            for k in range(args.steps)]
    loader = iter(DataLoader(data, batch_sampler=mine))
    if rank == 0:
        print(f"world {world}, samples per rank {counts}, threads {args.threads or 'default'}, "
              f"extra forwards {args.extra_forwards or 'none'}", flush=True)

    clock = StepClock(rank)
    for _ in range(args.steps):
        clock.start()
        x, y = next(loader)
        loss = loss_fn(ddp(x), y) * world / args.global_batch
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        clock.done(loss.item())
    clock.report()
    dist.destroy_process_group()
    gloo_exit.settle()


if __name__ == "__main__":
    main()
