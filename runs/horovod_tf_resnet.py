"""Horovod with TensorFlow: a Keras model on synthetic images, on CPU over Gloo.

    instrument run -np 2 runs/horovod_tf_resnet.py --batch-size 32 --steps 20 [--api keras]
    horovodrun -np 2 --gloo python runs/horovod_tf_resnet.py --model tiny --steps 5

``--api tape`` (default): a ``tf.function`` training step whose ``GradientTape`` is wrapped in
``hvd.DistributedGradientTape`` (one allreduce per gradient, averaged). ``--api keras``:
``model.fit`` with ``horovod.tensorflow.keras``'s ``DistributedOptimizer`` and
``BroadcastGlobalVariablesCallback``. Either way rank 0's initial variables are broadcast to
all ranks before the first update, and rank 0 prints each step's local loss.
"""

from __future__ import annotations

import argparse

import horovod.tensorflow as hvd
import tensorflow as tf
from tf_workload import (
    LossLog,
    StepClock,
    add_arguments,
    configure_threads,
    gradient_bytes,
    make_model,
    synthetic_dataset,
)


def train_with_tape(args: argparse.Namespace, model: tf.keras.Model, clock: StepClock) -> None:
    optimizer = tf.keras.optimizers.SGD(args.lr, momentum=0.9)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def train_step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    optimizer.build(model.trainable_variables)
    hvd.broadcast_variables(model.variables, root_rank=0)
    hvd.broadcast_variables(optimizer.variables, root_rank=0)
    batches = iter(synthetic_dataset(args.batch_size, args.image_size, args.classes, args.seed, hvd.rank()))
    for _ in range(args.steps):
        x, y = next(batches)
        clock.start()
        loss = train_step(x, y)
        clock.done(loss.numpy())


def train_with_keras(args: argparse.Namespace, model: tf.keras.Model, clock: StepClock) -> None:
    import horovod.tensorflow.keras as hvd_keras

    optimizer = hvd_keras.DistributedOptimizer(tf.keras.optimizers.legacy.SGD(args.lr, momentum=0.9))
    model.compile(optimizer=optimizer, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    data = synthetic_dataset(args.batch_size, args.image_size, args.classes, args.seed, hvd.rank())
    callbacks = [hvd_keras.callbacks.BroadcastGlobalVariablesCallback(0), LossLog(clock)]
    model.fit(data, epochs=1, steps_per_epoch=args.steps, verbose=0, callbacks=callbacks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    parser.add_argument("--api", choices=("tape", "keras"), default="tape",
                        help="DistributedGradientTape in a custom loop (default) or Keras model.fit")
    args = parser.parse_args()
    configure_threads()

    hvd.init()
    rank, world = hvd.rank(), hvd.size()
    model = make_model(args.model, args.image_size, args.classes, args.seed + rank)
    if rank == 0:
        print(f"world {world}, model {args.model}, api {args.api}, gradient tensors "
              f"{len(model.trainable_variables)}, gradient bytes {gradient_bytes(model)}", flush=True)
    clock = StepClock(rank)
    if args.api == "tape":
        train_with_tape(args, model, clock)
    else:
        train_with_keras(args, model, clock)
    clock.report()


if __name__ == "__main__":
    main()
