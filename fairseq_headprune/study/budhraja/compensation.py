"""How much each head's weights moved while a pruned model was fine-tuned (Budhraja et al. 2020, Figure 2).

The paper plots "the average change in magnitude of parameters for
different attention heads (W^q, W^k, W^v in Equation 1)" and states that
"the average change in attention parameters for any two layers differs by
less than 10%". Head h of a layer owns rows h*d_h ... (h+1)*d_h - 1 of the
query, key and value in-projections (fairseq's ``q_proj``, ``k_proj``,
``v_proj`` weights; biases left out). Two readings of "change in magnitude"
are computed for every head:

- ``mean_abs_change``: the mean of |W_after - W_before| over those rows' entries
  (the paper's "average change");
- ``relative_change``: ||W_after - W_before|| / ||W_before|| over the same entries
  (Frobenius norms), which does not grow with the weights' scale.

A layer's change is the mean over its unpruned heads; the spread of a
stack is the largest relative difference between two layers,
``(max - min) / min``, which the paper puts below 10%.
"""

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from fairseq_headprune.constants import ATTENTION_TYPES, TYPE_LETTERS
from fairseq_headprune.errors import HeadMaskError
from fairseq_headprune.study.masks.head_mask import HeadLayout, HeadMask

PAPER_SPREAD = 0.10  # "differs by less than 10%"
MEASURES = ("mean_abs_change", "relative_change")
# (attention type, 0-based layer) -> the q, k and v in-projection weights, each (H * d_h) x d_model
InProjections = Dict[Tuple[str, int], Tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


def head_name(attention_type: str, layer: int, head: int) -> str:
    """A head in the mask language, 1-based: ``E:3:5``."""
    return f"{TYPE_LETTERS[attention_type]}:{layer + 1}:{head + 1}"


@dataclass
class Compensation:
    """Per head, both change measures; which heads were pruned; per type and layer, the unpruned heads' mean."""

    layout: HeadLayout
    heads: Dict[str, Dict[str, float]]  # head name -> {measure: value}
    pruned: List[str] = field(default_factory=list)
    layer_means: Dict[str, Dict[str, List[Optional[float]]]] = field(default_factory=dict)  # measure -> type -> layers

    def spread(self, measure: str = "mean_abs_change", attention_type: Optional[str] = None) -> Optional[float]:
        """(max - min) / min over the layers' means (one type, or every layer of every type); None below 2 layers."""
        types = [attention_type] if attention_type else list(self.layer_means[measure])
        means = [m for t in types for m in self.layer_means[measure][t] if m is not None]
        if len(means) < 2 or min(means) <= 0:
            return None
        return (max(means) - min(means)) / min(means)

    def to_dict(self) -> Dict[str, object]:
        spreads = {measure: {"all": self.spread(measure),
                             **{t: self.spread(measure, t) for t in self.layer_means[measure]}}
                   for measure in MEASURES}
        return {
            "measures": {
                "mean_abs_change": "mean |W_after - W_before| over the head's rows of W_q, W_k, W_v (biases left out)",
                "relative_change": "||W_after - W_before|| / ||W_before|| over the same rows (Frobenius)",
            },
            "heads": {name: values for name, values in self.heads.items()},
            "pruned": list(self.pruned),
            "layer_means": self.layer_means,
            "layer_spread": spreads,
            "layer_spread_definition": "(largest - smallest) / smallest of the layers' mean change over unpruned heads",
            "paper_layer_spread": f"< {PAPER_SPREAD:.0%} (Budhraja et al. 2020, section 3.3)",
        }

    def pruned_grid(self, attention_type: str) -> torch.Tensor:
        """layers x heads, True where the fine-tuning held the head pruned."""
        layers, heads = self.layout[attention_type]
        pruned = set(self.pruned)
        return torch.tensor([[head_name(attention_type, layer, head) in pruned for head in range(heads)]
                             for layer in range(layers)], dtype=torch.bool)

    def grid(self, attention_type: str, measure: str = "mean_abs_change") -> torch.Tensor:
        """layers x heads of one measure (pruned heads included, as measured)."""
        layers, heads = self.layout[attention_type]
        values = torch.zeros(layers, heads)
        for layer in range(layers):
            for head in range(heads):
                values[layer, head] = self.heads[head_name(attention_type, layer, head)][measure]
        return values


def measure_compensation(before: InProjections, after: InProjections, layout: HeadLayout,
                         pruned: Optional[HeadMask] = None) -> Compensation:
    """Both measures for every head of ``layout`` from the in-projections of two checkpoints of one architecture.

    ``pruned``: the mask the fine-tuning held (0 = pruned); those heads are
    listed and left out of the layers' means.
    """
    heads: Dict[str, Dict[str, float]] = {}
    pruned_names: List[str] = []
    layer_means: Dict[str, Dict[str, List[Optional[float]]]] = {m: {} for m in MEASURES}
    for attention_type in (t for t in ATTENTION_TYPES if t in layout):
        layers, count = layout[attention_type]
        for measure in MEASURES:
            layer_means[measure][attention_type] = []
        for layer in range(layers):
            old, new = before[(attention_type, layer)], after[(attention_type, layer)]
            kept_values: Dict[str, List[float]] = {m: [] for m in MEASURES}
            for head, values in enumerate(_head_changes(old, new, count, f"{attention_type} layer {layer + 1}")):
                name = head_name(attention_type, layer, head)
                heads[name] = values
                if pruned is not None and float(pruned[attention_type][layer, head]) == 0.0:
                    pruned_names.append(name)
                else:
                    for measure in MEASURES:
                        kept_values[measure].append(values[measure])
            for measure in MEASURES:
                kept = kept_values[measure]
                layer_means[measure][attention_type].append(sum(kept) / len(kept) if kept else None)
    return Compensation(layout, heads, pruned_names, layer_means)


def _head_changes(old: Sequence[torch.Tensor], new: Sequence[torch.Tensor], heads: int, where: str
                  ) -> List[Dict[str, float]]:
    """Per head: mean |Δ| and ||Δ|| / ||W|| over its rows of the three projections."""
    width = old[0].size(0)
    if width % heads:
        raise HeadMaskError(f"{where}: in-projection width {width} is not {heads} heads")
    head_dim = width // heads
    before = torch.cat([w.double().reshape(heads, head_dim, -1) for w in old], dim=2)  # H x d_h x 3 d_model
    after = torch.cat([w.double().reshape(heads, head_dim, -1) for w in new], dim=2)
    delta = (after - before).reshape(heads, -1)
    norms = before.reshape(heads, -1).norm(dim=1)
    return [{"mean_abs_change": float(delta[h].abs().mean()),
             "relative_change": float(delta[h].norm() / norms[h]) if norms[h] > 0 else 0.0}
            for h in range(heads)]
