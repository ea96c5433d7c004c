"""Golden tests of the TensorFlow 2 custom-loop rules (GradientTape, tf.function steps)."""

from __future__ import annotations

from tests.instrument.convert.helpers import added, codes, conv, rules

QUICKSTART = """
    import tensorflow as tf

    train_ds = tf.data.Dataset.from_tensor_slices(
        (x_train, y_train)).shuffle(10000).batch(32)
    model = MyModel()
    loss_object = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    optimizer = tf.keras.optimizers.Adam()

    @tf.function
    def train_step(images, labels):
      with tf.GradientTape() as tape:
        loss = loss_object(labels, model(images, training=True))
      gradients = tape.gradient(loss, model.trainable_variables)
      optimizer.apply_gradients(zip(gradients, model.trainable_variables))

    for epoch in range(5):
      for images, labels in train_ds:
        train_step(images, labels)
      print(f'Epoch {epoch + 1}')
"""

QUICKSTART_CONVERTED = """\
import tensorflow as tf
import horovod.tensorflow as hvd
hvd.init()  # added by instrument horovodize
gpus = tf.config.experimental.list_physical_devices("GPU")
for gpu in gpus:
  tf.config.experimental.set_memory_growth(gpu, True)
if gpus:
  tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], "GPU")

train_ds = tf.data.Dataset.from_tensor_slices(
    (x_train, y_train)).batch(hvd.size(), drop_remainder=True).unbatch().shard(hvd.size(), hvd.rank()).shuffle(10000).batch(32)
model = MyModel()
loss_object = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
optimizer = tf.keras.optimizers.Adam(learning_rate=0.001 * hvd.size())

@tf.function
def train_step(images, labels):
  with tf.GradientTape() as tape:
    loss = loss_object(labels, model(images, training=True))
  # Horovod: average the gradients across ranks
  tape = hvd.DistributedGradientTape(tape)
  gradients = tape.gradient(loss, model.trainable_variables)
  optimizer.apply_gradients(zip(gradients, model.trainable_variables))

hvd_broadcast_done = False
for epoch in range(5):
  for images, labels in train_ds:
    train_step(images, labels)
    # Horovod: after the first step (the optimizer's variables exist now), rank 0's variables everywhere
    if not hvd_broadcast_done:
      hvd.broadcast_variables(model.variables, root_rank=0)
      hvd.broadcast_variables(optimizer.variables, root_rank=0)
      hvd_broadcast_done = True
  if hvd.rank() == 0:
    print(f'Epoch {epoch + 1}')
"""


def test_the_quickstart_loop_becomes_the_horovod_one_in_its_own_indentation() -> None:
    """The TensorFlow tutorial's shape, indented by two spaces: new blocks are too."""
    r = conv(QUICKSTART)
    assert r.output == QUICKSTART_CONVERTED
    assert r.framework == "tensorflow" and r.exit_status == 0
    assert rules(r) == [("init", 1), ("pin_device", 14), ("scale_lr", 7), ("wrap_optimizer", 13),
                        ("broadcast_state", 18), ("shard_data", 3), ("rank0_only", 19)]


def test_an_eager_loop_with_gradient_inside_the_tape_block() -> None:
    r = conv("""
        import tensorflow as tf

        def main():
            ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(4)
            model = tf.keras.Sequential([tf.keras.layers.Dense(2)])
            optimizer = tf.keras.optimizers.legacy.Adam()
            writer = tf.summary.create_file_writer("logs")
            for epoch in range(2):
                for step, (xb, yb) in enumerate(ds):
                    with tf.GradientTape() as tape:
                        loss = tf.reduce_mean((model(xb) - yb) ** 2)
                        grads = tape.gradient(loss, model.trainable_variables)
                    optimizer.apply_gradients(zip(grads, model.trainable_variables))
                    with writer.as_default():
                        tf.summary.scalar("loss", loss, step=step)
    """)
    new = added(r)
    # Horovod's wrapper cannot be made inside the block that records: the block opens it
    assert "with hvd.DistributedGradientTape(tf.GradientTape()) as tape:" in new
    # the flag lives in main(), before the outermost loop; legacy optimizers' variables are a method
    flag = new.index("hvd_broadcast_done = False")
    assert new[flag + 2:flag + 7] == [
        "# Horovod: after the first step (the optimizer's variables exist now), rank 0's variables everywhere",
        "if not hvd_broadcast_done:", "hvd.broadcast_variables(model.variables, root_rank=0)",
        "hvd.broadcast_variables(optimizer.variables(), root_rank=0)", "hvd_broadcast_done = True"]
    assert ('writer = tf.summary.create_file_writer("logs") if hvd.rank() == 0 else '
            'tf.summary.create_noop_writer()') in new
    assert "optimizer = tf.keras.optimizers.legacy.Adam(learning_rate=0.001 * hvd.size())" in new


def test_a_gan_step_broadcasts_both_models_once_and_warns() -> None:
    r = conv("""
        import tensorflow as tf
        gen_opt = tf.keras.optimizers.Adam(1e-4)
        disc_opt = tf.keras.optimizers.Adam(1e-4)

        @tf.function
        def train_step(images):
            with tf.GradientTape() as gen_tape, tf.GradientTape() as disc_tape:
                g, d = gen_loss(images), disc_loss(images)
            gg = gen_tape.gradient(g, generator.trainable_variables)
            dg = disc_tape.gradient(d, discriminator.trainable_variables)
            gen_opt.apply_gradients(zip(gg, generator.trainable_variables))
            disc_opt.apply_gradients(zip(dg, discriminator.trainable_variables))

        def train(dataset, epochs):
            for epoch in range(epochs):
                for batch in dataset:
                    train_step(batch)

        train_dataset = tf.data.Dataset.from_tensor_slices(images).shuffle(60000).batch(256)
        train(train_dataset, 50)
    """)
    new = added(r)
    assert new.count("if not hvd_broadcast_done:") == 1
    assert [line for line in new if line.startswith("hvd.broadcast_variables")] == [
        "hvd.broadcast_variables(generator.variables, root_rank=0)",
        "hvd.broadcast_variables(discriminator.variables, root_rank=0)",
        "hvd.broadcast_variables(gen_opt.variables, root_rank=0)",
        "hvd.broadcast_variables(disc_opt.variables, root_rank=0)"]
    assert new.count("gen_tape = hvd.DistributedGradientTape(gen_tape)") == 1
    # the dataset reaches the loop as train()'s parameter: followed to its source
    assert any(".shard(hvd.size(), hvd.rank()).shuffle(60000)" in line for line in new)
    assert codes(r.warnings) == ["several_optimizers"]


def test_steps_option_takes_a_share_of_the_batches() -> None:
    r = conv("""
        import tensorflow as tf
        ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(4)
        opt = tf.keras.optimizers.SGD(0.1)
        for xb, yb in ds:
            with tf.GradientTape() as tape:
                loss = model(xb)
            opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
    """, keras_data="steps")
    assert "for xb, yb in ds.take(len(ds) // hvd.size()):" in added(r)
    assert not any(".shard(" in line for line in added(r))
