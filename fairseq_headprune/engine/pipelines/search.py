"""The ``search`` and ``latency`` commands' work on a loaded model (Kwon et al. 2022).

``run_search`` reads or estimates the masks' Fisher information (head scores
and per-layer blocks, ``--importance-method fisher``, and for FFN neurons
their scores), builds the cost of every block searched (heads, FLOPs per
token, or a measured latency table), searches the masks within the budget,
rearranges the heads, optionally tunes the result by least squares on
training or validation data, and writes the masks (files every command's
``--head-mask`` and ``--ffn-mask`` read), the tuning and a record of what was
done and what it cost. ``run_latency`` measures and writes the table of
per-layer latencies (``engine.search.latency``, ``engine.search.exported_latency``).
"""

import dataclasses
import os
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from fairseq_headprune.constants import DEFAULT_SEQUENCE_LENGTH, FAIRSEQ_ENGINE
from fairseq_headprune.engine.export.engines import export_engine
from fairseq_headprune.engine.families import family_named, family_of_checkpoint
from fairseq_headprune.engine.pipelines.export import check_quantization
from fairseq_headprune.engine.runners.batches import model_device, split_mean_lengths
from fairseq_headprune.engine.search.exported_latency import measure_exported_latency_table
from fairseq_headprune.engine.search.latency import measure_latency_table
from fairseq_headprune.engine.search.mask_tuning import tune_mask, tuning_samples
from fairseq_headprune.engine.search.model_costs import (
    device_description,
    model_architecture,
    model_decoding_flops,
    model_flops,
    model_precision,
)
from fairseq_headprune.errors import ResultFileError, StudyError
from fairseq_headprune.modules.masked_ffn import current_ffn_mask, ffn_layout
from fairseq_headprune.modules.masked_multihead_attention import attention_modules, current_head_mask, head_layout
from fairseq_headprune.study.importance.scores import ImportanceResult, read_fisher_file
from fairseq_headprune.study.masks.ffn_mask import count_masked_neurons, ffn_mask_to_spec, write_ffn_mask_file
from fairseq_headprune.study.masks.head_mask import count_masked, head_mask_to_spec, write_mask_file
from fairseq_headprune.study.output.files import write_json
from fairseq_headprune.study.search.costs import (
    CTRANSLATE2_TIED_TYPES,
    DecodingShape,
    LatencyTable,
    LayerCosts,
    head_count_costs,
    output_projection_flops,
    predicted_speedup,
    read_latency_table,
    write_latency_table,
)
from fairseq_headprune.study.search.mask_search import SearchResult, search_mask
from fairseq_headprune.study.search.records import DecodingFlops, FlopsKept, SearchFile
from fairseq_headprune.study.search.settings import LatencySettings, SearchSettings
from fairseq_headprune.study.search.tuning import MaskTuning, write_tuning

MASK_FILE = "mask.json"
FFN_MASK_FILE = "ffn_mask.json"
TUNING_FILE = "tuning.json"
SEARCH_FILE = "search.json"
# the blocks each --structure searches
STRUCTURE_PARTS = {"heads": ("heads",), "ffn": ("ffn",), "joint": ("heads", "ffn")}


def run_latency(settings: LatencySettings) -> LatencyTable:
    """Load the checkpoint, measure, write the table."""
    family = family_of_checkpoint(settings.checkpoint)
    engine = None if settings.engine == FAIRSEQ_ENGINE else export_engine(settings.engine)
    if engine is not None:
        check_quantization(settings.quantization, settings.cpu, engine)
    cfg, task, model = family.load(settings.data, settings.checkpoint, settings.fairseq_args, cpu=settings.cpu)
    if current_head_mask(model) is not None or any(
            m.skip_embed_dim_check for m in attention_modules(model).values()):
        raise StudyError(f"{settings.checkpoint} has heads masked or removed; measure the full model")
    if current_ffn_mask(model) is not None or "ffn" not in model_architecture(model):
        raise StudyError(f"{settings.checkpoint} has FFN neurons masked or removed; measure the full model")
    model.eval()
    if engine is not None:
        source_length, target_length = split_mean_lengths(task, "valid")
        settings = dataclasses.replace(settings, sequence_length=settings.sequence_length or source_length,
                                       target_length=settings.target_length or target_length,
                                       beam=settings.beam or int(cfg.generation.beam))
        table = measure_exported_latency_table(engine, family, cfg, task, model, settings)
    else:
        table = measure_latency_table(model, dataclasses.replace(
            settings, sequence_length=settings.sequence_length or DEFAULT_SEQUENCE_LENGTH))
    write_latency_table(table, settings.out)
    return table


@dataclass
class SearchOutcome:
    """What ``run_search`` found and wrote."""

    result: SearchResult
    costs: LayerCosts
    heads_total: int
    heads_pruned: int
    fisher_source: str
    tuning: Optional[MaskTuning] = None
    seconds: Dict[str, float] = field(default_factory=dict)
    files: List[str] = field(default_factory=list)
    neurons_total: int = 0
    neurons_pruned: int = 0  # FFN neurons the search pruned (0 when it searched heads only)
    flops: Optional[FlopsKept] = None  # FLOPs per token of the attention and FFN layers kept
    predicted_speedup: Optional[float] = None  # the whole model's time over the masked one's, by the latency table
    prediction_note: Optional[str] = None  # why a table that timed the whole model predicts nothing
    decoding: Optional[DecodingFlops] = None  # decoding-flops: the sentence priced, the layers' and output's FLOPs


