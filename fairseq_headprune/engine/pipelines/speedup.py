"""``compress --target speedup=Nx``: measure candidate shapes in CTranslate2, compress to the least change fast
enough, and keep the BLEU within the tolerance by continuing the fine-tuning or backing off
(``study.compression.speedup``).

The run's directory holds ``plan/`` (a stage as ``compress`` writes them:
the candidates' measured speed-ups) and one ``attempt-N/`` per compression
tried, each a whole ``compress`` run (decoding-FLOPs target, whole layers
removed) that resumes as any does; OUT/report.json and OUT/report.md gather
the plan, every attempt and the result.
"""

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import torch
from tqdm import tqdm

from fairseq_headprune.engine.checkpoints.layers import layers_removed, model_depths
from fairseq_headprune.engine.export.vocabulary_map import vocabulary_map_for
from fairseq_headprune.engine.families import family_named
from fairseq_headprune.engine.pipelines.compress import CompressOutcome, run_compress, run_identity
from fairseq_headprune.engine.pipelines.compress_stages import STAGE_RECORD, StageCallback, Stages, open_out_dir
from fairseq_headprune.engine.pipelines.export import ctranslate2_device
from fairseq_headprune.engine.pipelines.search import layer_costs, search_costs
from fairseq_headprune.engine.pipelines.shallow import CHECKPOINT
from fairseq_headprune.engine.runners.batches import dictionary_tokens, load_split, split_mean_lengths
from fairseq_headprune.engine.search.ctranslate2_latency import save_masked_spec
from fairseq_headprune.engine.timing.isolated import CTRANSLATE2, SystemSpec, time_systems
from fairseq_headprune.errors import StudyError
from fairseq_headprune.modules.masked_ffn import ffn_layout, set_ffn_mask
from fairseq_headprune.modules.masked_multihead_attention import head_layout, set_head_mask
from fairseq_headprune.study.compression.decoding import DecodingOptions
from fairseq_headprune.study.compression.records import PlanRecord, Prediction
from fairseq_headprune.study.compression.settings import CompressSettings, ExportSettings
from fairseq_headprune.study.compression.speed import compressed_speedups, paired_speedup
from fairseq_headprune.study.compression.speedup import (
    SMALLER_BEAMS,
    PlannedCandidate,
    candidate_ladder,
    choose_candidate,
    disturbed_plan_text,
    kept_count,
    out_of_order,
)
from fairseq_headprune.study.compression.speedup_records import AttemptRecord, SpeedupReport, SpeedupResult
from fairseq_headprune.study.compression.speedup_report import speedup_report_markdown
from fairseq_headprune.study.compression.speedup_search import AttemptPlan, AttemptResult, SpeedupSearch
from fairseq_headprune.study.output.files import write_json, write_text

PLAN_SENTENCES = 64  # sentences of the Fisher split each candidate decodes per timed pass
REFERENCE, STOCK = "unpruned vmap", "unpruned"
REPORT_JSON, REPORT_MARKDOWN = "report.json", "report.md"
SEEDED_STAGES = ("layers", "fisher", "search", "distill")  # what a continued fine-tuning takes from its attempt
TEACHER_STAGES = ("distill",)  # what every later attempt takes from the first


@dataclass
class SpeedupOutcome:
    """What ``run_speedup`` did: its report, each attempt's compress outcome and the files written."""

    report: SpeedupReport
    attempts: List[CompressOutcome] = field(default_factory=list)
    files: List[str] = field(default_factory=list)


