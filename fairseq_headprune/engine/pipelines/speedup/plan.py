"""``plan/`` of ``compress --target speedup=Nx``: every candidate shape timed in the export engine, its damage measured,
and the one to try first (``study.compression.speedup``).

The timing: every shape of ``candidate_ladder`` exported with the vocabulary map (its layers, every layer narrowed
alike) and timed against the unpruned model (with and without its map) on the Fisher split's first sentences,
each generating the split's mean target length; ``PLAN_GROUP`` shapes at a time, each group in one rotated run
with the unpruned model (every speed-up is paired within its group's rounds) and deleted after it. Every shape
is timed ``screening_rounds`` rounds, then those whose timing decides the choice (``decisive_candidates``) at
--repeats rounds: the others are too slow or too damaged to be chosen whatever more rounds would measure.

The damage: the validation loss before fine-tuning of the unpruned model with the shape's whole layers removed
(chosen by the loss, one at a time, as ``engine.compression.layer_choice`` does; the losses measured once and
shared by the shapes) and every other layer keeping its heads and FFN neurons of highest Fisher information,
estimated once on the unpruned model (Kwon et al. 2022). The plan also scores the unpruned model on the decision
split (the attempts' fine-tunings stop once within the tolerance of it) and records the run's decoding.
"""

import dataclasses
import os
import shutil
import statistics
import tempfile
from typing import Dict, List, Mapping, Optional, Tuple

import torch
from tqdm import tqdm

from fairseq_headprune.engine.checkpoints.layers import layers_removed, model_depths
from fairseq_headprune.engine.compression.layer_choice import choose_layers
from fairseq_headprune.engine.export.base import ExportEngine
from fairseq_headprune.engine.export.engines import export_engine
from fairseq_headprune.engine.export.vocabulary_map import vocabulary_map_for
from fairseq_headprune.engine.families import family_named
from fairseq_headprune.engine.pipelines.compress_measures import split_score
from fairseq_headprune.engine.pipelines.search import layer_costs, search_costs
from fairseq_headprune.engine.runners.batches import collated_samples, dictionary_tokens, load_split, split_mean_lengths
from fairseq_headprune.engine.search.exported_latency import export_masked
from fairseq_headprune.engine.search.tuning_guard import batch_losses, pooled_loss, token_nll
from fairseq_headprune.engine.timing.isolated import SystemSpec, time_systems
from fairseq_headprune.errors import StudyError
from fairseq_headprune.modules.masked_ffn import ffn_layout, set_ffn_mask
from fairseq_headprune.modules.masked_multihead_attention import head_layout, set_head_mask
from fairseq_headprune.study.compression.decoding import DecodingOptions
from fairseq_headprune.study.compression.deployment_settings import ExportSettings
from fairseq_headprune.study.compression.settings import CompressSettings
from fairseq_headprune.study.compression.speed import Speedups, paired_speedup
from fairseq_headprune.study.compression.speedup.damage import damage_sample, paired_damage
from fairseq_headprune.study.compression.speedup.records import PlanRecord
from fairseq_headprune.study.compression.speedup.rules import choose_candidate, decisive_candidates, screening_rounds
from fairseq_headprune.study.compression.speedup.shapes import (
    SMALLER_BEAMS,
    Candidate,
    PlannedCandidate,
    candidate_ladder,
    ladder_shapes,
    out_of_order,
)
from fairseq_headprune.study.masks.layer_drop import LayerChoice, kept_layers
from fairseq_headprune.study.search.mask_search import width_count

PLAN_SENTENCES = 64  # sentences of the Fisher split each candidate decodes per timed pass
# shapes exported and timed together, beside the unpruned model, then deleted: the plan's disk and memory hold
# the unpruned model and this many shapes, whatever the ladder's length (47 shapes on a 6 + 6 model)
PLAN_GROUP = 8
REFERENCE, STOCK = "unpruned vmap", "unpruned"
# the stack each attention and FFN type belongs to
TYPE_STACKS = {"enc-enc": "encoder", "enc-dec": "decoder", "dec-dec": "decoder", "enc-ffn": "encoder",
               "dec-ffn": "decoder"}


