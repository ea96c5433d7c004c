"""PyTorch data: which ``DataLoader``s train, and their sharding.

A loader trains when a loop that takes training steps (``backward``, ``optimizer.step``...)
iterates it, followed through function parameters to the caller's variable. Such a loader
gets a ``DistributedSampler(dataset, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=...)``
that takes over its ``shuffle``, and ``loader.sampler.set_epoch(epoch)`` goes first in the
loop that repeats the epochs. Every other loader stays whole on every rank (evaluation).
"""

from __future__ import annotations

import libcst as cst

from instrument.convert.common_rules import Context, add_argument, kwarg
from instrument.convert.facts import (
    argument,
    dotted,
    has_star_kwargs,
    keyword,
    positional,
    root_name,
)

_LOADERS = ("torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader")
_UNWRAP = ("enumerate", "tqdm", "zip", "iter", "trange")


def _iterable_name(facts_ctx: Context, it: cst.BaseExpression) -> str | None:
    while isinstance(it, cst.Call) and it.args and (
            root_name(it.func) in _UNWRAP or (facts_ctx.facts.qname(it) or "").startswith("tqdm")):
        it = it.args[0].value
    return dotted(it)


def _training_sites(ctx: Context) -> list[tuple[str, cst.CSTNode]]:
    """(loader name, the loop or call that runs one epoch over it) for every training loop."""
    facts = ctx.facts
    out: list[tuple[str, cst.CSTNode]] = []
    for loop in facts.loops:
        if not isinstance(loop, cst.For) or not ctx.flow.node_trains(loop.body):
            continue
        name = _iterable_name(ctx, loop.iter)
        if not name:
            continue
        out.extend(ctx.facts.callers_names(name, loop))
    return out


def _epoch_loop(ctx: Context, site: cst.CSTNode, depth: int = 0) -> tuple[cst.For | cst.While, cst.CSTNode] | None:
    """The loop around ``site`` that repeats epochs: the innermost enclosing loop (other than
    the one over the data), else the loop around a call of the function holding ``site``."""
    facts = ctx.facts
    loops = facts.loops_around(site)
    if loops:
        return loops[0], site
    fn = facts.function_of(site)
    if fn is None or depth > 3:
        return None
    for call in facts.calls_of(fn):
        if call is not site:
            found = _epoch_loop(ctx, call, depth + 1)
            if found:
                return found
    return None


def shard_loaders(ctx: Context) -> None:
    facts = ctx.facts
    loaders = []
    for call in facts.calls:
        if facts.qname(call) in _LOADERS:
            stmt = facts.statement_of(call)
            small = stmt.body[0] if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 else None
            target = dotted(small.targets[0].target) if isinstance(small, cst.Assign) and small.value is call else None
            loaders.append((call, target))
    if not loaders:
        ctx.cannot_see("no_loader", None, "no DataLoader: the data is not sharded, so every rank "
                       "trains on all of it (shard it by hvd.rank() and hvd.size() yourself).")
        return
    sites = _training_sites(ctx)
    training = {name for name, _ in sites}
    chosen: list[tuple[cst.Call, str | None]] = [(c, t) for c, t in loaders if t in training]
    if not chosen:  # loops over something else (a wrapper): fall back on the names
        chosen = [(c, t) for c, t in loaders if t and "train" in t.lower()] or (
            loaders if len(loaders) == 1 else [])
        sites = []
        for _, t in chosen:
            ctx.cannot_see("no_epoch_loop", None, f"no training loop over `{t}` found: its sampler's "
                           "set_epoch is not called, so every epoch shuffles the same way.")
    for call, target in loaders:
        if (call, target) not in chosen:
            ctx.cannot_see("eval_not_sharded", call,
                           f"`{target or 'this DataLoader'}` is not a training loader: every rank "
                           "evaluates all of it, so its metrics are already global and the same on every rank.")
    for call, target in chosen:
        if _shard(ctx, call, target):
            _set_epoch(ctx, call, target, [s for n, s in sites if n == target])