def run_speedup(settings: CompressSettings, on_stage: Optional[StageCallback] = None,
                on_attempt=None, on_warning=None) -> SpeedupOutcome:
    """Plan (or resume the plan), then run the attempts ``SpeedupSearch`` asks for, one compress run each, handing
    it every attempt's result, until it accepts one or gives up; ``on_attempt(number, text)`` hears what each
    attempt is and what followed it, ``on_warning(text)`` a plan whose timings contradict the shapes' order."""
    if not os.path.isdir(settings.data):
        raise StudyError(f"data directory not found: {settings.data}")
    if not os.path.isfile(settings.checkpoint):
        raise StudyError(f"checkpoint not found: {settings.checkpoint}")
    open_out_dir(settings.out_dir, run_identity(settings))
    stages = Stages(settings.out_dir, on_stage)
    stages.run("plan", lambda work: plan_stage(settings, work))
    plan = stages.record("plan")
    planned = plan.candidates
    if plan.out_of_order and on_warning is not None:
        on_warning(disturbed_plan_text(plan.out_of_order, os.path.join(settings.out_dir, "plan")))
    tell = on_attempt or (lambda number, text: None)
    search = SpeedupSearch(planned, plan.chosen, settings.target.factor, settings.max_bleu_loss,
                           settings.max_attempts, settings.finetune.enabled)
    outcomes: List[CompressOutcome] = []
    records: List[AttemptRecord] = []
    attempt: Optional[AttemptPlan] = search.first()
    while attempt is not None:
        number = len(outcomes) + 1
        candidate = planned[attempt.shape]
        attempt_dir = _attempt_dir(settings.out_dir, number)
        previous = None if attempt.continues is None else _attempt_dir(settings.out_dir, attempt.continues)
        finetune_from = None if previous is None else os.path.join(previous, "finetune", CHECKPOINT)
        # a continued fine-tuning at the learning rate of the one it continues
        finetune_lr = None if previous is None else outcomes[attempt.continues - 1].report.finetune.lr
        attempt_settings = settings.attempt(candidate.flops_share, candidate.candidate.drop_counts, attempt_dir,
                                            finetune_from, candidate.candidate.beam, finetune_lr)
        if not os.path.isdir(attempt_dir):
            if previous is not None:
                _seed_attempt(attempt_settings, previous, SEEDED_STAGES)
            elif outcomes:  # the unpruned teacher's translations serve every shape
                _seed_attempt(attempt_settings, _attempt_dir(settings.out_dir, 1), TEACHER_STAGES)
        tell(number, f"{candidate.candidate.name} ({candidate.flops_share:.1%} of the decoding FLOPs kept)"
             + (f", fine-tuning continued from attempt {attempt.continues}" if previous is not None else ""))
        outcome = run_compress(attempt_settings, on_stage)
        outcomes.append(outcome)
        judged = _judged(outcome, candidate.candidate.beam)
        speedups = _measured_speedups(outcome, candidate.candidate.beam)
        step = search.decide(AttemptResult(judged.delta, speedups))
        records.append(AttemptRecord(
            attempt=number, dir=os.path.basename(attempt_dir), shape=candidate,
            continued_from=None if previous is None else os.path.basename(previous),
            finetune_updates=outcome.report.finetune.updates if outcome.report.finetune else 0,
            metric=judged.metric, unpruned=judged.unpruned, compressed=judged.compressed, delta=judged.delta,
            p_value=judged.p_value, samples=judged.samples, speedups=speedups, decision=step.decision))
        tell(number, f"{judged.metric} {judged.delta:+.2f} (tolerance -{settings.max_bleu_loss:g}), "
             + ", ".join(f"{value:.2f}x at batch {batch}" for batch, value in speedups.items())
             + f" like for like: {step.decision}")
        attempt = step.next
    report = SpeedupReport(checkpoint=os.path.abspath(settings.checkpoint), target=settings.target.text,
                           factor=settings.target.factor, max_bleu_loss=settings.max_bleu_loss, plan=plan,
                           attempts=records)
    report.result = _result(settings, report, records[search.best()])
    files = [os.path.join(settings.out_dir, name) for name in (REPORT_JSON, REPORT_MARKDOWN)]
    write_json(report.to_dict(), files[0], indent=1)
    write_text(speedup_report_markdown(report), files[1])
    return SpeedupOutcome(report, outcomes, files)


def _attempt_dir(out_dir: str, number: int) -> str:
    return os.path.join(out_dir, f"attempt-{number}")


