"""The ``compress`` command's work: a checkpoint to a compressed, exported and evaluated model, stage by stage.

Kwon et al. (2022)'s post-training path, with this project's commands as
its steps. Each stage writes one subdirectory of the output directory, built
in ``NAME.partial`` and renamed when it is complete, with its record in
``NAME/stage.json``; a stage whose directory exists is not run again, so an
interrupted run resumes where it stopped:

- ``layers/``: optionally, whole layers removed first, those the validation loss misses least
  (``engine.compression.layer_choice``);
- ``fisher/``: the masks' Fisher information on the validation split (``importance --importance-method fisher``);
- ``search/``: the mask within the target, rearranged and tuned (``search --tune-masks``);
- ``distill/``: optionally, the unpruned model's translations of the training sources
  (``engine.compression.distillation``);
- ``finetune/``: optionally, N updates of fairseq-train with the pruned units held (``engine.finetune.held``; with
  ``--target speedup``, until it is enough on the decision split);
- ``shrink/``: the pruned units removed for real, the tuning folded in (``shrink``): the compressed checkpoint;
- ``export/``: optionally, an export engine's models of the compressed and of the unpruned model (``export``);
- ``evaluate/``: both models on the evaluation split, tested against each other (the studies' sweeps;
  ``compress_measures``);
- ``speed/``: decoding speed of both, in fairseq and the export engine (``engine.compression.deployment``).

``OUT/compress.json`` records the run's settings: once a stage has
finished, a rerun with other settings is refused. ``OUT/report.json`` and ``OUT/report.md`` are written
from the stages' records at the end of every run.
"""

import dataclasses
import json
import math
import os
import shutil
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import torch

from fairseq_headprune.constants import FAIRSEQ_ENGINE
from fairseq_headprune.engine.checkpoints.info import checkpoint_masks
from fairseq_headprune.engine.checkpoints.shrink import checkpoint_parameters, shrink_checkpoint
from fairseq_headprune.engine.compression.deployment import time_compute_types
from fairseq_headprune.engine.export.engines import export_engine
from fairseq_headprune.engine.families import family_named
from fairseq_headprune.engine.finetune.held import (
    check_finetune_here,
    finetune_held,
    write_masked_start,
)
from fairseq_headprune.engine.finetune.resume import resume_point, with_resume_points
from fairseq_headprune.engine.pipelines.compress_measures import evaluate_stage, speed_stage
from fairseq_headprune.engine.pipelines.compress_stages import StageCallback, Stages, open_out_dir
from fairseq_headprune.engine.pipelines.export import check_quantization, deploy_device, run_export
from fairseq_headprune.engine.pipelines.importance import importance_prefix, run_importance
from fairseq_headprune.engine.pipelines.search import TUNING_FILE, run_latency, run_search
from fairseq_headprune.engine.pipelines.shallow import (
    CHECKPOINT,
    DISTILLED_DATA,
    check_layer_counts,
    distill_stage,
    layers_only_search,
    layers_only_shrink,
    layers_stage,
    prunes_units,
)
from fairseq_headprune.errors import StudyError
from fairseq_headprune.study.compression.deployment_settings import ExportSettings
from fairseq_headprune.study.compression.precision import (
    AUTO_QUANTIZATION,
    auto_candidates,
    choose_compute_type,
    only_float32_choice,
)
from fairseq_headprune.study.compression.records import (
    STAGE_RECORDS,
    CompressReport,
    DeployedFiles,
    ExportRecord,
    FinetuneStageRecord,
    FisherRecord,
    LayersRecord,
    ParameterCounts,
    SearchRecord,
    ShrinkRecord,
    StageStatus,
    WordDistillation,
    speedup_prediction,
)
from fairseq_headprune.study.compression.report import compression_report_markdown
from fairseq_headprune.study.compression.settings import STAGES, CompressSettings
from fairseq_headprune.study.masks.ffn_mask import ffn_mask_to_spec
from fairseq_headprune.study.masks.head_mask import head_mask_to_spec
from fairseq_headprune.study.output.files import (
    file_sha256,
    write_json,
    write_text,
)
from fairseq_headprune.study.search.costs import SearchBudget
from fairseq_headprune.study.search.settings import LatencySettings

BEFORE_FINETUNE = "before.pt"  # in finetune/: the pruned model before fine-tuning, removed for real
REPORT_JSON, REPORT_MARKDOWN = "report.json", "report.md"
LATENCY_TABLE = "latency.json"  # in search/: the table compress measured when --latency-table was not given


