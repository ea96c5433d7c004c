"""Golden tests of the PyTorch rules on small literal scripts: the exact code each rule writes,
and the line of the original it reports."""

from __future__ import annotations

from tests.instrument.convert.helpers import added, codes, conv, removed, rules

LOOP = """
    import torch
    from torch import nn, optim
    from torch.utils.data import DataLoader, TensorDataset

    model = nn.Linear(4, 2)
    opt = optim.SGD(model.parameters(), lr=0.1)
    ds = TensorDataset(torch.randn(8, 4), torch.randn(8, 2))
    loader = DataLoader(ds, batch_size=2, shuffle=True)
    for epoch in range(2):
        for x, y in loader:
            opt.zero_grad()
            loss = ((model(x) - y) ** 2).mean()
            loss.backward()
            opt.step()
            print(loss.item())
    torch.save(model.state_dict(), "m.pt")
"""

LOOP_CONVERTED = """\
import torch
from torch import nn, optim
from torch.utils.data import DataLoader, TensorDataset
import horovod.torch as hvd
hvd.init()  # added by instrument horovodize

model = nn.Linear(4, 2)
opt = optim.SGD(model.parameters(), lr=0.1)
# Horovod: learning rate x ranks, gradients averaged across ranks, rank 0's parameters everywhere
for group in opt.param_groups:
    group["lr"] *= hvd.size()
opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
ds = TensorDataset(torch.randn(8, 4), torch.randn(8, 2))
loader = DataLoader(ds, batch_size=2, sampler=torch.utils.data.distributed.DistributedSampler(ds, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=True))
for epoch in range(2):
    loader.sampler.set_epoch(epoch)
    for x, y in loader:
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        if hvd.rank() == 0:
            print(loss.item())
if hvd.rank() == 0:
    torch.save(model.state_dict(), "m.pt")
"""


def test_a_training_loop_becomes_the_horovod_one() -> None:
    r = conv(LOOP)
    assert r.output == LOOP_CONVERTED
    assert r.framework == "pytorch" and r.exit_status == 0
    # each rule with the original line it touched (1-based, in the dedented LOOP)
    assert rules(r) == [("init", 3), ("scale_lr", 6), ("wrap_optimizer", 6), ("broadcast_state", 6),
                        ("shard_data", 8), ("shard_data", 9), ("rank0_only", 15), ("rank0_only", 16)]
    assert codes(r.unseen) == ["fresh_optimizer_state", "shuffle_order"]


FUNCTIONS = """
    import torch
    import torch.nn.functional as F
    from torch import nn, optim

    def train(args, model, device, train_loader, optimizer, epoch):
        model.train()
        for batch_idx, (data, target) in enumerate(train_loader):
            optimizer.zero_grad()
            loss = F.nll_loss(model(data), target)
            loss.backward()
            optimizer.step()
            if batch_idx % args.log_interval == 0:
                print('epoch {} loss {:.6f}'.format(epoch, loss.item()))
            if args.dry_run:
                break

    def test(model, device, test_loader):
        correct = 0
        with torch.no_grad():
            for data, target in test_loader:
                correct += model(data).argmax(1).eq(target).sum().item()
        print('accuracy {}'.format(correct / len(test_loader.dataset)))

    def main(args):
        train_kwargs = {'batch_size': args.batch_size}
        if args.cuda:
            train_kwargs.update({'shuffle': True, 'pin_memory': True})
        train_loader = torch.utils.data.DataLoader(make_dataset(), **train_kwargs)
        test_loader = torch.utils.data.DataLoader(make_dataset(), batch_size=1000)
        model = Net()
        optimizer = optim.Adadelta(model.parameters(), lr=args.lr)
        for epoch in range(1, args.epochs + 1):
            train(args, model, 'cpu', train_loader, optimizer, epoch)
            test(model, 'cpu', test_loader)
        print('finished')
"""


def test_the_loader_is_followed_through_function_parameters() -> None:
    """mnist/main.py's shape: the loop over the loader is in train(), the epoch loop in main()."""
    r = conv(FUNCTIONS)
    assert "train_loader.sampler.set_epoch(epoch)" in added(r)
    # the loader's options come from a dict that may say shuffle: the sampler takes it over
    assert ("train_loader = torch.utils.data.DataLoader((train_dataset := make_dataset()), sampler=torch"
            ".utils.data.distributed.DistributedSampler(train_dataset, num_replicas=hvd.size(), rank=hvd.rank(), "
            "shuffle=train_kwargs.get(\"shuffle\", False)), **dict(train_kwargs, shuffle=False))") in added(r)
    # the evaluation loader stays whole on every rank, and says so
    assert "test_loader = torch.utils.data.DataLoader(make_dataset(), batch_size=1000)" not in removed(r)
    assert [u.line for u in r.unseen if u.code == "eval_not_sharded"] == [29]
    # progress output repeats each epoch (train() and test() run in the epoch loop): rank 0 only;
    # what main() prints once stays on every rank
    assert ("print('epoch {} loss {:.6f}'.format(epoch, loss.item()))" in removed(r)[0]
            and "    print('finished')" not in removed(r))
    assert [line for rule, line in rules(r) if rule == "rank0_only"] == [13, 22]
    # a break on a flag is the same on every rank: converted, not refused
    assert r.exit_status == 0


