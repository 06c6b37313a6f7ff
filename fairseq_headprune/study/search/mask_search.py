"""Budgeted mask search and mask rearrangement with the mask's Fisher information (Kwon et al. 2022).

Kwon, Kim, Mahoney, Hassoun, Keutzer and Gholami, "A Fast Post-Training
Pruning Framework for Transformers" (NeurIPS 2022), estimate the loss
increase of removing a set of heads and FFN neurons from the empirical
Fisher information of their masks: with F = E_x g g^T (g = dL(x)/dm), the
loss grows by about 1/2 (1 - m)^T F (1 - m) for a mask m. Section 4.1
searches the mask under a cost budget with the diagonal of F (each removed
unit adds 1/2 F_ii); section 4.2 then rearranges each attention layer's
mask, keeping its number of heads, with the layer's block of F, so that
heads whose removals interact are chosen together.

The search runs over blocks, attention layers (units: heads) and FFN layers
(units: neurons), whose cost is any function of how many units they keep
(``search_costs``): heads, FLOPs per token, or measured latency. A block
that keeps k units keeps the k of largest F_ii; how many each block keeps
is a multiple-choice knapsack, solved by dynamic programming: exactly for
integer costs (divided by their greatest common divisor), else with costs
rounded up onto a grid of ``COST_GRID`` steps of the budget, so the result
never exceeds the budget. FFN layers choose among counts every
``neuron_step`` neurons (and the full layer). ``uniform`` makes every layer
of an attention type keep as many heads as the others (one choice per
type). Nothing here depends on fairseq.
"""

import dataclasses
import itertools
import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from fairseq_headprune.constants import ATTENTION_TYPES, FFN_TYPES
from fairseq_headprune.errors import SettingsError
from fairseq_headprune.study.masks.head_mask import HeadMask, full_mask, layer_name
from fairseq_headprune.study.search.costs import Block, Layer, LayerCosts, block_order, head_count_costs

COST_GRID = 2000  # steps of the budget a real-valued cost is rounded up to
MAX_EXACT_CAPACITY = 100_000  # integer costs above this many steps of their divisor go onto the grid too
NEURON_OPTIONS = 128  # the default neuron step gives an FFN layer about this many counts to choose from


def default_neuron_step(neurons: int) -> int:
    """The step between an FFN layer's neuron counts that keeps the dynamic programme fast (about 128 counts)."""
    return max(1, math.ceil(neurons / NEURON_OPTIONS))


def layer_loss(fisher: torch.Tensor, kept: Sequence[int]) -> float:
    """1/2 (1 - m)^T F (1 - m) for one layer's block F and the heads it keeps
    (a diagonal F: 1/2 sum of removed F_hh)."""
    removed = [h for h in range(fisher.shape[0]) if h not in set(kept)]
    if not removed:
        return 0.0
    index = torch.tensor(removed)
    return 0.5 * float(fisher[index][:, index].sum())


@dataclass
class SearchResult:
    """The heads (and FFN neurons) a search keeps and what it estimated."""

    head_mask: HeadMask
    kept: Dict[Layer, List[int]]  # 0-based heads kept per attention layer
    cost: float
    budget: float
    unit: str
    diagonal_loss: float  # 1/2 sum of the removed heads' (and neurons') F_ii
    block_loss: Optional[float] = None  # 1/2 sum over attention layers of (1-m)^T F_l (1-m), if blocks were given
    rearranged: bool = False
    swaps: int = 0
    details: Dict[str, object] = field(default_factory=dict)
    ffn_mask: Optional[Dict[str, torch.Tensor]] = None  # per FFN type (layers, neurons); None: neurons not searched
    kept_neurons: Dict[Layer, int] = field(default_factory=dict)  # neurons kept per FFN layer searched

    def to_dict(self) -> Dict[str, object]:
        record = {
            "kept": {layer_name(t, layer): [h + 1 for h in heads] for (t, layer), heads in self.kept.items()},
            "cost": self.cost, "budget": self.budget, "unit": self.unit,
            "estimated_loss_increase_diagonal": self.diagonal_loss,
            "estimated_loss_increase_block": self.block_loss,
            "rearranged": self.rearranged, "swaps": self.swaps, **self.details,
        }
        if self.ffn_mask is not None:
            record["kept_neurons"] = {layer_name(*block): count for block, count in self.kept_neurons.items()}
        return record


def _by_score(scores: torch.Tensor) -> List[int]:
    """Units by decreasing score; ties by index."""
    return sorted(range(len(scores)), key=lambda h: (-float(scores[h]), h))


def _removal_losses(sorted_scores: Sequence[float], attention: bool) -> List[float]:
    """1/2 the scores beyond the first k, for k = 0 .. n (heads: summed as written; neurons: by suffix sums)."""
    if attention:
        return [0.5 * sum(sorted_scores[k:]) for k in range(len(sorted_scores) + 1)]
    suffix = np.concatenate([np.cumsum(np.asarray(sorted_scores, dtype=np.float64)[::-1])[::-1], [0.0]])
    return (0.5 * suffix).tolist()