@dataclass
class CompressOutcome:
    """What ``run_compress`` did and found; ``report`` is OUT/report.json."""

    report: CompressReport
    stages: Dict[str, str] = field(default_factory=dict)  # stage -> "ran" or "kept"
    files: List[str] = field(default_factory=list)


def run_compress(settings: CompressSettings, on_stage: Optional[StageCallback] = None,
                 fine_tune_checked: bool = False) -> CompressOutcome:
    """Run (or resume) every stage, then write OUT/report.json and OUT/report.md. ``fine_tune_checked``: the
    caller has checked that the fine-tune can run here for a model at least this large (a speed-up search, at its
    start, for the unpruned model), so its checkpoint is not read again for the check."""
    # what can be checked before anything is written
    if not os.path.isdir(settings.data):
        raise StudyError(f"data directory not found: {settings.data}")
    if settings.latency_table is not None and not os.path.isfile(settings.latency_table):
        raise StudyError(f"--latency-table file not found: {settings.latency_table}")
    engine = None if settings.export_format is None else export_engine(settings.export_format)
    device = deploy_device(settings.deployment.device, engine)
    if not fine_tune_checked:
        check_finetune_here(settings.finetune, settings.evaluation.cpu, settings.checkpoint, settings.data,
                            settings.family, settings.checkpoint if settings.distill == "word" else None)
    if engine is not None and settings.quantization != AUTO_QUANTIZATION:
        check_quantization(settings.quantization, settings.evaluation.cpu, engine, device)
    if settings.drop_layers:
        check_layer_counts(settings)
    open_out_dir(settings.out_dir, run_identity(settings), STAGES)
    stages = Stages(settings.out_dir, on_stage)
    if "layers" in settings.stages:
        stages.run("layers", lambda work: layers_stage(settings, work))
    stages.run("fisher", lambda work: _fisher(settings, stages, work))
    stages.run("search", lambda work: _search(settings, stages, work))
    if "distill" in settings.stages:
        stages.run("distill", lambda work: distill_stage(settings, work))
    if "finetune" in settings.stages:
        stages.run("finetune", lambda work: _finetune(settings, stages, work), resumable=True)
    stages.run("shrink", lambda work: _shrink(settings, stages, work))
    if "export" in settings.stages:
        stages.run("export", lambda work: _export(settings, stages, work))
    stages.run("evaluate", lambda work: evaluate_stage(settings, stages, work), resumable=True)
    stages.run("speed", lambda work: speed_stage(settings, stages, work))
    report = _report(settings, stages)
    files = [os.path.join(settings.out_dir, name) for name in (REPORT_JSON, REPORT_MARKDOWN)]
    write_json(report.to_dict(), files[0], indent=1)
    write_text(compression_report_markdown(report), files[1])
    return CompressOutcome(report, dict(stages.status), files)


def run_identity(settings: CompressSettings) -> Dict[str, object]:
    """What ``OUT/compress.json`` records: the settings' identity with the checkpoint's (and table's) hash."""
    identity = settings.identity()
    identity["checkpoint_sha256"] = file_sha256(settings.checkpoint) if os.path.isfile(settings.checkpoint) else None
    if settings.latency_table and os.path.isfile(settings.latency_table):
        identity["search"]["latency_table_sha256"] = file_sha256(settings.latency_table)
    return identity


# ----------------------------------------------------------------------------- the stages


def _base_checkpoint(settings: CompressSettings, stages: Stages) -> str:
    """The model the search prunes: the unpruned checkpoint, or it without the layers ``layers/`` removed."""
    return stages.path("layers", CHECKPOINT) if "layers" in settings.stages else settings.checkpoint


def _fisher(settings: CompressSettings, stages: Stages, work: str) -> FisherRecord:
    evaluation = settings.evaluation
    result = run_importance(settings.data, _base_checkpoint(settings, stages), settings.importance, work,
                            fairseq_args=evaluation.generation_args, cpu=evaluation.cpu, progress=evaluation.progress)
    return FisherRecord(file=os.path.basename(importance_prefix(work)) + ".json",
                        subsets=list(settings.importance.subsets),
                        sentences=int(result.settings.get("sentences", result.count)),
                        neurons=settings.importance.neurons)


# the latency table's rounds per round of the speed stage: the table prices differences between variants, which need
# more passes than a ratio of two systems to stand above the timing noise (20 for the speed stage's default 5)
TABLE_ROUNDS_PER_SPEED_ROUND = 4


