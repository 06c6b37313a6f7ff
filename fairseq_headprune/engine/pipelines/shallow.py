"""``compress``'s stages for a shallower model: whole layers removed first, and the distillation data.

``layers/`` removes the layers the validation loss misses least
(``engine.compression.layer_choice``) and writes the shallower checkpoint the search
starts from; ``distill/`` writes the training data whose targets are the
unpruned model's translations (``engine.compression.distillation``), which the
fine-tuning learns from.
"""

import os
import shutil

from fairseq_headprune.engine.checkpoints.info import load_checkpoint_state
from fairseq_headprune.engine.checkpoints.layers import layers_removed, state_depths
from fairseq_headprune.engine.checkpoints.shrink import checkpoint_parameters, shrink_checkpoint
from fairseq_headprune.engine.compression.distillation import write_distilled_data
from fairseq_headprune.engine.compression.layer_choice import choose_layers
from fairseq_headprune.engine.families import family_named
from fairseq_headprune.engine.pipelines.search import layer_costs, search_costs
from fairseq_headprune.engine.runners.batches import collated_samples
from fairseq_headprune.engine.search.model_costs import model_architecture, model_flops
from fairseq_headprune.engine.search.tuning_guard import token_nll
from fairseq_headprune.errors import SettingsError, StudyError
from fairseq_headprune.modules.masked_ffn import ffn_layout
from fairseq_headprune.modules.masked_multihead_attention import head_layout
from fairseq_headprune.study.compression.records import (
    DistillRecord,
    LayersRecord,
    ParameterCounts,
    SearchRecord,
    ShrinkRecord,
)
from fairseq_headprune.study.compression.settings import CompressSettings
from fairseq_headprune.study.output.files import write_text

CHECKPOINT = "checkpoint.pt"  # a stage's checkpoint, in its directory
DISTILLED_DATA = "data"  # in distill/: the data directory with the teacher's training targets


def check_layer_counts(settings: CompressSettings) -> None:
    """``--drop-*-layers`` leave at least one layer in each stack the model has."""
    if not os.path.isfile(settings.checkpoint):
        raise StudyError(f"checkpoint not found: {settings.checkpoint}")
    depths = state_depths(load_checkpoint_state(settings.checkpoint))
    for stack, count in settings.drop_layers.items():
        if stack not in depths:
            raise SettingsError(f"--drop-{stack}-layers: the model has no {stack}")
        if count >= depths[stack]:
            raise SettingsError(f"--drop-{stack}-layers {count}: the {stack} has {depths[stack]} layers and keeps "
                                "at least one")


def layers_stage(settings: CompressSettings, work: str) -> LayersRecord:
    """Whole layers removed, chosen by the validation loss (``layer_choice``), or as a speed-up plan chose them
    (``settings.shape.layer_choice``, measured on the same sentences); the target's cost of the unpruned model and
    of the shallower one, so that the search's budget stays a share of the unpruned model's."""
    evaluation = settings.evaluation
    family = family_named(settings.family)
    cfg, task, model = family.load(settings.data, settings.checkpoint, evaluation.generation_args, cpu=evaluation.cpu)
    samples = collated_samples(task, model, settings.importance.subsets, settings.importance.max_tokens,
                               None if settings.importance.max_tokens else 64, settings.importance.limit)
    if not samples:
        raise StudyError(f"--drop-*-layers: {' '.join(settings.importance.subsets)} holds no sentence")
    choice = settings.shape.layer_choice
    if choice is None:
        loss = family.tuning_loss(cfg, task) or token_nll(task.target_dictionary.pad())  # as mask tuning's guard
        choice = choose_layers(model, loss, samples, settings.drop_layers, progress=evaluation.progress)
    search_settings, costs = search_costs(settings.search_settings(settings.checkpoint, work), cfg, task, model)
    full = costs.full_cost()
    flops_full = model_flops(model, model_architecture(model), search_settings.sequence_length).full_cost()
    with layers_removed(model, choice.dropped):
        kept = layer_costs(search_settings, model).full_cost()
    target = settings.target
    limit = target.percent / 100.0 * full
    # a speedup plan's shape of layers alone asks for exactly what the layers keep (nothing searched)
    if limit > kept * (1.0 + 1e-9) or (limit >= kept and settings.attempt is None):
        raise StudyError(f"--target {target.text}: removing layers {choice.spec} already keeps {kept / full:.1%} of "
                         f"the unpruned model's {target.cost} cost; ask for less or remove fewer layers")
    shrink_checkpoint(settings.checkpoint, os.path.join(work, CHECKPOINT), None, drop_layers=choice.dropped)
    return LayersRecord(checkpoint=CHECKPOINT, spec=choice.spec, counts=dict(settings.drop_layers),
                        chosen_by="loss" if settings.shape.layer_choice is None else "plan",
                        base_loss=choice.base_loss, steps=choice.steps, subsets=list(settings.importance.subsets),
                        sentences=sum(len(sample["id"]) for sample in samples),
                        cost=settings.target.cost, unit=costs.unit, full_cost=full, kept_cost=kept,
                        flops_full=flops_full,
                        parameters=ParameterCounts(checkpoint_parameters(settings.checkpoint),
                                                   kept=checkpoint_parameters(os.path.join(work, CHECKPOINT))))


