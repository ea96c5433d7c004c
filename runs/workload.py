"""The model and data the PyTorch examples train: a compact ResNet on synthetic images.

torchvision's ResNet-18 (``weights=None``) is used with ``--model resnet18`` where torchvision
imports; the default is a small ResNet defined here so a CPU step takes tens of milliseconds,
with wider variants (``wide``, ``wider``) for experiments that vary the model size.
The data are random image-shaped tensors and labels from a fixed seed, made in memory.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + self.shortcut(x))


class CompactResNet(nn.Module):
    """ResNet with three stages of two basic blocks (16, 32, 64 channels)."""

    def __init__(self, num_classes: int = 10, width: int = 16):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        layers, cin = [], width
        for i, cout in enumerate((width, 2 * width, 4 * width)):
            layers += [BasicBlock(cin, cout, 1 if i == 0 else 2), BasicBlock(cout, cout, 1)]
            cin = cout
        self.layers = nn.Sequential(*layers)
        self.head = nn.Linear(cin, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layers(self.stem(x))
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


# Compact ResNets by name: channel width of the first stage (parameters grow with its square).
WIDTHS = {"compact": 16, "wide": 32, "wider": 64}


def make_model(name: str, num_classes: int = 10) -> nn.Module:
    if name in WIDTHS:
        return CompactResNet(num_classes, width=WIDTHS[name])
    if name == "resnet18":
        try:
            import torchvision
        except Exception as e:  # noqa: BLE001 -- torchvision fails in several ways beside some torch builds
            raise SystemExit(f"--model resnet18 needs torchvision, which does not import here ({e})") from None
        return torchvision.models.resnet18(weights=None, num_classes=num_classes)
    raise SystemExit(f"unknown model {name!r}; choose {', '.join(WIDTHS)} or resnet18")


class SyntheticImages(Dataset):
    """``size`` random images (3 x ``image_size``^2) with labels, fixed by ``seed``.

    Each sample is drawn when it is read, from a generator seeded by ``seed`` and its index, so
    a long run holds one batch, not the whole run's images (2,000 steps of 32 images on 2 ranks
    were 1.5 GB a rank, drawn before the first step); about 25 us a 32 x 32 image."""

    def __init__(self, size: int, image_size: int, num_classes: int = 10, seed: int = 0):
        self.size, self.image_size, self.num_classes, self.seed = size, image_size, num_classes, seed

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= i < self.size:
            raise IndexError(f"sample {i} of a dataset of {self.size}")
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
        x = torch.randn(3, self.image_size, self.image_size, generator=g)
        return x, torch.randint(0, self.num_classes, (), generator=g)


def batches(args: argparse.Namespace, rank: int, world: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """This rank's micro-batches for the whole run: ``--steps`` x ``--accumulate`` of
    ``--batch-size`` synthetic images, each rank its own share of one dataset."""
    per_rank = args.batch_size * args.accumulate * args.steps
    data = SyntheticImages(per_rank * world, args.image_size, seed=args.seed)
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=False)
    collate = slow_collate(args.slow_data_ms) if rank == args.slow_rank else None
    return iter(DataLoader(data, batch_size=args.batch_size, sampler=sampler, drop_last=True,
                           collate_fn=collate))


def slow_collate(ms: float):  # type: ignore[no-untyped-def]
    """The default collate, ``ms`` milliseconds slower: a straggler in data loading (it runs
    inside the DataLoader's ``__next__``, so inside the traced data loading region)."""
    import time

    from torch.utils.data import default_collate

    def collate(batch):  # type: ignore[no-untyped-def]
        time.sleep(ms / 1000)
        return default_collate(batch)

    return collate


def gradient_bytes(model: nn.Module) -> int:
    """Bytes of all trainable parameters' gradients (what one allreduce round moves)."""
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--batch-size", type=int, default=32, help="samples per rank per micro-batch")
    p.add_argument("--steps", type=int, default=20, help="optimizer steps")
    p.add_argument("--accumulate", type=int, default=1, metavar="K",
                   help="micro-batches per optimizer step (gradients reduced on the K-th only)")
    p.add_argument("--model", default="compact",
                   help="compact (default, 0.7 MB of gradients), wide (2.8 MB), wider (11 MB) or resnet18")
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--slow-rank", type=int, default=None, metavar="R",
                   help="make rank R a straggler: it sleeps --slow-data-ms in each batch's data loading")
    p.add_argument("--slow-data-ms", type=float, default=50.0, help="the straggler's extra ms per batch")
    p.add_argument("--fail-at-step", type=int, default=None, help="testing: raise at this step")
    p.add_argument("--fail-rank", type=int, default=1, help="testing: the rank that raises")