def _search(settings: CompressSettings, stages: Stages, work: str) -> SearchRecord:
    evaluation, target = settings.evaluation, settings.target
    # a latency target for the exported model is priced by the export engine's own table, one head count per stack
    deployed = target.cost == "latency" and settings.export_format is not None
    engine_options: Dict[str, object] = {}
    if deployed:
        engine_options.update(latency_engine=settings.export_format, latency_precision=settings.table_quantization)
    if settings.uniform:  # no padding: one head count per stack, the types the engine ties together
        tied = settings.export_format is not None and bool(export_engine(settings.export_format).tied_attention_types)
        engine_options.update(uniform=True, tie_decoder_heads=tied)
    if settings.shape.width is not None:  # the speed-up plan's shape: every layer keeps its width
        engine_options["width"] = settings.shape.width
    latency_table = settings.latency_table
    if target.cost == "latency" and latency_table is None:  # measured here, in the shape the speed stage times
        latency_table = os.path.join(work, LATENCY_TABLE)
        run_latency(LatencySettings(
            data=settings.data, checkpoint=settings.checkpoint, out=latency_table,
            batch_size=max(settings.deployment.batch_sizes),
            repeats=TABLE_ROUNDS_PER_SPEED_ROUND * settings.deployment.repeats,
            cpu=evaluation.cpu, progress=evaluation.progress, fairseq_args=list(evaluation.generation_args),
            engine=settings.export_format if deployed else FAIRSEQ_ENGINE,
            quantization=settings.table_quantization if deployed else "float32",
        ))
    search_settings = settings.search_settings(_base_checkpoint(settings, stages), work, latency_table=latency_table,
                                               fisher_file=stages.path("fisher", "importance.json"), **engine_options)
    layers = stages.record("layers", LayersRecord) if "layers" in settings.stages else None
    if layers is not None:  # the target is a share of the unpruned model's cost, not of the shallower one's
        budget = SearchBudget(amount=target.percent / 100.0 * layers.full_cost)
        if target.cost == "heads":  # the whole heads within the share
            budget = SearchBudget(amount=math.floor(budget.amount + 1e-9))
        search_settings = dataclasses.replace(search_settings, budget=budget)
        # a speed-up attempt's shape of layers alone
        if settings.attempt is not None and budget.amount >= layers.kept_cost * (1.0 - 1e-9):
            return layers_only_search(settings, _base_checkpoint(settings, stages), search_settings, layers)
    outcome = run_search(search_settings)
    result = outcome.result
    if not outcome.heads_pruned and not outcome.neurons_pruned:
        if target.cost == "latency" and outcome.costs.full_cost() <= 0.0:
            raise StudyError(f"--target {target.text}: the latency table prices every layer at 0 ms (no narrower "
                             "variant timed faster than the whole model: timing noise above what the layers cost); "
                             "time more rounds (--repeats) on an idle machine, or use a flops target")
        raise StudyError(f"--target {target.text} prunes nothing from this model; keep less")
    return SearchRecord(
        target=target.text, structure=target.structure, cost=target.cost,
        budget=result.budget, unit=result.unit, mask_cost=result.cost, full_cost=outcome.costs.full_cost(),
        heads_pruned=outcome.heads_pruned, heads_total=outcome.heads_total,
        spec=head_mask_to_spec(result.head_mask) if outcome.heads_pruned else None,
        neurons_pruned=outcome.neurons_pruned, neurons_total=outcome.neurons_total,
        ffn_spec=ffn_mask_to_spec(result.ffn_mask) if outcome.neurons_pruned else None,
        flops=outcome.flops, decoding_flops=outcome.decoding,
        tuned=outcome.tuning is not None, tuning_skipped=settings.tuning_skipped,
        tuning=None if outcome.tuning is None else outcome.tuning.summary(outcome.tuning.settings.get("sentences")),
        step_seconds=outcome.seconds,
        latency_table=None if latency_table is None else (
            LATENCY_TABLE if settings.latency_table is None else os.path.abspath(latency_table)),
        latency_table_shape=_table_shape(latency_table),
        predicted_speedup=outcome.predicted_speedup,
        prediction_note=outcome.prediction_note,
    )


def _table_shape(path: Optional[str]) -> Optional[Dict[str, object]]:
    """What the latency table timed (batch size, lengths, beam): the shape its prediction holds for."""
    if path is None:
        return None
    with open(path, encoding="utf-8") as stream:
        return json.load(stream).get("settings")


