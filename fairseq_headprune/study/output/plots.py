"""Figures for the studies (matplotlib, written straight to PNG files)."""

from typing import Dict, Optional

import numpy as np
import torch

from fairseq_headprune.constants import ATTENTION_TYPES, TYPE_TITLES
from fairseq_headprune.study.budhraja.report import recovery_curve_rows
from fairseq_headprune.study.importance.dynamics import dynamics_grid
from fairseq_headprune.study.output.files import atomic_path
from fairseq_headprune.study.pruning.curves import TUNED_SUFFIX, curve_orders, order_title


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


LINE_STYLES = ("-", "--", ":", "-.")


def save_figure(figure, path: str) -> None:
    """Save through a temporary name so an interrupted run leaves no half PNG."""
    with atomic_path(path) as temporary:
        figure.savefig(temporary, dpi=150, bbox_inches="tight", format="png")


def _layers_by_heads(axis, values, attention_type: str, **imshow):
    """One attention type's panel: layers down, heads across, 1-based labels."""
    layers, heads = values.shape
    image = axis.imshow(values, aspect="auto", **imshow)
    axis.set_title(TYPE_TITLES[attention_type])
    axis.set_xlabel("head")
    axis.set_ylabel("layer")
    axis.set_xticks(range(heads), [str(h + 1) for h in range(heads)], fontsize=7)
    axis.set_yticks(range(layers), [str(layer + 1) for layer in range(layers)])
    return image


def plot_head_heatmaps(
    scores: Dict[str, torch.Tensor],
    path: str,
    title: str,
    colorbar_label: str,
    cmap: str = "viridis",
    masked: Optional[Dict[str, torch.Tensor]] = None,
) -> None:
    """One panel per attention type (Enc-Enc, Enc-Dec, Dec-Dec): layers x heads. ``masked`` (True: a pruned head)
    shows those heads grey and hatched, outside the colour scale, which spans the other heads only."""
    plt = _pyplot()
    types = [t for t in ATTENTION_TYPES if t in scores]
    grids = {}
    for attention_type in types:
        values = scores[attention_type].detach().to("cpu", torch.float64).numpy()
        hidden = (masked[attention_type].to("cpu").numpy().astype(bool) if masked is not None
                  else np.zeros(values.shape, dtype=bool))
        grids[attention_type] = np.ma.masked_array(values, mask=hidden)
    shown = [float(v) for grid in grids.values() for v in grid.compressed()]
    low, high = (min(shown), max(shown)) if shown else (0.0, 1.0)
    colours = plt.get_cmap(cmap).copy()
    colours.set_bad("#d9d9d9")
    figure, axes = plt.subplots(1, len(types), figsize=(4.2 * len(types), 3.4), squeeze=False)
    image = None
    for axis, attention_type in zip(axes[0], types):
        image = _layers_by_heads(axis, grids[attention_type], attention_type, cmap=colours, vmin=low, vmax=high)
        for layer, head in zip(*np.nonzero(np.ma.getmaskarray(grids[attention_type]))):
            axis.add_patch(plt.Rectangle((head - 0.5, layer - 0.5), 1, 1, fill=False, hatch="///",
                                         edgecolor="#7f7f7f", linewidth=0))
    figure.colorbar(image, ax=axes[0].tolist(), label=colorbar_label, shrink=0.9)
    if masked is not None and any(bool(m.any()) for m in masked.values()):
        title += "\n(grey, hatched: pruned heads, held at zero)"
    figure.suptitle(title, y=1.04 + 0.07 * title.count("\n"))
    save_figure(figure, path)
    plt.close(figure)


def plot_compensation(compensation, path: str, title: str) -> None:
    """Budhraja et al.'s Figure 2: each head's mean |ΔW| of W_q, W_k, W_v, the pruned heads shown as pruned."""
    plot_head_heatmaps({t: compensation.grid(t) for t in compensation.layout}, path, title, "mean |ΔW|",
                       masked={t: compensation.pruned_grid(t) for t in compensation.layout})


