"""The ``search`` and ``latency`` commands' work on a loaded model (Kwon et al. 2022).

``run_search`` reads or estimates the mask's Fisher information (scores and
per-layer blocks, ``--importance-method fisher``), builds the cost of every
layer (heads, attention FLOPs per token, or a measured latency table),
searches the mask within the budget, rearranges it, optionally tunes it by
least squares on training or validation data, and writes the mask (a mask
file every command's ``--head-mask`` reads), the tuning and a record of what
was done and what it cost. ``run_latency`` measures and writes the table of
per-layer latencies (``methods.latency``).
"""

import os
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from ...errors import StudyError
from ...modules.masked_multihead_attention import attention_modules, current_head_mask, head_layout
from ...study.masks.head_mask import count_masked, head_mask_to_spec, write_mask_file
from ...study.methods.importance import ImportanceResult, read_fisher_file
from ...study.methods.mask_search import (
    LatencyTable,
    LayerCosts,
    SearchResult,
    flops_costs,
    head_count_costs,
    parse_budget,
    read_latency_table,
    search_mask,
    write_latency_table,
)
from ...study.methods.mask_tuning import MaskTuning, write_tuning
from ...study.output.files import write_json
from ...study.settings import LatencySettings, SearchSettings
from ..families import family_named, family_of_checkpoint
from ..methods.latency import device_description, measure_latency_table, model_architecture
from ..methods.mask_tuning import tune_mask, tuning_samples
from ..runners.batches import model_device

MASK_FILE = "mask.json"
TUNING_FILE = "tuning.json"
SEARCH_FILE = "search.json"


def run_latency(settings: LatencySettings) -> LatencyTable:
    """Load the checkpoint, measure, write the table."""
    family = family_of_checkpoint(settings.checkpoint)
    _, _, model = family.load(settings.data, settings.checkpoint, settings.fairseq_args, cpu=settings.cpu)
    if current_head_mask(model) is not None or any(
            m.skip_embed_dim_check for m in attention_modules(model).values()):
        raise StudyError(f"{settings.checkpoint} has heads masked or removed; measure the full model")
    model.eval()
    table = measure_latency_table(model, settings)
    write_latency_table(table, settings.out)
    return table


@dataclass
class SearchOutcome:
    """What ``run_search`` found and wrote."""

    result: SearchResult
    costs: LayerCosts
    total_heads: int
    pruned: int
    fisher_source: str
    tuning: Optional[MaskTuning] = None
    seconds: Dict[str, float] = field(default_factory=dict)
    files: List[str] = field(default_factory=list)


def layer_costs(settings: SearchSettings, model) -> LayerCosts:
    """The costs the budget counts, for this model."""
    layout = head_layout(model)
    if settings.cost == "heads":
        return head_count_costs(layout)
    architecture = model_architecture(model)
    if settings.cost == "flops":
        return flops_costs(layout, {t: tuple(d) for t, d in architecture["dims"].items()}, settings.sequence_length)
    table = read_latency_table(settings.latency_table, architecture, device_description(model_device(model)))
    return table.costs()


def run_search(settings: SearchSettings) -> SearchOutcome:
    """Search (and rearrange, and tune) the mask; write OUT/mask.json, OUT/search.json (and OUT/tuning.json)."""
    family = family_named(settings.family)
    cfg, task, model = family.load(settings.data, settings.checkpoint, settings.fairseq_args, cpu=settings.cpu)
    if current_head_mask(model) is not None:
        raise StudyError(f"{settings.checkpoint} has heads masked; search on the full model")
    layout = head_layout(model)
    costs = layer_costs(settings, model)  # a wrong latency table fails before any work
    budget = parse_budget(settings.budget, costs)
    seconds: Dict[str, float] = {}
    start = time.perf_counter()
    if settings.fisher_file:
        fisher = read_fisher_file(settings.fisher_file, layout)
        source = os.path.abspath(settings.fisher_file)
    else:
        estimator = family.importance_estimator(cfg, task, model, settings.importance)
        fisher = estimator.estimate(None, progress=settings.progress, description="Fisher information")
        source = f"estimated on {', '.join(settings.importance.subsets)}"
        seconds["fisher"] = time.perf_counter() - start
    start = time.perf_counter()
    result = search_mask(fisher.importance, fisher.fisher_blocks, costs, budget, settings.rearrange)
    seconds["search"] = time.perf_counter() - start
    tuning = None
    if settings.tuning is not None:
        samples = tuning_samples(task, model, settings.tuning)
        tuning = tune_mask(model, result.head_mask, samples, task.source_dictionary.pad(),
                           settings.tuning.scale_bound, settings.tuning.max_condition, progress=settings.progress)
        tuning.settings.update({"subsets": list(settings.tuning.subsets), "limit": settings.tuning.limit,
                                "checkpoint": os.path.abspath(settings.checkpoint)})
        seconds["tuning"] = tuning.settings["seconds"]
    total = sum(layers * heads for layers, heads in layout.values())
    outcome = SearchOutcome(result, costs, total, count_masked(result.head_mask), source, tuning, seconds)
    _write(settings, outcome, fisher)
    return outcome


def _write(settings: SearchSettings, outcome: SearchOutcome, fisher: ImportanceResult) -> None:
    os.makedirs(settings.out_dir, exist_ok=True)
    mask_path = os.path.join(settings.out_dir, MASK_FILE)
    write_mask_file(outcome.result.head_mask, mask_path)
    outcome.files.append(mask_path)
    if outcome.tuning is not None:
        tuning_path = os.path.join(settings.out_dir, TUNING_FILE)
        write_tuning(outcome.tuning, tuning_path)
        outcome.files.append(tuning_path)
    record = {
        "checkpoint": os.path.abspath(settings.checkpoint),
        "budget": settings.budget,
        "cost": settings.cost,
        "latency_table": os.path.abspath(settings.latency_table) if settings.latency_table else None,
        "sequence_length": settings.sequence_length if settings.cost == "flops" else None,
        "full_cost": outcome.costs.full_cost(),
        "fisher": outcome.fisher_source,
        "fisher_sentences": fisher.settings.get("sentences", fisher.count),
        "spec": head_mask_to_spec(outcome.result.head_mask),
        "pruned": outcome.pruned,
        "total": outcome.total_heads,
        "seconds": outcome.seconds,
        "result": outcome.result.to_dict(),
        "tuning": None if outcome.tuning is None else outcome.tuning.summary(),
    }
    search_path = os.path.join(settings.out_dir, SEARCH_FILE)
    write_json(record, search_path, indent=1)
    outcome.files.append(search_path)

