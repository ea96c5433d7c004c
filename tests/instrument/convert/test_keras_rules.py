"""Golden tests of the Keras rules (compile + fit) on small literal scripts."""

from __future__ import annotations

from tests.instrument.convert.helpers import added, codes, conv, removed, rules

CONVNET = """
    import numpy as np
    from tensorflow import keras
    from tensorflow.keras import layers

    x_train = np.zeros((60, 28, 28, 1), "float32")
    y_train = keras.utils.to_categorical(np.zeros(60), 10)
    model = keras.Sequential([keras.Input(shape=(28, 28, 1)), layers.Flatten(), layers.Dense(10)])
    model.compile(loss="categorical_crossentropy", optimizer="adam", metrics=["accuracy"])
    model.fit(x_train, y_train, batch_size=128, epochs=15, validation_split=0.1)
    score = model.evaluate(x_train, y_train, verbose=0)
    print("Test loss:", score[0])
"""

CONVNET_CONVERTED = """\
import numpy as np
from tensorflow import keras
from tensorflow.keras import layers
import tensorflow as tf
import horovod.tensorflow.keras as hvd
hvd.init()  # added by instrument horovodize
gpus = tf.config.experimental.list_physical_devices("GPU")
for gpu in gpus:
    tf.config.experimental.set_memory_growth(gpu, True)
if gpus:
    tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], "GPU")

x_train = np.zeros((60, 28, 28, 1), "float32")
y_train = keras.utils.to_categorical(np.zeros(60), 10)
model = keras.Sequential([keras.Input(shape=(28, 28, 1)), layers.Flatten(), layers.Dense(10)])
model.compile(loss="categorical_crossentropy", optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(learning_rate=0.001 * hvd.size())), metrics=["accuracy"])
# Horovod: each rank trains on every hvd.size()-th sample, the same number on every rank
shard = slice(hvd.rank(), len(x_train) // hvd.size() * hvd.size(), hvd.size())
model.fit(x_train[shard], y_train[shard], batch_size=128, epochs=15, validation_split=0.1, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), hvd.callbacks.MetricAverageCallback()], verbose=1 if hvd.rank() == 0 else 0)
score = model.evaluate(x_train, y_train, verbose=0)
print("Test loss:", score[0])
"""


def test_the_mnist_convnet_shape_becomes_the_horovod_one() -> None:
    r = conv(CONVNET)
    assert r.output == CONVNET_CONVERTED
    assert r.framework == "keras" and r.exit_status == 0
    assert rules(r) == [("init", 3), ("pin_device", 8), ("scale_lr", 8), ("wrap_optimizer", 8),
                        ("broadcast_state", 9), ("shard_data", 9), ("rank0_only", 9), ("average_metrics", 9)]
    # evaluate(verbose=0) is already quiet; its data stays whole on every rank, and the report says so
    assert codes(r.unseen) == ["eval_not_sharded"]


