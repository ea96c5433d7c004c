"""A loop without an optimizer, as in pytorch/examples' regression: forward, backward, and the
weights updated by hand. ``--steps N`` iterations, then ``--evaluate M`` forward passes."""

import argparse

import torch
import torch.nn.functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=5)
parser.add_argument("--evaluate", type=int, default=0)
args = parser.parse_args()

torch.manual_seed(0)
fc = torch.nn.Linear(4, 1)
x, y = torch.randn(32, 4), torch.randn(32, 1)
for _ in range(args.steps):
    fc.zero_grad()
    loss = F.smooth_l1_loss(fc(x), y)
    loss.backward()
    with torch.no_grad():
        for param in fc.parameters():
            param.add_(-0.1 * param.grad)
with torch.no_grad():
    for _ in range(args.evaluate):
        fc(x)
print(f"done: {args.steps} steps, loss {loss.item():.4f}")
