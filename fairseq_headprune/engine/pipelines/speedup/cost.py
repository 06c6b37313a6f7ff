"""``cost/`` of ``compress --target speedup=Nx``: one unit of each stage's work measured on this machine before the
long stages start (``study.compression.speedup.cost``): one export of the unpruned model and one timed pass of it
at each batch size as the plan makes them, one loss pass over the damage sentences, a few sentences of the decision
split translated by fairseq with the run's options, and a few fine-tune updates as an attempt's fine-tune makes them
(with the teacher for ``--distill word``)."""

import dataclasses
import os
import shutil
import tempfile
import time

import torch

from fairseq_headprune.engine.checkpoints.layers import model_depths
from fairseq_headprune.engine.export.engines import export_engine
from fairseq_headprune.engine.export.vocabulary_map import vocabulary_map_for
from fairseq_headprune.engine.families import family_named
from fairseq_headprune.engine.finetune.held import finetune_held, write_masked_start
from fairseq_headprune.engine.pipelines.speedup.plan import (
    PLAN_GROUP,
    PLAN_SENTENCES,
    REFERENCE,
    damage_inputs,
    export_shape,
    flops_shares,
    plan_ladder,
    plan_sentences,
)
from fairseq_headprune.engine.runners.batches import collated_samples, load_split, split_mean_lengths
from fairseq_headprune.engine.runners.translator import translate_batches
from fairseq_headprune.engine.search.tuning_guard import mean_loss
from fairseq_headprune.engine.timing.isolated import SystemSpec, time_systems
from fairseq_headprune.study.compression.decoding import DecodingOptions
from fairseq_headprune.study.compression.deployment_settings import ExportSettings
from fairseq_headprune.study.compression.settings import CompressSettings
from fairseq_headprune.study.compression.speedup.cost import CostProbe, layer_choice_passes
from fairseq_headprune.study.compression.speedup.rules import SCREEN_SHORTFALL, screening_rounds
from fairseq_headprune.study.compression.speedup.shapes import ladder_shapes

DECODED_SENTENCES = 32  # sentences of the decision split fairseq translates to measure its rate
SPEED_SENTENCES = 8  # ... and at least these at each speed batch size (a whole batch at the larger ones)
PROBE_UPDATES = 3  # fine-tune updates timed beyond the first (the first carries the start's cost)
MAX_PROBE_UPDATES = 48  # where the updates are too fast to tell from the start, at most this many


def cost_stage(settings: CompressSettings, work: str) -> CostProbe:
    """Measure one unit of each stage's work and count the units: see the module."""
    evaluation, deployment = settings.evaluation, settings.deployment
    family = family_named(settings.family)
    cfg, task, model = family.load(settings.data, settings.checkpoint, evaluation.generation_args, cpu=True)
    beam = int(cfg.generation.beam)
    depths = model_depths(model)
    ladder = plan_ladder(settings, cfg, model)
    shapes = ladder_shapes(ladder)
    shares = flops_shares(settings, cfg, task, model, shapes)
    beams = {str(index): [(c.beam or beam) / beam for c in ladder if (c.dropped, c.width) == shape]
             for index, shape in enumerate(shapes)}
    probe = CostProbe(shape_shares=[shares[shape] for shape in shapes], beams=beams, group=PLAN_GROUP,
                      repeats=deployment.repeats, screen_rounds=screening_rounds(deployment.repeats),
                      factor=settings.target.factor, shortfall=SCREEN_SHORTFALL,
                      batch_sizes=list(deployment.batch_sizes),
                      max_attempts=settings.speedup.max_attempts)
    _probe_export_and_timing(settings, family, cfg, task, model, beam, work, probe)
    samples, loss = damage_inputs(settings, family, cfg, task, model)
    start = time.perf_counter()
    mean_loss(model, loss, samples)
    probe.loss_seconds = time.perf_counter() - start
    # the layer choices' (the unpruned model's among them, which the damages are paired with) and each shape's
    probe.loss_passes = layer_choice_passes(depths, [c.drop_counts for c in ladder]) + len(shapes)
    _probe_decoding(settings, cfg, task, model, probe)
    probe.speed_systems = 6 if settings.vocabulary_map else 4
    if settings.finetune.enabled:
        _probe_finetune(settings, work, probe)
    return probe