def layer_costs(settings: SearchSettings, model) -> LayerCosts:
    """The costs the budget counts, for this model: those of the blocks ``settings.structure`` searches."""
    costs = _priced_costs(settings, model, STRUCTURE_PARTS[settings.structure])
    if settings.tie_decoder_heads:  # as CTranslate2 runs a decoder: one head count for self- and cross-attention
        costs = dataclasses.replace(costs, tied_types=tuple(dict.fromkeys(costs.tied_types + CTRANSLATE2_TIED_TYPES)))
    return costs


def _priced_costs(settings: SearchSettings, model, parts) -> LayerCosts:
    if settings.cost == "heads":
        return head_count_costs(head_layout(model))
    architecture = model_architecture(model)
    if "ffn" in parts and "ffn" not in architecture:
        raise StudyError(f"{settings.checkpoint} has FFN layers of uneven widths; search on the full model")
    if settings.cost == "flops":
        return model_flops(model, architecture, settings.sequence_length, parts)
    if settings.cost == "decoding-flops":
        return model_decoding_flops(model, architecture, decoding_shape(settings), parts)
    table = _latency_table(settings, model, architecture)
    if "ffn" in parts and not table.has_ffn:
        raise ResultFileError(f"the latency table {settings.latency_table} times no FFN layers; measure them with "
                              "the latency command", setting="latency_table")
    return table.costs(parts)


def search_costs(settings: SearchSettings, cfg, task, model) -> Tuple[SearchSettings, LayerCosts]:
    """The settings completed from the data (decoding-flops: the valid split's mean lengths and fairseq's --beam,
    unless given) and the costs they price this model at."""
    if settings.cost == "decoding-flops":
        source_length, target_length = split_mean_lengths(task, "valid")
        settings = dataclasses.replace(settings, source_length=settings.source_length or source_length,
                                       target_length=settings.target_length or target_length,
                                       beam=int(cfg.generation.beam))
    return settings, layer_costs(settings, model)


def decoding_shape(settings: SearchSettings) -> DecodingShape:
    """The sentence ``--cost decoding-flops`` prices: source tokens and decoder steps with </s>, and the beam."""
    if settings.source_length is None or settings.target_length is None or settings.beam is None:
        raise StudyError("decoding FLOPs need the source and target lengths and the beam (run_search sets them)")
    return DecodingShape(settings.source_length + 1, settings.target_length + 1, settings.beam)


def _latency_table(settings: SearchSettings, model, architecture) -> LatencyTable:
    precision = settings.latency_precision or (
        model_precision(model) if settings.latency_engine == FAIRSEQ_ENGINE else "float32")
    return read_latency_table(settings.latency_table, architecture, device_description(model_device(model)),
                              engine=settings.latency_engine, precision=precision)


def _fisher(settings: SearchSettings, family, cfg, task, model, seconds):
    """The Fisher scores (and neuron scores for ffn and joint), read from --fisher or estimated; and their source."""
    start = time.perf_counter()
    if settings.fisher_file:
        fisher = read_fisher_file(settings.fisher_file, head_layout(model))
        source = os.path.abspath(settings.fisher_file)
    else:
        estimator = family.importance_estimator(cfg, task, model, settings.importance)
        fisher = estimator.estimate(None, progress=settings.progress, description="Fisher information")
        source = f"estimated on {', '.join(settings.importance.subsets)}"
        seconds["fisher"] = time.perf_counter() - start
    if settings.structure != "heads":
        if fisher.neuron_importance is None:
            raise ResultFileError(
                f"the Fisher file {settings.fisher_file} has no FFN neuron scores; estimate them with importance "
                "--importance-method fisher --importance-structures heads,ffn", setting="fisher"
            )
        shapes = {t: tuple(s.shape) for t, s in fisher.neuron_importance.items()}
        if shapes != dict(ffn_layout(model)):
            raise ResultFileError(f"the Fisher file {settings.fisher_file} scores FFN neurons of another model "
                                  f"({shapes}, not {ffn_layout(model)})", setting="fisher")
    return fisher, source


