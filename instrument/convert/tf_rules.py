"""The TensorFlow 2 custom-loop rules (``tf.GradientTape``, ``@tf.function`` steps).

Each tape becomes ``hvd.DistributedGradientTape(tape)`` right before its ``gradient`` call;
Keras optimizers get learning rate x ``hvd.size()``; after the first training step (the
statement in the training loop that runs the step) the model's and the optimizer's variables
are broadcast from rank 0, once, behind a flag (the optimizer's variables exist only after
its first ``apply_gradients``); the dataset the training loop iterates is sharded at its
``tf.data`` source.
"""

from __future__ import annotations

import libcst as cst

from instrument.convert import checks, detect, tf_common
from instrument.convert.common_rules import Context
from instrument.convert.edits import appended
from instrument.convert.facts import dotted, method_name, receiver, root_name
from instrument.convert.report import Finding

HVD_MODULE = "horovod.tensorflow"
_UNWRAP = ("enumerate", "tqdm", "zip", "iter")


def convert(ctx: Context) -> Finding | None:
    facts = ctx.facts
    tapes: dict[str, cst.With] = {}
    for w in facts.withs:
        if not detect.in_keras_train_step(facts, w):
            for name in detect.gradient_tapes(facts, w):
                tapes[name] = w
    applies = [c for c in facts.calls if method_name(c) == "apply_gradients" and not detect.in_keras_train_step(facts, c)]
    if not applies:
        return Finding("no_optimizer", None, "no optimizer.apply_gradients(...) found, so there is nothing to "
                       "average across ranks.")
    ctors = [c for c in facts.calls if tf_common.is_keras_optimizer(ctx, c)]
    optimizers = sorted({dotted(receiver(c)) or facts.code(c) for c in applies})
    if len(optimizers) > 1:
        ctx.warn("several_optimizers", applies[1], f"{len(optimizers)} optimizers ({', '.join(optimizers)}): each "
                 "tape is wrapped; check that every rank applies the same gradients in the same order.")
    bare = checks.bare_apply_gradients(facts, set(tapes), set())
    ctx.warnings += bare
    for call in ctors:
        tf_common.scale_lr(ctx, call)
    if not ctors:
        ctx.cannot_see("optimizer_made_elsewhere", applies[0], "the optimizer is made where the converter "
                       "cannot see: its learning rate is not scaled.")
    gradient_calls = []
    for name, w in tapes.items():
        grads = [c for c in facts.calls if method_name(c) == "gradient" and root_name(receiver(c)) == name
                 and facts.function_of(c) is facts.function_of(w) and facts.line(c) >= facts.line(w)]
        stmt = facts.statement_of(grads[0]) if grads else None
        if stmt is None:
            ctx.cannot_see("tape_unused", w, f"`{name}.gradient(...)` not found: the tape is not wrapped.")
            continue
        gradient_calls.append(grads[0])
        if any(a is w for a in facts.ancestors(stmt)):
            # gradient() inside the tape's own block: Horovod's wrapper cannot be made there
            # (its gradient() would run on a tape still recording), so the block opens it
            item = next(i for i in w.items if isinstance(i.asname, cst.AsName)
                        and isinstance(i.asname.name, cst.Name) and i.asname.name.value == name)
            ctx.plan.rewrite(item.item, lambda v: cst.parse_expression(
                f"hvd.DistributedGradientTape({ctx.plan.module.code_for_node(v)})"))
            ctx.apply("wrap_optimizer", w, f"`{name}` opened as hvd.DistributedGradientTape (its gradient() "
                      "is inside the block)")
            continue
        ctx.plan.insert_before(stmt, ctx.plan.statements(
            f"{name} = hvd.DistributedGradientTape({name})\n", "Horovod: average the gradients across ranks"))
        ctx.apply("wrap_optimizer", grads[0], f"`{name}` wrapped in hvd.DistributedGradientTape")
    tf_common.pin_gpu(ctx, applies[0])
    bare_lines = {b.line for b in bare}
    _broadcasts(ctx, [c for c in applies if facts.line(c) not in bare_lines], gradient_calls, ctors)
    _writers(ctx)
    return None


