"""Refusals (exit 2, nothing converted, one sentence) and warnings (exit 3), each on the
smallest script that shows it, and the near misses that must not be refused."""

from __future__ import annotations

import textwrap

import pytest

from instrument.convert import convert
from instrument.convert.report import Status
from tests.instrument.convert.helpers import codes, conv

TORCH_LOOP = textwrap.dedent("""
    import torch
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(100):
        optimizer.zero_grad()
        loss = model(torch.ones(4)).sum()
        loss.backward()
        optimizer.step()
""").lstrip()


def refused(source: str) -> tuple[str, int | None, str]:
    r = conv(source)
    assert r.status is Status.REFUSED and r.exit_status == 2
    assert r.output == r.source  # nothing converted
    (refusal,) = r.refusals
    assert refusal.message.count(". ") == 0 and refusal.message.endswith(".")  # one sentence
    return refusal.code, refusal.line, refusal.message


@pytest.mark.parametrize(("head", "what", "line"), [
    ("import horovod.torch as hvd\nhvd.init()", "Horovod", 2),
    ("import torch.distributed as dist\ndist.init_process_group('gloo')", "torch.distributed", 2),
    ("from torch.nn.parallel import DistributedDataParallel as DDP", "DistributedDataParallel", 2),
    ("model = torch.nn.DataParallel(torch.nn.Linear(4, 1))", "DataParallel", 2),
    ("import torch.multiprocessing as mp\nmp.spawn(print, nprocs=2)", "torch.multiprocessing.spawn", 3),
    ("from mpi4py import MPI", "mpi4py", 2),
])
def test_distributed_pytorch_scripts_are_refused(head: str, what: str, line: int) -> None:
    code, at, message = refused("import torch\n" + head + "\n" + TORCH_LOOP)
    assert code == "already_distributed" and at == line
    assert f"already distributed (it uses {what})" in message


def test_a_tf_distribute_strategy_is_refused() -> None:
    code, line, _ = refused("""
        import tensorflow as tf
        strategy = tf.distribute.MirroredStrategy()
        with strategy.scope():
            model.compile(optimizer="adam", loss="mse")
        model.fit(x, y)
    """)
    assert (code, line) == ("already_distributed", 2)


def test_tf1_sessions_are_refused() -> None:
    code, line, message = refused("""
        import tensorflow as tf
        x = tf.compat.v1.placeholder(tf.float32)
        with tf.compat.v1.Session() as sess:
            sess.run(train_op)
    """)
    assert (code, line) == ("tf1_session", 2)
    assert "TensorFlow 1" in message


@pytest.mark.parametrize("source", [
    """
    import torch
    model = torch.nn.Linear(4, 1)
    for step in range(10):
        model.zero_grad()
        model(torch.ones(4)).sum().backward()
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-0.1)
    """,
    """
    import keras
    model = keras.Sequential([keras.layers.Dense(1)])
    model(x)
    """,
    """
    import tensorflow as tf
    with tf.GradientTape() as tape:
        loss = model(x)
    grads = tape.gradient(loss, model.trainable_variables)
    """,
])
def test_no_optimizer_is_refused(source: str) -> None:
    code, _, message = refused(source)
    assert code == "no_optimizer" and "optimizer" in message


def test_lbfgs_alone_is_refused_with_the_reason() -> None:
    code, line, message = refused("""
        import torch
        model = torch.nn.Linear(4, 1)
        optimizer = torch.optim.LBFGS(model.parameters(), lr=0.8)
        for i in range(10):
            optimizer.step(lambda: model(x).sum())
    """)
    assert (code, line) == ("no_optimizer", 3) and "closure" in message


@pytest.mark.parametrize(("source", "line"), [
    # the loss itself
    ("""
     for epoch in range(10):
         for x, y in loader:
             optimizer.zero_grad()
             loss = criterion(model(x), y)
             loss.backward()
             optimizer.step()
             if loss.item() < 1e-3:
                 break
     """, 8),
    # a value derived from it, two steps away
    ("""
     for epoch in range(10):
         running = 0.0
         for x, y in loader:
             optimizer.zero_grad()
             out = criterion(model(x), y)
             out.backward()
             optimizer.step()
             running += out.item()
         average = running / len(loader)
         if average < 0.01:
             break
     """, 11),
    # returned by the step function
    ("""
     def step(x, y):
         optimizer.zero_grad()
         l = criterion(model(x), y)
         l.backward()
         optimizer.step()
         return l.item()

     for x, y in loader:
         value = step(x, y)
         if value != value:
             continue
     """, 11),
    # a return out of the epoch loop
    ("""
     def train():
         for x, y in loader:
             optimizer.zero_grad()
             loss = criterion(model(x), y)
             loss.backward()
             optimizer.step()
             if torch.isnan(loss):
                 return
     """, 8),
    # a while loop until the loss is small
    ("""
     err = 1.0
     while err > 0.1:
         optimizer.zero_grad()
         out = criterion(model(x), y)
         out.backward()
         optimizer.step()
         err = out.item()
     """, 2),
])
def test_control_flow_on_the_loss_is_refused(source: str, line: int) -> None:
    head = "import torch\nmodel = torch.nn.Linear(4, 1)\noptimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
    code, at, message = refused(head + textwrap.dedent(source).lstrip("\n"))
    assert code == "loss_dependent_exit" and at == line + 3
    assert "rank" in message


