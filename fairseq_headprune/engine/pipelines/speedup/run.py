"""``compress --target speedup=Nx``: measure candidate shapes in the export engine (``speedup.plan``), compress to the
least damaged shape fast enough, and keep the BLEU within the tolerance by continuing the fine-tuning or backing
off (``study.compression.speedup.search``), every decision on the decision split; then evaluate and time the
result on the run's own split once.

The run's directory holds ``cost/`` (what one unit of each stage's work took here: the estimate printed before
the plan), ``plan/`` (a stage as ``compress`` writes them: the candidates' measured speed-ups and
damage), one ``attempt-N/`` per compression tried, each a whole ``compress`` run (decoding-FLOPs target, whole
layers removed) evaluated and timed on the decision split, and ``result/``: the attempt deployed, its stages
linked, evaluated and timed on the run's ``--gen-subset``; each resumes as any ``compress`` run does.
OUT/report.json and OUT/report.md gather the plan, every attempt and the result.
"""

import dataclasses
import json
import os
import shutil
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from fairseq_headprune.engine.export.engines import export_engine
from fairseq_headprune.engine.finetune.data import finetune_data
from fairseq_headprune.engine.finetune.held import check_finetune_here
from fairseq_headprune.engine.pipelines.compress import CompressOutcome, run_compress, run_identity
from fairseq_headprune.engine.pipelines.compress_stages import (
    RECORD as RUN_RECORD,
)
from fairseq_headprune.engine.pipelines.compress_stages import (
    STAGE_RECORD,
    StageCallback,
    Stages,
    open_out_dir,
)
from fairseq_headprune.engine.pipelines.export import deploy_device
from fairseq_headprune.engine.pipelines.shallow import CHECKPOINT
from fairseq_headprune.engine.pipelines.speedup.cost import cost_stage
from fairseq_headprune.engine.pipelines.speedup.halves import write_validation_halves
from fairseq_headprune.engine.pipelines.speedup.plan import plan_stage
from fairseq_headprune.errors import StudyError
from fairseq_headprune.study.compression.records import EvaluationRecord, Prediction, ScoreChange
from fairseq_headprune.study.compression.settings import STAGES, CompressSettings
from fairseq_headprune.study.compression.speed import Speedups, compressed_speedup_lows, compressed_speedups
from fairseq_headprune.study.compression.speedup.cost import ChosenShape, CostProbe, cost_lines, stage_costs
from fairseq_headprune.study.compression.speedup.records import (
    AttemptRecord,
    FinetuneSummary,
    HalvesRecord,
    PlanRecord,
    SpeedupReport,
    SpeedupResult,
)
from fairseq_headprune.study.compression.speedup.report import speedup_report_markdown, unreached_report_markdown
from fairseq_headprune.study.compression.speedup.rules import AttemptResult, unreached_text
from fairseq_headprune.study.compression.speedup.runs import attempt_run, on_halves, reported_run
from fairseq_headprune.study.compression.speedup.search import AttemptPlan, SpeedupSearch
from fairseq_headprune.study.compression.speedup.settings import SPEEDUP_STAGES, STOP_SHARE_OF_TOLERANCE
from fairseq_headprune.study.compression.speedup.shapes import PlannedCandidate, disturbed_plan_text
from fairseq_headprune.study.output.files import write_json, write_text

REPORT_JSON, REPORT_MARKDOWN = "report.json", "report.md"
RESULT_DIR = "result"  # the attempt deployed, evaluated and timed on the run's own split
SEEDED_STAGES = ("layers", "fisher", "search", "distill")  # what a continued fine-tuning takes from its attempt
TEACHER_STAGES = ("distill",)  # what every later attempt takes from the first
MEASURED_STAGES = ("evaluate", "speed")  # what the result measures again on the run's own split
HALVES_DATA = "data"  # --decision-half: the data directory with the decision split's halves, in OUT/halves