def _tuning_file(stages: Stages) -> Optional[str]:
    path = stages.path("search", TUNING_FILE)
    return path if os.path.isfile(path) else None


def _finetune(settings: CompressSettings, stages: Stages, work: str) -> FinetuneStageRecord:
    """Resumable: the masked start and the model before fine-tuning are kept in the stage's partial directory, and
    a killed fine-tune continues from its last resume point (every tenth of its updates)."""
    search = stages.record("search", SearchRecord)
    # a continued fine-tuning starts from the earlier attempt's weights, the tuning already in them
    tuning_file = None if settings.shape.finetune_from else _tuning_file(stages)
    start, train_dir = os.path.join(work, "start.pt"), os.path.join(work, "train")
    base = settings.shape.finetune_from or _base_checkpoint(settings, stages)
    head_mask, ffn_mask = checkpoint_masks(base, search.spec, search.ffn_spec)  # the record's masks, parsed once
    if not os.path.isfile(start):
        write_masked_start(base, start, head_mask, ffn_mask, tuning_file)
    evaluation = settings.evaluation
    data = stages.path("distill", DISTILLED_DATA) if "distill" in settings.stages else settings.data
    before = os.path.join(work, BEFORE_FINETUNE)
    if not os.path.isfile(before):  # the model as it was before fine-tuning, removed for real: evaluated too
        if prunes_units(search):
            shrink_checkpoint(start, before, head_mask, None, ffn_mask)
        else:  # whole layers removed only: nothing more to remove
            shutil.copyfile(start, before)
    teacher = settings.checkpoint if settings.distill == "word" else None
    resume_point(train_dir)
    outcome = finetune_held(start, data, train_dir, settings.family, with_resume_points(settings.finetune),
                            cpu=evaluation.cpu, progress=evaluation.progress, teacher=teacher,
                            distill_weight=settings.distill_weight)
    os.replace(outcome.checkpoint, os.path.join(work, CHECKPOINT))
    shutil.rmtree(os.path.join(work, "train"))
    os.remove(start)
    until = settings.finetune.until
    return FinetuneStageRecord(
        checkpoint=CHECKPOINT, before=BEFORE_FINETUNE, updates=outcome.updates, seconds_training=outcome.seconds,
        until=None if until is None else {**until.to_dict(), "ceiling": settings.finetune.updates,
                                          "interval": until.validation_interval(settings.finetune.updates),
                                          "interval_rule": until.interval_rule(settings.finetune.updates)},
        curve=outcome.curve, stopped=outcome.stopped, kept_updates=outcome.kept_updates,
        device=outcome.device, precision=outcome.precision, processes=outcome.processes,
        update_freq=outcome.update_freq, memory=outcome.memory, lr=outcome.lr, warmup_updates=outcome.warmup,
        lr_schedule="fixed after a linear warm-up",
        train_subset=outcome.train_subset, targets="distilled" if data != settings.data else "references",
        word_distillation=(None if teacher is None
                           else WordDistillation(os.path.abspath(teacher), settings.distill_weight)),
        start=("continued" if settings.shape.finetune_from else "tuned" if tuning_file is not None else "masked"))


def _shrink(settings: CompressSettings, stages: Stages, work: str) -> ShrinkRecord:
    search = stages.record("search", SearchRecord)
    out = os.path.join(work, CHECKPOINT)
    tuning_file = _tuning_file(stages)
    if not prunes_units(search):  # whole layers removed only: the (fine-tuned) shallower model as it is
        source = stages.path("finetune", CHECKPOINT) if "finetune" in settings.stages else \
            _base_checkpoint(settings, stages)
        return layers_only_shrink(settings, source, out, search)
    if "finetune" in settings.stages:  # the tuning is in its weights, the masks are recorded
        source = stages.path("finetune", CHECKPOINT)
        head_mask, ffn_mask = checkpoint_masks(source, search.spec, search.ffn_spec)  # the record's, parsed once
        outcome = shrink_checkpoint(source, out, head_mask, None, ffn_mask)
    else:  # the search's model, its tuning folded in or its mask removed
        source = _base_checkpoint(settings, stages)
        if tuning_file is not None:
            outcome = shrink_checkpoint(source, out, None, tuning_file, None)
        else:
            head_mask, ffn_mask = checkpoint_masks(source, search.spec, search.ffn_spec)
            outcome = shrink_checkpoint(source, out, head_mask, None, ffn_mask)
    write_text("\n".join(outcome.report) + "\n", os.path.join(work, "parameters.tsv"))
    return ShrinkRecord(
        checkpoint=CHECKPOINT, shrunk_from=os.path.abspath(source), tuning_folded=tuning_file is not None,
        heads_pruned=outcome.heads_pruned, heads_total=outcome.heads_total, spec=outcome.spec,
        neurons_pruned=outcome.neurons_pruned, neurons_total=outcome.neurons_total, ffn_spec=outcome.ffn_spec,
        parameters=ParameterCounts(checkpoint_parameters(settings.checkpoint), compressed=checkpoint_parameters(out)),
        report=outcome.report,
    )


