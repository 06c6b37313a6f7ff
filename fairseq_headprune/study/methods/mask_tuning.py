"""Mask tuning by linear least squares (after Kwon et al. 2022, section 4.3), as plain functions.

Once a mask is chosen, the kept heads of an attention layer can make up for
the removed ones: with A_h(t) = W_o[:, h] o_h(t) the contribution of head h
to the layer's output at position t, the tuned layer outputs
sum_{h kept} s_h A_h(t) + b_o + c instead of sum_{h kept} A_h(t) + b_o. The
scales s and the bias correction c (one value per output dimension) are
the least-squares fit of the unpruned layer's output Y(t) = sum_h A_h(t)
over sample positions. Eliminating c (it absorbs the mean residual) leaves
the k x k normal equations of the centred contributions, which this module
solves from streamed sums (``TuningSums``), so no activation is kept.

A fit that is ill-conditioned (condition number above ``max_condition``)
or needs a scale beyond ``scale_bound`` falls back to the binary mask
(scales 1, no correction) for that layer. Scales and correction fold
exactly into the output projection (``shrink`` does so).
"""

import json
import math
from dataclasses import dataclass, field
from typing import Dict, List, Tuple

import torch

from ...constants import DEFAULT_MAX_CONDITION, DEFAULT_SCALE_BOUND
from ...errors import ResultFileError
from ..output.files import read_json_of_format, write_json
from ..masks.head_mask import HeadLayout, HeadMask, head_mask_to_spec, layer_name, parse_head_mask, parse_layer_name

TUNING_FORMAT = "fairseq-headprune mask tuning"

Layer = Tuple[str, int]


@dataclass
class TuningSums:
    """Sums over sample positions t of one layer, in float64 (k kept heads, d output dimensions)."""

    contribution_gram: torch.Tensor  # k x k: sum_t <A_i(t), A_j(t)>
    contribution_sum: torch.Tensor  # k x d: sum_t A_i(t)
    contribution_target: torch.Tensor  # k: sum_t <A_i(t), Y(t)>
    target_sum: torch.Tensor  # d: sum_t Y(t)
    target_square: float = 0.0  # sum_t |Y(t)|^2
    positions: int = 0

    @classmethod
    def zeros(cls, kept: int, dim: int) -> "TuningSums":
        zeros = lambda *shape: torch.zeros(*shape, dtype=torch.float64)  # noqa: E731
        return cls(zeros(kept, kept), zeros(kept, dim), zeros(kept), zeros(dim))

    def add(self, contributions: torch.Tensor, targets: torch.Tensor) -> None:
        """Add positions: ``contributions`` N x k x d (the kept heads' A_h), ``targets`` N x d (Y)."""
        contributions, targets = contributions.to(torch.float64), targets.to(torch.float64)
        self.contribution_gram += torch.einsum("nid,njd->ij", contributions, contributions)
        self.contribution_sum += contributions.sum(dim=0)
        self.contribution_target += torch.einsum("nid,nd->i", contributions, targets)
        self.target_sum += targets.sum(dim=0)
        self.target_square += float(targets.pow(2).sum())
        self.positions += targets.size(0)


@dataclass
class LayerTuning:
    """One layer's tuned mask: a scale per head (0: removed) and the correction of the output bias."""

    scales: List[float]
    bias: List[float]
    fitted: bool  # False: the binary mask was kept (ill-conditioned or out of bounds)
    reason: str = ""  # why not fitted
    condition: float = float("nan")
    error_binary: float = float("nan")  # relative squared reconstruction error of the binary mask
    error_tuned: float = float("nan")  # ... of the fit (equal to error_binary when not fitted)

    def to_dict(self) -> Dict[str, object]:
        return dict(vars(self))


def _squared_error(sums: TuningSums, scales: torch.Tensor, bias: torch.Tensor) -> float:
    """sum_t |sum_i s_i A_i(t) + c - Y(t)|^2 from the sums."""
    n = sums.positions
    fitted_square = float(scales @ sums.contribution_gram @ scales)
    fitted_sum = scales @ sums.contribution_sum  # d
    value = (fitted_square + 2 * float(fitted_sum @ bias) + n * float(bias @ bias)
             - 2 * float(scales @ sums.contribution_target) - 2 * float(bias @ sums.target_sum) + sums.target_square)
    return max(value, 0.0)