@dataclass
class SpeedupOutcome:
    """What ``run_speedup`` did: its report (None after a dry run), each attempt's compress outcome and the files
    written."""

    report: Optional[SpeedupReport]
    attempts: List[CompressOutcome] = field(default_factory=list)
    files: List[str] = field(default_factory=list)


def run_speedup(settings: CompressSettings, on_stage: Optional[StageCallback] = None,
                on_attempt_start: Optional[Callable[[int, PlannedCandidate, Optional[int]], None]] = None,
                on_attempt: Optional[Callable[[AttemptRecord], None]] = None,
                on_warning: Optional[Callable[[str], None]] = None,
                on_cost: Optional[Callable[[List[str]], None]] = None, dry_run: bool = False) -> SpeedupOutcome:
    """Plan (or resume the plan), then run the attempts ``SpeedupSearch`` asks for, one compress run each, handing
    it every attempt's result, until it accepts one or gives up. ``on_attempt_start(number, shape, continues)``
    hears each attempt's shape before it runs (``continues``: the attempt whose fine-tuning it continues, or None),
    ``on_attempt(record)`` its record once decided on (what report.json holds), ``on_warning(text)`` a plan whose
    timings contradict the shapes' order, ``on_cost(lines)`` the estimate of each stage's cost, before the plan
    and again once it has chosen a shape; ``dry_run``: stop after the first estimate (no report)."""
    if not os.path.isdir(settings.data):
        raise StudyError(f"data directory not found: {settings.data}")
    if not os.path.isfile(settings.checkpoint):
        raise StudyError(f"checkpoint not found: {settings.checkpoint}")
    deploy_device(settings.deployment.device, export_engine(settings.export_format))  # before the plan times there
    check_finetune_here(settings.finetune, settings.evaluation.cpu, settings.checkpoint, settings.data,
                        settings.family, settings.checkpoint if settings.distill == "word" else None)
    open_out_dir(settings.out_dir, run_identity(settings), SPEEDUP_STAGES)
    stages = Stages(settings.out_dir, on_stage)
    if settings.speedup.decision_half:
        stages.run("halves", lambda work: _halves_stage(settings, work))
        settings = _on_halves(settings, stages)
    settings = with_finetune_data(settings)
    if stages.record("plan", PlanRecord) is None:  # a run past its plan measures nothing more
        stages.run("cost", lambda work: cost_stage(settings, work), feeds_later=False)
    probe = stages.record("cost", CostProbe)
    if on_cost is not None and probe is not None:
        on_cost(cost_lines(probe, stage_costs(probe)))
    if dry_run:
        return SpeedupOutcome(None)
    stages.run("plan", lambda work: plan_stage(settings, work))
    plan = stages.record("plan", PlanRecord)
    planned = plan.candidates
    if on_cost is not None and probe is not None and plan.chosen is not None:
        chosen = ChosenShape(planned[plan.chosen].flops_share, planned[plan.chosen].speedups.slowest)
        on_cost(cost_lines(probe, stage_costs(probe, chosen), chosen))
    if plan.chosen is None:  # the table is kept: a user sees how near the fastest shape came
        path = os.path.join(settings.out_dir, REPORT_MARKDOWN)
        why = unreached_text(planned, settings.target.factor)
        write_text(unreached_report_markdown(plan, settings.target.text, os.path.abspath(settings.checkpoint), why),
                   path)
        raise StudyError(f"{why} (every shape timed: {path})")
    if plan.out_of_order and on_warning is not None:
        on_warning(disturbed_plan_text(plan.out_of_order, os.path.join(settings.out_dir, "plan")))
    search = SpeedupSearch(planned, plan.chosen, settings.target.factor, settings.speedup.max_bleu_loss,
                           settings.speedup.max_attempts, settings.finetune.enabled)
    outcomes: List[CompressOutcome] = []
    attempt_settings: List[CompressSettings] = []
    records: List[AttemptRecord] = []
    attempt: Optional[AttemptPlan] = search.first()
    while attempt is not None:
        number = len(outcomes) + 1
        candidate = planned[attempt.shape]
        attempt_dir = _attempt_dir(settings.out_dir, number)
        previous = None if attempt.continues is None else _attempt_dir(settings.out_dir, attempt.continues)
        current = _attempt_settings(settings, plan, candidate, attempt_dir, previous,
                                    None if previous is None else outcomes[attempt.continues - 1])
        if not os.path.isdir(attempt_dir):
            if previous is not None:
                _seed(current, previous, SEEDED_STAGES)
            elif outcomes:  # the unpruned teacher's translations serve every shape
                _seed(current, _attempt_dir(settings.out_dir, 1), TEACHER_STAGES)
        if on_attempt_start is not None:
            on_attempt_start(number, candidate, attempt.continues)
        outcome = run_compress(current, on_stage, fine_tune_checked=True)
        outcomes.append(outcome)
        attempt_settings.append(current)
        score = _score(outcome.report.evaluation, candidate.candidate.beam)
        speedups = _measured_speedups(outcome, candidate.candidate.beam)
        lows = _measured_speedups(outcome, candidate.candidate.beam, lows=True)
        finetune = _finetune_summary(outcome)
        step = search.decide(AttemptResult(score.delta, speedups, finetune.stopped, speedup_lows=lows))
        records.append(AttemptRecord(
            attempt=number, dir=os.path.basename(attempt_dir), shape=candidate,
            continued_from=None if previous is None else os.path.basename(previous), finetune=finetune,
            score=score, speedups=speedups, decision=step.decision, seconds=_stage_seconds(outcome),
            speedup_lows=lows))
        if on_attempt is not None:
            on_attempt(records[-1])
        attempt = step.next
    report = SpeedupReport(checkpoint=os.path.abspath(settings.checkpoint), target=settings.target.text,
                           factor=settings.target.factor, max_bleu_loss=settings.speedup.max_bleu_loss, plan=plan,
                           attempts=records,
                           halves=stages.record("halves", HalvesRecord) if settings.speedup.decision_half else None)
    best = search.best()
    report.result = _result(settings, report, records[best], attempt_settings[best], on_stage)
    files = [os.path.join(settings.out_dir, name) for name in (REPORT_JSON, REPORT_MARKDOWN)]
    write_json(report.to_dict(), files[0], indent=1)
    write_text(speedup_report_markdown(report), files[1])
    return SpeedupOutcome(report, outcomes, files)