def test_every_param_group_is_scaled_and_a_hidden_model_is_found_through_names() -> None:
    r = conv("""
        import torch
        from torch import nn, optim
        model = nn.Linear(4, 2)
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = optim.Adam([{"params": params}, {"params": [], "lr": 1e-2}], lr=1e-3)
        for step in range(3):
            optimizer.zero_grad()
            model(torch.ones(4)).sum().backward()
            optimizer.step()
    """)
    new = added(r)
    # the loop over param_groups scales the group with its own lr as well as the default
    assert new[new.index("for group in optimizer.param_groups:") + 1] == 'group["lr"] *= hvd.size()'
    assert "optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())" in new
    assert "hvd.broadcast_parameters(model.state_dict(), root_rank=0)" in new


def test_an_optimizer_from_elsewhere_is_wrapped_and_reported() -> None:
    r = conv("""
        import torch
        from mylib import make_optimizer
        model = torch.nn.Linear(4, 2)
        optimizer = make_optimizer(model)
        for step in range(3):
            optimizer.zero_grad()
            model(torch.ones(4)).sum().backward()
            optimizer.step()
    """)
    assert "optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())" in added(r)
    assert "optimizer_made_elsewhere" in codes(r.unseen)


def test_loaded_optimizer_state_is_broadcast_after_the_load() -> None:
    r = conv("""
        import torch
        model = torch.nn.Linear(4, 2)
        optimizer = torch.optim.Adam(model.parameters())
        optimizer.load_state_dict(torch.load("ckpt.pt"))
        for step in range(3):
            optimizer.zero_grad()
            model(torch.ones(4)).sum().backward()
            optimizer.step()
    """)
    lines = r.output.splitlines()
    load = lines.index('optimizer.load_state_dict(torch.load("ckpt.pt"))')
    assert lines[load + 2] == "hvd.broadcast_optimizer_state(optimizer, root_rank=0)"
    assert ("broadcast_state", 4) in rules(r)
    assert "fresh_optimizer_state" not in codes(r.unseen)


def test_clipping_waits_for_the_averaged_gradients() -> None:
    r = conv("""
        import torch
        model = torch.nn.Linear(4, 2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(3):
            optimizer.zero_grad()
            model(torch.ones(4)).sum().backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
    """)
    assert added(r)[-4:] == ["# Horovod: wait for the averaged gradients before clipping", "optimizer.synchronize()",
                             "with optimizer.skip_synchronize():", "optimizer.step()"]


def test_cuda_device_zero_becomes_the_local_rank_and_cpu_stays_cpu() -> None:
    r = conv("""
        import torch
        model = torch.nn.Linear(4, 2).cuda(0)
        device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
        other = torch.device("cuda", 0)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(3):
            optimizer.zero_grad()
            model(torch.ones(4, device=device)).sum().backward()
            optimizer.step()
    """)
    new = added(r)
    assert new[2:4] == ["if torch.cuda.is_available():", "torch.cuda.set_device(hvd.local_rank())"]
    assert "model = torch.nn.Linear(4, 2).cuda(hvd.local_rank())" in new
    assert 'device = torch.device(f"cuda:{hvd.local_rank()}" if torch.cuda.is_available() else "cpu")' in new
    assert 'other = torch.device("cuda", hvd.local_rank())' in new
    cpu = conv("""
        import torch
        model = torch.nn.Linear(4, 2).to(torch.device("cpu"))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(3):
            optimizer.zero_grad()
            model(torch.ones(4)).sum().backward()
            optimizer.step()
    """)
    assert "pin_device" not in cpu.rules() and "cuda" not in cpu.output


def test_tensorboard_writer_and_progress_bar_on_rank_0_only() -> None:
    r = conv("""
        import torch
        from torch.utils.tensorboard import SummaryWriter
        from tqdm import tqdm
        writer = SummaryWriter("runs")
        model = torch.nn.Linear(4, 2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in tqdm(range(3)):
            optimizer.zero_grad()
            loss = model(torch.ones(4)).sum()
            loss.backward()
            optimizer.step()
            writer.add_scalar("loss", loss.item(), step)
    """)
    new = added(r)
    assert 'writer = SummaryWriter("runs") if hvd.rank() == 0 else None' in new
    assert "for step in tqdm(range(3), disable=hvd.rank() != 0):" in new
    assert new[-2:] == ["if hvd.rank() == 0:", 'writer.add_scalar("loss", loss.item(), step)']


def test_a_loader_with_its_own_sampler_is_left_and_reported() -> None:
    r = conv("""
        import torch
        from torch.utils.data import DataLoader, WeightedRandomSampler
        model = torch.nn.Linear(4, 2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = DataLoader(dataset, sampler=WeightedRandomSampler([1.0] * 8, 8))
        for x in loader:
            optimizer.zero_grad()
            model(x).sum().backward()
            optimizer.step()
    """)
    assert "shard_data" not in r.rules()
    assert [(u.code, u.line) for u in r.unseen if u.code == "custom_sampler"] == [("custom_sampler", 5)]


def test_a_loader_made_each_epoch_gets_set_epoch_after_it_is_made() -> None:
    r = conv("""
        import torch
        from torch.utils.data import DataLoader
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for epoch in range(3):
            loader = DataLoader(ds, batch_size=4, shuffle=True)
            for x, y in loader:
                opt.zero_grad()
                model(x).sum().backward()
                opt.step()
    """)
    lines = r.output.splitlines()
    made = next(i for i, line in enumerate(lines) if line.startswith("    loader = DataLoader("))
    assert lines[made + 1] == "    loader.sampler.set_epoch(epoch)"