def _export(settings: CompressSettings, stages: Stages, work: str) -> ExportRecord:
    evaluation = settings.evaluation
    models = {"compressed": stages.path("shrink", CHECKPOINT)}
    if family_named(settings.family).times_exported_models:  # the unpruned model exported: the speed's reference
        models["unpruned"] = settings.checkpoint
    quantization, choice = settings.quantization, None
    if quantization == AUTO_QUANTIZATION:
        quantization, choice = _choose_quantization(settings, models["compressed"], work)
    record = ExportRecord(format=settings.export_format, quantization_choice=choice)
    for name, checkpoint in models.items():
        outcome = run_export(ExportSettings(
            data=settings.data, checkpoint=checkpoint, out_dir=os.path.join(work, name), format=settings.export_format,
            quantization=quantization, cpu=evaluation.cpu or settings.deployment.device == "cpu",
            fairseq_args=list(evaluation.generation_args),
            vocabulary_map=bool(settings.vocabulary_map),
        ))
        record.quantization = outcome.quantization
        record.models[name] = {"dir": name, "num_heads": outcome.num_heads, "padded": outcome.padded,
                               "kept": outcome.kept, "vocabulary_map": outcome.vocabulary_map}
    return record


def _choose_quantization(settings: CompressSettings, checkpoint: str, work: str):
    """``--quantization auto``: the compressed model exported in float32 and timed at every candidate compute type
    this device computes, each in its own process, at the speed stage's batch sizes; the fastest within the BLEU
    tolerance of float32 (``precision_choice``). Returns the type and the record of the choice."""
    evaluation = settings.evaluation
    device = settings.deployment.device  # checked where the run started
    supported = export_engine(settings.export_format).compute_types(device)
    candidates = auto_candidates(supported, device)
    if len(candidates) < 2:
        return "float32", only_float32_choice(supported, device)
    timed_dir = os.path.join(work, "float32-timed")
    run_export(ExportSettings(data=settings.data, checkpoint=checkpoint, out_dir=timed_dir,
                              format=settings.export_format, quantization="float32",
                              cpu=evaluation.cpu or settings.deployment.device == "cpu",
                              fairseq_args=list(evaluation.generation_args)))
    timings = time_compute_types(settings.export_format, timed_dir, candidates, settings.data, checkpoint,
                                 evaluation.gen_subset, evaluation.generation_args, settings.deployment,
                                 torch.device(device))
    shutil.rmtree(timed_dir)
    choice = choose_compute_type(timings, settings.quantization_tolerance)
    choice.split, choice.sentences, choice.vocabulary_map = (evaluation.gen_subset, settings.deployment.sentences,
                                                             False)
    return choice.chosen, choice


# ----------------------------------------------------------------------------- the report


def _report(settings: CompressSettings, stages: Stages) -> CompressReport:
    """OUT/report.json: the stages' records, the files to deploy and what each stage cost."""
    records = {stage: stages.record(stage, STAGE_RECORDS[stage]) for stage in settings.stages}
    exported = records.get("export")
    return CompressReport(
        checkpoint=os.path.abspath(settings.checkpoint), data=os.path.abspath(settings.data), family=settings.family,
        target=settings.target.text, layers=records.get("layers"), distill=records.get("distill"),
        fisher=records["fisher"], search=records["search"], finetune=records.get("finetune"),
        shrink=records["shrink"], export=exported, evaluation=records["evaluate"], speed=records["speed"],
        speedup_prediction=speedup_prediction(records["search"], records["speed"]),
        files=DeployedFiles(os.path.abspath(stages.path("shrink", CHECKPOINT)),
                            None if exported is None else os.path.abspath(stages.path("export", "compressed"))),
        stages={stage: StageStatus(stages.status.get(stage), None if records[stage] is None else records[stage].seconds)
                for stage in settings.stages},
    )