def test_fixed_step_counts_flags_and_evaluation_breaks_are_not_refused() -> None:
    r = conv("""
        import torch
        model = torch.nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for step, (x, y) in enumerate(loader):
            optimizer.zero_grad()
            loss = (model(x) - y).pow(2).mean()
            loss.backward()
            optimizer.step()
            if step == args.steps:
                break
            if args.dry_run:
                break
        for x, y in test_loader:  # no training here: ranks may stop at different points
            test_loss = (model(x) - y).pow(2).mean()
            if test_loss > 10:
                break
    """)
    assert r.status is Status.CONVERTED and not r.refusals


def test_framework_must_be_one() -> None:
    assert refused("import torch\nimport tensorflow as tf\n" + TORCH_LOOP)[0] == "ambiguous_framework"
    assert refused("import numpy as np\nprint(np.zeros(3))\n")[0] == "no_framework"
    code, line, _ = refused("""
        import tensorflow as tf
        model.compile(optimizer="adam", loss="mse")
        model.fit(x, y)
        with tf.GradientTape() as tape:
            loss = model(x)
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
    """)
    assert (code, line) == ("ambiguous_framework", 4)


def test_a_script_that_does_not_parse_is_refused() -> None:
    r = convert("import torch\ndef f(:\n")
    assert r.exit_status == 2 and r.refusals[0].code == "syntax_error" and r.refusals[0].line == 2


# -- warnings: converted, exit status 3 ------------------------------------------------------

def test_several_optimizers_warn() -> None:
    r = conv("""
        import torch
        netG, netD = Generator(), Discriminator()
        optG = torch.optim.Adam(netG.parameters(), lr=2e-4)
        optD = torch.optim.Adam(netD.parameters(), lr=2e-4)
        for x in loader:
            optD.zero_grad()
            errD = netD(x).mean()
            errD.backward()
            optD.step()
            optG.zero_grad()
            errG = netD(netG(x)).mean()
            errG.backward()
            optG.step()
    """)
    assert r.exit_status == 3 and codes(r.warnings) == ["several_optimizers"] and r.warnings[0].line == 4
    assert r.output.count("hvd.DistributedOptimizer(") == 2


def test_custom_train_step_and_bare_apply_gradients_warn() -> None:
    r = conv("""
        import tensorflow as tf

        class MyModel(tf.keras.Model):
            def train_step(self, data):
                x, y = data
                with tf.GradientTape() as tape:
                    loss = self.compiled_loss(y, self(x, training=True))
                grads = tape.gradient(loss, self.trainable_variables)
                self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
                return {"loss": loss}

        model = MyModel()
        model.compile(optimizer="adam", loss="mse")
        model.fit(x, y)
        model.optimizer.apply_gradients(zip(precomputed, model.trainable_variables))
    """)
    assert r.exit_status == 3
    assert [(w.code, w.line) for w in r.warnings] == [("custom_train_step", 4), ("bare_apply_gradients", 15)]


def test_tf_gradients_from_elsewhere_warn_but_from_a_helper_do_not() -> None:
    r = conv("""
        import tensorflow as tf
        opt = tf.keras.optimizers.SGD(0.1)

        def grad(model, x):
            with tf.GradientTape() as tape:
                loss = model(x)
            return loss, tape.gradient(loss, model.trainable_variables)

        for x in ds:
            loss, grads = grad(model, x)
            opt.apply_gradients(zip(grads, model.trainable_variables))
            opt.apply_gradients(zip(noise, model.trainable_variables))
    """)
    assert [(w.code, w.line) for w in r.warnings] == [("bare_apply_gradients", 12)]


@pytest.mark.parametrize("call", [
    "datasets.MNIST('../data', train=True, download=True)",
    "torchvision.models.resnet18(pretrained=True)",
    "torch.hub.load('pytorch/vision', 'resnet18')",
])
def test_downloads_warn_and_suggest_a_file_lock(call: str) -> None:
    r = conv("import torch, torchvision\nfrom torchvision import datasets\n"
             f"data = {call}\n" + TORCH_LOOP)
    assert r.exit_status == 3 and codes(r.warnings) == ["data_download"]
    assert "FileLock" in r.warnings[0].message and r.warnings[0].line == 3


def test_keras_dataset_downloads_warn() -> None:
    r = conv("""
        from tensorflow import keras
        (x, y), _ = keras.datasets.mnist.load_data()
        model.compile(optimizer="adam", loss="mse")
        model.fit(x, y)
    """)
    assert [(w.code, w.line) for w in r.warnings] == [("data_download", 2)]
