"""The weights that belong to a head or an FFN neuron: selected when units are removed, scaled when a tuning is
folded in. One implementation of each, for every path that needs it: the state dict (``shrink``), the built
model that a shrunk checkpoint is loaded into (``modules.pruned_heads``), mask tuning on a loaded model and the
CTranslate2 export.

Head h of an attention layer with head dimension d owns rows h·d ... (h+1)·d − 1 of the query, key and value
projections and the same columns of the output projection (Michel et al. 2019, section 4.3); neuron i of an FFN
owns row i of ``fc1`` (weight and bias) and column i of ``fc2``. A tuning (Kwon et al. 2022, section 4.3) scales
each kept unit's columns of ``out_proj`` / ``fc2`` and corrects their bias.
"""

from typing import Optional, Sequence, Tuple

import torch


def kept_units(mask: torch.Tensor) -> Sequence[int]:
    """0-based units (heads or neurons) whose mask value is not 0."""
    return [unit for unit in range(mask.numel()) if float(mask[unit]) != 0.0]


def unit_index(units: Sequence[int], width: int = 1, device=None) -> torch.Tensor:
    """The rows (of q/k/v or fc1) and columns (of out_proj or fc2) of ``units``, each ``width`` wide (a head's
    dimension; 1 for a neuron), in the units' order."""
    return torch.tensor([unit * width + i for unit in units for i in range(width)], dtype=torch.long, device=device)


def unit_rows(tensor: Optional[torch.Tensor], index: torch.Tensor) -> Optional[torch.Tensor]:
    """An input projection's weight or bias (q, k, v, fc1) narrowed to the units' rows (a copy; None stays None)."""
    return None if tensor is None else tensor.index_select(0, index.to(tensor.device)).clone()


def unit_columns(weight: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """An output projection's weight (out_proj, fc2) narrowed to the units' columns (a copy)."""
    return weight.index_select(1, index.to(weight.device)).clone()


def scaled_columns(weight: torch.Tensor, scales: Sequence[float]) -> torch.Tensor:
    """An output projection's weight with each unit's columns multiplied by its scale: the weight has
    ``len(scales)`` units of equal width side by side."""
    units = len(scales)
    if units == 0 and weight.size(1) == 0:  # a layer that keeps no unit
        return weight.clone()
    if units == 0 or weight.size(1) % units:
        raise ValueError(f"{weight.size(1)} columns are not {units} units of one width")
    scales = torch.as_tensor(scales, dtype=weight.dtype, device=weight.device)
    columns = scales.repeat_interleave(weight.size(1) // units)
    return weight * columns.unsqueeze(0)


def folded_tuning(weight: torch.Tensor, bias: Optional[torch.Tensor], scales: Sequence[float],
                  correction: Sequence[float]) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """An output projection with a tuning folded in: its units' columns scaled, its bias corrected."""
    folded_bias = None if bias is None else bias + torch.as_tensor(correction, dtype=bias.dtype, device=bias.device)
    return scaled_columns(weight, scales), folded_bias