def plot_importance(result, path: str, title: Optional[str] = None) -> None:
    """Heat map of per-layer normalised importance, as used to rank heads."""
    plot_head_heatmaps(
        result.normalized,
        path,
        title or f"Head importance ({result.granularity} level, normalised per layer)",
        "$I_h \\,/\\, \\|I_{\\mathrm{layer}}\\|_2$",
    )


def _rows_to_grids(rows, value: str):
    """attention type -> (layers x heads array of ``value``, boolean significance array)."""

    grids = {}
    for attention_type in ATTENTION_TYPES:
        cells = [r for r in rows if r["attention_type"] == attention_type]
        if not cells:
            continue
        layers = max(r["layer"] for r in cells)
        heads = max(r["head"] for r in cells)
        values = np.full((layers, heads), np.nan)
        significant = np.zeros((layers, heads), dtype=bool)
        for r in cells:
            values[r["layer"] - 1, r["head"] - 1] = r[value]
            significant[r["layer"] - 1, r["head"] - 1] = bool(r["significant"])
        grids[attention_type] = (values, significant)
    return grids


def plot_delta_heatmaps(rows, path: str, title: str, colorbar_label: str = "ΔBLEU") -> None:
    """ΔBLEU per head, layers x heads per attention type; dots mark significant cells."""

    plt = _pyplot()
    grids = _rows_to_grids(rows, "delta")
    limit = max(float(np.nanmax(np.abs(v))) for v, _ in grids.values()) or 1.0
    figure, axes = plt.subplots(1, len(grids), figsize=(4.2 * len(grids), 3.4), squeeze=False)
    image = None
    for axis, (attention_type, (values, significant)) in zip(axes[0], grids.items()):
        image = _layers_by_heads(axis, values, attention_type, cmap="RdBu", vmin=-limit, vmax=limit)
        ys, xs = np.nonzero(significant)
        axis.scatter(xs, ys, s=10, c="black", marker="o", label="p < α")
    figure.colorbar(image, ax=axes[0].tolist(), label=colorbar_label, shrink=0.9)
    figure.suptitle(title, y=1.04)
    save_figure(figure, path)
    plt.close(figure)


def plot_score_histogram(rows, baseline_bleu: float, path: str, title: str, xlabel: str, column: str = "bleu") -> None:
    """Figure 1 of the paper: how many heads leave which score (``column`` of the rows) when masked alone."""

    plt = _pyplot()
    types = [t for t in ATTENTION_TYPES if any(r["attention_type"] == t for r in rows)]
    scores = [r[column] for r in rows]
    low, high = min(scores + [baseline_bleu]), max(scores + [baseline_bleu])
    bins = np.linspace(low - 0.5, high + 0.5, 31)
    figure, axis = plt.subplots(figsize=(6, 3.4))
    axis.hist(
        [[r[column] for r in rows if r["attention_type"] == t] for t in types],
        bins=bins, stacked=True, label=[TYPE_TITLES[t] for t in types],
    )
    axis.axvline(baseline_bleu, color="black", linestyle="--", linewidth=1, label="no head masked")
    axis.set_xlabel(xlabel)
    axis.set_ylabel("heads")
    axis.set_title(title)
    axis.legend(fontsize=8)
    save_figure(figure, path)
    plt.close(figure)


def plot_cross_domain(rows, path: str, title: str, xlabel: str, ylabel: str) -> None:
    """Figure 2 of the paper: ΔBLEU per head on one test set against another."""
    plt = _pyplot()
    figure, axis = plt.subplots(figsize=(4.6, 4.2))
    for attention_type in ATTENTION_TYPES:
        points = [r for r in rows if r["attention_type"] == attention_type]
        if points:
            axis.scatter(
                [r["delta"] for r in points], [r["cross_delta"] for r in points],
                s=14, alpha=0.8, label=TYPE_TITLES[attention_type],
            )
    axis.axhline(0, color="grey", linewidth=0.5)
    axis.axvline(0, color="grey", linewidth=0.5)
    axis.set_xlabel(xlabel)
    axis.set_ylabel(ylabel)
    axis.set_title(title, fontsize=10)
    axis.legend(fontsize=8)
    save_figure(figure, path)
    plt.close(figure)