def distill_stage(settings: CompressSettings, work: str) -> DistillRecord:
    """The unpruned model's beam outputs on the training sources, as the fine-tuning's data (``distillation``)."""
    evaluation = settings.evaluation
    cfg, task, model = family_named(settings.family).load(settings.data, settings.checkpoint,
                                                          evaluation.generation_args, cpu=evaluation.cpu)
    outcome = write_distilled_data(cfg, task, model, os.path.join(work, DISTILLED_DATA), split="train",
                                   progress=evaluation.progress)
    return DistillRecord(data=DISTILLED_DATA, kind=settings.distill, split=outcome.split,
                         sentences=outcome.sentences, target_tokens=outcome.target_tokens,
                         reference_tokens=outcome.reference_tokens, identical_to_reference=outcome.identical,
                         seconds_translating=outcome.seconds)


def prunes_units(search: SearchRecord) -> bool:
    """Whether the search pruned any head or neuron (a speedup shape may remove whole layers only)."""
    return bool(search.heads_pruned or search.neurons_pruned)


def layers_only_search(settings: CompressSettings, base_checkpoint: str, search_settings,
                       layers: LayersRecord) -> SearchRecord:
    """The search's record for a speedup shape that removes whole layers and nothing else: no unit pruned."""
    evaluation = settings.evaluation
    _, _, model = family_named(settings.family).load(settings.data, base_checkpoint, evaluation.generation_args,
                                                     cpu=evaluation.cpu)
    flops = model_flops(model, model_architecture(model), search_settings.sequence_length).full_cost()
    return SearchRecord(
        target=settings.target.text, structure=settings.target.structure, cost=settings.target.cost,
        budget=search_settings.budget.amount, unit=layers.unit, mask_cost=layers.kept_cost, full_cost=layers.kept_cost,
        heads_total=sum(count * heads for count, heads in head_layout(model).values()),
        neurons_total=sum(count * width for count, width in ffn_layout(model).values()),
        flops={"kept": flops, "full": flops, "unit": "FLOPs per token",
               "sequence_length": search_settings.sequence_length},
        tuning_skipped="whole layers removed only: no unit searched")


def layers_only_shrink(settings: CompressSettings, source: str, out: str, search: SearchRecord) -> ShrinkRecord:
    """``shrink/`` for a shape of whole layers alone: the (fine-tuned) shallower model as it is."""
    shutil.copyfile(source, out)
    write_text("no head or neuron pruned\n", os.path.join(os.path.dirname(out), "parameters.tsv"))
    return ShrinkRecord(
        checkpoint=os.path.basename(out), shrunk_from=os.path.abspath(source), tuning_folded=False, heads_pruned=0,
        heads_total=search.heads_total, neurons_pruned=0, neurons_total=search.neurons_total,
        parameters=ParameterCounts(checkpoint_parameters(settings.checkpoint), compressed=checkpoint_parameters(out)),
        report=[])
