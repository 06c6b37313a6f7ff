"""Budgeted mask search and mask rearrangement with the mask's Fisher information (Kwon et al. 2022).

Kwon, Kim, Mahoney, Hassoun, Keutzer and Gholami, "A Fast Post-Training
Pruning Framework for Transformers" (NeurIPS 2022), estimate the loss
increase of removing a set of heads from the empirical Fisher information of
the head mask: with F = E_x g g^T (g = dL(x)/dxi), the loss grows by about
1/2 (1 - m)^T F (1 - m) for a mask m. Section 4.1 searches the mask under a
cost budget with the diagonal of F (each removed head adds 1/2 F_hh);
section 4.2 then rearranges each layer's mask, keeping its number of heads,
with the layer's block of F, so that heads whose removals interact are
chosen together.

Here a layer's cost is any function of how many heads it keeps: the number
of heads, attention FLOPs per token, or latency measured per layer
(``LatencyTable``). The search is exact for integer costs (a multiple-choice
knapsack over layers, solved by dynamic programming); real costs are
rounded up onto a grid of ``COST_GRID`` steps of the budget, so the result
never exceeds the budget. Nothing here depends on fairseq.
"""

import itertools
import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from ...constants import ATTENTION_TYPES
from ...errors import ResultFileError, SettingsError
from ..output.files import read_json_of_format, write_json
from ..masks.head_mask import HeadLayout, HeadMask, full_mask, layer_name, parse_layer_name

COST_UNITS = {"heads": "heads", "flops": "attention FLOPs per token", "latency": "ms"}
COST_GRID = 2000  # steps of the budget a real-valued cost is rounded up to
LATENCY_TABLE_FORMAT = "fairseq-headprune latency table"

# (attention type, 0-based layer)
Layer = Tuple[str, int]


@dataclass
class LayerCosts:
    """Cost of every layer as a function of the number of heads it keeps (index k: k heads kept)."""

    kind: str
    per_layer: Dict[Layer, List[float]]

    @property
    def unit(self) -> str:
        return COST_UNITS[self.kind]

    def full_cost(self) -> float:
        return float(sum(costs[-1] for costs in self.per_layer.values()))

    def cost_of(self, head_mask: HeadMask) -> float:
        return float(sum(costs[int(head_mask[t][layer].sum().item())] for (t, layer), costs in self.per_layer.items()))


def head_count_costs(layout: HeadLayout) -> LayerCosts:
    """One unit per head kept: the budget is a number of heads."""
    return LayerCosts("heads", {
        (t, layer): [float(k) for k in range(heads + 1)]
        for t in ATTENTION_TYPES if t in layout
        for layer in range(layout[t][0])
        for heads in [layout[t][1]]
    })


def attention_flops_per_head(embed_dim: int, head_dim: int, length: int) -> float:
    """FLOPs per token of one head: its q, k, v rows and out-projection columns, scores and weighted sum.

    2 d d_h for each of the four projections, and 2 n d_h each for q k^T and
    the weighted sum of the values over ``length`` = n attended positions
    (source and target taken to be equally long).
    """
    return 8.0 * embed_dim * head_dim + 4.0 * length * head_dim


def flops_costs(layout: HeadLayout, dims: Dict[str, Tuple[int, int]], length: int) -> LayerCosts:
    """Attention FLOPs per token; ``dims``: per type (embedding dimension, head dimension)."""
    if length <= 0:
        raise SettingsError(f"--sequence-length must be positive, got {length}")
    per_layer = {}
    for t in ATTENTION_TYPES:
        if t not in layout:
            continue
        per_head = attention_flops_per_head(*dims[t], length)
        for layer in range(layout[t][0]):
            per_layer[(t, layer)] = [k * per_head for k in range(layout[t][1] + 1)]
    return LayerCosts("flops", per_layer)


