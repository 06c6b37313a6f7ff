"""Head importance scores (Michel et al. 2019, section 4.1): statistics and files.

I_h = E_x |dL(x)/dxi_h|.  With xi multiplying head h's output o_h (T x d),
dL/dxi_h = sum_t <o_h,t, dL/d(xi_h o_h,t)>, so one backward pass gives, for
every head, its contribution at each position t of each sentence b.  How the
absolute value is taken decides the granularity:

- ``sentence``: |sum_t c[t, b, h]| per sentence, averaged over sentences
  (the paper's definition);
- ``token``: sum_t |c[t, b, h]|, divided by the number of target tokens
  (the authors' released ``prune.py``);
- ``batch``: |sum_{t,b} c[t, b, h]| per batch, averaged over batches.

The ``fisher`` method squares where the ``gradient`` method takes the
absolute value: F_h = E_x (dL(x)/dxi_h)^2 at sentence level, the diagonal of
the mask's empirical Fisher information, which Kwon et al. (2022, "A Fast
Post-Training Pruning Framework for Transformers", section 4.1) use to
estimate the loss increase of a mask. Same backward pass, same files.

Nothing here depends on fairseq: scores are tensors ``(layers, heads)`` per
attention type, as in ``head_mask``.
"""

import csv
import json
import math
import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import torch

from fairseq_headprune.constants import (
    ATTENTION_TYPES,
    DEFAULT_IMPORTANCE_METHOD,
    FFN_TYPES,
    GRANULARITIES,
    IMPORTANCE_METHODS,
    TYPE_LETTERS,
)
from fairseq_headprune.errors import ResultFileError
from fairseq_headprune.study.masks.head_mask import HeadLayout
from fairseq_headprune.study.output.files import atomic_text_file, write_json

IMPORTANCE_FORMAT_VERSION = 1

# attention type -> float tensor (layers, heads)
HeadScores = Dict[str, torch.Tensor]


def gradient_magnitude(gradients: torch.Tensor, method: str = DEFAULT_IMPORTANCE_METHOD) -> torch.Tensor:
    """|g| (Michel et al.'s importance) or g^2 (the Fisher information), elementwise."""
    if method == "gradient":
        return gradients.abs()
    if method == "fisher":
        return gradients.pow(2)
    raise ValueError(f"unknown importance method {method!r} (expected one of {IMPORTANCE_METHODS})")


def reduce_contributions(
    contributions: torch.Tensor, granularity: str, method: str = DEFAULT_IMPORTANCE_METHOD
) -> torch.Tensor:
    """Sum of |dL/dxi_h| (or, ``fisher``, (dL/dxi_h)^2) terms for one batch, from per-position contributions.

    ``contributions`` is T x B x H (c[t, b, h] = <o_h, dL/d(xi_h o_h)> at
    position t of sentence b); positions that feed no loss (padding) hold 0.
    Returns an ``(H,)`` tensor to be added to the running sum.
    """
    if granularity == "sentence":
        return gradient_magnitude(contributions.sum(dim=0), method).sum(dim=0)
    if granularity == "token":
        return gradient_magnitude(contributions, method).sum(dim=(0, 1))
    if granularity == "batch":
        return gradient_magnitude(contributions.sum(dim=(0, 1)), method)
    raise ValueError(f"unknown importance granularity {granularity!r} (expected one of {GRANULARITIES})")


def fisher_block_terms(contributions: torch.Tensor, granularity: str) -> torch.Tensor:
    """Sum of g g^T over the units of one batch: the layer's block of the mask's empirical Fisher.

    ``contributions`` is T x B x H as in ``reduce_contributions``; g is the
    vector of one unit's dL/dxi_h over the layer's heads (a sentence, a
    target token or the batch, as ``granularity`` says). Its diagonal is
    ``reduce_contributions(..., "fisher")``. Kwon et al. (2022, section 4.2)
    rearrange a layer's mask with this block.
    """
    if granularity == "sentence":
        per_unit = contributions.sum(dim=0)  # B x H
    elif granularity == "token":
        per_unit = contributions.reshape(-1, contributions.size(-1))
    elif granularity == "batch":
        per_unit = contributions.sum(dim=(0, 1)).unsqueeze(0)
    else:
        raise ValueError(f"unknown importance granularity {granularity!r} (expected one of {GRANULARITIES})")
    return per_unit.transpose(0, 1) @ per_unit


def normalize_per_layer(scores: HeadScores) -> HeadScores:
    """Divide each layer's scores by their l2 norm over the layer's heads.

    Molchanov et al. (2017), as Michel et al. do before ranking heads across
    layers.  A layer whose scores are all zero stays zero.
    """
    normalized = {}
    for attention_type, layer_scores in scores.items():
        norms = layer_scores.norm(p=2, dim=-1, keepdim=True)
        normalized[attention_type] = torch.where(
            norms > 0, layer_scores / norms.clamp_min(torch.finfo(layer_scores.dtype).tiny), 0.0
        )
    return normalized