def _step_site(ctx: Context, call: cst.CSTNode, depth: int = 0) -> cst.CSTNode | None:
    """The node, inside a loop, that runs one training step: ``call`` itself in an eager loop,
    else a call of the function holding it (a ``tf.function`` runs Python once, when traced)."""
    facts = ctx.facts
    fn = facts.function_of(call)
    if facts.loops_around(call) and (fn is None or not _is_tf_function(ctx, fn)):
        return call
    if fn is None or depth > 3:
        return None
    for site in facts.calls_of(fn):
        if facts.function_of(site) is not fn:
            found = _step_site(ctx, site, depth + 1)
            if found is not None:
                return found
    return None


def _is_tf_function(ctx: Context, fn: cst.FunctionDef) -> bool:
    return any((ctx.facts.qname(d.decorator) or "").startswith("tensorflow.function") for d in fn.decorators)


def _broadcasts(ctx: Context, applies: list[cst.Call], gradient_calls: list[cst.Call],
                ctors: list[cst.Call]) -> None:
    """One flag-guarded broadcast after each statement that runs a training step, of every
    model and optimizer that step updates."""
    facts = ctx.facts
    groups: dict[int, tuple[cst.CSTNode, cst.BaseStatement, list[str], list[str]]] = {}
    sharded: set[int] = set()
    for apply in applies:
        opt = dotted(receiver(apply))
        model = _model_of(ctx, apply, gradient_calls)
        site = _step_site(ctx, apply)
        stmt = facts.statement_of(site) if site is not None else None
        if stmt is not None and id(facts.loops_around(stmt)[0]) not in sharded:
            sharded.add(id(facts.loops_around(stmt)[0]))
            _shard_loop_data(ctx, facts.loops_around(stmt)[0])
        if opt is None or model is None or stmt is None or site is None:
            ctx.cannot_see("no_broadcast", apply, "the first training step is not visible (or the model or "
                           "optimizer is not a plain name): variables are not broadcast, so every rank must "
                           "start from the same seed.")
            continue
        if not _visible(ctx, stmt, model, apply) or not _visible(ctx, stmt, opt, apply):
            ctx.cannot_see("no_broadcast", site, f"`{model}` or `{opt}` is not visible where the step runs: "
                           "variables are not broadcast, so every rank must start from the same seed.")
            continue
        _, _, models, opts = groups.setdefault(id(stmt), (site, stmt, [], []))
        if model not in models:
            models.append(model)
        if opt not in opts:
            opts.append(opt)
    for site, stmt, models, opts in groups.values():
        loops = facts.loops_around(stmt)
        outer = facts.statement_of(loops[-1])
        if outer is None:
            continue
        done = facts.fresh("hvd_broadcast_done")
        lines = [f"if not {done}:"]
        lines += [f"    hvd.broadcast_variables({m}.variables, root_rank=0)" for m in models]
        for opt in opts:
            ctor = next((c for c in ctors if any(dotted(t.target) == opt for t in _assign_targets(ctx, c))), None)
            lines.append(f"    hvd.broadcast_variables({tf_common.optimizer_variables(ctx, opt, ctor)}, root_rank=0)")
        lines.append(f"    {done} = True")
        ctx.plan.insert_before(outer, ctx.plan.statements(f"{done} = False\n", None))
        ctx.plan.insert_after(stmt, ctx.plan.statements(
            "\n".join(lines) + "\n",
            "Horovod: after the first step (the optimizer's variables exist now), rank 0's variables everywhere"))
        ctx.apply("broadcast_state", site, f"rank 0's variables of {', '.join(f'`{n}`' for n in models + opts)} "
                  "broadcast after the first step")


def _model_of(ctx: Context, apply: cst.Call, gradient_calls: list[cst.Call]) -> str | None:
    """``model`` of ``apply_gradients(zip(grads, model.trainable_variables))``, else of the
    variables the tape differentiates in the same function."""
    candidates: list[cst.BaseExpression] = []
    if apply.args and isinstance(apply.args[0].value, cst.Call) and len(apply.args[0].value.args) > 1:
        candidates.append(apply.args[0].value.args[1].value)
    fn = ctx.facts.function_of(apply)
    candidates += [g.args[1].value for g in gradient_calls
                   if ctx.facts.function_of(g) is fn and len(g.args) > 1]
    for v in candidates:
        if isinstance(v, cst.Attribute) and v.attr.value in ("trainable_variables", "trainable_weights"):
            return dotted(v.value)
    return None