def _seed_attempt(attempt: CompressSettings, previous: str, stages: Sequence[str]) -> None:
    """An attempt starts with an earlier attempt's ``stages`` (hard links: nothing is copied), under its own
    record: a continued fine-tuning takes its layers, Fisher scores, search and distilled data; any later
    attempt, the distilled data (the unpruned model's translations do not depend on the shape)."""
    open_out_dir(attempt.out_dir, run_identity(attempt))
    for stage in stages:
        source = os.path.join(previous, stage)
        if os.path.isfile(os.path.join(source, STAGE_RECORD)):
            shutil.copytree(source, os.path.join(attempt.out_dir, stage), copy_function=os.link)


@dataclass(frozen=True)
class _Judged:
    """The score an attempt is judged by: the compressed model at the shape's beam against the unpruned model at
    the run's."""

    metric: str
    unpruned: float
    compressed: float
    delta: float
    p_value: float
    samples: Optional[int]


def _judged(outcome: CompressOutcome, beam: Optional[int]) -> _Judged:
    evaluation = outcome.report.evaluation
    samples = evaluation.test.get("samples")
    if beam is None:
        return _Judged(evaluation.label, evaluation.unpruned, evaluation.compressed, evaluation.delta,
                       evaluation.p_value, samples)
    row = next((r for r in evaluation.beams if r.beam == beam), None)
    if row is None:
        raise StudyError(f"an attempt at beam {beam} was not evaluated at that beam (--speed-beams)")
    return _Judged(evaluation.label, evaluation.unpruned, row.compressed, row.delta_vs_run_beam,
                   row.p_value_vs_run_beam, samples)


def _measured_speedups(outcome: CompressOutcome, beam: Optional[int]) -> Dict[str, float]:
    """The compressed model's speed-up like for like with the vocabulary map (CTranslate2), per batch size: at
    the shape's beam against the unpruned model at the run's."""
    speed = outcome.report.speed
    if beam is None:
        return compressed_speedups(speed.rows)
    return compressed_speedups([row for row in speed.beam_rows if row.beam == beam], against_run_beam=True)


# ----------------------------------------------------------------------------- the plan


def plan_stage(settings: CompressSettings, work: str) -> PlanRecord:
    """Export every candidate of ``candidate_ladder`` with the vocabulary map, time them all against the unpruned
    model (with and without its map) in one rotated run on the Fisher split's first sentences, each generating
    the split's mean target length, and choose (``choose_candidate``)."""
    evaluation, deployment = settings.evaluation, settings.deployment
    family = family_named(settings.family)
    cfg, task, model = family.load(settings.data, settings.checkpoint, evaluation.generation_args, cpu=True)
    search_settings, costs = search_costs(settings.search_settings(settings.checkpoint, work), cfg, task, model)
    full = costs.full_cost()
    split = settings.importance.subsets[0]
    _, target_length = split_mean_lengths(task, split)
    beam = int(cfg.generation.beam)
    quantization = settings.table_quantization
    depths = model_depths(model)
    smaller = [b for b in SMALLER_BEAMS if b < beam] if settings.allow_beam else []
    ladder = candidate_ladder(depths, beams=smaller)
    planned: List[PlannedCandidate] = []
    threads, device = torch.get_num_threads(), ctranslate2_device(evaluation.cpu)
    progress = tqdm(total=len(ladder) + 1, desc="plan: exporting shapes", unit="shape",
                    disable=not evaluation.progress, leave=False)
    with tempfile.TemporaryDirectory(prefix="headprune-plan-") as directory:
        vmap = os.path.join(directory, "vmap.txt")
        vocabulary_map_for(task, ExportSettings.vocabulary_map_candidates, ExportSettings.vocabulary_map_common, vmap)
        specs = []

        def add(name: str, path: str, use_vmap: bool, at_beam: Optional[int] = None) -> None:
            options = DecodingOptions.fixed_length(at_beam or beam, target_length).to_dict()
            specs.append(SystemSpec(name, CTRANSLATE2, "variant", quantization, path, family=family.name,
                                    threads=threads, device=device, options=options, use_vmap=use_vmap))

        reference = os.path.join(directory, "unpruned")
        _export_shape(family, cfg, task, model, 1.0, quantization, vmap, reference)
        add(REFERENCE, reference, True)
        add(STOCK, reference, False)
        progress.update(1)
        shapes: Dict[tuple, tuple] = {}  # (layers, width) -> its export and share: the smaller beams share them
        for candidate in ladder:
            shape = (candidate.dropped, candidate.width)
            if shape not in shapes:
                dropped = {stack: list(range(depths[stack] - count, depths[stack]))
                           for stack, count in candidate.drop_counts.items()}
                path = os.path.join(directory, f"shape-{len(shapes)}")
                with layers_removed(model, dropped):
                    kept = layer_costs(search_settings, model).cost_of(*_uniform_masks(model, candidate.width))
                    _export_shape(family, cfg, task, model, candidate.width, quantization, vmap, path)
                shapes[shape] = (path, kept / full)
            path, share = shapes[shape]
            planned.append(PlannedCandidate(candidate, share))
            add(candidate.name, path, True, candidate.beam)
            progress.update(1)
        progress.close()
        sentences = _plan_sentences(task, split, deployment.batch_sizes)
        run = time_systems(specs, deployment.batch_sizes, deployment.repeats, sentences=sentences)
    map_gain = {}
    for passes in run.passes:
        batch = str(passes.batch_size)
        reference_seconds = passes.seconds[REFERENCE]
        map_gain[batch] = paired_speedup(passes.seconds[STOCK], reference_seconds)  # the map's own speed-up
        for planned_candidate in planned:
            planned_candidate.speedups[batch] = paired_speedup(reference_seconds,
                                                               passes.seconds[planned_candidate.candidate.name])
    record = PlanRecord(factor=settings.target.factor, batch_sizes=list(deployment.batch_sizes),
                        quantization=quantization, split=split, sentences=PLAN_SENTENCES, beam=beam,
                        target_length=target_length, repeats=deployment.repeats,
                        candidates=planned, map_gain=map_gain, environment=run.environment)
    record.out_of_order = out_of_order(planned)
    record.chosen = choose_candidate(planned, settings.target.factor)
    return record


