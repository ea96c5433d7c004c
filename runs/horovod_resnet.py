"""Horovod (PyTorch, Gloo): the DDP example's ResNet and synthetic images, on CPU.

    instrument run -np 2 runs/horovod_resnet.py --batch-size 32 --steps 20 [--accumulate 4]
    instrument run --launcher horovodrun -np 2 runs/horovod_resnet.py

Gradients are averaged by ``hvd.DistributedOptimizer``; rank 0's initial parameters are
broadcast with ``hvd.broadcast_parameters``. With ``--accumulate K`` the optimizer is built with
``backward_passes_per_step=K``, so each parameter's allreduce is issued during the K-th backward
of a step only. Rank 0 prints each step's loss (full precision, for comparing runs) and the
mean step time, in the same words as the DDP example.
"""

from __future__ import annotations

import argparse

import horovod.torch as hvd
import torch
from step_clock import StepClock
from workload import add_arguments, batches, gradient_bytes, make_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    args = parser.parse_args()

    hvd.init()
    rank, world = hvd.rank(), hvd.size()
    torch.manual_seed(args.seed)
    model = make_model(args.model)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9),
        named_parameters=model.named_parameters(),
        backward_passes_per_step=args.accumulate,
    )
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
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
        for _ in range(args.accumulate):
            x, y = next(loader)
            loss = loss_fn(model(x), y) / args.accumulate
            loss.backward()
            total += loss.item()
        opt.step()
        opt.zero_grad()  # Horovod's zero_grad() takes no arguments
        clock.done(total)
    clock.report()
    hvd.shutdown()


if __name__ == "__main__":
    main()