_ORDER_STYLES = {
    "importance": dict(color="tab:blue", linestyle="-", marker="o"),
    "iterative": dict(color="tab:green", linestyle="-", marker="s"),
    "ablation": dict(color="tab:orange", linestyle="--", marker="^"),
    "random": dict(color="tab:grey", linestyle=":", marker="x"),
    "fisher": dict(color="tab:purple", linestyle="-", marker="D"),
    "fisher-rearranged": dict(color="tab:red", linestyle="-", marker="v"),
    "gates": dict(color="tab:brown", linestyle="-.", marker="*"),
}


def _order_style(order: str) -> dict:
    """An order's line; its tuned variant (``ORDER+tuned``) in the same colour, dashed, hollow markers."""

    if order.endswith(TUNED_SUFFIX):
        style = dict(_ORDER_STYLES[order[: -len(TUNED_SUFFIX)]])
        style.update(linestyle="--", markerfacecolor="none")
        return style
    return _ORDER_STYLES[order]


def _curve(axis, points, label: str, column: str = "bleu", **style) -> None:
    points = sorted(points, key=lambda r: r["percent"])
    x = [r["percent"] for r in points]
    y = [r[column] for r in points]
    axis.plot(x, y, label=label, markersize=4, **style)
    if any(r["draws"] > 1 for r in points):
        low = [r[column] - r[column + "_std"] for r in points]
        high = [r[column] + r[column + "_std"] for r in points]
        axis.fill_between(x, low, high, color=style.get("color"), alpha=0.2, linewidth=0)


def plot_pruning_curves(summary, scope: str, baseline_bleu: float, path: str, ylabel: str, column: str = "bleu",
                        metric_label: str = "BLEU", xlabel: Optional[str] = None) -> None:
    """Figure 3 of the paper: the score (BLEU, or ``column``) against % of heads pruned (or ``xlabel``), one line
    per order."""

    plt = _pyplot()
    figure, axis = plt.subplots(figsize=(5.2, 3.6))
    for order in curve_orders(r["order"] for r in summary if r["scope"] == scope):
        points = [r for r in summary if r["scope"] == scope and r["order"] == order]
        if points:
            label = order_title(order, metric_label) + (f" (mean ± std, {points[0]['draws']} draws)"
                                                        if order == "random" else "")
            _curve(axis, points, label, column, **_order_style(order))
    axis.axhline(baseline_bleu, color="black", linestyle="--", linewidth=0.8, label="unpruned")
    if xlabel is None:
        heads = next(r["total"] for r in summary if r["scope"] == scope)
        what = "all heads" if scope == "all" else f"{TYPE_TITLES[scope]} heads"
        xlabel = f"% of {what} pruned ({heads} heads)"
    axis.set_xlabel(xlabel)
    axis.set_ylabel(ylabel)
    axis.set_xlim(left=0)
    axis.legend(fontsize=7)
    save_figure(figure, path)
    plt.close(figure)


def plot_pruning_by_type(summary, order: str, baseline_bleu: float, path: str, ylabel: str,
                         column: str = "bleu", metric_label: str = "BLEU") -> None:
    """Figure 4 of the paper: pruning one attention type at a time, one line per type."""

    plt = _pyplot()
    figure, axis = plt.subplots(figsize=(5.2, 3.6))
    for scope in ("all",) + ATTENTION_TYPES:
        points = [r for r in summary if r["scope"] == scope and r["order"] == order]
        if points:
            label = "all types" if scope == "all" else TYPE_TITLES[scope]
            _curve(axis, points, label, column, linestyle=":" if scope == "all" else "-", marker="o")
    axis.axhline(baseline_bleu, color="black", linestyle="--", linewidth=0.8, label="unpruned")
    axis.set_xlabel("% of the attention type's heads pruned")
    axis.set_ylabel(ylabel)
    axis.set_title(f"order: {order_title(order, metric_label)}", fontsize=9)
    axis.set_xlim(left=0)
    axis.legend(fontsize=7)
    save_figure(figure, path)
    plt.close(figure)


