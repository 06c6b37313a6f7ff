"""Figures for the studies (matplotlib, written straight to PNG files)."""

from typing import Dict, Optional

import torch

from .atomic_files import atomic_path
from .head_mask import ATTENTION_TYPES

PANEL_TITLES = {"enc-enc": "Enc-Enc", "enc-dec": "Enc-Dec", "dec-dec": "Dec-Dec"}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(figure, path: str) -> None:
    """Save through a temporary name so an interrupted run leaves no half PNG."""
    with atomic_path(path) as temporary:
        figure.savefig(temporary, dpi=150, bbox_inches="tight", format="png")


def plot_head_heatmaps(
    scores: Dict[str, torch.Tensor],
    path: str,
    title: str,
    colorbar_label: str,
    cmap: str = "viridis",
) -> None:
    """One panel per attention type (Enc-Enc, Enc-Dec, Dec-Dec): layers x heads."""
    plt = _pyplot()
    types = [t for t in ATTENTION_TYPES if t in scores]
    low = min(float(scores[t].min()) for t in types)
    high = max(float(scores[t].max()) for t in types)
    figure, axes = plt.subplots(1, len(types), figsize=(4.2 * len(types), 3.4), squeeze=False)
    image = None
    for axis, attention_type in zip(axes[0], types):
        values = scores[attention_type].detach().to("cpu", torch.float64).numpy()
        layers, heads = values.shape
        image = axis.imshow(values, cmap=cmap, vmin=low, vmax=high, aspect="auto")
        axis.set_title(PANEL_TITLES[attention_type])
        axis.set_xlabel("head")
        axis.set_ylabel("layer")
        axis.set_xticks(range(heads), [str(h + 1) for h in range(heads)], fontsize=7)
        axis.set_yticks(range(layers), [str(layer + 1) for layer in range(layers)])
    figure.colorbar(image, ax=axes[0].tolist(), label=colorbar_label, shrink=0.9)
    figure.suptitle(title, y=1.04)
    save_figure(figure, path)
    plt.close(figure)


def plot_importance(result, path: str, title: Optional[str] = None) -> None:
    """Heat map of per-layer normalised importance, as used to rank heads."""
    plot_head_heatmaps(
        result.normalized,
        path,
        title or f"Head importance ({result.granularity} level, normalised per layer)",
        "$I_h \\,/\\, \\|I_{\\mathrm{layer}}\\|_2$",
    )
