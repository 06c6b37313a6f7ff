"""Mask tuning by linear least squares (Kwon et al. 2022, section 4.3), as plain functions.

Once a mask is chosen, the kept units of a layer can make up for the removed
ones. A unit is an attention head (its contribution A_h(t) = W_o[:, h] o_h(t)
to the layer's output at position t) or an FFN neuron (A_i(t) = W_2[:, i]
a_i(t)). The tuned layer outputs sum_{i kept} s_i A_i(t) + b + c instead of
sum_{i kept} A_i(t) + b. As in Kwon et al.'s reference implementation, the
target is what the unpruned model's sub-layer hands on, seen from the pruned
model: Y(t) = (unpruned output + unpruned residual input) - b - pruned
residual input, so each layer also corrects the drift that the pruned layers
below it left in the residual stream. The scales s and the correction c (one
value per output dimension) are the least-squares fit over sample positions.
Eliminating c leaves the k x k normal equations of the centred contributions,
solved here from streamed sums (``TuningSums``), so no activation is kept.

The normal equations are solved for s - 1 in the eigenbasis of the Gram
matrix, leaving out the directions whose eigenvalue is below the largest
over ``max_condition`` (dead neurons, identical heads): a unit whose effect
the data cannot tell apart keeps its scale 1. A fit that needs a scale
beyond ``scale_bound`` falls back to the binary mask (scales 1, no
correction) for that layer; so does a fit the engine finds raising the loss
on held-aside data. Scales and correction fold exactly into the output
projection or ``fc2`` (``shrink`` does so).
"""

import hashlib
import json
import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import torch

from fairseq_headprune.constants import DEFAULT_MAX_CONDITION, DEFAULT_SCALE_BOUND, FFN_TYPES
from fairseq_headprune.errors import ResultFileError
from fairseq_headprune.study.masks.ffn_mask import FfnLayout, FfnMask, ffn_mask_to_spec, parse_ffn_mask
from fairseq_headprune.study.masks.head_mask import (
    HeadLayout,
    HeadMask,
    head_mask_to_spec,
    layer_name,
    parse_head_mask,
    parse_layer_name,
)
from fairseq_headprune.study.output.files import read_json_of_format, write_json
from fairseq_headprune.study.search.records import TuningSummary

TUNING_FORMAT = "fairseq-headprune mask tuning"

Layer = Tuple[str, int]


