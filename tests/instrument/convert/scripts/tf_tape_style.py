"""A TensorFlow 2 custom training loop in the style of the TensorFlow "quickstart for experts"
tutorial: a Model subclass, a @tf.function training step with a GradientTape, tf.data
pipelines over seeded synthetic arrays made in code (written for the horovodize tests).

It prints each step's loss, and at the end how many training samples it saw and a checksum
of its weights.
"""

# ruff: noqa: UP008, UP010, UP032, B905 (written the way the public examples are)

import argparse
import hashlib
import os

import numpy as np
import tensorflow as tf
from tensorflow.keras import Model
from tensorflow.keras.layers import Conv2D, Dense, Flatten


class MyModel(Model):
    def __init__(self):
        super().__init__()
        self.conv1 = Conv2D(4, 3, activation='relu')
        self.flatten = Flatten()
        self.d1 = Dense(10)

    def call(self, x):
        return self.d1(self.flatten(self.conv1(x)))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--epochs', type=int, default=2)
    parser.add_argument('--samples', type=int, default=128)
    parser.add_argument('--batch-size', type=int, default=16)
    parser.add_argument('--seed', type=int, default=3)
    parser.add_argument('--checkpoint-dir', default=None)
    args = parser.parse_args()
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.keras.utils.set_random_seed(args.seed)

    rng = np.random.default_rng(args.seed)
    x_train = rng.normal(size=(args.samples, 10, 10, 1)).astype("float32")
    y_train = rng.integers(0, 10, args.samples)
    x_test = rng.normal(size=(32, 10, 10, 1)).astype("float32")
    y_test = rng.integers(0, 10, 32)

    train_ds = tf.data.Dataset.from_tensor_slices(
        (x_train, y_train)).shuffle(1000, seed=args.seed).batch(args.batch_size)
    test_ds = tf.data.Dataset.from_tensor_slices((x_test, y_test)).batch(args.batch_size)

    model = MyModel()
    loss_object = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    optimizer = tf.keras.optimizers.SGD(learning_rate=0.05, momentum=0.9)
    test_loss = tf.keras.metrics.Mean(name='test_loss')

    @tf.function
    def train_step(images, labels):
        with tf.GradientTape() as tape:
            predictions = model(images, training=True)
            loss = loss_object(labels, predictions)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return loss

    @tf.function
    def test_step(images, labels):
        test_loss(loss_object(labels, model(images, training=False)))

    seen = 0
    for epoch in range(args.epochs):
        test_loss.reset_state()
        for step, (images, labels) in enumerate(train_ds):
            loss = train_step(images, labels)
            seen += int(images.shape[0])
            print(f'epoch {epoch} step {step} loss {float(loss):.6f}')
        for test_images, test_labels in test_ds:
            test_step(test_images, test_labels)
        print(f'Epoch {epoch + 1}, Test Loss: {test_loss.result():0.4f}')

    if args.checkpoint_dir:
        # one file name per process: the tests count how many processes wrote one
        model.save_weights(os.path.join(args.checkpoint_dir, f"ckpt-{os.getpid()}.weights.h5"))

    digest = hashlib.sha256()
    for w in model.trainable_weights:
        digest.update(w.numpy().tobytes())
    print(f'samples seen {seen}')
    print(f'parameters sha256 {digest.hexdigest()}')


if __name__ == '__main__':
    main()