def _halves_stage(settings: CompressSettings, work: str) -> HalvesRecord:
    """The decision split dealt into the half that fits and the half that decides (``halves``)."""
    outcome = write_validation_halves(settings.data, settings.speedup.decision_subset,
                                      os.path.join(work, HALVES_DATA))
    # the data's path once the stage is complete (the work directory is renamed)
    return HalvesRecord(**{**dataclasses.asdict(outcome), "data": os.path.join(settings.out_dir, "halves",
                                                                                  HALVES_DATA)})


def _on_halves(settings: CompressSettings, stages: Stages) -> CompressSettings:
    """The run's settings on its halves, once they are written (``runs.on_halves``)."""
    halves = stages.record("halves", HalvesRecord)
    if halves is None:  # compress_shape on a run made without --decision-half
        raise StudyError(f"{settings.out_dir} holds no halves: run compress --target speedup=Nx --decision-half "
                         "there first, or leave out --decision-half")
    return on_halves(settings, stages.path("halves", HALVES_DATA), halves.fit, halves.decide)


def with_finetune_data(settings: CompressSettings) -> CompressSettings:
    """The run's settings with the fine-tuning's data counted (``FinetuneStop.data``), so that its validations
    come at the interval the data sets, where no interval is given."""
    finetune = settings.finetune
    until = finetune.until
    if until is None or until.interval or (until.data is not None and until.data.validation == until.subset):
        return settings  # no interval to set, or counted already (--finetune-epochs, by the command)
    data = finetune_data(settings.checkpoint, settings.data, settings.family, finetune, until.subset)
    return dataclasses.replace(settings, finetune=dataclasses.replace(
        finetune, until=dataclasses.replace(until, data=data)))