def spearman(first: Sequence[float], second: Sequence[float]):
    """Spearman rank correlation and its two-sided p-value (scipy)."""
    from scipy.stats import spearmanr

    if len(first) != len(second):
        raise ValueError(f"cannot correlate {len(first)} with {len(second)} values")
    result = spearmanr(first, second)
    return float(result.statistic), float(result.pvalue)


def flatten_scores(scores: HeadScores) -> List[float]:
    """Scores in (attention type, layer, head) order, as in the TSV file."""
    return [
        float(value)
        for attention_type in ATTENTION_TYPES
        if attention_type in scores
        for value in scores[attention_type].reshape(-1).tolist()
    ]


@dataclass
class ImportanceResult:
    """Importance of every head and how it was estimated."""

    importance: HeadScores
    granularity: str
    count: float  # sentences, target tokens or batches the mean is over
    settings: Dict[str, object] = field(default_factory=dict)
    # loss increase when each head alone is masked (optional, same shape)
    loss_increase: Optional[HeadScores] = None
    method: str = DEFAULT_IMPORTANCE_METHOD  # gradient (I_h) or fisher (F_h)
    # fisher: per attention type (layers, heads, heads), E_x g g^T of each layer's heads (diagonal: importance)
    fisher_blocks: Optional[Dict[str, torch.Tensor]] = None
    # per FFN type (layers, neurons): E_x |dL/dzeta_i| (or its square) of every FFN neuron, when asked for
    neuron_importance: Optional[Dict[str, torch.Tensor]] = None

    @property
    def layout(self) -> HeadLayout:
        return {t: tuple(s.shape) for t, s in self.importance.items()}

    @property
    def normalized(self) -> HeadScores:
        return normalize_per_layer(self.importance)

    def correlation_with_loss_increase(self):
        """Spearman (rho, p) between raw importance and single-head loss increase."""
        if self.loss_increase is None:
            return None
        return spearman(flatten_scores(self.importance), flatten_scores(self.loss_increase))


def _to_lists(scores: Optional[HeadScores]):
    if scores is None:
        return None
    return {t: scores[t].tolist() for t in ATTENTION_TYPES if t in scores}


def write_importance_json(result: ImportanceResult, path: str) -> None:
    correlation = result.correlation_with_loss_increase()
    payload = {
        "format": "fairseq-headprune importance",
        "version": IMPORTANCE_FORMAT_VERSION,
        "granularity": result.granularity,
        "method": result.method,
        "count": result.count,
        "settings": result.settings,
        "layout": {t: list(shape) for t, shape in result.layout.items()},
        "importance": _to_lists(result.importance),
        "normalized": _to_lists(result.normalized),
    }
    if result.fisher_blocks is not None:
        payload["fisher_blocks"] = _to_lists(result.fisher_blocks)
    if result.neuron_importance is not None:
        payload["neuron_importance"] = {t: result.neuron_importance[t].tolist()
                                        for t in FFN_TYPES if t in result.neuron_importance}
    if result.loss_increase is not None:
        payload["loss_increase"] = _to_lists(result.loss_increase)
        payload["spearman_importance_vs_loss_increase"] = {"rho": correlation[0], "p": correlation[1]}
    write_json(payload, path, indent=1)


def write_importance_tsv(result: ImportanceResult, path: str) -> None:
    """One row per head: attention_type, 1-based layer and head, raw and normalised score."""
    normalized = result.normalized

    with atomic_text_file(path) as stream:
        writer = csv.writer(stream, delimiter="\t", lineterminator="\n")
        header = ["attention_type", "layer", "head", "importance", "normalized"]
        if result.loss_increase is not None:
            header.append("loss_increase")
        writer.writerow(header)
        for attention_type in ATTENTION_TYPES:
            if attention_type not in result.importance:
                continue
            layers, heads = result.importance[attention_type].shape
            for layer in range(layers):
                for head in range(heads):
                    row = [
                        attention_type,
                        layer + 1,
                        head + 1,
                        f"{result.importance[attention_type][layer, head].item():.8g}",
                        f"{normalized[attention_type][layer, head].item():.8g}",
                    ]
                    if result.loss_increase is not None:
                        row.append(f"{result.loss_increase[attention_type][layer, head].item():.8g}")
                    writer.writerow(row)