def plot_dynamics(rows, path: str, ylabel: str, label: str = "BLEU") -> None:
    """Figure 5 of the paper: per pruning level, the score (BLEU) relative to the epoch's unpruned score.

    Epochs on a log scale; the upper panel shows each epoch's unpruned score.
    """

    plt = _pyplot()
    grid = dynamics_grid(rows)
    epochs, levels, by_key = grid.epochs, grid.levels, grid.cell
    figure, (top, bottom) = plt.subplots(
        2, 1, figsize=(5.6, 5.2), sharex=True, gridspec_kw={"height_ratios": [1, 2.4]}
    )
    top.plot(epochs, [grid.unpruned_score(e) for e in epochs], color="black", marker="o", markersize=3)
    top.set_ylabel(f"unpruned\n{ylabel}", fontsize=8)
    colors = plt.get_cmap("viridis")
    for index, level in enumerate(levels[1:]):
        points = [(e, 100 * by_key[(e, level)]["relative"]) for e in epochs if (e, level) in by_key]
        axis_color = colors(index / max(1, len(levels) - 2))
        bottom.plot([p[0] for p in points], [p[1] for p in points], marker="o", markersize=3,
                    color=axis_color, label=f"{grid.percent[level]:.0f}% pruned")
    bottom.axhline(100, color="black", linestyle="--", linewidth=0.8)
    bottom.set_xscale("log")
    bottom.set_xticks(epochs, [str(e) for e in epochs], fontsize=7)
    bottom.minorticks_off()
    bottom.set_xlabel("epoch (log scale)")
    bottom.set_ylabel(f"{label}, % of the epoch's unpruned {label}")
    bottom.legend(fontsize=6, ncol=3, loc="best")
    save_figure(figure, path)
    plt.close(figure)


def plot_recovery_curves(records, path: str, label: str, title: str) -> None:
    """The gap of each fine-tuned configuration to the control fine-tuned alike, against the updates done: one line
    per budget (the mean over its draws, the band their spread); the right panel is the second half of the
    fine-tune at a scale where the remaining gap shows, so that a reader sees whether it still closes."""
    plt = _pyplot()
    rows = recovery_curve_rows(records)  # FinetuneRecord
    figure, (whole, late) = plt.subplots(1, 2, figsize=(12, 4.5))
    end = max((p["updates"] for _, points in rows for p in points), default=0)
    late_means = [p["mean"] for _, points in rows for p in points if p["updates"] >= end / 2]
    colors = plt.get_cmap("tab10")
    for index, (budget, points) in enumerate(rows):
        updates = [p["updates"] for p in points]
        means = np.array([p["mean"] for p in points])
        spreads = np.array([p["std"] for p in points])
        draws = points[0]["draws"]
        # ten colours, then the next line style: every budget of a grid (Tables 5 and 6 give 17) its own line
        color, style = colors(index % 10), LINE_STYLES[(index // 10) % len(LINE_STYLES)]
        for axis in (whole, late):
            axis.plot(updates, means, marker="o", markersize=3, color=color, linestyle=style,
                      label=f"{budget} ({draws} draw{'s' if draws != 1 else ''})")
            if any(spreads > 0):
                axis.fill_between(updates, means - spreads, means + spreads, color=color, alpha=0.15)
    for axis in (whole, late):
        axis.axhline(0.0, color="black", linewidth=0.8)
        axis.set_xlabel("fine-tuning updates")
        axis.grid(alpha=0.3)
    whole.set_ylabel(f"{label} minus the fine-tuned control's")
    if late_means:
        low, high = min(late_means), max(late_means)
        late.set_xlim(end / 2 - 0.05 * end, end + 0.05 * end)
        late.set_ylim(min(low, -1.0) - 1.0, max(high, 0.0) + 1.0)
    late.set_title("the second half of the fine-tune", fontsize=8)
    late.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5))  # beside the panel, over no line
    figure.suptitle(title, fontsize=8)
    save_figure(figure, path)
    plt.close(figure)