def _uniform_masks(model, width: float):
    """Every layer keeping its first ``kept_units`` heads and neurons (the shape alone matters to the timing)."""
    head_mask = {t: torch.ones(shape) for t, shape in head_layout(model).items()}
    ffn_mask = {t: torch.ones(shape) for t, shape in ffn_layout(model).items()}
    for masks in (head_mask, ffn_mask):
        for mask in masks.values():
            mask[:, kept_count(mask.shape[1], width):] = 0.0
    return head_mask, ffn_mask


def _export_shape(family, cfg, task, model, width: float, quantization: str, vmap: str, path: str) -> None:
    """The model (its layers as they are now) narrowed uniformly to ``width``, exported with the vocabulary map."""
    try:
        save_masked_spec(family, cfg, task, model, *_uniform_masks(model, width), quantization, path, vmap)
    finally:
        set_head_mask(model, None)
        set_ffn_mask(model, None)


def _plan_sentences(task, split: str, batch_sizes) -> Dict[int, Dict[str, list]]:
    """The first ``PLAN_SENTENCES`` sources of ``split`` in CTranslate2's tokens, in batches of each size."""
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


def _result(settings: CompressSettings, report: SpeedupReport, chosen: AttemptRecord) -> SpeedupResult:
    """The attempt deployed, with the plan's timing of its shape (uniform narrowing, fixed length, the Fisher
    split) beside the speed-up measured on the compressed model (its searched mask, its own translations)."""
    attempt_dir = os.path.join(settings.out_dir, chosen.dir)
    timed = next(p.speedups for p in report.plan.candidates if p.candidate == chosen.shape.candidate)
    prediction = {batch: Prediction(timed[batch], measured) for batch, measured in chosen.speedups.items()
                  if batch in timed}
    return SpeedupResult(
        attempt=chosen.attempt, speedups=dict(chosen.speedups), delta=chosen.delta, p_value=chosen.p_value,
        samples=chosen.samples, prediction=prediction, report=os.path.join(chosen.dir, REPORT_MARKDOWN),
        checkpoint=os.path.abspath(os.path.join(attempt_dir, "shrink", CHECKPOINT)),
        exported=os.path.abspath(os.path.join(attempt_dir, "export", "compressed")))
