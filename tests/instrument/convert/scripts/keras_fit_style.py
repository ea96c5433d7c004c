"""
Title: A small convnet trained with model.fit, in the style of keras-io's mnist_convnet, on
seeded synthetic arrays made in code (written for the horovodize tests).

It prints each batch's running loss, and at the end how many training samples went through
the model and a checksum of its weights.
"""

# ruff: noqa: UP008, UP010, UP032, B905 (written the way the public examples are)

import argparse
import hashlib
import os

import numpy as np
import tensorflow as tf
from tensorflow import keras
from tensorflow.keras import layers

parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--samples", type=int, default=128)
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--seed", type=int, default=7)
parser.add_argument("--checkpoint-dir", default=None)
args = parser.parse_args()

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)
keras.utils.set_random_seed(args.seed)

num_classes = 10
input_shape = (12, 12, 1)

# Synthetic images and one-hot labels in place of keras.datasets.mnist
rng = np.random.default_rng(args.seed)
x_train = rng.normal(size=(args.samples, *input_shape)).astype("float32")
y_train = keras.utils.to_categorical(rng.integers(0, num_classes, args.samples), num_classes)
x_test = rng.normal(size=(64, *input_shape)).astype("float32")
y_test = keras.utils.to_categorical(rng.integers(0, num_classes, 64), num_classes)


class SampleCounter(layers.Layer):
    """Counts the samples that go through it in training (a weight, so it is not trained)."""

    def build(self, input_shape):
        self.seen = self.add_weight(name="seen", shape=(), initializer="zeros", trainable=False)

    def call(self, inputs, training=None):
        if training:
            self.seen.assign_add(tf.cast(tf.shape(inputs)[0], tf.float32))
        return inputs


class LossLog(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        print("step {} loss {:.6f}".format(batch, logs["loss"]))


counter = SampleCounter()
model = keras.Sequential(
    [
        keras.Input(shape=input_shape),
        counter,
        layers.Conv2D(4, kernel_size=(3, 3), activation="relu"),
        layers.MaxPooling2D(pool_size=(2, 2)),
        layers.Flatten(),
        layers.Dropout(0.5),
        layers.Dense(num_classes, activation="softmax"),
    ]
)

callbacks = [LossLog()]
if args.checkpoint_dir:
    # one file name per process: the tests count how many processes wrote one
    path = os.path.join(args.checkpoint_dir, "ckpt-{}.weights.h5".format(os.getpid()))
    callbacks.append(keras.callbacks.ModelCheckpoint(path, save_weights_only=True))

model.compile(loss="categorical_crossentropy", optimizer="adam", metrics=["accuracy"])

model.fit(x_train, y_train, batch_size=args.batch_size, epochs=args.epochs, callbacks=callbacks,
          shuffle=True)

score = model.evaluate(x_test, y_test, verbose=0)
print("Test loss:", score[0])

digest = hashlib.sha256()
for w in model.trainable_weights:
    digest.update(w.numpy().tobytes())
print("samples seen {}".format(int(counter.seen.numpy())))
print("parameters sha256 {}".format(digest.hexdigest()))
