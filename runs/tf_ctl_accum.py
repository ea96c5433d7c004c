"""TensorFlow custom training loop with gradient accumulation under MultiWorkerMirroredStrategy.

    instrument run -np 2 runs/tf_ctl_accum.py --batch-size 64 --accumulate 4 --steps 20

Each loop iteration (a step) runs one micro-batch through a ``tf.function`` using
``GradientTape`` and adds its gradients to per-worker accumulators. Every K-th iteration also
all-reduces the accumulated gradients once (an explicit ``all_reduce`` in the replica
context), averages them over workers and micro-batches, and applies them with
``skip_gradients_aggregation=True`` so the optimizer does not reduce them again. So
``--steps 20 --accumulate 4`` makes 20 steps and 5 all-reduces; ``--steps`` should be a
multiple of K. Rank 0 prints each micro-batch's local loss.
"""

from __future__ import annotations

import argparse

import tensorflow as tf
from tf_workload import (
    StepClock,
    add_arguments,
    configure_threads,
    gradient_bytes,
    make_model,
    synthetic_dataset,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    parser.add_argument("--accumulate", type=int, default=4, metavar="K",
                        help="micro-batches per all-reduce and optimizer update (default 4)")
    args = parser.parse_args()
    if args.accumulate < 1:
        parser.error("--accumulate must be at least 1")
    configure_threads()

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    rank, world = strategy.cluster_resolver.task_id or 0, strategy.num_replicas_in_sync
    k = args.accumulate
    with strategy.scope():
        model = make_model(args.model, args.image_size, args.classes, args.seed)
        optimizer = tf.keras.optimizers.SGD(args.lr, momentum=0.9)
        # Per-worker sums of the micro-batch gradients: read and written locally, never synced.
        accumulators = [
            tf.Variable(tf.zeros_like(v), trainable=False, synchronization=tf.VariableSynchronization.ON_READ,
                        aggregation=tf.VariableAggregation.NONE)
            for v in model.trainable_variables
        ]
    # Per-sample losses averaged over this worker's micro-batch; workers are averaged after the
    # all-reduce (Keras refuses an automatic reduction inside a strategy).
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, reduction=tf.keras.losses.Reduction.NONE)

    def gradients(x: tf.Tensor, y: tf.Tensor) -> tuple[tf.Tensor, list[tf.Tensor]]:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(loss_fn(y, model(x, training=True)))
            scaled = loss / k
        return loss, tape.gradient(scaled, model.trainable_variables)

    def accumulate(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        loss, grads = gradients(x, y)
        for acc, g in zip(accumulators, grads, strict=True):
            acc.assign_add(g)
        return loss

    def synchronize(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        loss, grads = gradients(x, y)
        local = [acc + g for acc, g in zip(accumulators, grads, strict=True)]
        summed = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, local)
        mean = [g / world for g in summed]
        optimizer.apply_gradients(zip(mean, model.trainable_variables, strict=True),
                                  skip_gradients_aggregation=True)
        for acc in accumulators:
            acc.assign(tf.zeros_like(acc))
        return loss

    @tf.function
    def accumulate_step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        return strategy.run(accumulate, args=(x, y))

    @tf.function
    def sync_step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        return strategy.run(synchronize, args=(x, y))

    batches = iter(synthetic_dataset(args.batch_size, args.image_size, args.classes, args.seed, rank))
    if rank == 0:
        print(f"world {world}, model {args.model}, accumulate {k}, gradient bytes {gradient_bytes(model)}",
              flush=True)
    clock = StepClock(rank)
    for step in range(args.steps):
        x, y = next(batches)
        clock.start()
        step_fn = sync_step if step % k == k - 1 else accumulate_step
        loss = strategy.experimental_local_results(step_fn(x, y))[0]
        clock.done(loss.numpy())
    clock.report()


if __name__ == "__main__":
    main()
