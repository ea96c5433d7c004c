"""The Keras rules (``model.compile`` + ``model.fit``, tf.keras or keras 2.15).

``compile``: the optimizer (a string is first resolved to its class with its default
learning rate) gets learning rate x ``hvd.size()`` and is wrapped in
``hvd.DistributedOptimizer``. ``fit``: ``BroadcastGlobalVariablesCallback(0)`` and
``MetricAverageCallback()`` first among the callbacks, checkpoint / TensorBoard / CSV
callbacks on rank 0 only, ``verbose`` on rank 0 only, and the training data split: arrays
by a slice taking every size-th sample (the same number on every rank), a tf.data pipeline at
its source (``--keras-data shard``, the default), or ``steps_per_epoch // hvd.size()``
(``--keras-data steps``).
"""

from __future__ import annotations

import libcst as cst

from instrument.convert import checks, tf_common
from instrument.convert.common_rules import Context, add_argument, kwarg
from instrument.convert.facts import argument, dotted, keyword, method_name, positional
from instrument.convert.report import Finding

HVD_MODULE = "horovod.tensorflow.keras"
_RANK0_CALLBACKS = ("ModelCheckpoint", "TensorBoard", "CSVLogger")
_HVD_CALLBACKS = ("hvd.callbacks.BroadcastGlobalVariablesCallback(0)", "hvd.callbacks.MetricAverageCallback()")


def convert(ctx: Context) -> Finding | None:
    facts = ctx.facts
    compiles = [c for c in facts.calls if method_name(c) == "compile" and isinstance(c.func, cst.Attribute)
                and not (facts.qname(c) or "").startswith(("re.", "builtins"))]
    if not compiles:
        return Finding("no_optimizer", None, "no model.compile(...) found, so there is no optimizer to "
                       "average gradients with.")
    for call in compiles:
        jit = keyword(call, "jit_compile")
        if jit is not None and not (isinstance(jit.value, cst.Name) and jit.value.value in ("False", "None")):
            ctx.cannot_see("jit_compile", call, "compile(jit_compile=...) has XLA compile the training "
                           "step, allreduce included, which Horovod supports only experimentally "
                           "(HOROVOD_ENABLE_XLA_OPS=1): drop it if fit fails.")
    if len(compiles) > 1:
        ctx.warn("several_optimizers", compiles[1], f"{len(compiles)} models are compiled (a GAN?): each "
                 "optimizer is wrapped; check that every rank runs the same training steps in the same order.")
    ctx.warnings += checks.custom_train_steps(facts)
    train_steps = {id(c) for c in facts.calls if method_name(c) == "apply_gradients"
                   and _in_train_step(ctx, c)}
    ctx.warnings += checks.bare_apply_gradients(facts, set(), train_steps)
    keras = tf_common.keras_alias(ctx)
    for call in compiles:
        _wrap_compiled_optimizer(ctx, call, keras)
    tf_common.pin_gpu(ctx, compiles[0])
    fits = [c for c in facts.calls if method_name(c) in ("fit", "fit_generator") and isinstance(c.func, cst.Attribute)]
    for call in fits:
        _fit(ctx, call)
    for call in facts.calls:
        if method_name(call) in ("evaluate", "predict") and isinstance(call.func, cst.Attribute):
            _quiet(ctx, call, "0")
            if method_name(call) == "evaluate":
                ctx.cannot_see("eval_not_sharded", call, "evaluation data is not sharded: every rank "
                               "evaluates all of it, so the metrics are already global and the same "
                               "on every rank.")
    _rank0_callbacks(ctx)
    return None


def _in_train_step(ctx: Context, call: cst.Call) -> bool:
    fn = ctx.facts.function_of(call)
    return fn is not None and fn.name.value == "train_step"


# -- compile ---------------------------------------------------------------------------------