def read_importance_file(path: str, layout: Optional[HeadLayout] = None) -> ImportanceResult:
    """Read an importance ``.json`` file; check it fits ``layout`` if given."""
    if not os.path.isfile(path):
        raise ResultFileError(f"importance file not found: {path}")
    try:
        with open(path) as stream:
            payload = json.load(stream)
        importance = {t: torch.tensor(v, dtype=torch.float64) for t, v in payload["importance"].items()}
        loss_increase = payload.get("loss_increase")
        blocks = payload.get("fisher_blocks")
        neurons = payload.get("neuron_importance")
        result = ImportanceResult(
            importance=importance,
            granularity=payload["granularity"],
            count=payload["count"],
            settings=payload.get("settings", {}),
            method=payload.get("method", DEFAULT_IMPORTANCE_METHOD),
            loss_increase=None
            if loss_increase is None
            else {t: torch.tensor(v, dtype=torch.float64) for t, v in loss_increase.items()},
            fisher_blocks=None if blocks is None else {
                t: torch.tensor(v, dtype=torch.float64) for t, v in blocks.items()},
            neuron_importance=None if neurons is None else {
                t: torch.tensor(v, dtype=torch.float64) for t, v in neurons.items()},
        )
    except (ValueError, KeyError, TypeError) as error:
        raise ResultFileError(f"{path} is not a fairseq-headprune importance file ({error})") from error
    if result.method not in IMPORTANCE_METHODS:
        raise ResultFileError(f"{path}: unknown importance method {result.method!r}")
    for ffn_type, scores in (result.neuron_importance or {}).items():
        if ffn_type not in FFN_TYPES or scores.dim() != 2:
            raise ResultFileError(f"{path}: bad neuron scores for FFN type {ffn_type!r}")
    for attention_type in importance:
        if attention_type not in ATTENTION_TYPES or importance[attention_type].dim() != 2:
            raise ResultFileError(f"{path}: bad scores for attention type {attention_type!r}")
        if result.fisher_blocks is not None:
            layers, heads = importance[attention_type].shape
            block = result.fisher_blocks.get(attention_type)
            if block is None or tuple(block.shape) != (layers, heads, heads):
                raise ResultFileError(f"{path}: bad Fisher blocks for attention type {attention_type!r}")
    if layout is not None:
        shapes = {t: tuple(s.shape) for t, s in importance.items()}
        expected = {t: tuple(shape) for t, shape in layout.items()}
        if shapes != expected:
            describe = lambda d: " ".join(f"{t}={layers}x{h}" for t, (layers, h) in sorted(d.items()))  # noqa: E731
            raise ResultFileError(
                f"importance file {path} is for a model with {describe(shapes)}, "
                f"not {describe(expected)}"
            )
    return result


def summarize(result: ImportanceResult) -> List[str]:
    """Lines for the console: per type, the most and least important heads, each as its ``--head-mask`` spec."""
    lines = []
    normalized = result.normalized
    for attention_type in ATTENTION_TYPES:
        if attention_type not in result.importance:
            continue
        scores = result.importance[attention_type]
        flat = scores.reshape(-1)
        heads = scores.shape[1]
        order = torch.argsort(flat, descending=True).tolist()
        letter = TYPE_LETTERS[attention_type]
        name = lambda i: f"{letter}:{i // heads + 1}:{i % heads + 1}"  # noqa: E731  (the --head-mask spec)
        lines.append(
            f"{attention_type}\tmean {flat.mean().item():.4g}\t"
            f"top {', '.join(name(i) for i in order[:3])}\t"
            f"bottom {', '.join(name(i) for i in order[-3:])}\t"
            f"max normalised {normalized[attention_type].max().item():.3f}"
        )
    for ffn_type in FFN_TYPES:
        if result.neuron_importance is not None and ffn_type in result.neuron_importance:
            scores = result.neuron_importance[ffn_type]
            per_layer = ", ".join(f"{layer + 1}: {row.mean().item():.3g}" for layer, row in enumerate(scores))
            lines.append(f"{ffn_type}\tmean {scores.mean().item():.4g}\tper layer {per_layer}\t"
                         f"{int((scores == 0).sum())} of {scores.numel()} neurons at 0")
    correlation = result.correlation_with_loss_increase()
    if correlation is not None and not math.isnan(correlation[0]):
        lines.append(
            f"spearman({'Fisher score' if result.method == 'fisher' else 'importance'}, "
            f"loss increase when the head alone is masked) = "
            f"{correlation[0]:.3f} (p = {correlation[1]:.2g}, {len(flatten_scores(result.importance))} heads)"
        )
    return lines


def read_fisher_file(path: str, layout) -> ImportanceResult:
    """An importance file of the fisher method, with its per-layer blocks."""
    try:
        result = read_importance_file(path, layout)
    except ResultFileError as error:
        raise ResultFileError(f"the Fisher file: {error}", setting="fisher") from error
    if result.method != "fisher" or result.fisher_blocks is None:
        raise ResultFileError(
            f"the Fisher file {path} holds {result.method} scores without Fisher blocks; "
            "estimate them with importance --importance-method fisher", setting="fisher"
        )
    return result
