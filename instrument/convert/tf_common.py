"""What the Keras and TensorFlow 2 rules share: Keras optimizers (their default learning
rates, scaling them), one GPU per process, and sharding a ``tf.data`` pipeline at its source.

A ``tf.data`` source becomes ``SOURCE.batch(hvd.size(), drop_remainder=True).unbatch()
.shard(hvd.size(), hvd.rank())``: sharding right at the source gives each rank every
size-th element before any shuffling, and the batch/unbatch pair first drops the last
``len % size`` elements, so every rank gets exactly as many elements (hence steps). With
shards one element apart, one rank could take one more step than the others and wait in its
allreduce forever. On one rank both are the identity.
"""

from __future__ import annotations

import libcst as cst

from instrument.convert.common_rules import Context, add_argument, kwarg
from instrument.convert.edits import appended
from instrument.convert.facts import argument, dotted, keyword, positional, root_name

# Keras 2.15 / 3 defaults (keras.optimizers.get(name).learning_rate)
DEFAULT_LR = {"Adam": "0.001", "SGD": "0.01", "RMSprop": "0.001", "Adagrad": "0.001", "Adadelta": "0.001",
              "Adamax": "0.001", "Nadam": "0.001", "Ftrl": "0.001", "AdamW": "0.001", "Lion": "0.0001",
              "Adafactor": "0.001"}
BY_STRING = {"adam": "Adam", "sgd": "SGD", "rmsprop": "RMSprop", "adagrad": "Adagrad", "adadelta": "Adadelta",
             "adamax": "Adamax", "nadam": "Nadam", "ftrl": "Ftrl", "adamw": "AdamW", "lion": "Lion"}
SOURCES = ("tensorflow.data.Dataset.from_tensor_slices", "tensorflow.data.Dataset.from_generator",
           "tensorflow.data.Dataset.range", "tensorflow.data.Dataset.list_files",
           "tensorflow.data.TFRecordDataset", "tensorflow.data.TextLineDataset",
           "tensorflow.data.FixedLengthRecordDataset", "tensorflow.data.Dataset.from_tensors")
_SIMPLE = (cst.Name, cst.Attribute, cst.Call, cst.Integer, cst.Float, cst.Subscript)


def is_keras_optimizer(ctx: Context, call: cst.Call) -> bool:
    name = ctx.facts.qname(call) or ""
    return name.startswith("keras.optimizers.") and name.rpartition(".")[2] in DEFAULT_LR


def keras_alias(ctx: Context) -> str:
    """How the script names Keras: ``keras`` or ``tf.keras`` (importing tensorflow if needed)."""
    alias = ctx.facts.local_alias("keras")
    if alias:
        return alias
    return ctx.module_alias("tensorflow", "tf") + ".keras"


def scale_lr(ctx: Context, call: cst.Call) -> None:
    """``learning_rate`` of a Keras optimizer's constructor x ``hvd.size()``."""
    cls = (ctx.facts.qname(call) or "").rpartition(".")[2]
    arg = keyword(call, "learning_rate") or keyword(call, "lr") or positional(call, 0)
    if arg is None:
        default = DEFAULT_LR.get(cls)
        if default is None:
            ctx.cannot_see("lr_default", call, f"{cls}'s default learning rate is unknown: not scaled.")
            return
        ctx.plan.rewrite(call, lambda c: add_argument(c, kwarg("learning_rate", f"{default} * hvd.size()"))
                         if isinstance(c, cst.Call) else c)
        ctx.apply("scale_lr", call, f"{cls}(learning_rate={default} * hvd.size()) (its default x ranks)")
        return
    if _is_schedule(ctx, arg.value):
        ctx.cannot_see("lr_schedule", call, f"`{ctx.code(arg.value)}` is a learning-rate schedule, which "
                       "cannot be multiplied: scale its initial rate by hvd.size() yourself.")
        return
    ctx.plan.rewrite(arg.value, times_size)
    ctx.apply("scale_lr", call, f"{cls}: learning rate `{ctx.code(arg.value)}` x hvd.size()")


def times_size(node: cst.CSTNode) -> cst.CSTNode:
    assert isinstance(node, cst.BaseExpression)
    left = node if isinstance(node, _SIMPLE) or node.lpar else node.with_changes(
        lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    return cst.BinaryOperation(left=left, operator=cst.Multiply(), right=cst.parse_expression("hvd.size()"))


def _is_schedule(ctx: Context, value: cst.BaseExpression) -> bool:
    exprs = [value]
    name = dotted(value)
    if name:
        exprs += assignments(ctx, name)
    for e in exprs:
        for c in ctx.facts.calls_in(e):
            q = (ctx.facts.qname(c) or dotted(c.func) or "").lower()
            if "schedule" in q or "decay" in q:
                return True
    return False


def assignments(ctx: Context, name: str) -> list[cst.BaseExpression]:
    """Every value assigned to ``name`` anywhere in the script."""
    out: list[cst.BaseExpression] = []

    class V(cst.CSTVisitor):
        def visit_Assign(self, node: cst.Assign) -> None:
            if any(dotted(t.target) == name for t in node.targets):
                out.append(node.value)

    ctx.facts.module.visit(V())
    return out


def pin_gpu(ctx: Context, first: cst.CSTNode) -> None:
    tf = ctx.module_alias("tensorflow", "tf")
    gpus = ctx.facts.fresh("gpus", "hvd_gpus")
    gpu = ctx.facts.fresh("gpu", "hvd_gpu")
    ctx.after_init += [
        f"{gpus} = {tf}.config.experimental.list_physical_devices(\"GPU\")",
        f"for {gpu} in {gpus}:",
        f"    {tf}.config.experimental.set_memory_growth({gpu}, True)",
        f"if {gpus}:",
        f"    {tf}.config.experimental.set_visible_devices({gpus}[hvd.local_rank()], \"GPU\")",
    ]
    ctx.apply("pin_device", first, "one GPU per process: the local rank's (none on a CPU machine)")


def dataset_sources(ctx: Context, name: str, depth: int = 0) -> list[cst.Call]:
    """The ``tf.data`` source calls whose pipelines end up in ``name``."""
    out: list[cst.Call] = []
    for value in assignments(ctx, name):
        calls = [c for c in ctx.facts.calls_in(value) if ctx.facts.qname(c) in SOURCES]
        if calls:
            out.append(calls[0])
        elif depth < 4:
            base = root_name(value)
            if base and base != name:
                out += dataset_sources(ctx, base, depth + 1)
    return out


def shard_source(ctx: Context, source: cst.Call, user: str) -> None:
    code = ".batch(hvd.size(), drop_remainder=True).unbatch().shard(hvd.size(), hvd.rank())"
    ctx.plan.rewrite(source, appended(ctx.plan.module, code))
    ctx.apply("shard_data", source, f"each rank takes every hvd.size()-th element of `{user}`'s source, "
              "the same number on every rank")


def optimizer_variables(ctx: Context, opt: str, ctor: cst.Call | None) -> str:
    """Code for an optimizer's variables: a method on legacy Keras optimizers, a list on the
    others."""
    name = (ctx.facts.qname(ctor) or "") if ctor is not None else ""
    if ".legacy." in name:
        return f"{opt}.variables()"
    if name:
        return f"{opt}.variables"
    return f"({opt}.variables() if callable({opt}.variables) else {opt}.variables)"


def data_argument(call: cst.Call) -> cst.Arg | None:
    return argument(call, 0, "x")
