"""PyTorch DDP over gloo: a ResNet-style CNN on synthetic images, on CPU.

    instrument run -np 2 runs/ddp_resnet.py --batch-size 32 --steps 20 [--accumulate 4]

With ``--accumulate K``, the first K-1 micro-batches of each step run under ``no_sync()`` and
gradients are all-reduced on the K-th, as custom training loops do. Rank 0 prints each step's
loss (full precision, for comparing runs) and the mean step time.
"""

from __future__ import annotations

import argparse
import contextlib

import gloo_exit
import torch
import torch.distributed as dist
from step_clock import StepClock
from torch.nn.parallel import DistributedDataParallel as DDP
from workload import add_arguments, batches, gradient_bytes, make_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    parser.add_argument("--bucket-cap-mb", type=float, default=25.0,
                        help="DDP's gradient bucket size (default 25, DDP's own); smaller buckets "
                        "start their allreduces earlier in backward")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)
    model = make_model(args.model)
    ddp = DDP(model, bucket_cap_mb=args.bucket_cap_mb)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()

    loader = batches(args, rank, world)
    if rank == 0:
        print(f"world {world}, model {args.model}, gradient bytes {gradient_bytes(model)}", flush=True)

    clock = StepClock(rank)
    for step in range(args.steps):
        clock.start()
        if args.fail_at_step == step and rank == args.fail_rank:
            raise RuntimeError(f"deliberate failure at step {step} (--fail-at-step)")
        total = 0.0
        for micro in range(args.accumulate):
            x, y = next(loader)
            sync = micro == args.accumulate - 1
            with contextlib.nullcontext() if sync else ddp.no_sync():
                loss = loss_fn(ddp(x), y) / args.accumulate
                loss.backward()
            total += loss.item()
        opt.step()
        opt.zero_grad(set_to_none=True)
        clock.done(total)
    clock.report()
    dist.destroy_process_group()
    gloo_exit.settle()  # let gloo's threads finish before Python shuts down (see gloo_exit.py)


if __name__ == "__main__":
    main()
