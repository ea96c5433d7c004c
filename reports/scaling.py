"""The pages of a sweep: scaling curves, phases against ranks, fitted models, predictions.

Figure builders are pure functions of the tables :func:`analyze.experiments.compare.compare` returns
(``configs``, ``runs``, ``curves``, ...) to a ggplot. A curve is drawn per level of the
*series* factor (the first factor that is not the rank count: the framework or sync mode of
the usual design) and the remaining factors split the panels.

A sweep's report has no per-run pages (a 180-run sweep would need 540): its pages are the
bottleneck comparison per configuration (mean over replications, 12 configurations a page),
the scaling curves, phases against ranks, the fits, the allreduce model, its hold-out
predictions, the allocation of variation and, where the runs have power, energy and EDP.
``analyze report SWEEP/<run>`` draws any run's own pages.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
from plotnine import (
    aes,
    coord_flip,
    element_blank,
    element_text,
    facet_wrap,
    geom_abline,
    geom_col,
    geom_errorbar,
    geom_hline,
    geom_line,
    geom_point,
    geom_text,
    ggplot,
    labs,
    scale_color_manual,
    scale_linetype_manual,
    scale_x_continuous,
    scale_y_continuous,
    theme,
)

from analyze.experiments.compare import PHASE_COLUMNS, Comparison, group_labels
from reports import energy, figures
from reports.page import Page
from reports.theme import BASE_SIZE, HEIGHT_IN, PHASE_ORDER, WIDTH_IN, phase_fill, theme_dltrace

BOTTLENECK_PER_PAGE = 12
# Okabe-Ito, as the phase colours (reports/theme.py), in an order that keeps the first two
# curves apart for colour-blind readers.
LABELLED = 3  # predictions labelled with their error (more overlap)
SERIES_COLORS = ["#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#000000", "#F0E442"]
METRICS = {  # column -> (axis title, ideal value: None, or "ranks" for linear speedup)
    "step_ms": ("time per step [ms]", None),
    "speedup": ("speedup (throughput / fewest ranks')", "ranks"),
    "efficiency": ("parallel efficiency", 1.0),
}


def series_and_panels(factors: list[str]) -> tuple[str | None, list[str]]:
    """The factor drawn as coloured curves, and those that split panels."""
    others = [f for f in factors if f not in ("ranks", "nodes")]
    return (others[0] if others else None), others[1:]


def _panel(df: pd.DataFrame, panels: list[str]) -> pd.Series:
    """A panel's title: one factor=level per line."""
    if not panels:
        return pd.Series("", index=df.index)
    return _ordered(df[panels].astype(str).apply(lambda r: "\n".join(f"{k}={v}" for k, v in r.items()), axis=1))


def _ordered(labels: pd.Series) -> pd.Categorical:
    """Panels in order of first appearance (the tables come sorted in design order)."""
    return pd.Categorical(labels, categories=list(dict.fromkeys(labels)))


def _ncol(n_panels: int) -> int:
    return 1 if n_panels == 1 else 2 if n_panels in (2, 4) else 3


