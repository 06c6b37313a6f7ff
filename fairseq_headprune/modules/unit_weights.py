"""The weights that belong to a head or an FFN neuron: which they are, selected when units are removed, scaled
when a tuning is folded in. One statement of the ownership (``HEAD_PARAMETERS``, ``NEURON_PARAMETERS``) and one
implementation of each slice, for every path that needs them: the state dict (``shrink``), the built model
that a shrunk checkpoint is loaded into (``modules.pruned_heads``), the masked modules' held weights, mask
tuning on a loaded model and the CTranslate2 export.

Head h of an attention layer with head dimension d owns rows h·d ... (h+1)·d − 1 of the query, key and value
projections (weights and biases) and the same columns of the output projection (Michel et al. 2019,
section 4.3); neuron i of an FFN owns row i of ``fc1`` (weight and bias) and column i of ``fc2``. The output
projection's bias is the layer's, owned by no unit. A tuning (Kwon et al. 2022, section 4.3) scales each kept
unit's columns of ``out_proj`` / ``fc2`` and corrects their bias.
"""

from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from fairseq_headprune.errors import HeadMaskError


@dataclass(frozen=True)
class UnitParameters:
    """The parameters one kind of unit owns in its block (an attention module for a head, a Transformer layer
    for an FFN neuron), named as the block's attributes and, after the block's state-dict prefix, its keys."""

    unit: str  # "head" or "neuron"
    input_projections: Tuple[str, ...]  # the linears whose weight rows and bias entries a unit owns
    output_projection: str  # the linear whose weight columns a unit owns (its bias is the layer's)
    width_attribute: Optional[str] = None  # the block's attribute holding a unit's rows (None: one row)

    @property
    def parameters(self) -> Tuple[Tuple[str, int], ...]:
        """(parameter name, dimension: 0 rows, 1 columns) of every tensor a unit owns a slice of, in order."""
        rows = tuple((f"{linear}.{kind}", 0) for linear in self.input_projections for kind in ("weight", "bias"))
        return rows + ((f"{self.output_projection}.weight", 1),)

    def width(self, block) -> int:
        """A unit's rows of each input projection (and columns of the output projection) in a built block."""
        return 1 if self.width_attribute is None else int(getattr(block, self.width_attribute))

    def width_in_state(self, input_rows: int, units: int, where: str) -> int:
        """A unit's rows in a state dict, whose block has ``input_rows`` rows per input projection for ``units``
        units: one for a neuron, the rows over the units for a head (its dimension)."""
        if self.width_attribute is None:
            return 1
        if units == 0 or input_rows % units:
            raise HeadMaskError(f"{where}: width {input_rows} is not {units} {self.unit}s")
        return input_rows // units

    def output_linear(self, block) -> torch.nn.Linear:
        return getattr(block, self.output_projection)


HEAD_PARAMETERS = UnitParameters("head", ("q_proj", "k_proj", "v_proj"), "out_proj", width_attribute="head_dim")
NEURON_PARAMETERS = UnitParameters("neuron", ("fc1",), "fc2")


def block_tensor(block, name: str) -> Optional[torch.Tensor]:
    """A block's parameter by its name in ``UnitParameters.parameters`` (None: a projection without a bias)."""
    linear, kind = name.rsplit(".", 1)
    return getattr(getattr(block, linear), kind)


def kept_units(mask: torch.Tensor) -> Sequence[int]:
    """0-based units (heads or neurons) whose mask value is not 0."""
    return [unit for unit in range(mask.numel()) if float(mask[unit]) != 0.0]


def kept_unit_scales(mask: Optional[torch.Tensor], units: int) -> List[Tuple[int, float]]:
    """(unit, scale) of every kept unit: a kept unit's mask value is its scale (a tuned mask's differ from 1);
    with no mask, all ``units`` at scale 1."""
    if mask is None:
        return [(unit, 1.0) for unit in range(units)]
    return [(unit, float(mask[unit])) for unit in kept_units(mask)]


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


def owned_tensors(tensor_of: Callable[[str], Optional[torch.Tensor]], owner: UnitParameters,
                  index: torch.Tensor) -> Dict[str, torch.Tensor]:
    """Each tensor ``owner``'s units own, narrowed to their rows or columns ``index`` (copies), by parameter
    name; ``tensor_of`` reads one by that name (a live block's, or a state dict's after the block's prefix)
    and a None from it (a projection without a bias, a key not in the state dict) is left out."""
    narrowed = {}
    for name, dim in owner.parameters:
        tensor = tensor_of(name)
        if tensor is not None:
            narrowed[name] = unit_rows(tensor, index) if dim == 0 else unit_columns(tensor, index)
    return narrowed


def masked_unit_slices(block, owner: UnitParameters,
                       mask: Optional[torch.Tensor]) -> List[Tuple[torch.Tensor, int, torch.Tensor]]:
    """(parameter, dimension, indices) of the slices a built block's masked units (mask value 0) own; none
    without a mask or with one mask per sentence."""
    if mask is None or mask.dim() != 1:
        return []
    masked = (mask == 0).nonzero().flatten().tolist()
    if not masked:
        return []
    index = unit_index(masked, owner.width(block), device=owner.output_linear(block).weight.device)
    slices = []
    for name, dim in owner.parameters:
        tensor = block_tensor(block, name)
        if tensor is not None:
            slices.append((tensor, dim, index))
    return slices


def narrow_block(block, owner: UnitParameters, units: Sequence[int]) -> None:
    """Keep only ``units`` (0-based) of a built block: each tensor they own narrowed to their slices, the
    projections' feature counts to match."""
    index = unit_index(units, owner.width(block))
    with torch.no_grad():
        narrowed = owned_tensors(lambda name: block_tensor(block, name), owner, index)
        for name, tensor in narrowed.items():
            linear, kind = name.rsplit(".", 1)
            setattr(getattr(block, linear), kind, torch.nn.Parameter(tensor))
    for linear in owner.input_projections:
        getattr(block, linear).out_features = len(index)
    owner.output_linear(block).in_features = len(index)


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
