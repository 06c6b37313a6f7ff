"""The ``search`` and ``latency`` commands' work on a loaded model (Kwon et al. 2022).

``run_search`` reads or estimates the mask's Fisher information (scores and
per-layer blocks, ``--importance-method fisher``), builds the cost of every
layer (heads, attention FLOPs per token, or a measured latency table),
searches the mask within the budget, rearranges it, optionally tunes it by
least squares on training or validation data, and writes the mask (a mask
file every command's ``--head-mask`` reads), the tuning and a record of what
was done and what it cost. ``measure_latency_table`` times each attention
layer with 0 .. H heads kept on this device.
"""

import copy
import os
import platform
import statistics
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import torch

from ..constants import TRANSLATION_FAMILY
from ..errors import ResultFileError, StudyError
from ..study.files import write_json
from ..study.head_mask import count_masked, head_mask_to_spec, write_mask_file
from ..study.importance import ImportanceResult, read_importance_file
from ..study.mask_search import (
    LatencyTable,
    LayerCosts,
    SearchResult,
    flops_costs,
    head_count_costs,
    parse_budget,
    read_latency_table,
    search_mask,
)
from ..study.mask_tuning import MaskTuning, write_tuning
from ..study.settings import ImportanceSettings, LatencySettings, SearchSettings, TuningSettings

MASK_FILE = "mask.json"
TUNING_FILE = "tuning.json"
SEARCH_FILE = "search.json"


def model_architecture(model) -> Dict[str, object]:
    """What a latency table must match: heads per layer and dimensions of each attention type."""
    from ..modules.masked_multihead_attention import attention_modules, head_layout

    layout = head_layout(model)
    dims = {}
    for (attention_type, _), module in attention_modules(model).items():
        dims.setdefault(attention_type, [int(module.out_proj.out_features), int(module.head_dim)])
    return {"layout": {t: list(shape) for t, shape in layout.items()}, "dims": dims}


def device_description(device: torch.device) -> str:
    """The device a latency table holds for: the GPU's name, or the CPU's model and threads."""
    if device.type == "cuda":
        return f"cuda: {torch.cuda.get_device_name(device)}"
    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as stream:
            cpu = next((line.split(":", 1)[1].strip() for line in stream if line.startswith("model name")), cpu)
    except OSError:
        pass
    return f"cpu: {cpu}, {torch.get_num_threads()} threads"


def measure_latency_table(model, settings: LatencySettings) -> LatencyTable:
    """Median milliseconds of each attention layer's forward pass keeping its first k heads, k = 0 .. H.

    A layer is timed alone on random inputs of ``sequence_length`` positions
    (keys and values too) and ``batch_size`` sentences, as a full-sequence
    (teacher-forced) pass; a copy of the layer is narrowed with
    ``shrink_attention`` for each k, as ``shrink`` narrows it.
    """
    from tqdm import tqdm

    from ..modules.masked_multihead_attention import attention_modules, install_masked_attention
    from .loading import model_device
    from .shrink import shrink_attention

    install_masked_attention(model)
    device = model_device(model)
    modules = attention_modules(model)
    per_layer: Dict[tuple, List[float]] = {}
    generator = torch.Generator(device="cpu").manual_seed(0)
    bar = tqdm(total=sum(m.num_heads + 1 for m in modules.values()), desc="latency", unit="shape",
               disable=not settings.progress, leave=False)
    try:
        for key, module in modules.items():
            width = module.out_proj.out_features
            shape = (settings.sequence_length, settings.batch_size, width)
            query = torch.randn(*shape, generator=generator).to(device, next(model.parameters()).dtype)
            memory = torch.randn(*shape, generator=generator).to(device, query.dtype)
            timings = []
            for kept in range(module.num_heads + 1):
                narrowed = copy.deepcopy(module)
                shrink_attention(narrowed, list(range(kept)))
                key_value = memory if module.encoder_decoder_attention else query
                timings.append(_median_ms(lambda: narrowed(query, key_value, key_value, need_weights=False),
                                          settings.repeats, device))
                bar.update(1)
            per_layer[key] = timings
    finally:
        bar.close()
    return LatencyTable(
        per_layer, device_description(device), model_architecture(model),
        {"batch_size": settings.batch_size, "sequence_length": settings.sequence_length,
         "repeats": settings.repeats, "torch": torch.__version__, "dtype": str(next(model.parameters()).dtype)},
    )


def _median_ms(call, repeats: int, device: torch.device) -> float:
    synchronize = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    with torch.no_grad():
        for _ in range(3):  # warm-up
            call()
        synchronize()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            call()
            synchronize()
            times.append(1000.0 * (time.perf_counter() - start))
    return statistics.median(times)


def run_latency(settings: LatencySettings) -> LatencyTable:
    """Load the checkpoint, measure, write the table."""
    from ..study.mask_search import write_latency_table
    from .checkpoint_info import checkpoint_family
    from .loading import load_family_model

    _, _, model = load_family_model(checkpoint_family(settings.checkpoint), settings.data, settings.checkpoint,
                                    settings.fairseq_args, cpu=settings.cpu)
    from ..modules.masked_multihead_attention import attention_modules, current_head_mask

    if current_head_mask(model) is not None or any(
            m.skip_embed_dim_check for m in attention_modules(model).values()):
        raise StudyError(f"{settings.checkpoint} has heads masked or removed; measure the full model")
    model.eval()
    table = measure_latency_table(model, settings)
    write_latency_table(table, settings.out)
    return table


def importance_estimator(family: str, cfg, task, model, settings: ImportanceSettings):
    """The estimator of the model's family: the translation criterion's, or the classifier's or LM's."""
    if family == TRANSLATION_FAMILY:
        from .scoring import ImportanceEstimator

        return ImportanceEstimator(task, model, settings)
    from .scored_importance import ExampleImportanceEstimator, study_criterion

    return ExampleImportanceEstimator(family, task, model, study_criterion(family, cfg, task), settings)


def read_fisher_file(path: str, layout) -> ImportanceResult:
    """An importance file of the fisher method, with its per-layer blocks."""
    try:
        result = read_importance_file(path, layout)
    except ResultFileError as error:
        raise ResultFileError(f"--fisher: {error}")
    if result.method != "fisher" or result.fisher_blocks is None:
        raise ResultFileError(
            f"--fisher {path} holds {result.method} scores without Fisher blocks; "
            "estimate them with importance --importance-method fisher"
        )
    return result


def tuning_samples(task, model, settings: TuningSettings) -> List[dict]:
    """Teacher-forced batches of the tuning splits (collated once, on the model's device)."""
    from .loading import iterate_samples, model_device, split_batches

    samples = []
    for split in settings.subsets:
        dataset, batches = split_batches(task, split, settings.max_tokens, None if settings.max_tokens else 64,
                                         settings.limit)
        samples += list(iterate_samples(dataset, batches, model_device(model)))
    if not samples:
        raise StudyError(f"--tune-subset {' '.join(settings.subsets)} holds no sentence")
    return samples


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
    from ..modules.masked_multihead_attention import head_layout
    from .loading import model_device

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
    from ..modules.masked_multihead_attention import current_head_mask, head_layout
    from .loading import load_family_model
    from .mask_tuning import tune_mask

    cfg, task, model = load_family_model(settings.family, settings.data, settings.checkpoint, settings.fairseq_args,
                                         cpu=settings.cpu)
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
        estimator = importance_estimator(settings.family, cfg, task, model, settings.importance)
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