def plan_stage(settings: CompressSettings, work: str) -> PlanRecord:
    """Time and measure every candidate shape, score the unpruned model on the decision split, and choose
    (``choose_candidate``): see the module."""
    evaluation, deployment = settings.evaluation, settings.deployment
    family = family_named(settings.family)
    cfg, task, model = family.load(settings.data, settings.checkpoint, evaluation.generation_args, cpu=True)
    split = settings.importance.subsets[0]
    beam = int(cfg.generation.beam)
    ladder = plan_ladder(settings, cfg, model)
    base_loss, damages, choices, sentences = _damages(settings, family, cfg, task, model, ladder)
    planned, map_gain, environment, target_length = _timed(settings, family, cfg, task, model, ladder, split, beam,
                                                           damages)
    decoding = DecodingOptions.of_generation(cfg.generation)
    decision_subset = settings.speedup.decision_subset
    reference = split_score(settings, settings.checkpoint, decision_subset, os.path.join(work, "reference"))
    # the fine-tuning's stop target is set from the split it validates on
    until = settings.finetune.until
    stop_subset = "" if until is None or until.subset == decision_subset else until.subset
    stop_reference = (split_score(settings, settings.checkpoint, stop_subset, os.path.join(work, "stop-reference"))
                      if stop_subset else None)
    record = PlanRecord(factor=settings.target.factor, margin=settings.speedup.plan_margin,
                        batch_sizes=list(deployment.batch_sizes),
                        quantization=settings.table_quantization, split=split, sentences=PLAN_SENTENCES, beam=beam,
                        target_length=target_length, repeats=deployment.repeats,
                        screen_rounds=screening_rounds(deployment.repeats), candidates=planned,
                        map_gain=map_gain, environment=environment, decision_subset=decision_subset,
                        reference=reference, stop_subset=stop_subset, stop_reference=stop_reference,
                        base_loss=base_loss, damage_sentences=sentences,
                        damage_sampled_from=0 if settings.importance.limit is not None else _split_sentences(
                            task, settings.importance.subsets, sentences),
                        generation={"beam": decoding.beam, "lenpen": decoding.lenpen, "max_len_a": decoding.max_len_a,
                                    "max_len_b": decoding.max_len_b, "min_len": decoding.min_len},
                        remove_bpe=cfg.common_eval.post_process or None,
                        layer_choices={name: choice for name, choice in choices.items()})
    record.out_of_order = out_of_order(planned, repeats=deployment.repeats)
    record.chosen = choose_candidate(planned, settings.target.factor, settings.speedup.plan_margin)
    return record