def parse_budget(text: str, costs: LayerCosts) -> float:
    """A budget in the costs' unit: ``N`` (heads, FLOPs or ms) or ``P%`` of the unpruned model's cost."""
    full = costs.full_cost()
    stripped = str(text).strip()
    try:
        value = float(stripped[:-1]) * full / 100.0 if stripped.endswith("%") else float(stripped)
    except ValueError:
        raise SettingsError(f"--budget: expected a number or a percentage, got {text!r}")
    if not math.isfinite(value) or value < 0:
        raise SettingsError(f"--budget must be non-negative, got {text!r}")
    if value > full * (1 + 1e-9):
        raise SettingsError(
            f"--budget {text} is more than the unpruned model costs ({full:g} {costs.unit}); "
            "nothing would be pruned"
        )
    if costs.kind == "heads":
        if not stripped.endswith("%") and value != int(value):
            raise SettingsError(f"--budget: a number of heads must be whole, got {text!r}")
        value = float(math.floor(value + 1e-9))  # a percentage of the heads: the whole heads it allows
    return value


def layer_loss(fisher: torch.Tensor, kept: Sequence[int]) -> float:
    """1/2 (1 - m)^T F (1 - m) for one layer's block F and the heads it keeps (a diagonal F: 1/2 sum of removed F_hh)."""
    removed = [h for h in range(fisher.shape[0]) if h not in set(kept)]
    if not removed:
        return 0.0
    index = torch.tensor(removed)
    return 0.5 * float(fisher[index][:, index].sum())


@dataclass
class SearchResult:
    """The heads a search keeps and what it estimated."""

    head_mask: HeadMask
    kept: Dict[Layer, List[int]]  # 0-based heads kept per layer
    cost: float
    budget: float
    unit: str
    diagonal_loss: float  # 1/2 sum of the removed heads' F_hh
    block_loss: Optional[float] = None  # 1/2 sum over layers of (1-m)^T F_l (1-m), if blocks were given
    rearranged: bool = False
    swaps: int = 0
    details: Dict[str, object] = field(default_factory=dict)

    def to_dict(self) -> Dict[str, object]:
        return {
            "kept": {layer_name(t, layer): [h + 1 for h in heads] for (t, layer), heads in self.kept.items()},
            "cost": self.cost, "budget": self.budget, "unit": self.unit,
            "estimated_loss_increase_diagonal": self.diagonal_loss,
            "estimated_loss_increase_block": self.block_loss,
            "rearranged": self.rearranged, "swaps": self.swaps, **self.details,
        }


def _layers(fisher: Dict[str, torch.Tensor]) -> List[Layer]:
    return [(t, layer) for t in ATTENTION_TYPES if t in fisher for layer in range(fisher[t].shape[0])]


def _by_score(scores: torch.Tensor) -> List[int]:
    """Heads by decreasing score; ties by head index."""
    return sorted(range(len(scores)), key=lambda h: (-float(scores[h]), h))