@dataclass
class TuningSums:
    """Sums over sample positions t of one layer, in float64 (k kept units, d output dimensions)."""

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

    def add_factored(self, activations: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> None:
        """Add positions whose contributions factor as A_i(t) = a_i(t) w_i (FFN neurons), never forming N x k x d.

        ``activations`` N x k (a_i(t)), ``weight`` d x k (w_i, columns of fc2), ``targets`` N x d.
        """
        activations, weight, targets = (x.to(torch.float64) for x in (activations, weight, targets))
        self.contribution_gram += (activations.T @ activations) * (weight.T @ weight)
        self.contribution_sum += activations.sum(dim=0).unsqueeze(1) * weight.T
        self.contribution_target += (activations * (targets @ weight)).sum(dim=0)
        self.target_sum += targets.sum(dim=0)
        self.target_square += float(targets.pow(2).sum())
        self.positions += targets.size(0)


@dataclass
class LayerTuning:
    """One layer's tuned mask: a scale per unit (0: removed) and the correction of the output bias."""

    scales: List[float]
    bias: List[float]
    fitted: bool  # False: the binary mask was kept (out of bounds, no data, or worse on held-aside data)
    reason: str = ""  # why not fitted
    condition: float = float("nan")
    error_binary: float = float("nan")  # relative squared reconstruction error of the binary mask
    error_tuned: float = float("nan")  # ... of the fit (equal to error_binary when not fitted)
    directions: int = -1  # eigen-directions of the normal equations fitted (the rest left at scale 1)
    loss_binary: float = float("nan")  # loss per token on the held-aside data with this layer binary
    loss_tuned: float = float("nan")  # ... with this layer's fit (kept only if lower)

    def as_binary(self, reason: str) -> "LayerTuning":
        """The binary mask of this layer (scales 1 on the kept units, no correction), saying why."""
        scales = [1.0 if s != 0 else 0.0 for s in self.scales]
        return LayerTuning(scales, [0.0] * len(self.bias), False, reason, self.condition, self.error_binary,
                           self.error_binary, self.directions, self.loss_binary, self.loss_tuned)

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


def solve_layer(sums: TuningSums, kept: List[int], units: int, scale_bound: float = DEFAULT_SCALE_BOUND,
                max_condition: float = DEFAULT_MAX_CONDITION) -> LayerTuning:
    """The least-squares scales of the ``kept`` units (of ``units``) and the bias correction.

    Solved for s - 1 on the eigen-directions of the centred Gram matrix whose
    eigenvalue is at least the largest over ``max_condition``: where the data
    determine the scales this is the least-squares solution; elsewhere the
    scales stay 1 (the binary mask's).
    """
    dim = sums.target_sum.numel()
    n = sums.positions
    binary_scales = torch.ones(len(kept), dtype=torch.float64)
    no_bias = torch.zeros(dim, dtype=torch.float64)
    reference = max(sums.target_square, 1e-300)
    error_binary = _squared_error(sums, binary_scales, no_bias) / reference if n else float("nan")

    def binary(reason: str, condition: float = float("nan"), directions: int = 0) -> LayerTuning:
        scales = [0.0] * units
        for unit in kept:
            scales[unit] = 1.0
        return LayerTuning(scales, [0.0] * dim, False, reason, condition, error_binary, error_binary, directions)

    if n == 0:
        return binary("no sample positions")
    if not kept:
        # no unit left: only the correction c = mean Y can be fitted (the layer outputs b + c)
        bias = sums.target_sum / n
        error = _squared_error(sums, torch.zeros(0, dtype=torch.float64), bias) / reference
        return LayerTuning([0.0] * units, bias.tolist(), True, "", 1.0, error_binary, error, 0)
    gram = sums.contribution_gram - sums.contribution_sum @ sums.contribution_sum.T / n
    right = sums.contribution_target - sums.contribution_sum @ sums.target_sum / n
    gram = (gram + gram.T) / 2
    eigenvalues, eigenvectors = torch.linalg.eigh(gram)
    largest, smallest = float(eigenvalues.max()), float(eigenvalues.min())
    condition = math.inf if smallest <= 0 else largest / smallest
    if largest <= 0:
        return binary("the kept units contribute nothing on the sample positions", condition)
    fitted = eigenvalues >= largest / max_condition
    basis = eigenvectors[:, fitted]
    step = basis @ ((basis.T @ (right - gram @ binary_scales)) / eigenvalues[fitted])
    scales = binary_scales + step
    directions = int(fitted.sum())
    if float(scales.abs().max()) > scale_bound:
        return binary(f"a scale of {float(scales.abs().max()):.3g} exceeds the bound {scale_bound:g}", condition,
                      directions)
    bias = (sums.target_sum - scales @ sums.contribution_sum) / n
    all_scales = [0.0] * units
    for unit, value in zip(kept, scales.tolist()):
        all_scales[unit] = value
    error = _squared_error(sums, scales, bias) / reference
    return LayerTuning(all_scales, bias.tolist(), True, "", condition, error_binary, error, directions)


@dataclass
class MaskTuning:
    """A binary head (and neuron) mask with its tuned scales and bias corrections, and the data it was fitted on.

    ``layers`` holds attention layers (``enc-enc`` ...) and FFN layers
    (``enc-ffn``, ``dec-ffn``); a layer absent from it is binary.
    """

    head_mask: HeadMask
    layers: Dict[Layer, LayerTuning]
    settings: Dict[str, object] = field(default_factory=dict)
    ffn_mask: Optional[FfnMask] = None

    @property
    def spec(self) -> str:
        return head_mask_to_spec(self.head_mask)

    @property
    def ffn_spec(self) -> str:
        return "" if self.ffn_mask is None else ffn_mask_to_spec(self.ffn_mask)

    def head_layers(self) -> Dict[Layer, LayerTuning]:
        return {key: values for key, values in self.layers.items() if key[0] not in FFN_TYPES}

    def ffn_layers(self) -> Dict[Layer, LayerTuning]:
        return {key: values for key, values in self.layers.items() if key[0] in FFN_TYPES}

    def fingerprint(self) -> str:
        """Depends on the masks and every tuned value: names a tuned configuration's results."""

        payload = {"spec": self.spec, "layers": {f"{t}:{layer}": [v.scales, v.bias]
                                                 for (t, layer), v in sorted(self.layers.items())}}
        if self.ffn_mask is not None:
            payload["ffn_spec"] = self.ffn_spec
        return hashlib.sha1(json.dumps(payload).encode()).hexdigest()[:12]

    def summary(self, sentences: Optional[int] = None) -> TuningSummary:
        """The tuning in four figures (and the sentences it was fitted on, where given)."""
        fitted = [v for v in self.layers.values() if v.fitted]
        return TuningSummary(len(self.layers), len(fitted), _mean([v.error_binary for v in self.layers.values()]),
                             _mean([v.error_tuned for v in self.layers.values()]), sentences)


def _mean(values: List[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return sum(finite) / len(finite) if finite else float("nan")


def write_tuning(tuning: MaskTuning, path: str) -> None:
    payload = {
        "format": TUNING_FORMAT,
        "spec": tuning.spec,
        "settings": tuning.settings,
        "summary": tuning.summary().to_dict(),
        "layers": {layer_name(t, layer): v.to_dict() for (t, layer), v in tuning.layers.items()},
    }
    if tuning.ffn_mask is not None:
        payload["ffn_spec"] = tuning.ffn_spec
    write_json(payload, path, indent=1)


def read_tuning(path: str, layout: HeadLayout, ffn_layout: Optional[FfnLayout] = None) -> MaskTuning:
    """A tuning file of ``search --tune-masks``, checked against the model's layouts (heads, FFN neurons)."""
    description = "a mask-tuning file of search --tune-masks"
    payload = read_json_of_format(path, TUNING_FORMAT, "tuning", description)
    try:
        head_mask = parse_head_mask(payload["spec"], layout)
        ffn_mask = None
        if payload.get("ffn_spec") is not None:
            if ffn_layout is None:
                raise ResultFileError(f"the tuning file {path} tunes FFN neurons, which this command cannot apply",
                                      setting="tuning")
            ffn_mask = parse_ffn_mask(payload["ffn_spec"], ffn_layout)
        layers = {}
        for name, values in payload["layers"].items():
            layers[parse_layer_name(name)] = LayerTuning(**values)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        raise ResultFileError(f"the tuning file {path} is not {description} ({error})", setting="tuning") from error
    masks = dict(head_mask, **(ffn_mask or {}))
    shapes = dict(layout, **(ffn_layout or {}))
    for (t, layer), values in layers.items():
        if t not in shapes or not 0 <= layer < shapes[t][0] or len(values.scales) != shapes[t][1]:
            raise ResultFileError(f"{path} tunes {t} layer {layer + 1}, which does not fit this model")
        if t not in masks:
            raise ResultFileError(f"{path} tunes {t} layer {layer + 1} but holds no mask of it")
        if any(s != 0.0 for s, m in zip(values.scales, masks[t][layer].tolist()) if m == 0):
            raise ResultFileError(f"{path}: {t} layer {layer + 1} scales a unit its mask removes")
    return MaskTuning(head_mask, layers, payload.get("settings", {}), ffn_mask)