def _knapsack_units(costs: Sequence[Sequence[float]], budget: float) -> Tuple[List[List[int]], int]:
    """Integer cost units and the capacity: exact for integer costs (over their gcd), else the budget's grid."""
    values = [float(c) for group in costs for c in group]
    if float(budget).is_integer() and all(v.is_integer() for v in values):
        divisor = math.gcd(*(int(v) for v in values if v)) or 1
        capacity = int(budget) // divisor
        if capacity <= MAX_EXACT_CAPACITY:
            return [[int(c) // divisor for c in group] for group in costs], capacity
    scale, capacity = (1.0, 0) if budget <= 0 else (COST_GRID / budget, COST_GRID)
    return [[int(math.ceil(c * scale - 1e-9)) for c in group] for group in costs], capacity


def choose_options(costs: Sequence[Sequence[float]], losses: Sequence[Sequence[float]], budget: float
                   ) -> Optional[List[int]]:
    """A multiple-choice knapsack: one option per group, least total loss at a total cost of at most ``budget``.

    Options are scanned in order and replaced only by a strictly smaller loss,
    so ties keep the earlier option (fewer units); among equal least losses
    the cheapest total wins. None when no choice fits.
    """
    units, capacity = _knapsack_units(costs, budget)
    best = np.full(capacity + 1, np.inf)  # best[c]: least loss of the groups so far at total cost units c
    best[0] = 0.0
    choices = []
    for group_units, group_losses in zip(units, losses):
        new = np.full(capacity + 1, np.inf)
        choice = np.full(capacity + 1, -1, dtype=np.int64)
        for option, (unit_cost, loss) in enumerate(zip(group_units, group_losses)):
            if unit_cost > capacity:
                continue
            shifted = np.full(capacity + 1, np.inf)
            shifted[unit_cost:] = best[: capacity + 1 - unit_cost] + loss
            better = shifted < new - 1e-15
            new[better], choice[better] = shifted[better], option
        best = new
        choices.append(choice)
    if not np.isfinite(best).any():
        return None
    end = int(np.argmin(best))  # least loss; the first such cost on ties
    chosen = []
    for group_units, choice in zip(reversed(units), reversed(choices)):
        option = int(choice[end])
        chosen.append(option)
        end -= group_units[option]
    return chosen[::-1]


def _block_options(costs: LayerCosts, block: Block, neuron_step: Optional[int]) -> List[int]:
    """The unit counts a block may keep: every head count; FFN counts every ``neuron_step`` and the full layer.

    An FFN layer priced at some counts only (a latency table's steps) keeps
    to those, filtered by ``neuron_step`` only when one is given.
    """
    counts = costs.kept_counts(block)
    if block[0] in ATTENTION_TYPES or (neuron_step is None and block in costs.counts):
        return counts
    step = neuron_step or default_neuron_step(counts[-1])
    return [k for k in counts if k % step == 0 or k == counts[-1]]


def width_count(total: int, width: float) -> int:
    """How many of a layer's ``total`` units it keeps at ``width`` (a share): at least one."""
    return max(1, min(total, int(round(width * total))))


def fisher_search(fisher: Dict[str, torch.Tensor], costs: LayerCosts, budget: float,
                  neurons: Optional[Dict[str, torch.Tensor]] = None, neuron_step: Optional[int] = None,
                  uniform: bool = False, width: Optional[float] = None) -> SearchResult:
    """Keep the heads (and neurons) that minimise the diagonal-Fisher loss estimate at a cost of at most ``budget``.

    Kwon et al. (2022, section 4.1). The blocks searched are those ``costs``
    prices: attention layers with ``fisher`` (per type, layers x heads) and
    FFN layers with ``neurons`` (per FFN type, layers x neurons); the others
    keep every unit. In a block that keeps k units the k with the largest
    F_ii stay; with ``uniform`` the layers of an attention type keep equally
    many heads, and those of the types ``costs.tied_types`` ties into one
    stack (CTranslate2's decoder) one count together. With ``width`` every
    block keeps that share of its units (``width_count``) and the budget
    chooses nothing: the shape a speed-up plan timed, its units by F_ii.
    """
    blocks = block_order(costs.per_layer)
    scores = {}
    for t, layer in blocks:
        source = fisher if t in ATTENTION_TYPES else neurons
        if not source or t not in source:
            what = "heads" if t in ATTENTION_TYPES else "neurons (importance --importance-structures heads,ffn)"
            raise SettingsError(f"the search has no Fisher scores for the {what} of {t}")
        scores[(t, layer)] = source[t][layer]
    order = {block: _by_score(scores[block]) for block in blocks}
    if width is None:
        options = {block: _block_options(costs, block, neuron_step) for block in blocks}
    else:  # one count per block: the budget chooses nothing
        options = {block: [width_count(int(scores[block].numel()), width)] for block in blocks}
    loss_of = {}  # per block: the loss of keeping k units, indexed by k
    for block in blocks:
        loss_of[block] = _removal_losses([float(scores[block][h]) for h in order[block]], block[0] in ATTENTION_TYPES)
    # the knapsack's groups: one per block, or (uniform) one per attention type choosing one count for its layers
    costs.check_uniform(uniform)
    groups: List[Tuple[List[Block], List[int]]] = []
    for types in _uniform_types(costs.tied_types):
        members = [b for b in blocks if b[0] in types]
        if uniform and types[0] in ATTENTION_TYPES and members:
            shared = [k for k in options[members[0]] if all(k in options[b] for b in members)]
            groups.append((members, shared))
        else:
            groups += [([b], options[b]) for b in members]
    group_costs = [[sum(costs.cost_at(b, k) for b in members) for k in counts] for members, counts in groups]
    group_losses = [[sum(loss_of[b][k] for b in members) for k in counts] for members, counts in groups]
    chosen = [0] * len(groups) if width is not None else choose_options(group_costs, group_losses, budget)
    if chosen is None:
        cheapest = sum(min(c) for c in group_costs)
        raise SettingsError(f"the budget {budget:g} {costs.unit} is below the least any mask costs ({cheapest:g})",
                            setting="budget")
    kept_count = {b: counts[option] for (members, counts), option in zip(groups, chosen) for b in members}
    kept = {(t, layer): list(range(fisher[t].shape[1])) for t in ATTENTION_TYPES if t in fisher
            for layer in range(fisher[t].shape[0])}
    kept.update({b: sorted(order[b][:k]) for b, k in kept_count.items() if b[0] in ATTENTION_TYPES})
    head_mask = mask_of(fisher, kept)
    ffn_mask, kept_neurons = None, {b: k for b, k in kept_count.items() if b[0] in FFN_TYPES}
    if kept_neurons:
        ffn_mask = mask_of(neurons, {b: order[b][:k] for b, k in kept_neurons.items()}, keep_others=True)
    head_loss = sum(loss_of[b][k] for b, k in kept_count.items() if b[0] in ATTENTION_TYPES)
    neuron_loss = sum(loss_of[b][k] for b, k in kept_neurons.items())
    details = {"uniform": True} if uniform else {}
    if width is not None:
        details["width"] = width
    if ffn_mask is not None:
        steps = [options[b][1] - options[b][0] for b in kept_neurons if len(options[b]) > 1]  # as the counts fell
        details.update(estimated_loss_increase_diagonal_heads=head_loss,
                       estimated_loss_increase_diagonal_neurons=neuron_loss, neuron_step=max(steps, default=1))
    return SearchResult(head_mask, kept, costs.cost_of(head_mask, ffn_mask), budget, costs.unit,
                        head_loss + neuron_loss, details=details, ffn_mask=ffn_mask, kept_neurons=kept_neurons)


def _uniform_types(tied_types: Sequence[Tuple[str, ...]]) -> List[Tuple[str, ...]]:
    """The types a uniform search gives one count each: every type alone, save those tied into one stack."""
    groups, seen = [], set()
    for t in ATTENTION_TYPES + FFN_TYPES:
        if t in seen:
            continue
        group = next((tuple(g) for g in tied_types if t in g), (t,))
        seen.update(group)
        groups.append(group)
    return groups


def mask_of(scores: Dict[str, torch.Tensor], kept: Dict[Layer, List[int]], keep_others: bool = False) -> HeadMask:
    """The mask of the shape of ``scores`` keeping ``kept`` units per layer (other layers: none, or all)."""
    mask = {t: (torch.ones if keep_others else torch.zeros)(tuple(s.shape)) for t, s in scores.items()}
    for (t, layer), units in kept.items():
        mask[t][layer] = 0.0
        mask[t][layer, list(units)] = 1.0
    return mask


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
    neuron_loss = float(result.details.get("estimated_loss_increase_diagonal_neurons", 0.0))
    details = dict(result.details, block_loss_before_rearrangement=result.block_loss)
    if "estimated_loss_increase_diagonal_heads" in details:
        details["estimated_loss_increase_diagonal_heads"] = diagonal
    return dataclasses.replace(result, head_mask=head_mask, kept=kept, diagonal_loss=diagonal + neuron_loss,
                               block_loss=block_loss(blocks, kept), rearranged=True, swaps=swaps, details=details)


def blocks_as_scores(blocks: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """The diagonal of each layer's block: the Fisher scores (layers, heads)."""
    return {t: block.diagonal(dim1=-2, dim2=-1) for t, block in blocks.items()}


def search_mask(fisher: Dict[str, torch.Tensor], blocks: Optional[Dict[str, torch.Tensor]], costs: LayerCosts,
                budget: float, rearranged: bool = True, neurons: Optional[Dict[str, torch.Tensor]] = None,
                neuron_step: Optional[int] = None, uniform: bool = False, width: Optional[float] = None
                ) -> SearchResult:
    """The search, then (with ``blocks`` and ``rearranged``) the heads' rearrangement;
    block losses reported if known."""
    result = fisher_search(fisher, costs, budget, neurons, neuron_step, uniform, width)
    if blocks is None:
        if rearranged:
            raise SettingsError("rearranging needs the Fisher blocks: estimate with the importance method fisher",
                                setting="importance_method")
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