def _wrap_compiled_optimizer(ctx: Context, call: cst.Call, keras: str) -> None:
    facts = ctx.facts
    arg = argument(call, 0, "optimizer")
    wrap = "hvd.DistributedOptimizer({})"
    if arg is None:
        new = f"{keras}.optimizers.RMSprop(learning_rate=0.001 * hvd.size())"
        ctx.plan.rewrite(call, lambda c: add_argument(c, kwarg("optimizer", wrap.format(new)))
                         if isinstance(c, cst.Call) else c)
        ctx.apply("scale_lr", call, "Keras's default optimizer, RMSprop(learning_rate=0.001 * hvd.size())")
        ctx.apply("wrap_optimizer", call, "hvd.DistributedOptimizer(RMSprop(...)) (compile had none: Keras's default)")
        return
    value = arg.value
    if isinstance(value, cst.SimpleString):
        cls = tf_common.BY_STRING.get(str(value.evaluated_value).lower())
        if cls is None:
            ctx.plan.rewrite(value, lambda v: cst.parse_expression(
                wrap.format(f"{keras}.optimizers.get({ctx.plan.module.code_for_node(v)})")))
            ctx.apply("wrap_optimizer", call, f"optimizer {facts.code(value)} resolved with keras.optimizers.get "
                      "and wrapped in hvd.DistributedOptimizer")
            ctx.cannot_see("lr_default", value, f"the default learning rate of {facts.code(value)} is unknown: "
                           "not scaled.")
            return
        new = f"{keras}.optimizers.{cls}(learning_rate={tf_common.DEFAULT_LR[cls]} * hvd.size())"
        ctx.plan.rewrite(value, lambda _v: cst.parse_expression(wrap.format(new)))
        ctx.apply("scale_lr", call, f"{facts.code(value)} -> {cls}(learning_rate={tf_common.DEFAULT_LR[cls]} "
                  "* hvd.size()) (its default x ranks)")
        ctx.apply("wrap_optimizer", call, f"{cls} wrapped in hvd.DistributedOptimizer")
        return
    if isinstance(value, cst.Call) and tf_common.is_keras_optimizer(ctx, value):
        tf_common.scale_lr(ctx, value)
    else:
        name = dotted(value)
        ctors = [c for v in (tf_common.assignments(ctx, name) if name else [])
                 for c in facts.calls_in(v) if tf_common.is_keras_optimizer(ctx, c)]
        if ctors:
            tf_common.scale_lr(ctx, ctors[0])
        else:
            ctx.cannot_see("optimizer_made_elsewhere", value, f"`{facts.code(value)}` is made where the "
                           "converter cannot see: wrapped, but its learning rate is not scaled.")
    ctx.plan.rewrite(value, lambda v: cst.parse_expression(wrap.format(ctx.plan.module.code_for_node(v))))
    ctx.apply("wrap_optimizer", call, f"`{facts.code(value)}` wrapped in hvd.DistributedOptimizer")


# -- fit -------------------------------------------------------------------------------------

def _fit(ctx: Context, call: cst.Call) -> None:
    cbs = keyword(call, "callbacks")
    first = ", ".join(_HVD_CALLBACKS)
    if cbs is None:
        ctx.plan.rewrite(call, lambda c: add_argument(c, kwarg("callbacks", f"[{first}]"))
                         if isinstance(c, cst.Call) else c)
    elif isinstance(cbs.value, cst.List):
        ctx.plan.rewrite(cbs.value, lambda v: _prepend_elements(v, _HVD_CALLBACKS))
    else:
        ctx.plan.rewrite(cbs.value, lambda v: cst.parse_expression(
            f"[{first}, *{ctx.plan.module.code_for_node(v)}]"))
    ctx.apply("broadcast_state", call, "hvd.callbacks.BroadcastGlobalVariablesCallback(0) first among the callbacks")
    ctx.apply("average_metrics", call, "hvd.callbacks.MetricAverageCallback(): epoch metrics averaged across ranks")
    _quiet(ctx, call, "1")
    _split_data(ctx, call)