class _ShapeTimer:
    """Exports shapes of the model beside its unpruned export (``directory``) and times them against it, with and
    without its map, ``PLAN_GROUP`` shapes at a time, each group in one rotated run with the unpruned model
    (every speed-up paired within its group's rounds) and deleted after it; gathers each candidate's speed-ups
    and rounds, the map's gain of every group and the machine."""

    def __init__(self, settings: CompressSettings, family, cfg, task, model, ladder: List[Candidate], beam: int,
                 target_length: int, directory: str, progress):
        self.settings, self.family, self.cfg, self.task, self.model = settings, family, cfg, task, model
        self.ladder, self.beam, self.target_length, self.progress = ladder, beam, target_length, progress
        self.engine = export_engine(settings.export_format)
        self.depths = model_depths(model)
        self.sentences = plan_sentences(task, settings.importance.subsets[0], settings.deployment.batch_sizes)
        self.directory = directory
        self.vmap = os.path.join(directory, "vmap.txt")
        self.reference = os.path.join(directory, "unpruned")
        self.speedups: Dict[str, Speedups] = {}  # candidate name -> its speed-ups
        self.rounds: Dict[str, int] = {}  # candidate name -> the rounds they are the median of
        self.map_gains: Dict[int, List[float]] = {}
        self.environment: Dict[str, object] = {}
        vocabulary_map_for(task, ExportSettings.vocabulary_map_candidates, ExportSettings.vocabulary_map_common,
                           self.vmap)
        export_shape(self.engine, family, cfg, task, model, 1.0, settings.table_quantization, self.vmap,
                     self.reference)
        progress.update(1)

    def _spec(self, name: str, path: str, use_vmap: bool, at_beam: Optional[int] = None) -> SystemSpec:
        options = DecodingOptions.fixed_length(at_beam or self.beam, self.target_length).to_dict()
        deployment = self.settings.deployment
        return SystemSpec(name, self.engine.name, "variant", self.settings.table_quantization, path,
                          family=self.family.name, threads=torch.get_num_threads(), device=deployment.device,
                          options=options, use_vmap=use_vmap)

    def time(self, shapes, repeats: int, label: str) -> None:
        """Time ``shapes`` (``(dropped counts, width)``) at ``repeats`` rounds, in groups under ``label``."""
        deployment = self.settings.deployment
        for number in range(0, len(shapes), PLAN_GROUP):
            group_dir = os.path.join(self.directory, f"{label}-{number // PLAN_GROUP}")
            specs = [self._spec(REFERENCE, self.reference, True), self._spec(STOCK, self.reference, False)]
            for index, (dropped_counts, width) in enumerate(shapes[number:number + PLAN_GROUP]):
                # which layers go does not change the timing: the last ones of each stack
                dropped = {stack: list(range(self.depths[stack] - count, self.depths[stack]))
                           for stack, count in dropped_counts}
                path = os.path.join(group_dir, f"shape-{index}")
                with layers_removed(self.model, dropped):
                    export_shape(self.engine, self.family, self.cfg, self.task, self.model, width,
                                 self.settings.table_quantization, self.vmap, path)
                specs += [self._spec(candidate.name, path, True, candidate.beam) for candidate in self.ladder
                          if (candidate.dropped, candidate.width) == (dropped_counts, width)]
                self.progress.update(1)
            run = time_systems(specs, deployment.batch_sizes, repeats, sentences=self.sentences)
            self.environment = self.environment or run.environment
            for passes in run.passes:
                batch, reference_seconds = int(passes.batch_size), passes.seconds[REFERENCE]
                self.map_gains.setdefault(batch, []).append(paired_speedup(passes.seconds[STOCK], reference_seconds))
                for system in specs[2:]:
                    self.speedups.setdefault(system.name, Speedups())[batch] = paired_speedup(
                        reference_seconds, passes.seconds[system.name])
                    self.rounds[system.name] = repeats
            shutil.rmtree(group_dir)


def _timed(settings: CompressSettings, family, cfg, task, model, ladder: List[Candidate], split: str, beam: int,
           damages: Mapping[tuple, Tuple[float, Optional[float]]]
           ) -> Tuple[List[PlannedCandidate], Speedups, Dict[str, object], int]:
    """Every shape exported with the vocabulary map and timed against the unpruned model (``_ShapeTimer``), so
    that the plan's disk and memory hold the unpruned model and one group whatever the ladder's length: first
    every shape ``screening_rounds`` rounds, then the shapes whose timing decides the choice
    (``decisive_candidates``, from the timing so far and ``damages``) again at --repeats rounds, their speed-ups
    replaced by those, until every decisive shape is. Returns the candidates with their decoding-FLOPs share,
    damage, speed-ups and rounds, the map's own speed-up (the median over the groups), the machine and the
    target length."""
    repeats = settings.deployment.repeats
    _, target_length = split_mean_lengths(task, split)
    shapes = ladder_shapes(ladder)
    shares = flops_shares(settings, cfg, task, model, shapes)
    screen_rounds = screening_rounds(repeats)
    progress = tqdm(total=len(shapes) + 1, desc="plan: exporting and timing shapes", unit="shape",
                    disable=not settings.evaluation.progress, leave=False)
    with tempfile.TemporaryDirectory(prefix="headprune-plan-") as directory:
        timer = _ShapeTimer(settings, family, cfg, task, model, ladder, beam, target_length, directory, progress)
        timer.time(shapes, screen_rounds, "group")
        planned = [PlannedCandidate(candidate, shares[candidate.dropped, candidate.width],
                                    timer.speedups[candidate.name], *damages[candidate.dropped, candidate.width],
                                    rounds=timer.rounds[candidate.name]) for candidate in ladder]
        refined: List[tuple] = []  # the shapes timed at --repeats
        while screen_rounds < repeats:
            decisive = decisive_candidates(planned, settings.target.factor, settings.speedup.plan_margin)
            new = [shape for shape in dict.fromkeys((planned[i].candidate.dropped, planned[i].candidate.width)
                                                    for i in decisive) if shape not in refined]
            if not new:  # at most the whole ladder: each pass refines a shape or ends
                break
            progress.total += len(new)
            progress.refresh()
            timer.time(new, repeats, f"refined-{len(refined)}")
            refined += new
            for candidate in planned:
                if (candidate.candidate.dropped, candidate.candidate.width) in new:
                    candidate.screened = candidate.speedups
                candidate.speedups = Speedups(timer.speedups[candidate.candidate.name])
                candidate.rounds = timer.rounds[candidate.candidate.name]
    progress.close()
    map_gain = Speedups({batch: statistics.median(gains) for batch, gains in timer.map_gains.items()})
    return planned, map_gain, timer.environment, target_length