def _probe_export_and_timing(settings: CompressSettings, family, cfg, task, model, beam: int, work: str,
                             probe: CostProbe) -> None:
    """One export of the unpruned model with the vocabulary map, and one process timing it once at each batch
    size on the plan's sentences (its start and model loading apart from the pass)."""
    engine = export_engine(settings.export_format)
    split = settings.importance.subsets[0]
    _, target_length = split_mean_lengths(task, split)
    sentences = plan_sentences(task, split, settings.deployment.batch_sizes)
    probe.plan_sentences = min(PLAN_SENTENCES, len(task.dataset(split)))
    with tempfile.TemporaryDirectory(prefix="headprune-cost-", dir=work) as directory:
        vmap = os.path.join(directory, "vmap.txt")
        vocabulary_map_for(task, ExportSettings.vocabulary_map_candidates, ExportSettings.vocabulary_map_common, vmap)
        path = os.path.join(directory, "unpruned")
        start = time.perf_counter()
        export_shape(engine, family, cfg, task, model, 1.0, settings.table_quantization, vmap, path)
        probe.export_seconds = time.perf_counter() - start
        probe.export_bytes = _bytes_under(path)
        options = DecodingOptions.fixed_length(beam, target_length).to_dict()
        spec = SystemSpec(REFERENCE, engine.name, "variant", settings.table_quantization, path, family=family.name,
                          threads=torch.get_num_threads(), device=settings.deployment.device, options=options,
                          use_vmap=True)
        start = time.perf_counter()
        run = time_systems([spec], settings.deployment.batch_sizes, 1, sentences=sentences)
        wall = time.perf_counter() - start
    probe.pass_seconds = {int(p.batch_size): float(p.seconds[REFERENCE][0]) for p in run.passes}
    # the warm-up pass took about as long as the timed one
    probe.worker_seconds = max(wall - 2.0 * sum(probe.pass_seconds.values()), 0.0)


def _probe_decoding(settings: CompressSettings, cfg, task, model, probe: CostProbe) -> None:
    """fairseq's beam search on the decision split's first sentences, on the evaluation's device; and how many
    sentences each stage translates."""
    decision = settings.speedup.decision_subset
    until = settings.finetune.until
    on_gpu = not settings.evaluation.cpu and torch.cuda.is_available()
    if on_gpu:
        model.cuda()
    samples = collated_samples(task, model, [decision], None, 16, DECODED_SENTENCES)
    seconds, hypotheses = translate_batches(task, model, samples, generation=cfg.generation)
    # the speed stage's fairseq systems at each batch size: a sentence at batch 1 costs several at batch 16
    for batch_size in settings.deployment.batch_sizes:
        batched = collated_samples(task, model, [decision], None, batch_size, max(batch_size, SPEED_SENTENCES))
        batch_seconds, batch_hypotheses = translate_batches(task, model, batched, generation=cfg.generation)
        probe.fairseq_seconds[int(batch_size)] = batch_seconds / max(len(batch_hypotheses), 1)
    if on_gpu:
        model.cpu()
    probe.decoded = len(hypotheses)
    probe.decode_seconds = seconds / max(len(hypotheses), 1)
    probe.decision_sentences = _sentences(task, decision)
    if until is not None and until.subset != decision:
        probe.extra_reference_sentences = _sentences(task, until.subset)
    probe.report_sentences = _sentences(task, settings.evaluation.gen_subset)
    probe.speed_sentences = settings.deployment.sentences or probe.report_sentences


def _probe_finetune(settings: CompressSettings, work: str, probe: CostProbe) -> None:
    """Two short fine-tunes of the unpruned model as an attempt's fine-tune makes them (its criterion, batch and
    precision; the teacher for --distill word), of 1 and ``1 + PROBE_UPDATES`` updates (up to ``1 +
    MAX_PROBE_UPDATES`` where they are too fast to tell from the start): their difference is what those updates
    cost, the rest what starting and ending one costs."""
    finetune, until = settings.finetune, settings.finetune.until
    teacher = settings.checkpoint if settings.distill == "word" else None
    start_checkpoint = os.path.join(work, "start.pt")
    write_masked_start(settings.checkpoint, start_checkpoint, None, None)
    probe_settings = dataclasses.replace(finetune, until=None, save_interval=0, epochs=0)

    def seconds_for(updates: int) -> float:
        save_dir = os.path.join(work, f"finetune-{updates}")
        began = time.perf_counter()
        outcome = finetune_held(start_checkpoint, settings.data, save_dir, settings.family, probe_settings,
                                cpu=settings.evaluation.cpu, progress=False, teacher=teacher,
                                distill_weight=settings.distill_weight, stop=("update", updates))
        probe.memory = outcome.memory
        seconds = time.perf_counter() - began
        probe.weights_bytes = os.path.getsize(os.path.join(save_dir, "checkpoint_last.pt"))
        shutil.rmtree(save_dir, ignore_errors=True)
        return seconds

    first, timed = seconds_for(1), PROBE_UPDATES
    more = seconds_for(1 + timed)
    # a fast update is lost in the start's noise: time more of them until they weigh a quarter of the start
    while more - first < 0.25 * first and timed < MAX_PROBE_UPDATES:
        timed *= 4
        more = seconds_for(1 + timed)
    os.remove(start_checkpoint)
    probe.update_seconds = max(more - first, 0.0) / timed
    probe.start_seconds = max(first - probe.update_seconds, 0.0)
    probe.distilled = teacher is not None
    probe.ceiling = finetune.updates
    probe.validations = (finetune.updates // until.validation_interval(finetune.updates)) if until else 0
    probe.validation_rule = until.interval_rule(finetune.updates) if until else ""
    probe.updates_per_epoch = until.data.updates_per_epoch if until is not None and until.data is not None else 0
    probe.minutes_cap = None if until is None else until.minutes


def _sentences(task, split: str) -> int:
    load_split(task, split)
    return len(task.dataset(split))


def _bytes_under(path: str) -> int:
    return sum(os.path.getsize(os.path.join(folder, name)) for folder, _, names in os.walk(path) for name in names)