def test_optimizer_objects_callbacks_and_datasets() -> None:
    r = conv("""
        import tensorflow as tf

        opt = tf.keras.optimizers.SGD(0.01, momentum=0.9)
        model.compile(optimizer=opt, loss="mse")
        callbacks = [tf.keras.callbacks.EarlyStopping(patience=2)]
        callbacks.append(tf.keras.callbacks.TensorBoard("logs"))
        model.fit(train_ds, epochs=3, callbacks=callbacks)
        model.fit(x, y, callbacks=[
            tf.keras.callbacks.ModelCheckpoint("ckpt.h5"),
            tf.keras.callbacks.CSVLogger("log.csv"),
        ], verbose=2)
        train_ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(100).batch(8)
        model.save("final.keras")
    """)
    new = added(r)
    # the learning rate is scaled where the optimizer is made, and compile wraps it
    assert "opt = tf.keras.optimizers.SGD(0.01 * hvd.size(), momentum=0.9)" in new
    assert 'model.compile(optimizer=hvd.DistributedOptimizer(opt), loss="mse")' in new
    # a list of callbacks made elsewhere: ours first; file-writing callbacks on rank 0 only
    assert new[new.index("if hvd.rank() == 0:") + 1] == 'callbacks.append(tf.keras.callbacks.TensorBoard("logs"))'
    assert ("model.fit(train_ds, epochs=3, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), "
            "hvd.callbacks.MetricAverageCallback(), *callbacks], verbose=1 if hvd.rank() == 0 else 0)") in new
    # one callback per line stays one per line
    assert new[new.index("model.fit(x[shard], y[shard], callbacks=["):][1:6] == [
        "hvd.callbacks.BroadcastGlobalVariablesCallback(0),", "hvd.callbacks.MetricAverageCallback(),",
        '*([tf.keras.callbacks.ModelCheckpoint("ckpt.h5")] if hvd.rank() == 0 else []),',
        '*([tf.keras.callbacks.CSVLogger("log.csv")] if hvd.rank() == 0 else []),',
        "], verbose=2 if hvd.rank() == 0 else 0)"]
    # a tf.data pipeline is sharded at its source, before shuffling, equally on every rank
    assert ("train_ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(hvd.size(), drop_remainder=True)"
            ".unbatch().shard(hvd.size(), hvd.rank()).shuffle(100).batch(8)") in new
    assert new[-2:] == ["if hvd.rank() == 0:", 'model.save("final.keras")']


def test_compile_without_optimizer_gets_keras_default_scaled() -> None:
    r = conv("""
        import keras
        model.compile(loss="mse")
        model.fit(x, y)
    """)
    assert ('model.compile(loss="mse", optimizer=hvd.DistributedOptimizer(keras.optimizers.RMSprop('
            'learning_rate=0.001 * hvd.size())))') in added(r)


def test_unknown_strings_and_schedules_are_wrapped_but_not_scaled() -> None:
    r = conv("""
        from tensorflow import keras
        model.compile(optimizer="my_opt", loss="mse")
        schedule = keras.optimizers.schedules.ExponentialDecay(0.1, 1000, 0.9)
        other.compile(optimizer=keras.optimizers.Adam(learning_rate=schedule), loss="mse")
        model.fit(x, y)
    """)
    new = added(r)
    assert 'model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.get("my_opt")), loss="mse")' in new
    assert ('other.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(learning_rate=schedule)), '
            'loss="mse")') in new
    assert sorted(codes(r.unseen)) == ["lr_default", "lr_schedule"]
    assert codes(r.warnings) == ["several_optimizers"]  # two models compiled


def test_steps_option_divides_steps_per_epoch() -> None:
    r = conv("""
        import tensorflow as tf
        model.compile(optimizer="sgd", loss="mse")
        model.fit(train_ds, epochs=2, steps_per_epoch=100)
        model.fit(x, y, batch_size=32, epochs=2)
    """, keras_data="steps")
    new = added(r)
    assert any("steps_per_epoch=max(1, 100 // hvd.size())" in line for line in new)
    assert any("steps_per_epoch=len(x) // (32 * hvd.size())" in line for line in new)
    assert not any("shard" in line for line in new)


def test_several_inputs_are_each_sliced_and_verbose_zero_stays() -> None:
    r = conv("""
        import tensorflow as tf
        model.compile(optimizer="adam", loss="mse")
        model.fit([a, b], y, sample_weight=w, verbose=0)
    """)
    new = added(r)
    assert "shard = slice(hvd.rank(), len(a) // hvd.size() * hvd.size(), hvd.size())" in new
    assert ("model.fit([a[shard], b[shard]], y[shard], sample_weight=w[shard], verbose=0, callbacks=["
            "hvd.callbacks.BroadcastGlobalVariablesCallback(0), hvd.callbacks.MetricAverageCallback()])") in new
    assert "model.fit([a, b], y, sample_weight=w, verbose=0)" in removed(r)
