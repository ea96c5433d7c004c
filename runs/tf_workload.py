"""What the TensorFlow examples train: Keras application models on synthetic images.

``--model resnet50`` and ``--model efficientnetb0`` are ``keras.applications`` models built with
``weights=None`` (nothing is downloaded) at a small input size for CPUs (32x32 by default, the
smallest both accept); ``--model tiny`` is a two-layer CNN for tests that must take seconds.
The data are random images and labels from a fixed seed, made in memory, different on each
worker. The scripts print the same lines as the PyTorch examples (``gradient bytes N``,
``step i loss x``, ``losses [...]``, ``rank r done: N steps``) so tests read them alike.
"""

from __future__ import annotations

import argparse
import os

import numpy as np
import tensorflow as tf
from step_clock import StepClock

MODELS = ("resnet50", "efficientnetb0", "tiny")
POOL_BATCHES = 4  # distinct synthetic batches per worker, repeated


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", choices=MODELS, default="resnet50",
                   help="resnet50 (default), efficientnetb0 (keras.applications, weights=None) "
                   "or tiny (a small CNN for quick tests)")
    p.add_argument("--batch-size", type=int, default=32, help="samples per worker per step")
    p.add_argument("--steps", type=int, default=20, help="training steps (batches) per worker")
    p.add_argument("--image-size", type=int, default=32, help="input height and width (>= 32)")
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=0)


def configure_threads() -> None:
    """One intra-op pool per rank sized like torchrun's OMP_NUM_THREADS, so ranks sharing a
    machine do not each start a thread per core (TensorFlow does not read that variable)."""
    n = os.environ.get("OMP_NUM_THREADS", "")
    if n.isdigit() and int(n) > 0:
        tf.config.threading.set_intra_op_parallelism_threads(int(n))


def make_model(name: str, image_size: int, classes: int, seed: int) -> tf.keras.Model:
    """The model ``name`` with weights drawn from ``seed`` (call inside a strategy scope)."""
    tf.keras.utils.set_random_seed(seed)
    shape = (image_size, image_size, 3)
    if name == "resnet50":
        return tf.keras.applications.ResNet50(weights=None, input_shape=shape, classes=classes,
                                              classifier_activation=None)
    if name == "efficientnetb0":
        return tf.keras.applications.EfficientNetB0(weights=None, input_shape=shape, classes=classes,
                                                    classifier_activation=None)
    if name == "tiny":
        layers = tf.keras.layers
        return tf.keras.Sequential([
            layers.Input(shape),
            layers.Conv2D(8, 3, strides=2, use_bias=False),
            layers.BatchNormalization(),
            layers.ReLU(),
            layers.Conv2D(16, 3, strides=2),
            layers.GlobalAveragePooling2D(),
            layers.Dense(classes),
        ], name="tiny")
    raise SystemExit(f"unknown model {name!r}; choose one of {', '.join(MODELS)}")


def synthetic_dataset(batch: int, image_size: int, classes: int, seed: int, worker: int) -> tf.data.Dataset:
    """Endless batches of random images and labels, the same for a given seed and worker."""
    rng = np.random.default_rng([seed, worker])
    n = batch * POOL_BATCHES
    x = rng.standard_normal((n, image_size, image_size, 3), dtype=np.float32)
    y = rng.integers(0, classes, size=n).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch, drop_remainder=True).repeat()


def gradient_bytes(model: tf.keras.Model) -> int:
    """Bytes of all trainable variables' gradients (what one all-reduce round moves)."""
    return sum(int(v.shape.num_elements()) * v.dtype.size for v in model.trainable_variables)


class LossLog(tf.keras.callbacks.Callback):
    """``model.fit``'s per-batch loss (as Keras reports it) and time, into a :class:`StepClock`."""

    def __init__(self, clock: StepClock):
        super().__init__()
        self.clock = clock

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        self.clock.start()

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self.clock.done((logs or {})["loss"])