def _shard(ctx: Context, call: cst.Call, target: str | None) -> bool:
    facts = ctx.facts
    if keyword(call, "sampler") or keyword(call, "batch_sampler") or positional(call, 3):
        ctx.cannot_see("custom_sampler", call, "this DataLoader has its own sampler, which the converter "
                       "cannot shard: every rank trains on all of its samples.")
        return False
    ds = argument(call, 0, "dataset")
    if ds is None:
        ctx.cannot_see("no_dataset", call, "the DataLoader's dataset is not visible: not sharded.")
        return False
    torch = ctx.module_alias("torch", "torch")
    shuffle = keyword(call, "shuffle") or positional(call, 2)
    star = has_star_kwargs(call)
    ds_name = dotted(ds.value)
    if ds_name is None:
        base = target.rpartition(".")[2] if target else "train"
        ds_name = facts.fresh(base.replace("loader", "dataset") if "loader" in base else base + "_dataset",
                              "hvd_dataset")
        def walrus(v: cst.CSTNode, n: str = ds_name) -> cst.CSTNode:
            return cst.parse_expression(f"({n} := {ctx.plan.module.code_for_node(v)})")

        ctx.plan.rewrite(ds.value, walrus)
    if shuffle is not None:
        shuffle_code = facts.code(shuffle.value)
    elif star is not None:
        kw = facts.code(star.value)
        shuffle_code = f"{kw}.get(\"shuffle\", False)"
        ctx.plan.rewrite(star.value, lambda _v: cst.parse_expression(f"dict({kw}, shuffle=False)"))
    else:
        shuffle_code = "False"
    sampler = (f"{torch}.utils.data.distributed.DistributedSampler({ds_name}, num_replicas=hvd.size(), "
               f"rank=hvd.rank(), shuffle={shuffle_code})")
    if shuffle is not None:
        def to_sampler(a: cst.CSTNode) -> cst.CSTNode:
            assert isinstance(a, cst.Arg)
            return a.with_changes(keyword=cst.Name("sampler"), value=cst.parse_expression(sampler),
                                  equal=a.equal if a.keyword is not None else cst.AssignEqual(
                                      cst.SimpleWhitespace(""), cst.SimpleWhitespace("")))

        ctx.plan.rewrite(shuffle, to_sampler)
    else:
        ctx.plan.rewrite(call, lambda c: add_argument(c, kwarg("sampler", sampler)) if isinstance(c, cst.Call) else c)
    ctx.apply("shard_data", call, f"DistributedSampler({ds_name}, shuffle={shuffle_code}) for "
              f"`{target or 'the DataLoader'}`" + (" (takes over shuffle)" if shuffle is not None else ""))
    if shuffle is not None and not (isinstance(shuffle.value, cst.Name) and shuffle.value.value == "False"):
        ctx.cannot_see("shuffle_order", call, "DistributedSampler shuffles with its own seed (seed + epoch), "
                       "so even on one rank the sample order differs from the original's.")
    return True


def _set_epoch(ctx: Context, loader: cst.Call, target: str | None, sites: list[cst.CSTNode]) -> None:
    """``target.sampler.set_epoch(epoch)`` first in the epoch loop, or right after the loader
    is made when that happens inside the loop."""
    if not target:
        return
    done: set[int] = set()
    for site in sites:
        found = _epoch_loop(ctx, site)
        if found is None:
            continue
        loop, _ = found
        if id(loop) in done:
            continue
        done.add(id(loop))
        if not isinstance(loop, cst.For) or not isinstance(loop.target, cst.Name) \
                or not isinstance(loop.body, cst.IndentedBlock):
            ctx.cannot_see("no_epoch_variable", loop, f"the epoch loop has no epoch variable: "
                           f"`{target}.sampler.set_epoch(epoch)` is not called, so every epoch "
                           "shuffles the same way.")
            continue
        # ``target`` is the loader's name where the epoch loop is (callers_names followed it there)
        code = f"{target}.sampler.set_epoch({loop.target.value})"
        made = ctx.facts.statement_of(loader)
        if made is not None and any(a is loop for a in ctx.facts.ancestors(made)):
            ctx.plan.insert_after(made, ctx.plan.statements(code + "\n"))
        else:
            ctx.plan.insert_before(loop.body.body[0], ctx.plan.statements(code + "\n"))
        ctx.apply("shard_data", loop, f"`{code}` each epoch")