def _facets(column: str, n_panels: int, title_lines: int, **kw: Any) -> tuple[list, float]:
    """The panels' facet_wrap and strip theme, and the figure height they need."""
    rows = -(-n_panels // _ncol(n_panels))
    height = min(9.5, HEIGHT_IN + 1.9 * (rows - 1) + 0.18 * title_lines * rows)
    return [facet_wrap(column, ncol=_ncol(n_panels), **kw),
            theme(strip_text=element_text(size=BASE_SIZE - 3, ha="left"))], height


def _colour(series: str | None) -> dict[str, str]:
    return {"color": series} if series else {}


def _as_text(values: pd.Series) -> pd.Categorical:
    """Levels as text for a discrete scale, in the design's order."""
    order = values.cat.categories if isinstance(values.dtype, pd.CategoricalDtype) else pd.unique(values)
    return pd.Categorical(values.astype(str), categories=[str(v) for v in order])


def _series_scale(n: int) -> scale_color_manual:
    return scale_color_manual(values=(SERIES_COLORS * (n // len(SERIES_COLORS) + 1))[:n])


def scaling(configs: pd.DataFrame, runs: pd.DataFrame, metric: str, factors: list[str]) -> ggplot:
    """``metric`` (step_ms, speedup or efficiency) against ranks: configuration means with their
    confidence interval (step time) or ideal line (speedup, efficiency), runs as small dots."""
    series, panels = series_and_panels(factors)
    title, ideal = METRICS[metric]
    df = configs.assign(panel=_panel(configs, panels))
    if series:
        df[series] = _as_text(df[series])
    p = ggplot(df, aes("ranks", metric, **_colour(series), group=series or 1))
    if metric == "step_ms":
        dots = runs.assign(panel=_panel(runs, panels))
        if series:
            dots[series] = _as_text(dots[series])
        p += geom_point(dots, aes("ranks", "step_ms", **_colour(series)), size=0.8, alpha=0.45,
                        inherit_aes=False)
        p += geom_errorbar(aes(ymin="step_ms_ci_low", ymax="step_ms_ci_high"), width=0.08)
    elif ideal == "ranks":
        p += geom_abline(intercept=0, slope=1, linetype="dashed", color="#777777")
    elif ideal is not None:
        p += geom_hline(yintercept=ideal, linetype="dashed", color="#777777")
    p += geom_line()
    p += geom_point(size=1.8)
    if series:
        p += _series_scale(df[series].nunique())
    height = HEIGHT_IN
    if panels:
        facets, height = _facets("panel", df["panel"].nunique(), len(panels))
        p += facets[0]
    ranks = sorted(df["ranks"].unique())
    subtitle = {"step_ms": "mean and 95% CI over replications; dots: runs",
                "speedup": "against the same levels with the fewest ranks; dashed: linear",
                "efficiency": "speedup / rank ratio; dashed: perfect scaling"}[metric]
    if series:
        subtitle += f"\ncolour: {series}"
    p = (p + scale_x_continuous(breaks=ranks)
         + labs(title=f"Scaling: {title.split(' [')[0].split(' (')[0]}", subtitle=subtitle,
                x="ranks", y=title)
         + theme_dltrace() + theme(figure_size=(WIDTH_IN, height)))
    return p + facets[1] if panels else p


def phases(configs: pd.DataFrame, factors: list[str]) -> ggplot:
    """Mean time per step by phase for every configuration: a bar per rank count, panels by
    the other factors (batch size among them)."""
    others = [f for f in factors if f not in ("ranks", "nodes")]
    cols = [c for c in PHASE_COLUMNS.values() if c in configs]
    long = configs.melt(id_vars=["ranks", *others], value_vars=cols, var_name="phase", value_name="ms")
    long["phase"] = pd.Categorical(long["phase"].map({v: k for k, v in PHASE_COLUMNS.items()}),
                                   categories=PHASE_ORDER[::-1])
    long["panel"] = _panel(long, others)
    long["x"] = long["ranks"].astype(str)
    facets, height = _facets("panel", long["panel"].nunique(), len(others))
    p = (ggplot(long, aes("x", "ms", fill="phase")) + geom_col(width=0.7)
         + phase_fill(figures.present_phases(long["phase"], long["ms"]))
         + scale_y_continuous(expand=(0, 0, 0.05, 0))
         + labs(title="Where a step's time goes, by configuration",
                subtitle="mean over steady-state steps, ranks and replications",
                x="ranks", y="time per step [ms]")
         + theme_dltrace() + theme(figure_size=(WIDTH_IN, height if others else HEIGHT_IN)))
    return p + facets[0] + facets[1] if others else p


def fits(runs: pd.DataFrame, curves: pd.DataFrame, fit_table: pd.DataFrame, response: str,
         factors: list[str]) -> ggplot:
    """Runs' ``response`` (step_ms or comm_ms) against ranks with the fitted linear and
    quadratic models per group; R^2 in each panel's label."""
    others = [f for f in factors if f not in ("ranks", "nodes")]
    dots = runs.sort_values([*others, "ranks"]) if others else runs
    dots = dots.assign(group_label=_ordered(group_labels(dots, others)))
    lines = curves[curves["response"] == response]
    lines = lines.assign(group_label=pd.Categorical(lines["group_label"], categories=dots["group_label"].cat.categories))
    r2 = fit_table[fit_table["response"] == response]
    text = {g: "; ".join(f"{m} R²={v:.2f}" for m, v in zip(d["model"], d["r2"], strict=True))
            for g, d in r2.groupby("group_label")}
    label = {g: (g.replace(", ", "\n") + "\n" + text.get(g, "no fit")).strip() for g in dots["group_label"].unique()}
    facets, height = _facets("group_label", len(label), len(others) + 1,
                             labeller=lambda g: label.get(g, g), scales="free_y")
    what = {"step_ms": "time per step", "comm_ms": "visible communication per step"}[response]
    return (ggplot(dots, aes("ranks", response))
            + geom_point(size=1.2, alpha=0.7)
            + geom_line(lines, aes("ranks", "value", linetype="model"), color="#0072B2")
            + facets[0]
            + scale_linetype_manual(values={"linear": "solid", "quadratic": "dashed"})
            + scale_x_continuous(breaks=sorted(dots["ranks"].unique()))
            + labs(title=f"Model of {what} against ranks", subtitle="dots: runs; lines: least-squares fits",
                   x="ranks", y=f"{what} [ms]")
            + theme_dltrace() + facets[1]
            + theme(figure_size=(WIDTH_IN, height)))


def allreduce_model(points: pd.DataFrame, model: pd.DataFrame) -> ggplot:
    """Mean allreduce transfer time per call against the bytes a ring allreduce sends, with
    the fitted line t = latency + bytes / bandwidth."""
    order = sorted(points["ranks"].unique())
    names = {p: f"{p} rank" + ("s" if p != 1 else "") for p in order}
    df = points.assign(ring_mb=points["ring_bytes"] / 1e6,
                       ranks=pd.Categorical(points["ranks"].map(names), categories=[names[p] for p in order]))
    p = (ggplot(df, aes("ring_mb", "transfer_ms", color="ranks")) + geom_point(size=1.6, alpha=0.8)
         + _series_scale(df["ranks"].nunique()))
    subtitle = "dots: one message size in one run (steady state)"
    if len(model):
        m = model.iloc[0]
        p += geom_abline(intercept=m["latency_ms"], slope=m["ms_per_byte"] * 1e6, color="#555555")
        bw = "n/a" if pd.isna(m["bandwidth_gbs"]) else f"{m['bandwidth_gbs']:.3g} GB/s"
        subtitle = f"fit: latency {m['latency_ms']:.3g} ms, bandwidth {bw}, R²={m['r2']:.2f}\n{subtitle}"
    return (p + labs(title="Allreduce cost model (ring: 2(p-1)/p of the bytes)", subtitle=subtitle,
                     x="bytes sent per rank, 2(p-1)/p x payload [MB]", y="transfer per call [ms]",
                     color="ranks")
            + theme_dltrace())


def predictions(pred: pd.DataFrame) -> ggplot:
    """Predicted against measured time for held-out data; on the diagonal is a perfect model.
    The worst predictions are labelled with what was held out and their error."""
    df = pred.dropna(subset=["predicted_ms", "measured_ms"]).copy()
    df["what"] = df["target"].map({"allreduce_ms": "allreduce per step", "step_ms": "step time"})
    worst = df["error_pct"].abs().sort_values(ascending=False).index[:LABELLED]
    df["text"] = ""
    df.loc[worst, "text"] = [f" {h}: {e:+.0f}%" for h, e in zip(df.loc[worst, "holdout"], df.loc[worst, "error_pct"],
                                                                strict=True)]
    mean_err = df.groupby("what")["error_pct"].apply(lambda e: e.abs().mean())
    sub = "; ".join(f"{w}: mean |error| {v:.1f}% over {int((df['what'] == w).sum())} hold-outs"
                    for w, v in mean_err.items())
    return (ggplot(df, aes("measured_ms", "predicted_ms", color="what"))
            + _series_scale(df["what"].nunique())
            + geom_abline(intercept=0, slope=1, linetype="dashed", color="#777777")
            + geom_point(size=1.8)
            + geom_text(aes(label="text"), size=BASE_SIZE - 4, ha="left", show_legend=False)
            + labs(title="Prediction vs measurement (held-out data)", subtitle=sub,
                   x="measured [ms]", y="predicted [ms]")
            + theme_dltrace())


def variation(table: pd.DataFrame) -> ggplot:
    """Percentage of variation each factor, interaction and the error explain, per response."""
    df = table.copy()
    order = df.groupby("term")["percent"].max().sort_values().index.tolist()
    df["term"] = pd.Categorical(df["term"], categories=order)
    df["text"] = df["percent"].map(lambda v: f" {v:.1f}%")
    method = "2^k r design" if (df["method"] == "2k_r").all() else "full-factorial analysis"
    n_terms = df["term"].nunique()
    return (ggplot(df, aes("term", "percent")) + geom_col(fill="#0072B2", width=0.7)
            + geom_text(aes(label="text"), ha="left", size=BASE_SIZE - 3)
            + coord_flip() + facet_wrap("response", ncol=2)
            + scale_y_continuous(limits=(0, 125), breaks=[0, 25, 50, 75, 100])
            + labs(title="Allocation of variation", subtitle=f"{method}\nthe bars of a response sum to 100%",
                   y="variation explained [%]")
            + theme_dltrace()
            + theme(figure_size=(WIDTH_IN, min(9.0, 1.6 + 0.28 * n_terms)), axis_title_y=element_blank()))


def sweep_pages(c: Comparison) -> list[Page]:
    """Every page of a sweep's report, in order; pages whose data are missing are left out."""
    per_phase = c.configs.melt(id_vars=["config_label"], value_vars=list(PHASE_COLUMNS.values()),
                               var_name="column", value_name="ms")
    per_phase["phase"] = per_phase["column"].map({v: k for k, v in PHASE_COLUMNS.items()})
    per_phase["run"] = per_phase["config_label"].str.replace(", ", "\n", n=2)
    labels = list(dict.fromkeys(per_phase["run"]))
    pages = []
    per_page = -(-len(labels) // -(-len(labels) // BOTTLENECK_PER_PAGE))  # as even as can be
    for i in range(0, len(labels), per_page):
        chunk = per_phase[per_phase["run"].isin(labels[i:i + per_page])]
        pages.append(Page(f"bottleneck-{i // per_page + 1}", figures.bottleneck(chunk)))
    ok = c.runs[c.runs["status"] == "ok"]
    pages.append(Page("scaling-step", scaling(c.configs, ok, "step_ms", c.factors)))
    if c.configs["speedup"].notna().any():
        pages.append(Page("scaling-speedup", scaling(c.configs, ok, "speedup", c.factors)))
        pages.append(Page("scaling-efficiency", scaling(c.configs, ok, "efficiency", c.factors)))
    pages.append(Page("phases", phases(c.configs, c.factors)))
    for response in ("step_ms", "comm_ms"):
        if (c.fits["response"] == response).any():
            pages.append(Page(f"fit-{response.removesuffix('_ms')}",
                              fits(ok, c.curves, c.fits, response, c.factors)))
    if len(c.allreduce_points):
        pages.append(Page("allreduce-model", allreduce_model(c.allreduce_points, c.allreduce_model)))
    if c.predictions["measured_ms"].notna().any():
        pages.append(Page("predictions", predictions(c.predictions)))
    if len(c.variation):
        pages.append(Page("variation", variation(c.variation)))
    if len(c.energy_configs):
        pages.append(Page("energy", energy.sweep_energy(c.energy_configs)))
    return pages