def fisher_search(fisher: Dict[str, torch.Tensor], costs: LayerCosts, budget: float) -> SearchResult:
    """Keep the heads that minimise the diagonal-Fisher loss estimate at a cost of at most ``budget``.

    Kwon et al. (2022, section 4.1). In a layer that keeps k heads the k with
    the largest F_hh stay; how many each layer keeps is a multiple-choice
    knapsack, solved exactly for integer costs (real costs rounded up to a
    grid of the budget, so the chosen mask never costs more than ``budget``).
    """
    layers = _layers(fisher)
    order = {key: _by_score(fisher[key[0]][key[1]]) for key in layers}
    # loss of keeping k heads: 1/2 the F_hh of the heads beyond the first k
    loss_of = {}
    for key in layers:
        scores = fisher[key[0]][key[1]]
        sorted_scores = [float(scores[h]) for h in order[key]]
        loss_of[key] = [0.5 * sum(sorted_scores[k:]) for k in range(len(sorted_scores) + 1)]
    integer = all(float(c).is_integer() for key in layers for c in costs.per_layer[key]) and float(budget).is_integer()
    if integer:
        scale, capacity = 1.0, int(budget)
        units = {key: [int(c) for c in costs.per_layer[key]] for key in layers}
    else:
        if budget <= 0:
            scale, capacity = 1.0, 0
        else:
            scale, capacity = COST_GRID / budget, COST_GRID
        units = {key: [int(math.ceil(c * scale - 1e-9)) for c in costs.per_layer[key]] for key in layers}
    # best[c]: least loss of the layers so far at total cost units c (inf: unreachable)
    best = np.full(capacity + 1, np.inf)
    best[0] = 0.0
    choices = []
    for key in layers:
        new = np.full(capacity + 1, np.inf)
        choice = np.full(capacity + 1, -1, dtype=np.int64)
        for k, (unit_cost, loss) in enumerate(zip(units[key], loss_of[key])):
            if unit_cost > capacity:
                continue
            shifted = np.full(capacity + 1, np.inf)
            shifted[unit_cost:] = best[: capacity + 1 - unit_cost] + loss
            # prefer fewer heads on equal loss (strictly better only), scanning k upwards
            better = shifted < new - 1e-15
            new[better], choice[better] = shifted[better], k
        best = new
        choices.append(choice)
    if not np.isfinite(best).any():
        cheapest = sum(min(costs.per_layer[key]) for key in layers)
        raise SettingsError(f"--budget {budget:g} {costs.unit} is below the least any mask costs ({cheapest:g})")
    end = int(np.argmin(best))  # least loss; the first such cost on ties
    kept: Dict[Layer, List[int]] = {}
    for key, choice in zip(reversed(layers), reversed(choices)):
        k = int(choice[end])
        kept[key] = sorted(order[key][:k])
        end -= units[key][k]
    kept = {key: kept[key] for key in layers}
    head_mask = mask_of(fisher, kept)
    diagonal = sum(loss_of[key][len(kept[key])] for key in layers)
    return SearchResult(head_mask, kept, costs.cost_of(head_mask), budget, costs.unit, diagonal)


def mask_of(fisher: Dict[str, torch.Tensor], kept: Dict[Layer, List[int]]) -> HeadMask:
    layout = {t: tuple(scores.shape) for t, scores in fisher.items()}
    head_mask = {t: torch.zeros(shape) for t, shape in layout.items()}
    for (t, layer), heads in kept.items():
        head_mask[t][layer, heads] = 1.0
    return head_mask


def rearrange_layer(block: torch.Tensor, kept: Sequence[int], max_swaps: Optional[int] = None) -> Tuple[List[int], int]:
    """Greedy swaps of a kept and a removed head while 1/2 (1-m)^T F (1-m) decreases (Kwon et al. 4.2).

    The number of heads kept stays; each swap is the one that lowers the
    estimate most. Returns the heads kept and the number of swaps.
    """
    heads = block.shape[0]
    kept = sorted(kept)
    if not kept or len(kept) == heads:
        return kept, 0
    max_swaps = heads * heads if max_swaps is None else max_swaps
    current = layer_loss(block, kept)
    swaps = 0
    while swaps < max_swaps:
        removed = [h for h in range(heads) if h not in kept]
        best = None
        for keep_out, bring_in in itertools.product(kept, removed):
            candidate = sorted([h for h in kept if h != keep_out] + [bring_in])
            loss = layer_loss(block, candidate)
            if loss < current - 1e-12 * max(1.0, abs(current)) and (best is None or loss < best[0]):
                best = (loss, candidate)
        if best is None:
            break
        current, kept = best
        swaps += 1
    return kept, swaps


def block_loss(blocks: Dict[str, torch.Tensor], kept: Dict[Layer, List[int]]) -> float:
    return sum(layer_loss(blocks[t][layer], heads) for (t, layer), heads in kept.items())


def rearrange(result: SearchResult, blocks: Dict[str, torch.Tensor]) -> SearchResult:
    """The searched mask rearranged layer by layer with the block-diagonal Fisher (same heads per layer)."""
    kept, swaps = {}, 0
    for key, heads in result.kept.items():
        kept[key], layer_swaps = rearrange_layer(blocks[key[0]][key[1]], heads)
        swaps += layer_swaps
    head_mask = mask_of(blocks_as_scores(blocks), kept)
    diagonal = sum(
        0.5 * float(blocks[t][layer].diagonal()[[h for h in range(blocks[t].shape[1]) if h not in heads]].sum())
        for (t, layer), heads in kept.items()
    )
    details = dict(result.details, block_loss_before_rearrangement=result.block_loss)
    return SearchResult(head_mask, kept, result.cost, result.budget, result.unit, diagonal,
                        block_loss(blocks, kept), True, swaps, details)