def plan_ladder(settings: CompressSettings, cfg, model) -> List[Candidate]:
    """The shapes the plan times (``candidate_ladder``): at the run's beam, and with --allow-beam at the smaller
    beams too."""
    beam = int(cfg.generation.beam)
    smaller = [b for b in SMALLER_BEAMS if b < beam] if settings.speedup.allow_beam else []
    return candidate_ladder(model_depths(model), beams=smaller)


def flops_shares(settings: CompressSettings, cfg, task, model, shapes) -> Dict[tuple, float]:
    """Each shape's (``(dropped counts, width)``) decoding FLOPs over the unpruned model's, every kept layer
    narrowed alike; which layers go does not change it (the last ones of each stack are left out)."""
    search_settings, costs = search_costs(settings.search_settings(settings.checkpoint, "."), cfg, task, model)
    full, depths, shares = costs.full_cost(), model_depths(model), {}
    for dropped_counts, width in shapes:
        dropped = {stack: list(range(depths[stack] - count, depths[stack])) for stack, count in dropped_counts}
        with layers_removed(model, dropped):
            shares[dropped_counts, width] = layer_costs(search_settings, model).cost_of(
                *_uniform_masks(model, width)) / full
    return shares


def damage_inputs(settings: CompressSettings, family, cfg, task, model):
    """The sentences a shape's damage is measured on (the Fisher split's, collated once: with no
    --importance-limit, a random ``DAMAGE_SAMPLE`` of a larger split, ``damage_sample``) and the loss measured."""
    importance = settings.importance
    samples = collated_samples(task, model, importance.subsets, importance.max_tokens,
                               None if importance.max_tokens else 64, importance.limit,
                               sample=damage_sample if importance.limit is None else None)
    if not samples:
        raise StudyError(f"--target speedup: {' '.join(importance.subsets)} holds no sentence to measure on")
    return samples, family.tuning_loss(cfg, task) or token_nll(task.target_dictionary.pad())