def run_search(settings: SearchSettings) -> SearchOutcome:
    """Search (and rearrange, and tune) the masks; write OUT/mask.json, OUT/search.json (OUT/ffn_mask.json,
    OUT/tuning.json)."""
    family = family_named(settings.family)
    cfg, task, model = family.load(settings.data, settings.checkpoint, settings.fairseq_args, cpu=settings.cpu)
    if current_head_mask(model) is not None:
        raise StudyError(f"{settings.checkpoint} has heads masked; search on the full model")
    if settings.structure != "heads" and current_ffn_mask(model) is not None:
        raise StudyError(f"{settings.checkpoint} has FFN neurons masked; search on the full model")
    layout = head_layout(model)
    settings, costs = search_costs(settings, cfg, task, model)  # a wrong latency table fails before any work
    costs.check_uniform(settings.uniform)
    budget = settings.budget.resolve(costs)
    seconds: Dict[str, float] = {}
    fisher, source = _fisher(settings, family, cfg, task, model, seconds)
    start = time.perf_counter()
    result = search_mask(fisher.importance, fisher.fisher_blocks, costs, budget, settings.rearrange,
                         neurons=fisher.neuron_importance if settings.structure != "heads" else None,
                         neuron_step=settings.neuron_step, uniform=settings.uniform, width=settings.width)
    seconds["search"] = time.perf_counter() - start
    tuning = None
    if settings.tuning is not None:
        samples = tuning_samples(task, model, settings.tuning)
        tuning = tune_mask(model, result.head_mask, samples, task.source_dictionary.pad(), settings.tuning,
                           ffn_mask=result.ffn_mask, loss=family.tuning_loss(cfg, task), progress=settings.progress)
        tuning.settings.update({"subsets": list(settings.tuning.subsets), "limit": settings.tuning.limit,
                                "checkpoint": os.path.abspath(settings.checkpoint)})
        seconds["tuning"] = tuning.settings["seconds"]
    total = sum(layers * heads for layers, heads in layout.values())
    outcome = SearchOutcome(result, costs, total, count_masked(result.head_mask), source, tuning, seconds)
    if result.ffn_mask is not None:
        outcome.neurons_total = sum(int(m.numel()) for m in result.ffn_mask.values())
        outcome.neurons_pruned = count_masked_neurons(result.ffn_mask)
    architecture = model_architecture(model)
    flops = model_flops(model, architecture, settings.sequence_length)
    outcome.flops = FlopsKept(flops.cost_of(result.head_mask, result.ffn_mask), flops.full_cost(), flops.unit,
                              settings.sequence_length)
    if settings.cost == "decoding-flops":  # what the layers keep, beside what no pruning removes
        shape = decoding_shape(settings)
        outcome.decoding = DecodingFlops(
            shape.source_length, shape.target_steps, shape.beam, result.cost, costs.full_cost(),
            output_projection_flops(architecture["dims"]["dec-dec"][0], len(task.target_dictionary), shape))
    if settings.cost == "latency":
        whole = _latency_table(settings, model, architecture).settings.get("whole_model_ms")
        if whole:  # tables that timed the whole model (CTranslate2's) predict the mask's speed-up
            outcome.predicted_speedup = predicted_speedup(whole, costs.full_cost(), result.cost)
            if outcome.predicted_speedup is None:
                outcome.prediction_note = (f"no prediction: the table prices its layers at {costs.full_cost():.3f} "
                                           f"ms, not below the whole model's {whole:.3f} ms (noisy timings; "
                                           "measure again with more --repeats)")
    _write(settings, outcome, fisher)
    return outcome


def _write(settings: SearchSettings, outcome: SearchOutcome, fisher: ImportanceResult) -> None:
    os.makedirs(settings.out_dir, exist_ok=True)
    mask_path = os.path.join(settings.out_dir, MASK_FILE)
    write_mask_file(outcome.result.head_mask, mask_path)
    outcome.files.append(mask_path)
    ffn_mask = outcome.result.ffn_mask
    if ffn_mask is not None:
        ffn_path = os.path.join(settings.out_dir, FFN_MASK_FILE)
        write_ffn_mask_file(ffn_mask, ffn_path)
        outcome.files.append(ffn_path)
    if outcome.tuning is not None:
        tuning_path = os.path.join(settings.out_dir, TUNING_FILE)
        write_tuning(outcome.tuning, tuning_path)
        outcome.files.append(tuning_path)
    record = SearchFile(
        checkpoint=os.path.abspath(settings.checkpoint), budget=settings.budget.text, cost=settings.cost,
        structure=settings.structure, uniform=settings.uniform,
        latency_table=os.path.abspath(settings.latency_table) if settings.latency_table else None,
        sequence_length=settings.sequence_length if settings.cost == "flops" else None,
        full_cost=outcome.costs.full_cost(), fisher=outcome.fisher_source,
        fisher_sentences=fisher.settings.get("sentences", fisher.count),
        spec=head_mask_to_spec(outcome.result.head_mask), heads_pruned=outcome.heads_pruned,
        heads_total=outcome.heads_total, ffn_spec=None if ffn_mask is None else ffn_mask_to_spec(ffn_mask),
        neurons_pruned=outcome.neurons_pruned if ffn_mask is not None else None,
        neurons_total=outcome.neurons_total if ffn_mask is not None else None,
        flops=outcome.flops, decoding_flops=outcome.decoding, predicted_speedup=outcome.predicted_speedup,
        prediction_note=outcome.prediction_note, seconds=outcome.seconds, result=outcome.result.to_dict(),
        tuning=None if outcome.tuning is None else outcome.tuning.summary())
    search_path = os.path.join(settings.out_dir, SEARCH_FILE)
    write_json(record.to_dict(), search_path, indent=1)
    outcome.files.append(search_path)
