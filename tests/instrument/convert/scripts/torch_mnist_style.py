"""A single-device PyTorch training script in the style of pytorch/examples mnist/main.py, on
seeded synthetic data made in code (written for the horovodize tests: argparse main(), a
model class, train()/test() functions, a DataLoader per split, StepLR, a checkpoint).

It prints each step's loss, and at the end how many training samples it saw and a checksum
of its parameters, which is what the tests compare across ranks and with the original.
"""

# ruff: noqa: UP008, UP010, UP032, B905 (written the way the public examples are)

from __future__ import print_function

import argparse
import hashlib
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.optim.lr_scheduler import StepLR
from torch.utils.data import TensorDataset


class Net(nn.Module):
    def __init__(self):
        super(Net, self).__init__()
        self.conv1 = nn.Conv2d(1, 4, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.fc1 = nn.Linear(4 * 6 * 6, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        return F.log_softmax(self.fc1(x), dim=1)


def synthetic(n, seed):
    """Images and labels drawn from a seeded generator (in place of MNIST)."""
    g = torch.Generator().manual_seed(seed)
    return TensorDataset(torch.randn(n, 1, 14, 14, generator=g), torch.randint(0, 10, (n,), generator=g))


def train(args, model, device, train_loader, optimizer, epoch):
    model.train()
    seen = 0
    for batch_idx, (data, target) in enumerate(train_loader):
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        output = model(data)
        loss = F.nll_loss(output, target)
        loss.backward()
        optimizer.step()
        seen += len(data)
        if batch_idx % args.log_interval == 0:
            print('epoch {} step {} loss {:.6f}'.format(epoch, batch_idx, loss.item()))
        if args.dry_run:
            break
    return seen


def test(model, device, test_loader):
    model.eval()
    test_loss = 0
    correct = 0
    with torch.no_grad():
        for data, target in test_loader:
            data, target = data.to(device), target.to(device)
            output = model(data)
            test_loss += F.nll_loss(output, target, reduction='sum').item()  # sum up batch loss
            pred = output.argmax(dim=1, keepdim=True)
            correct += pred.eq(target.view_as(pred)).sum().item()

    test_loss /= len(test_loader.dataset)
    print('Test set: Average loss: {:.4f}, Accuracy: {}/{}'.format(
        test_loss, correct, len(test_loader.dataset)))


def main():
    parser = argparse.ArgumentParser(description='PyTorch MNIST-style example on synthetic data')
    parser.add_argument('--batch-size', type=int, default=16, metavar='N')
    parser.add_argument('--test-batch-size', type=int, default=64, metavar='N')
    parser.add_argument('--epochs', type=int, default=2, metavar='N')
    parser.add_argument('--samples', type=int, default=128, help='training samples')
    parser.add_argument('--lr', type=float, default=0.5, metavar='LR')
    parser.add_argument('--gamma', type=float, default=0.7, metavar='M')
    parser.add_argument('--no-cuda', action='store_true', default=False)
    parser.add_argument('--dry-run', action='store_true', default=False)
    parser.add_argument('--seed', type=int, default=1, metavar='S')
    parser.add_argument('--log-interval', type=int, default=1, metavar='N')
    parser.add_argument('--checkpoint-dir', default=None, help='save the model here at the end')
    args = parser.parse_args()
    use_cuda = not args.no_cuda and torch.cuda.is_available()

    torch.manual_seed(args.seed)
    device = torch.device("cuda" if use_cuda else "cpu")

    train_kwargs = {'batch_size': args.batch_size}
    test_kwargs = {'batch_size': args.test_batch_size}

    dataset1 = synthetic(args.samples, args.seed)
    dataset2 = synthetic(64, args.seed + 1)
    train_loader = torch.utils.data.DataLoader(dataset1, shuffle=False, **train_kwargs)
    test_loader = torch.utils.data.DataLoader(dataset2, **test_kwargs)

    model = Net().to(device)
    optimizer = optim.Adadelta(model.parameters(), lr=args.lr)

    scheduler = StepLR(optimizer, step_size=1, gamma=args.gamma)
    seen = 0
    for epoch in range(1, args.epochs + 1):
        seen += train(args, model, device, train_loader, optimizer, epoch)
        test(model, device, test_loader)
        scheduler.step()

    if args.checkpoint_dir:
        # one file name per process: the tests count how many processes wrote one
        torch.save(model.state_dict(), os.path.join(args.checkpoint_dir, "mnist_cnn-{}.pt".format(os.getpid())))

    digest = hashlib.sha256()
    for tensor in model.state_dict().values():
        digest.update(tensor.detach().cpu().numpy().tobytes())
    print('samples seen {}'.format(seen))
    print('parameters sha256 {}'.format(digest.hexdigest()))


if __name__ == '__main__':
    main()
