"""TensorFlow, fully synchronous: ``model.fit`` under MultiWorkerMirroredStrategy on CPU.

    instrument run -np 2 runs/tf_sync_resnet.py --batch-size 64 --steps 20 [--model efficientnetb0]

Every batch's gradients are all-reduced across the workers (Keras aggregates them in the
optimizer). The workers find each other through ``TF_CONFIG``, which ``instrument run`` sets.
Rank 0 prints each step's loss as Keras reports it (the running mean over the epoch).
"""

from __future__ import annotations

import argparse

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    args = parser.parse_args()
    configure_threads()

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    resolver = strategy.cluster_resolver
    rank, world = resolver.task_id or 0, strategy.num_replicas_in_sync
    with strategy.scope():
        model = make_model(args.model, args.image_size, args.classes, args.seed)
        model.compile(optimizer=tf.keras.optimizers.SGD(args.lr, momentum=0.9),
                      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))

    def per_worker(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
        return synthetic_dataset(args.batch_size, args.image_size, args.classes, args.seed,
                                 ctx.input_pipeline_id)

    data = strategy.distribute_datasets_from_function(per_worker)
    if rank == 0:
        print(f"world {world}, model {args.model}, gradient bytes {gradient_bytes(model)}", flush=True)
    clock = StepClock(rank)
    model.fit(data, epochs=1, steps_per_epoch=args.steps, verbose=0, callbacks=[LossLog(clock)])
    clock.report()


if __name__ == "__main__":
    main()