def _read_json(path: str) -> dict:
    with open(path, encoding="utf-8") as stream:
        return json.load(stream)


def _attempt_settings(settings: CompressSettings, plan, candidate: PlannedCandidate, attempt_dir: str,
                      previous: Optional[str], continued: Optional[CompressOutcome]) -> CompressSettings:
    """The compress run of one attempt: the shape's layers as the plan chose them, its decoding-FLOPs share, the
    fine-tuning stopping within ``STOP_SHARE_OF_TOLERANCE`` of the tolerance of the unpruned model's score on the
    split it validates on (the decision split, or with ``--decision-half`` the fit half; at the shape's beam); a
    continued one from the attempt it continues, at its learning rate."""
    stop = settings.finetune.until
    if stop is not None and plan.stop_score is not None:
        generation = dict(plan.generation, beam=candidate.candidate.beam or plan.generation.get("beam"))
        stop = dataclasses.replace(stop, generation=generation, remove_bpe=plan.remove_bpe,
                                   target=plan.stop_score - STOP_SHARE_OF_TOLERANCE * settings.speedup.max_bleu_loss)
    return attempt_run(
        settings,         candidate.flops_share, plan.layer_choices.get(candidate.candidate.layers_name), attempt_dir,
        finetune_from=None if previous is None else os.path.join(previous, "finetune", CHECKPOINT),
        beam=candidate.candidate.beam,
        finetune_lr=None if continued is None else continued.report.finetune.lr, finetune_stop=stop,
        width=candidate.candidate.width)


def _attempt_dir(out_dir: str, number: int) -> str:
    return os.path.join(out_dir, f"attempt-{number}")


def _seed(attempt: CompressSettings, previous: str, stages: Sequence[str]) -> None:
    """A compress run starts with an earlier one's ``stages`` (hard links: nothing is copied), under its own
    record: a continued fine-tuning takes its layers, Fisher scores, search and distilled data; any later
    attempt, the distilled data (the unpruned model's translations do not depend on the shape); the result, all
    but what it measures again."""
    open_out_dir(attempt.out_dir, run_identity(attempt), STAGES)
    for stage in stages:
        source = os.path.join(previous, stage)
        if os.path.isfile(os.path.join(source, STAGE_RECORD)):
            shutil.copytree(source, os.path.join(attempt.out_dir, stage), copy_function=os.link)


def _score(evaluation: EvaluationRecord, beam: Optional[int]) -> ScoreChange:
    """The score an attempt is judged by (or the result reported by): the compressed model at the shape's beam
    against the unpruned model at the run's."""
    change = evaluation.change(beam)
    if change is None:
        raise StudyError(f"an attempt at beam {beam} was not evaluated at that beam (--speed-beams)")
    return change


def _stage_seconds(outcome: CompressOutcome, stages: Sequence[str] = ()) -> Dict[str, float]:
    """Each stage's seconds as it ran (``stages``: only those); a stage linked from an earlier attempt has that
    attempt's (``SpeedupReport.minutes`` counts it once)."""
    return {stage: status.seconds for stage, status in outcome.report.stages.items()
            if status.seconds is not None and (not stages or stage in stages)}


def _finetune_summary(outcome: CompressOutcome) -> FinetuneSummary:
    finetune = outcome.report.finetune
    if finetune is None:
        return FinetuneSummary()
    return FinetuneSummary(finetune.updates, finetune.stopped, finetune.kept_updates, list(finetune.curve),
                           finetune.seconds_training, finetune.device, finetune.precision, finetune.processes)


def _measured_speedups(outcome: CompressOutcome, beam: Optional[int], lows: bool = False) -> Speedups:
    """The compressed model's speed-up like for like with the vocabulary map (exported), per batch size: at
    the shape's beam against the unpruned model at the run's; ``lows``: the low ends of their intervals over the
    timing rounds."""
    speed, measured = outcome.report.speed, compressed_speedup_lows if lows else compressed_speedups
    if beam is None:
        return measured(speed.rows)
    return measured([row for row in speed.beam_rows if row.beam == beam], against_run_beam=True)