def solve_layer(sums: TuningSums, kept: List[int], heads: int, scale_bound: float = DEFAULT_SCALE_BOUND,
                max_condition: float = DEFAULT_MAX_CONDITION) -> LayerTuning:
    """The least-squares scales of the ``kept`` heads (of ``heads``) and the bias correction."""
    dim = sums.target_sum.numel()
    n = sums.positions
    binary_scales = torch.ones(len(kept), dtype=torch.float64)
    no_bias = torch.zeros(dim, dtype=torch.float64)
    reference = max(sums.target_square, 1e-300)
    error_binary = _squared_error(sums, binary_scales, no_bias) / reference if n else float("nan")

    def binary(reason: str, condition: float = float("nan")) -> LayerTuning:
        scales = [0.0] * heads
        for h in kept:
            scales[h] = 1.0
        return LayerTuning(scales, [0.0] * dim, False, reason, condition, error_binary, error_binary)

    if not kept:
        # no head left: only the correction c = mean Y can be fitted (the layer outputs b_o + c)
        if n == 0:
            return binary("no sample positions")
        bias = sums.target_sum / n
        error = _squared_error(sums, torch.zeros(0, dtype=torch.float64), bias) / reference
        return LayerTuning([0.0] * heads, bias.tolist(), True, "", 1.0, error_binary, error)
    if n == 0:
        return binary("no sample positions")
    gram = sums.contribution_gram - sums.contribution_sum @ sums.contribution_sum.T / n
    right = sums.contribution_target - sums.contribution_sum @ sums.target_sum / n
    eigenvalues = torch.linalg.eigvalsh(gram)
    largest, smallest = float(eigenvalues.max()), float(eigenvalues.min())
    condition = math.inf if smallest <= 0 else largest / smallest
    if not math.isfinite(condition) or condition > max_condition:
        return binary(f"condition number {condition:.3g} > {max_condition:g}", condition)
    scales = torch.linalg.solve(gram, right)
    if float(scales.abs().max()) > scale_bound:
        return binary(f"a scale of {float(scales.abs().max()):.3g} exceeds the bound {scale_bound:g}", condition)
    bias = (sums.target_sum - scales @ sums.contribution_sum) / n
    all_scales = [0.0] * heads
    for h, value in zip(kept, scales.tolist()):
        all_scales[h] = value
    error = _squared_error(sums, scales, bias) / reference
    return LayerTuning(all_scales, bias.tolist(), True, "", condition, error_binary, error)


@dataclass
class MaskTuning:
    """A binary mask with its tuned scales and bias corrections, and the data it was fitted on."""

    head_mask: HeadMask
    layers: Dict[Layer, LayerTuning]
    settings: Dict[str, object] = field(default_factory=dict)

    @property
    def spec(self) -> str:
        return head_mask_to_spec(self.head_mask)

    def scale_mask(self) -> HeadMask:
        """The mask with each kept head's scale in place of its 1 (a real-valued mask)."""
        scaled = {t: m.clone().float() for t, m in self.head_mask.items()}
        for (t, layer), tuning in self.layers.items():
            scaled[t][layer] = torch.tensor(tuning.scales, dtype=torch.float32)
        return scaled

    def fingerprint(self) -> str:
        """Depends on the mask and every tuned value: names a tuned configuration's results."""
        import hashlib

        payload = json.dumps({"spec": self.spec, "layers": {f"{t}:{l}": [v.scales, v.bias]
                                                            for (t, l), v in sorted(self.layers.items())}})
        return hashlib.sha1(payload.encode()).hexdigest()[:12]

    def summary(self) -> Dict[str, object]:
        fitted = [v for v in self.layers.values() if v.fitted]
        return {
            "layers": len(self.layers), "fitted": len(fitted),
            "mean_error_binary": _mean([v.error_binary for v in self.layers.values()]),
            "mean_error_tuned": _mean([v.error_tuned for v in self.layers.values()]),
        }


def _mean(values: List[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return sum(finite) / len(finite) if finite else float("nan")


def write_tuning(tuning: MaskTuning, path: str) -> None:
    write_json({
        "format": TUNING_FORMAT,
        "spec": tuning.spec,
        "settings": tuning.settings,
        "summary": tuning.summary(),
        "layers": {layer_name(t, layer): v.to_dict() for (t, layer), v in tuning.layers.items()},
    }, path, indent=1)


def read_tuning(path: str, layout: HeadLayout) -> MaskTuning:
    """A tuning file of ``search --tune-masks``, checked against the model's layout."""
    description = "a mask-tuning file of search --tune-masks"
    payload = read_json_of_format(path, TUNING_FORMAT, "--tuning", description)
    try:
        head_mask = parse_head_mask(payload["spec"], layout)
        layers = {}
        for name, values in payload["layers"].items():
            layers[parse_layer_name(name)] = LayerTuning(**values)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        raise ResultFileError(f"--tuning {path} is not {description} ({error})")
    for (t, layer), values in layers.items():
        if t not in layout or not 0 <= layer < layout[t][0] or len(values.scales) != layout[t][1]:
            raise ResultFileError(f"{path} tunes {t} layer {layer + 1}, which does not fit this model")
        if any(s != 0.0 for s, m in zip(values.scales, head_mask[t][layer].tolist()) if m == 0):
            raise ResultFileError(f"{path}: {t} layer {layer + 1} scales a head its mask removes")
    return MaskTuning(head_mask, layers, payload.get("settings", {}))
