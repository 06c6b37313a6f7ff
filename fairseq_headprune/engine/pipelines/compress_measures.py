"""``compress``'s measuring stages: ``evaluate/`` (both models on the evaluation split, each in its own resumable
sweep, tested against each other, also at ``--speed-beams``) and ``speed/`` (both models and their exports timed,
each in its own process)."""

import dataclasses
import os

import torch

from fairseq_headprune.engine.compression.deployment import deployment_environment, measure_speed
from fairseq_headprune.engine.families import family_named
from fairseq_headprune.engine.pipelines.compress_stages import Stages
from fairseq_headprune.engine.pipelines.shallow import CHECKPOINT
from fairseq_headprune.errors import StudyError
from fairseq_headprune.study.compression.records import (
    BeamResult,
    EvaluationRecord,
    ExportRecord,
    FinetuneStageRecord,
    SpeedRecord,
)
from fairseq_headprune.study.compression.settings import CompressSettings
from fairseq_headprune.study.importance.ablation import BASELINE, HeadConfig, baseline_config


def evaluate_stage(settings: CompressSettings, stages: Stages, work: str) -> EvaluationRecord:
    """Both models on the evaluation split, each in its own (resumable) sweep, compared by the paired test."""
    evaluation = settings.evaluation
    family = family_named(settings.family)
    sweeps, scores = {}, {}
    models = [("unpruned", settings.checkpoint), ("compressed", stages.path("shrink", CHECKPOINT))]
    finetuned = stages.record("finetune", FinetuneStageRecord) if "finetune" in settings.stages else None
    before = finetuned.before if finetuned is not None else None
    if before is not None:  # the same pruned model before fine-tuning: what the fine-tuning recovered
        models.append(("before_finetune", stages.path("finetune", before)))
    for weights, checkpoint in models:
        sweep_settings = dataclasses.replace(evaluation, checkpoint=checkpoint, out_dir=os.path.join(work, weights))
        cfg, task, model = family.load(settings.data, checkpoint, sweep_settings.generation_args, cpu=evaluation.cpu)
        sweep = family.open_split_sweep(sweep_settings, cfg, task, model, evaluation.gen_subset,
                                        evaluation.gen_subset)
        sweeps[weights], scores[weights] = sweep, sweep.run([baseline_config()], None)[BASELINE]
    if len(scores["unpruned"].stats) != len(scores["compressed"].stats):
        raise StudyError(f"the two models were scored on different sentences of {evaluation.gen_subset}")
    compressed = dataclasses.replace(scores["compressed"], name="compressed")
    baseline, rows = sweeps["unpruned"].compare({BASELINE: scores["unpruned"], "compressed": compressed},
                                                [baseline_config(), HeadConfig("compressed", None)])
    metric, row = evaluation.metric, rows[0]
    beams = [_at_beam(settings, family, beam, models[:2], sweeps["unpruned"], scores["unpruned"], work)
             for beam in settings.deployment.beams]
    return EvaluationRecord(
        metric=metric.name, label=metric.label, description=metric.description,
        higher_is_better=metric.higher_is_better, split=evaluation.gen_subset, sentences=len(baseline.stats),
        unpruned=sweeps["unpruned"].baseline_score(baseline), compressed=row[metric.column],
        delta=row["delta"], p_value=row["p_value"], significant=row["significant"],
        ci_low=row["ci_low"], ci_high=row["ci_high"], test=evaluation.test,
        before_finetune=(sweeps["before_finetune"].baseline_score(scores["before_finetune"])
                         if "before_finetune" in sweeps else None),
        beams=beams, extra=family.evaluation_record(scores),
    )