def _damages(settings: CompressSettings, family, cfg, task, model, ladder: List[Candidate]
             ) -> Tuple[float, Dict[tuple, Tuple[float, Optional[float]]], Dict[str, LayerChoice], int]:
    """Each shape's validation loss over the unpruned model's before fine-tuning (see the module): the unpruned
    model's loss, the damage and its standard error by (layers, width) (``paired_damage``), the layers chosen by
    each shape's layer name, and the sentences the loss is measured on."""
    importance = settings.importance
    samples, loss = damage_inputs(settings, family, cfg, task, model)
    fisher = family.importance_estimator(cfg, task, model, dataclasses.replace(importance, neurons=True)).estimate(
        None, progress=settings.evaluation.progress, description="plan: Fisher information")
    scores = {**fisher.importance, **(fisher.neuron_importance or {})}
    depths = model_depths(model)
    unpruned = batch_losses(model, loss, samples)  # each shape's damage is paired with these batch for batch
    cache = {frozenset(): pooled_loss(unpruned)}  # the layer choices' loss with no layer left out: measured here
    choices: Dict[str, LayerChoice] = {}
    damages: Dict[tuple, Tuple[float, Optional[float]]] = {}
    shapes = ladder_shapes(ladder)
    progress = tqdm(total=len(shapes), desc="plan: damage of each shape", unit="shape",
                    disable=not settings.evaluation.progress, leave=False)
    base_loss = None
    for dropped, width in shapes:
        candidate = Candidate(dropped, width)
        name = candidate.layers_name
        if name not in choices:
            choices[name] = choose_layers(model, loss, samples, candidate.drop_counts, progress=False, cache=cache)
        choice = choices[name]
        base_loss = choice.base_loss
        with layers_removed(model, choice.dropped):
            head_mask, ffn_mask = _fisher_masks(model, scores, kept_layers(choice.dropped, depths), width)
            set_head_mask(model, head_mask)
            set_ffn_mask(model, ffn_mask)
            try:
                damages[dropped, width] = paired_damage(batch_losses(model, loss, samples), unpruned)
            finally:
                set_head_mask(model, None)
                set_ffn_mask(model, None)
        progress.update(1)
    progress.close()
    return base_loss, damages, choices, sum(len(sample["id"]) for sample in samples)


def _split_sentences(task, subsets, measured: int) -> int:
    """The Fisher split's sentences where the damage measured fewer (``damage_sample``); 0 where it measured all."""
    total = sum(len(task.dataset(subset)) for subset in subsets)
    return total if measured < total else 0


def _fisher_masks(model, scores: Mapping[str, torch.Tensor], kept: Mapping[str, List[int]], width: float):
    """Head and FFN-neuron masks of the model as it is now (some layers left out): in every layer, the ``width``
    share of its units of highest Fisher information (``scores``: type -> unpruned layers x units) kept."""
    masks = []
    for layout in (head_layout(model), ffn_layout(model)):
        mask = {}
        for unit_type, (layers, units) in layout.items():
            rows = kept[TYPE_STACKS[unit_type]]
            mask[unit_type] = torch.zeros(layers, units)
            for position, layer in enumerate(rows):
                best = torch.argsort(scores[unit_type][layer].float(), descending=True)[:width_count(units, width)]
                mask[unit_type][position, best] = 1.0
        masks.append(mask)
    return masks[0], masks[1]


def _uniform_masks(model, width: float):
    """Every layer keeping its first ``width_count`` heads and neurons (the shape alone matters to the timing)."""
    head_mask = {t: torch.ones(shape) for t, shape in head_layout(model).items()}
    ffn_mask = {t: torch.ones(shape) for t, shape in ffn_layout(model).items()}
    for masks in (head_mask, ffn_mask):
        for mask in masks.values():
            mask[:, width_count(mask.shape[1], width):] = 0.0
    return head_mask, ffn_mask


def export_shape(engine: ExportEngine, family, cfg, task, model, width: float, quantization: str, vmap: str,
                  path: str) -> None:
    """The model (its layers as they are now) narrowed uniformly to ``width``, exported with the vocabulary map."""
    try:
        export_masked(engine, family, cfg, task, model, *_uniform_masks(model, width), quantization, path, vmap)
    finally:
        set_head_mask(model, None)
        set_ffn_mask(model, None)


def plan_sentences(task, split: str, batch_sizes) -> Dict[int, Dict[str, list]]:
    """The first ``PLAN_SENTENCES`` sources of ``split`` in the dictionary's tokens (an export engine's input), in
    batches of each size."""
    load_split(task, split)
    dataset = task.dataset(split)
    count = min(PLAN_SENTENCES, len(dataset))
    if count == 0:
        raise StudyError(f"--target speedup: split {split!r} holds no sentence to time")
    sources = [dictionary_tokens(task.source_dictionary, dataset[i]["source"].tolist()) for i in range(count)]
    batches = {}
    for size in batch_sizes:
        grouped = [sources[start:start + size] for start in range(0, count, size)]
        batches[size] = {"sources": grouped, "source_lengths": [max(len(s) for s in group) + 1 for group in grouped]}
    return batches