def _prepend_elements(node: cst.CSTNode, elements: tuple[str, ...]) -> cst.CSTNode:
    assert isinstance(node, cst.List)
    new = [cst.Element(cst.parse_expression(e), comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
           for e in elements]
    old = list(node.elements)
    if not old:
        new[-1] = new[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
    elif isinstance(old[0].comma, cst.Comma) and "\n" in cst.Module([]).code_for_node(old[0].comma):
        # one callback per line: ours get lines of their own too
        new = [e.with_changes(comma=old[0].comma) for e in new]
    return node.with_changes(elements=[*new, *old])


def _quiet(ctx: Context, call: cst.Call, default: str) -> None:
    """``verbose`` on rank 0 only."""
    verbose = keyword(call, "verbose")
    if verbose is None:
        if method_name(call) != "fit" and default == "0":
            default = "1"
        ctx.plan.rewrite(call, lambda c: add_argument(c, kwarg("verbose", f"{default} if hvd.rank() == 0 else 0"))
                         if isinstance(c, cst.Call) else c)
    elif isinstance(verbose.value, cst.Integer) and verbose.value.value == "0":
        return
    else:
        ctx.plan.rewrite(verbose.value, lambda v: cst.parse_expression(
            f"{ctx.plan.module.code_for_node(v)} if hvd.rank() == 0 else 0"))
    ctx.apply("rank0_only", call, f"{method_name(call)}(verbose=...) on rank 0 only")


def _split_data(ctx: Context, call: cst.Call) -> None:
    facts = ctx.facts
    x = tf_common.data_argument(call)
    if x is None:
        ctx.cannot_see("no_data", call, "fit's data is not visible: not split across ranks.")
        return
    name = dotted(x.value)
    sources = [src for n, _ in (facts.callers_names(name, call) if name else [])
               for src in tf_common.dataset_sources(ctx, n)]
    y = argument(call, 1, "y")
    steps = keyword(call, "steps_per_epoch")
    if ctx.options.keras_data == "steps" or (not sources and y is None and steps is not None):
        if steps is not None:
            ctx.plan.rewrite(steps.value, lambda v: cst.parse_expression(
                f"max(1, {ctx.plan.module.code_for_node(v)} // hvd.size())"))
        elif sources or y is None:
            ctx.plan.rewrite(call, lambda c: add_argument(c, kwarg(
                "steps_per_epoch", f"len({facts.code(x.value)}) // hvd.size()")) if isinstance(c, cst.Call) else c)
        else:
            batch = keyword(call, "batch_size") or positional(call, 2)
            bs = facts.code(batch.value) if batch is not None else "32"
            ctx.plan.rewrite(call, lambda c: add_argument(c, kwarg(
                "steps_per_epoch", f"len({facts.code(x.value)}) // ({bs} * hvd.size())")) if isinstance(c, cst.Call) else c)
        ctx.apply("shard_data", call, "steps_per_epoch // hvd.size(): each rank runs its share of the steps")
        return
    if sources:
        for s in sources:
            tf_common.shard_source(ctx, s, name or "x")
        return
    if y is None:
        ctx.cannot_see("unsharded_input", x.value, f"`{facts.code(x.value)}` is neither arrays nor a tf.data "
                       "pipeline the converter can see: not split (try --keras-data steps).")
        return
    stmt = facts.statement_of(call)
    if stmt is None:
        ctx.cannot_see("unsharded_input", call, "fit is inside a one-line block: data not split.")
        return
    shard = facts.fresh("shard", "hvd_shard")
    ref = _length_source(x.value)
    ctx.plan.insert_before(stmt, ctx.plan.statements(
        f"{shard} = slice(hvd.rank(), len({facts.code(ref)}) // hvd.size() * hvd.size(), hvd.size())\n",
        "Horovod: each rank trains on every hvd.size()-th sample, the same number on every rank"))
    for arg in (x, y, keyword(call, "sample_weight")):
        if arg is not None:
            ctx.plan.rewrite(arg.value, lambda v: _sliced(v, shard))
    ctx.apply("shard_data", call, f"arrays sliced with `{shard}`: every hvd.size()-th sample from hvd.rank()")


def _length_source(x: cst.BaseExpression) -> cst.BaseExpression:
    if isinstance(x, cst.List | cst.Tuple) and x.elements:
        return x.elements[0].value
    if isinstance(x, cst.Dict) and x.elements and isinstance(x.elements[0], cst.DictElement):
        return x.elements[0].value
    return x


def _sliced(node: cst.CSTNode, shard: str) -> cst.CSTNode:
    """``x[shard]``; each array of a literal list, tuple or dict of inputs."""
    if isinstance(node, cst.List | cst.Tuple):
        return node.with_changes(elements=[e.with_changes(value=_sliced(e.value, shard)) for e in node.elements])
    if isinstance(node, cst.Dict):
        return node.with_changes(elements=[e.with_changes(value=_sliced(e.value, shard))
                                           if isinstance(e, cst.DictElement) else e for e in node.elements])
    assert isinstance(node, cst.BaseExpression)
    base = node if isinstance(node, cst.Name | cst.Attribute | cst.Call | cst.Subscript) or node.lpar else \
        node.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    return cst.Subscript(value=base, slice=[cst.SubscriptElement(cst.Index(cst.Name(shard)))])


# -- callbacks that write files --------------------------------------------------------------

def _rank0_callbacks(ctx: Context) -> None:
    facts = ctx.facts
    for call in facts.calls:
        name = facts.qname(call) or ""
        if not (name.startswith("keras.callbacks.") and name.rpartition(".")[2] in _RANK0_CALLBACKS):
            continue
        parent = facts.parent(call)
        holder = facts.parent(parent) if isinstance(parent, cst.Element) else None
        if isinstance(parent, cst.Element) and isinstance(holder, cst.List):
            ctx.plan.rewrite(parent, lambda e: _starred_on_rank0(ctx, e))
            ctx.apply("rank0_only", call, f"{name.rpartition('.')[2]} callback on rank 0 only")
            continue
        stmt = facts.statement_of(call)
        arg_of = facts.parent(parent) if isinstance(parent, cst.Arg) else None
        if isinstance(arg_of, cst.Call) and method_name(arg_of) in ("append", "insert") and stmt is not None \
                and isinstance(stmt, cst.SimpleStatementLine) and isinstance(stmt.body[0], cst.Expr):
            ctx.rank0(stmt, call, f"{name.rpartition('.')[2]} callback added on rank 0 only")
            continue
        ctx.cannot_see("callback_everywhere", call, f"this {name.rpartition('.')[2]} callback is not in a list "
                       "the converter can edit: it runs on every rank, and every rank writes its files.")


def _starred_on_rank0(ctx: Context, element: cst.CSTNode) -> cst.CSTNode:
    """``X`` in a list of callbacks becomes ``*([X] if hvd.rank() == 0 else [])``."""
    assert isinstance(element, cst.Element)
    code = ctx.plan.module.code_for_node(element.value)
    return cst.StarredElement(value=cst.parse_expression(f"([{code}] if hvd.rank() == 0 else [])"),
                              comma=element.comma)