def _at_beam(settings: CompressSettings, family, beam: int, models, run_sweep, run_unpruned,
             work: str) -> BeamResult:
    """Both models evaluated at ``beam`` (their own resumable sweeps), the compressed one tested against the
    unpruned one at that beam (like for like) and at the run's beam (what a smaller beam costs in deployment)."""
    evaluation = settings.evaluation
    arguments = [*evaluation.generation_args, "--beam", str(beam)]
    sweeps, scores = {}, {}
    for weights, checkpoint in models:
        sweep_settings = dataclasses.replace(evaluation, checkpoint=checkpoint, generation_args=arguments,
                                             out_dir=os.path.join(work, f"beam-{beam}", weights))
        cfg, task, model = family.load(settings.data, checkpoint, arguments, cpu=evaluation.cpu)
        sweeps[weights] = family.open_split_sweep(sweep_settings, cfg, task, model, evaluation.gen_subset,
                                                  evaluation.gen_subset)
        scores[weights] = sweeps[weights].run([baseline_config()], None)[BASELINE]
    compressed = dataclasses.replace(scores["compressed"], name="compressed")
    configs = [baseline_config(), HeadConfig("compressed", None)]
    baseline, (same_beam,) = sweeps["unpruned"].compare({BASELINE: scores["unpruned"], "compressed": compressed},
                                                        configs)
    _, (run_beam,) = run_sweep.compare({BASELINE: run_unpruned, "compressed": compressed}, configs)
    metric = evaluation.metric
    return BeamResult(beam=beam, unpruned=sweeps["unpruned"].baseline_score(baseline),
                      compressed=same_beam[metric.column], delta=same_beam["delta"], p_value=same_beam["p_value"],
                      delta_vs_run_beam=run_beam["delta"], p_value_vs_run_beam=run_beam["p_value"])


def speed_stage(settings: CompressSettings, stages: Stages, work: str) -> SpeedRecord:
    """Both models (and their exports) timed each in its own process, in the precision the evaluation
    translates in (``DeploymentSettings.precision``)."""
    evaluation, deployment = settings.evaluation, settings.deployment
    family = family_named(settings.family)
    device = torch.device(deployment.device)  # where it is deployed (checked by run_compress), not where it trained
    arguments, precision = list(evaluation.generation_args), deployment.precision
    checkpoints = {"unpruned": settings.checkpoint, "compressed": stages.path("shrink", CHECKPOINT)}
    export = stages.record("export", ExportRecord) if "export" in settings.stages else None
    exported = {} if export is None or not family.times_exported_models else {  # decoding is timed: translation
        (name, export.quantization): stages.path("export", name) for name in ("unpruned", "compressed")
        if name in export.models}
    mapped = ("unpruned", "compressed") if settings.vocabulary_map else ()
    rows, options, machine = measure_speed(family.name, checkpoints, exported, settings.data, evaluation.gen_subset,
                                           arguments, deployment, device, precision, vocabulary_mapped=mapped,
                                           export_format=settings.export_format)
    beam_rows = []
    for beam in deployment.beams:  # the same systems at other beam sizes (translation: options are known)
        at_beam, _, _ = measure_speed(family.name, checkpoints, exported, settings.data, evaluation.gen_subset,
                                      arguments, deployment, device, precision,
                                      options=dataclasses.replace(options, beam=beam), vocabulary_mapped=mapped,
                                      run_beam_options=options, export_format=settings.export_format)
        for row in at_beam:
            row.beam = beam
        beam_rows += at_beam
    environment = {**deployment_environment(device, deployment.threads), **machine}
    return SpeedRecord(split=evaluation.gen_subset, environment=environment, settings=deployment,
                       unit=family.speed_unit, decoding=options, rows=rows,
                       beam_rows=beam_rows)


def split_score(settings: CompressSettings, checkpoint: str, split: str, out_dir: str) -> float:
    """One model's score on ``split`` (BLEU, accuracy, perplexity), translated or scored by the studies' resumable
    sweep in ``out_dir`` with the run's generation options."""
    evaluation = settings.evaluation
    family = family_named(settings.family)
    sweep_settings = dataclasses.replace(evaluation, checkpoint=checkpoint, out_dir=out_dir, gen_subset=split)
    cfg, task, model = family.load(settings.data, checkpoint, sweep_settings.generation_args, cpu=evaluation.cpu)
    sweep = family.open_split_sweep(sweep_settings, cfg, task, model, split, split)
    return sweep.baseline_score(sweep.run([baseline_config()], None)[BASELINE])