def _result(settings: CompressSettings, report: SpeedupReport, chosen: AttemptRecord, attempt: CompressSettings,
            on_stage: Optional[StageCallback], result_dir: Optional[str] = None) -> SpeedupResult:
    """The attempt deployed, evaluated and timed once on the run's own split (in ``OUT/result``, its other stages
    linked from the attempt's), with the plan's timing of its shape (uniform narrowing, fixed length, the Fisher
    split) beside the speed-up measured there."""
    result_dir = result_dir or os.path.join(settings.out_dir, RESULT_DIR)
    reported = reported_run(settings, attempt, result_dir)
    if not os.path.isdir(result_dir):
        _seed(reported, os.path.join(settings.out_dir, chosen.dir),
              [stage for stage in reported.stages if stage not in MEASURED_STAGES])
    outcome = run_compress(reported, on_stage, fine_tune_checked=True)
    speedups = _measured_speedups(outcome, chosen.shape.candidate.beam)
    timed = chosen.shape.speedups
    return SpeedupResult(
        attempt=chosen.attempt, decided=chosen.score,
        reported=_score(outcome.report.evaluation, chosen.shape.candidate.beam), speedups=speedups,
        prediction={batch: Prediction(timed[batch], measured) for batch, measured in speedups.items()
                    if batch in timed},
        report=os.path.join(os.path.relpath(result_dir, settings.out_dir), REPORT_MARKDOWN),
        checkpoint=outcome.report.files.checkpoint,
        exported=outcome.report.files.exported or "", seconds=_stage_seconds(outcome, MEASURED_STAGES))


def compress_shape(settings: CompressSettings, shape: int, out_dir: str,
                   on_stage: Optional[StageCallback] = None) -> Tuple[AttemptRecord, SpeedupResult]:
    """One shape of a finished speed-up run's plan (``settings.out_dir``), compressed as its attempts are (the same
    layers, search, fine-tuning and its stop rule) in ``out_dir/attempt``, judged on the decision split, then
    evaluated and timed on the run's own split in ``out_dir/result``: to set another choice of shape beside the
    plan's (``scripts/benchmarks/benchmark_shape_choice.py``)."""
    stages = Stages(settings.out_dir, None)
    plan = stages.record("plan", PlanRecord)
    if plan is None:
        raise StudyError(f"{settings.out_dir} holds no plan: run compress --target speedup=Nx there first")
    if settings.speedup.decision_half:
        settings = _on_halves(settings, stages)
    settings = with_finetune_data(settings)
    candidate = plan.candidates[shape]
    attempt_dir = os.path.join(out_dir, "attempt")
    current = _attempt_settings(settings, plan, candidate, attempt_dir, None, None)
    first = _attempt_dir(settings.out_dir, 1)
    if not os.path.isdir(attempt_dir) and os.path.isdir(first):
        # the unpruned teacher's translations; the whole first attempt where it compressed this shape
        same = _read_json(os.path.join(first, RUN_RECORD))["identity"] == run_identity(current)
        _seed(current, first, [stage for stage in current.stages if stage not in MEASURED_STAGES] if same
              else TEACHER_STAGES)
    outcome = run_compress(current, on_stage)
    score = _score(outcome.report.evaluation, candidate.candidate.beam)
    record = AttemptRecord(attempt=1, dir=os.path.relpath(attempt_dir, settings.out_dir), shape=candidate,
                           continued_from=None, finetune=_finetune_summary(outcome), score=score,
                           speedups=_measured_speedups(outcome, candidate.candidate.beam), decision="",
                           seconds=_stage_seconds(outcome))
    report = SpeedupReport(checkpoint=os.path.abspath(settings.checkpoint), target=settings.target.text,
                           factor=settings.target.factor, max_bleu_loss=settings.speedup.max_bleu_loss,
                           plan=plan, attempts=[record])
    return record, _result(settings, report, record, current, on_stage, os.path.join(out_dir, "result"))