def _assign_targets(ctx: Context, call: cst.Call) -> list[cst.AssignTarget]:
    parent = ctx.facts.parent(call)
    return list(parent.targets) if isinstance(parent, cst.Assign) else []


def _visible(ctx: Context, stmt: cst.CSTNode, dotted_name: str, used_at: cst.CSTNode) -> bool:
    """Is the first name of ``dotted_name`` (used at ``used_at``) bound where ``stmt`` runs:
    in its function, at module level, or as a global of a module-level step function?"""
    facts = ctx.facts
    root = dotted_name.split(".")[0]
    fn = facts.function_of(stmt)
    if fn is not None and (root in _params(fn) or root in _assigned_in(fn)):
        return True
    if root == "self" or root in _module_names(ctx):
        return root != "self"
    step = facts.function_of(used_at)
    return (step is not None and facts.function_of(step) is None and not any(
        isinstance(a, cst.ClassDef) for a in facts.ancestors(step))
        and root not in _params(step) and root not in _assigned_in(step))


def _params(fn: cst.FunctionDef) -> set[str]:
    return {p.name.value for p in (*fn.params.params, *fn.params.kwonly_params, *fn.params.posonly_params)}


def _module_names(ctx: Context) -> set[str]:
    out: set[str] = set()
    for stmt in ctx.facts.module.body:
        if isinstance(stmt, cst.SimpleStatementLine):
            for small in stmt.body:
                if isinstance(small, cst.Assign):
                    for t in small.targets:
                        out |= checks.used_names(t.target)
    return out


def _assigned_in(fn: cst.FunctionDef) -> set[str]:
    out: set[str] = set()

    class V(cst.CSTVisitor):
        def visit_Assign(self, node: cst.Assign) -> None:
            for t in node.targets:
                out.update(checks.used_names(t.target))

    fn.body.visit(V())
    return out


def _shard_loop_data(ctx: Context, loop: cst.For | cst.While) -> None:
    facts = ctx.facts
    if not isinstance(loop, cst.For):
        ctx.cannot_see("unsharded_input", loop, "the training loop does not iterate a dataset: not sharded.")
        return
    it = loop.iter
    while isinstance(it, cst.Call) and it.args and root_name(it.func) in _UNWRAP:
        it = it.args[0].value
    name = root_name(it)
    sources: list[cst.Call] = []
    for n, _ in facts.callers_names(name, loop) if name else []:
        sources += tf_common.dataset_sources(ctx, n)
    if not sources:
        ctx.cannot_see("unsharded_input", loop, f"`{facts.code(loop.iter)}` is not a tf.data pipeline the "
                       "converter can see: not sharded, so every rank trains on all of it.")
        return
    if ctx.options.keras_data == "steps" and isinstance(loop.iter, cst.Name):
        ctx.plan.rewrite(loop.iter, appended(ctx.plan.module, f".take(len({name}) // hvd.size())"))
        ctx.apply("shard_data", loop, f"each rank runs len({name}) // hvd.size() steps per epoch")
        return
    for s in sources:
        tf_common.shard_source(ctx, s, name or "")
    for other in facts.loops:
        if isinstance(other, cst.For) and other is not loop:
            other_name = root_name(other.iter)
            if other_name and other_name != name and tf_common.dataset_sources(ctx, other_name):
                ctx.cannot_see("eval_not_sharded", other, f"`{other_name}` is not a training dataset: every "
                               "rank evaluates all of it, so its metrics are the same on every rank.")


def _writers(ctx: Context) -> None:
    for call in ctx.facts.calls:
        if ctx.facts.qname(call) == "tensorflow.summary.create_file_writer":
            tf = ctx.module_alias("tensorflow", "tf")
            noop = f" if hvd.rank() == 0 else {tf}.summary.create_noop_writer()"
            ctx.plan.rewrite(call, appended(ctx.plan.module, noop))
            ctx.apply("rank0_only", call, "TensorBoard summaries written on rank 0 only (a no-op writer elsewhere)")
    ctx.cannot_see("metrics_local", None, "metrics a custom loop computes on the training data are each "
                   "rank's own (its shard); rank 0 prints its own.")