def blocks_as_scores(blocks: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """The diagonal of each layer's block: the Fisher scores (layers, heads)."""
    return {t: block.diagonal(dim1=-2, dim2=-1) for t, block in blocks.items()}


def search_mask(fisher: Dict[str, torch.Tensor], blocks: Optional[Dict[str, torch.Tensor]], costs: LayerCosts,
                budget: float, rearranged: bool = True) -> SearchResult:
    """The search, then (with ``blocks`` and ``rearranged``) the rearrangement; block losses reported if known."""
    result = fisher_search(fisher, costs, budget)
    if blocks is None:
        if rearranged:
            raise SettingsError("rearranging needs the Fisher blocks: estimate with --importance-method fisher")
        return result
    result.block_loss = block_loss(blocks, result.kept)
    return rearrange(result, blocks) if rearranged else result


def pruned_count_search(fisher: Dict[str, torch.Tensor], blocks: Optional[Dict[str, torch.Tensor]],
                        pruned: int, rearranged: bool) -> HeadMask:
    """The mask a pruning curve uses at ``pruned`` heads pruned: the search at a budget of the rest kept."""
    layout = {t: tuple(s.shape) for t, s in fisher.items()}
    costs = head_count_costs(layout)
    total = int(costs.full_cost())
    if pruned == 0:
        return full_mask(layout)
    return search_mask(fisher, blocks, costs, float(total - pruned), rearranged).head_mask


# ----------------------------------------------------------------------------- latency tables


@dataclass
class LatencyTable:
    """Measured latency (ms) of every attention layer keeping k = 0 .. H heads, and where it was measured."""

    per_layer: Dict[Layer, List[float]]
    device: str
    architecture: Dict[str, object]  # layout and dimensions of the model measured
    settings: Dict[str, object] = field(default_factory=dict)

    def costs(self) -> LayerCosts:
        return LayerCosts("latency", dict(self.per_layer))


def write_latency_table(table: LatencyTable, path: str) -> None:
    write_json({
        "format": LATENCY_TABLE_FORMAT,
        "device": table.device,
        "architecture": table.architecture,
        "settings": table.settings,
        "per_layer_ms": {layer_name(t, layer): costs for (t, layer), costs in table.per_layer.items()},
    }, path, indent=1)


def read_latency_table(path: str, architecture: Dict[str, object], device: str) -> LatencyTable:
    """Read a latency table and check it was measured for this model's architecture on this device."""
    description = "a latency table of the latency command"
    payload = read_json_of_format(path, LATENCY_TABLE_FORMAT, "--latency-table", description)
    try:
        per_layer = {}
        for name, costs in payload["per_layer_ms"].items():
            per_layer[parse_layer_name(name)] = [float(c) for c in costs]
        table = LatencyTable(per_layer, payload["device"], payload["architecture"], payload.get("settings", {}))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        raise ResultFileError(f"--latency-table {path} is not {description} ({error})")
    if table.architecture != architecture:
        raise ResultFileError(
            f"--latency-table {path} was measured on another model ({_describe(table.architecture)}), "
            f"not this one ({_describe(architecture)})"
        )
    if table.device != device:
        raise ResultFileError(
            f"--latency-table {path} was measured on another device ({table.device}), not this one ({device}); "
            "measure it here with the latency command"
        )
    return table


def _describe(architecture: Dict[str, object]) -> str:
    return ", ".join(
        f"{t} {layers}x{heads}, d={dims[0]}" for t, (layers, heads), dims in
        ((t, architecture["layout"][t], architecture["dims"][t]) for t in ATTENTION_TYPES if t in architecture["layout"])
    )
