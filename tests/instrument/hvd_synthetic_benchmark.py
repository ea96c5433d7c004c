"""A training script as third parties write them for Horovod, run unmodified by the tests.

Its shape follows Horovod's own PyTorch synthetic benchmark: names imported with
``from horovod.torch import ...``, a torchvision model where torchvision imports (a small CNN
otherwise), parameters and optimizer state broadcast from rank 0, and timing by ``timeit``
around a step function. It knows nothing about dltrace.
"""

from __future__ import annotations

import argparse
import timeit

import torch
import torch.nn.functional as F
from horovod.torch import (
    DistributedOptimizer,
    allreduce,
    broadcast_optimizer_state,
    broadcast_parameters,
    init,
    rank,
    size,
)


def build_model() -> torch.nn.Module:
    try:
        from torchvision import models

        return models.resnet18(num_classes=10)
    except Exception:  # noqa: BLE001 -- not installed, or a build that does not match torch
        return torch.nn.Sequential(
            torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
            torch.nn.Conv2d(16, 32, 3, stride=2, padding=1), torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(32, 10))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--num-warmup-batches", type=int, default=1)
    p.add_argument("--num-batches-per-iter", type=int, default=2)
    p.add_argument("--num-iters", type=int, default=2)
    args = p.parse_args()

    init()
    torch.manual_seed(0)
    model = build_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * size(), momentum=0.9)
    optimizer = DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    broadcast_parameters(model.state_dict(), root_rank=0)
    broadcast_optimizer_state(optimizer, root_rank=0)

    data = torch.randn(args.batch_size, 3, 32, 32)
    target = torch.randint(0, 10, (args.batch_size,))

    def benchmark_step() -> None:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(data), target)
        loss.backward()
        optimizer.step()

    timeit.timeit(benchmark_step, number=args.num_warmup_batches)
    img_secs = []
    for _ in range(args.num_iters):
        t = timeit.timeit(benchmark_step, number=args.num_batches_per_iter)
        img_secs.append(args.batch_size * args.num_batches_per_iter / t)
    mean = allreduce(torch.tensor(sum(img_secs) / len(img_secs)), name="img_sec").item()
    if rank() == 0:
        grad_bytes = sum(q.numel() * q.element_size() for q in model.parameters())
        steps = args.num_warmup_batches + args.num_iters * args.num_batches_per_iter
        print(f"Img/sec per rank: {mean:.1f}", flush=True)
        print(f"gradient bytes {grad_bytes} parameters {len(list(model.parameters()))} steps {steps}",
              flush=True)


if __name__ == "__main__":
    main()
