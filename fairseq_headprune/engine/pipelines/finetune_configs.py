"""Budhraja et al. (2020)'s protocol inside ``prune``: every pruned configuration fine-tuned, then scored again.

Section 3.1 of the paper: heads zeroed by ξ, "we fine-tune the Transformer
model for 30 epochs and the BERT model for 10 epochs", then evaluate. Here
each configuration (a budget's draw, a layer strategy, a curve's step at a
chosen level) starts from the study's checkpoint with its mask recorded
(``write_masked_start``), trains with the masked heads held at zero
(``finetune_held``: the checkpoint's own optimizer, criterion and batch
size), and is scored by the study's own sweep on the fine-tuned checkpoint.
The unpruned model fine-tuned for the same budget is the control, so that
fine-tuning's own gain is not credited to pruning.

Layout of ``OUT/finetune/``::

    results.json            the merged records (rank 0, after every share is done)
    NAME/recipe.json        how it is fine-tuned (length, learning rate, warm-up, curve, seed): another is refused
    NAME/start.pt           the masked start (removed once trained)
    NAME/train/             fairseq-train's save dir: checkpoint_last.pt every SAVE_INTERVAL updates
    NAME/checkpoint.pt      the fine-tuned checkpoint (its mask recorded; loads in generate and stock fairseq)
    NAME/eval/              the sweep that scored it
    NAME/record.json        this configuration's record, written last: a finished configuration

Each draw of a random budget is fine-tuned under its own seed (``FinetuneRecipe.for_draw``), as the paper samples
and fine-tunes each of its draws anew; the control and the configurations without draws share the first.

Where the paper sets two configurations side by side (Table 5's middle:K and
top+bottom:K ...: ``study.budhraja.pairs``), the merge also tests the two
against each other directly, on their per-sentence statistics.

Resumable at two levels: a configuration with ``record.json`` is never
redone, and one killed mid-training resumes from ``train/checkpoint_last.pt``.
Sharded: the configurations are dealt over ``--config-shard I/K`` processes,
then over the torchrun ranks of each; every fine-tune runs in a child
process of its own, outside the ranks' process group.
"""

import dataclasses
import json
import multiprocessing
import os
import shutil
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from fairseq_headprune.engine.checkpoints.info import training_history
from fairseq_headprune.engine.families import family_named
from fairseq_headprune.engine.finetune.held import (
    Stop,
    finetune_held,
    save_curve_checkpoint,
    write_masked_start,
)
from fairseq_headprune.engine.finetune.resume import resume_point, resumed_seconds, with_resume_points
from fairseq_headprune.engine.pipelines.compensation import checkpoint_compensation
from fairseq_headprune.engine.runtime.console import run_quietly
from fairseq_headprune.engine.runtime.ranks import alone, current_ranks
from fairseq_headprune.errors import HeadPruneError, StudyError
from fairseq_headprune.modules.masked_multihead_attention import current_head_mask
from fairseq_headprune.study.budhraja.budgets import Budget, draws_text
from fairseq_headprune.study.budhraja.finetune_plan import TrainingHistory, finetune_epochs, plan_line
from fairseq_headprune.study.budhraja.pairs import within_pairs
from fairseq_headprune.study.budhraja.records import CONTROL, CurvePoint, FinetuneRecord, TestAgainst
from fairseq_headprune.study.budhraja.report import markdown_finetuned
from fairseq_headprune.study.finetune.settings import FinetuneRecipe, FinetuneSettings
from fairseq_headprune.study.importance.ablation import BASELINE, ConfigScores, baseline_config, compare_with_baseline
from fairseq_headprune.study.masks.head_mask import HeadLayout, HeadMask, head_mask_to_spec
from fairseq_headprune.study.output.files import write_json, write_text
from fairseq_headprune.study.output.plots import plot_compensation, plot_recovery_curves
from fairseq_headprune.study.pruning.curves import mask_name, pruned_at_level
from fairseq_headprune.study.pruning.settings import PruneSettings

FINETUNE_DIR, RESULTS, RECORD, CHECKPOINT, CURVE = "finetune", "results.json", "record.json", "checkpoint.pt", "curve"
RECIPE = "recipe.json"  # how the configuration is being fine-tuned (FinetuneRecipe), written before it starts
TRAINED = "trained.json"  # the fine-tune's updates, learning rate, warm-up and seconds, written when it ends


@dataclass
class FinetuneConfig:
    """One configuration to fine-tune: its name, mask, what it is, and its score without fine-tuning."""

    name: str  # directory under OUT/finetune
    label: str  # what a table shows: the budget (and draw), or the order and level
    head_mask: Optional[HeadMask]  # None: the control
    score_before: float
    note: str = ""
    kind: str = "control"  # a budget's kind (level, per-layer, per-type, layers) or "curve step"
    budget: str = ""  # the configuration its draws share (a budget's label, a curve's order and level)
    percent: float = 0.0  # of all heads pruned
    draw: Optional[int] = None
    budget_of: Optional[Budget] = None  # the budget it is a draw of (its place in the paper's tables)

    @property
    def spec(self) -> str:
        return "none" if self.head_mask is None else head_mask_to_spec(self.head_mask)


def finetune_configurations(settings: PruneSettings, layout: HeadLayout, steps, budget_draws,
                            by_config: Dict[str, dict], baseline_score: float) -> List[FinetuneConfig]:
    """The control, every budget's draws, and the curves' steps at ``settings.finetune_levels``, each mask once."""
    column = settings.sweep.metric.column
    configs = [FinetuneConfig(CONTROL, "unpruned (control)", None, baseline_score, "fine-tuning alone")]
    for budget, draw, head_mask in budget_draws:
        label = budget.label if not budget.random else f"{budget.label} draw {draw}"
        configs.append(FinetuneConfig(mask_name(head_mask), label, head_mask, by_config[mask_name(head_mask)][column],
                                      budget.note, budget.kind, budget.label, budget.pruned_percent(layout),
                                      draw if budget.random else None, budget))
    for step in steps:  # a level is the steps that prune as many heads as a random level of it (rounded up)
        if step.tuning is None and any(step.pruned == pruned_at_level(level, step.total)
                                       for level in settings.finetune_levels):
            draw = f" draw {step.draw}" if step.draw is not None else ""
            curve = f"{step.scope} {step.order} {step.percent:.0f}%"
            configs.append(FinetuneConfig(step.config_name, curve + draw, step.head_mask,
                                          by_config[step.config_name][column], "", "curve step", curve, step.percent,
                                          step.draw))
    unique: Dict[str, FinetuneConfig] = {}
    for config in configs:
        unique.setdefault(config.name, config)
    return list(unique.values())


def run_finetune_configs(settings: PruneSettings, configs: Sequence[FinetuneConfig],
                         unpruned: Optional[ConfigScores] = None) -> Optional[List[FinetuneRecord]]:
    """This process's share fine-tuned and scored; on rank 0 the merged records (None elsewhere), each tested
    against the fine-tuned control and against ``unpruned``, the study's unpruned model (the paper's baseline)."""
    out = os.path.join(settings.sweep.out_dir, FINETUNE_DIR)
    os.makedirs(out, exist_ok=True)
    index, count = settings.config_shard
    ranks = current_ranks()
    mine = ranks.share([c for i, c in enumerate(configs) if i % count == index - 1])
    history = training_history(settings.sweep.checkpoint)
    # every share's configurations, so that no share mixes two recipes in one results.json
    recipe = checked_recipe(out, [(c.name, c.draw) for c in configs], settings.finetune, history)
    todo = [c for c in mine if not os.path.isfile(os.path.join(out, c.name, RECORD))]
    if todo and ranks.is_main:
        finetune = settings.finetune
        stops = finetune.curve_stops()
        print(plan_line(len(configs), len(todo), finetune.updates, finetune.epochs, len(stops) + 1 if stops else 0,
                        history), flush=True)
    for position, config in enumerate(mine, start=1):
        if not os.path.isfile(os.path.join(out, config.name, RECORD)):
            if settings.sweep.progress:
                print(f"fine-tune {position}/{len(mine)}: {config.label} ({settings.finetune.length()})", flush=True)
            _finetune_and_score(settings, config, os.path.join(out, config.name), recipe.for_draw(config.draw))
    ranks.barrier()
    if not ranks.is_main:
        return None
    return merge_records(settings, configs, out, unpruned)


def checked_recipe(out: str, configurations: Sequence[Tuple[str, Optional[int]]], finetune: FinetuneSettings,
                   history: TrainingHistory) -> FinetuneRecipe:
    """The run's fine-tuning recipe from the checkpoint ``history`` describes, after refusing any of the
    ``configurations`` (directory name under ``out``, draw) whose directory holds another."""
    recipe = finetune.recipe(history.peak_lr, history.seed)
    for name, draw in configurations:
        _check_same_recipe(os.path.join(out, name), recipe.for_draw(draw), history.seed)
    return recipe


def _check_same_recipe(work: str, recipe: FinetuneRecipe, checkpoint_seed: Optional[int]) -> None:
    """Refuse a configuration's directory that holds a fine-tune of another recipe (finished: its record; begun:
    its ``recipe.json``), which would be kept or resumed as if it were this one."""
    recorded = None
    if os.path.isfile(os.path.join(work, RECORD)):
        with open(os.path.join(work, RECORD), encoding="utf-8") as stream:
            recorded = FinetuneRecord.from_dict(json.load(stream)).recipe(checkpoint_seed)
    elif os.path.isfile(os.path.join(work, RECIPE)):
        with open(os.path.join(work, RECIPE), encoding="utf-8") as stream:
            recorded = FinetuneRecipe.from_dict(json.load(stream))
    difference = None if recorded is None else recipe.difference(recorded)
    if difference:
        raise StudyError(f"{work} holds a configuration {difference}: give another --out-dir, or remove that "
                         "directory to fine-tune it again")


def _finetune_and_score(settings: PruneSettings, config: FinetuneConfig, work: str, recipe: FinetuneRecipe) -> None:
    """One configuration: masked start, fine-tune (resumable; stopping at the curve's points to save them), the
    study's sweep on the result and on every point of the curve, its record."""
    sweep_settings = settings.sweep
    checkpoint = os.path.join(work, CHECKPOINT)
    curve_dir = os.path.join(work, CURVE)
    stops = settings.finetune.curve_stops()
    began = time.perf_counter()
    outcome = None
    if not os.path.isfile(checkpoint):
        os.makedirs(work, exist_ok=True)
        write_json(recipe.to_dict(), os.path.join(work, RECIPE))
        start = os.path.join(work, "start.pt")
        if not os.path.isfile(start):
            write_masked_start(sweep_settings.checkpoint, start, config.head_mask, None)
        if stops:
            os.makedirs(curve_dir, exist_ok=True)
            point = _curve_checkpoint(curve_dir, (stops[0][0], 0))
            if not os.path.isfile(point):
                save_curve_checkpoint(start, point)
        finetune = dataclasses.replace(with_resume_points(settings.finetune), seed=recipe.seed)  # the draw's seed
        train_dir = os.path.join(work, "train")
        resume_point(train_dir)
        began -= resumed_seconds(train_dir, start)  # the time a killed run spent is the configuration's too
        for stop in stops[:-1]:  # the curve's points on the way: train up to each, keep a copy
            point = _curve_checkpoint(curve_dir, stop)
            if not os.path.isfile(point):
                partial = _finetune_in_child(start, sweep_settings.data, train_dir, sweep_settings.family, finetune,
                                             sweep_settings.cpu, stop)
                save_curve_checkpoint(partial["checkpoint"], point)
        outcome = _finetune_in_child(start, sweep_settings.data, train_dir, sweep_settings.family, finetune,
                                     sweep_settings.cpu)
        if stops:
            save_curve_checkpoint(outcome["checkpoint"], _curve_checkpoint(curve_dir, stops[-1]))
        # what the record states of the fine-tune, kept before its checkpoint takes its place: a run stopped
        # between the two and run again finds the checkpoint and fine-tunes nothing
        write_json({key: outcome[key] for key in ("updates", "lr", "warmup")}
                   | {"seconds": time.perf_counter() - began}, os.path.join(work, TRAINED))
        os.replace(outcome["checkpoint"], checkpoint)
        shutil.rmtree(train_dir)
        os.remove(start)
    elif os.path.isfile(os.path.join(work, TRAINED)):
        with open(os.path.join(work, TRAINED), encoding="utf-8") as stream:
            outcome = json.load(stream)
        began = time.perf_counter() - outcome["seconds"]
    scores = _score(settings, checkpoint, os.path.join(work, "eval"))
    curve = [_curve_point(settings, curve_dir, stop) for stop in ([(stops[0][0], 0)] + stops if stops else [])]
    compensation = checkpoint_compensation(sweep_settings.checkpoint, checkpoint)  # Figure 2
    write_json(dict(compensation.to_dict(), before=sweep_settings.checkpoint, after=checkpoint),
               os.path.join(work, "compensation.json"), indent=1)
    plot_compensation(compensation, os.path.join(work, "compensation.png"),
                      f"{config.label}: change of each head's W_q, W_k, W_v while fine-tuning")
    budget = config.budget_of
    record = FinetuneRecord(
        config.name, config.label, config.spec, config.score_before, _metric_score(settings, scores),
        sweep_settings.metric.column, settings.finetune.length(), os.path.abspath(checkpoint), config.note,
        config.kind, config.budget, config.percent, draw=config.draw,
        tables=list(budget.tables) if budget else [], paper_level=budget.paper_level if budget else None,
        arm=budget.arm if budget else "", layer_spread=compensation.spread("mean_abs_change"),
        layer_spreads={t: compensation.spread("mean_abs_change", t) for t in compensation.layout},
        seconds=time.perf_counter() - began, curve=curve, stats=scores.stats.tolist(), hypotheses=scores.hypotheses,
        seed=recipe.seed)
    if outcome is not None:
        record.updates, record.lr, record.warmup_updates = outcome["updates"], outcome["lr"], outcome["warmup"]
    write_json(record.to_dict(), os.path.join(work, RECORD))


def _curve_checkpoint(curve_dir: str, stop: Stop) -> str:
    """Where a point of the curve is kept: ``curve/update-40.pt``, ``curve/epoch-3.pt`` (0: the masked start)."""
    return os.path.join(curve_dir, f"{stop[0]}-{stop[1]}.pt")


def _curve_point(settings: PruneSettings, curve_dir: str, stop: Stop) -> CurvePoint:
    """A point of the curve scored by the study's own sweep on its checkpoint (stored beside it, resumable)."""
    checkpoint = _curve_checkpoint(curve_dir, stop)
    scored = checkpoint[:-len(".pt")] + ".json"
    if not os.path.isfile(scored):
        scores = _score(settings, checkpoint, checkpoint[:-len(".pt")])
        state = torch.load(checkpoint, map_location="cpu", weights_only=False)
        history = state.get("optimizer_history") or [{}]
        updates = 0 if stop[1] == 0 else int(history[-1].get("num_updates", 0))  # the start: the study's checkpoint's
        write_json({"stop": stop[0], "at": stop[1], "updates": updates, "score": _metric_score(settings, scores),
                    "stats": scores.stats.tolist()}, scored)
    with open(scored) as stream:
        point = json.load(stream)
    return CurvePoint(point["stop"], point["at"], point["updates"], point["score"])


def _metric_score(settings: PruneSettings, scores: ConfigScores) -> float:
    return float(settings.sweep.metric.score(scores.stats))


def _score(settings: PruneSettings, checkpoint: str, out_dir: str) -> ConfigScores:
    """The fine-tuned checkpoint under its recorded mask, through the study's own sweep (resumable)."""
    sweep_settings = dataclasses.replace(settings.sweep, checkpoint=checkpoint, out_dir=out_dir)
    family = family_named(sweep_settings.family)
    cfg, task, model = family.load(sweep_settings.data, checkpoint, sweep_settings.generation_args,
                                   cpu=sweep_settings.cpu)
    split = sweep_settings.gen_subset
    sweep = family.open_split_sweep(sweep_settings, cfg, task, model, split, split, sweep_settings.references)
    with alone():
        return sweep.run([baseline_config()], current_head_mask(model))[BASELINE]


def _finetune_in_child(start: str, data: str, save_dir: str, family: str, finetune: FinetuneSettings,
                       cpu: bool, stop: Optional[Stop] = None) -> Dict[str, object]:
    """``finetune_held`` in a spawned process: fairseq's trainer would otherwise join the ranks' process group."""
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    child = context.Process(target=run_quietly, args=(__name__, "_finetune_child", results, start, data, save_dir,
                                                      family, finetune, cpu, torch.get_num_threads(), stop))
    child.start()
    child.join()
    answer = results.get() if not results.empty() else ("error", f"the fine-tuning process died (exit code "
                                                                  f"{child.exitcode}); rerun to resume it")
    if answer[0] == "error":
        raise StudyError(answer[1])
    return answer[1]


def _finetune_child(results, start, data, save_dir, family, finetune, cpu, threads, stop) -> None:
    torch.set_num_threads(threads)
    try:
        outcome = finetune_held(start, data, save_dir, family, finetune, cpu=cpu, progress=False, stop=stop)
    except HeadPruneError as error:
        results.put(("error", str(error)))
        return
    results.put(("ok", dataclasses.asdict(outcome)))


def merge_records(settings: PruneSettings, configs: Sequence[FinetuneConfig], out: str,
                  unpruned: Optional[ConfigScores] = None) -> List[FinetuneRecord]:
    """Every finished record in the configurations' order, tested against the fine-tuned control and the unpruned
    model, each point of its curve beside the control's at the same point; results.json, results.md, curves.png."""
    records = []
    for config in configs:
        path = os.path.join(out, config.name, RECORD)
        if os.path.isfile(path):
            with open(path) as stream:
                records.append(_with_layer_spreads(FinetuneRecord.from_dict(json.load(stream)),
                                                   os.path.join(out, config.name)))
    missing = len(configs) - len(records)
    control = next((r for r in records if r.is_control), None)
    if control is not None and len(records) > 1:
        _test_against(settings, _scores(control), [r for r in records if r is not control], "control")
    if unpruned is not None and records:
        _test_against(settings, unpruned, records, "unpruned")
    _test_pairs(settings, records)
    if control is not None:
        for record in records:
            _curve_gaps(record, control)
    history = training_history(settings.sweep.checkpoint)
    for record in records:
        record.missing_configurations = missing  # > 0: another shard has not finished; merge again after it
        record.trained_updates, record.trained_epochs = history.updates, history.epochs
    listed = [record.to_dict(detail=False) for record in records]
    write_json(listed, os.path.join(out, RESULTS), indent=1)
    if records:
        write_text(markdown_finetuned(records, settings.sweep.metric.label), os.path.join(out, "results.md"))
        if any(len(r.curve) > 1 for r in records):
            plot_recovery_curves(records, os.path.join(out, "curves.png"), settings.sweep.metric.label,
                                 _study_title(settings, history, records))
    return records


def _with_layer_spreads(record: FinetuneRecord, work: str) -> FinetuneRecord:
    """A record written before records held each attention type's layer spread gets it from its compensation.json."""
    path = os.path.join(work, "compensation.json")
    if not record.layer_spreads and os.path.isfile(path):
        with open(path) as stream:
            spreads = json.load(stream)["layer_spread"]["mean_abs_change"]
        record.layer_spreads = {t: value for t, value in spreads.items() if t != "all"}
    return record


def _study_title(settings: PruneSettings, history, records: Sequence[FinetuneRecord]) -> str:
    """What the curves' plot names: the model, the fine-tune's length and the draws."""
    epochs = finetune_epochs(settings.finetune.updates, history)
    length = settings.finetune.length() + (f" ({epochs:.1f} epochs)" if epochs and not settings.finetune.epochs else "")
    model = os.path.join(*os.path.abspath(settings.sweep.checkpoint).split(os.sep)[-3:])
    drawn = [r.group for r in records if r.draw is not None and r.kind != "curve step"]
    return (f"{model} (trained {history.describe()}); each configuration fine-tuned {length}"
            + (f"; random budgets: {draws_text([drawn.count(g) for g in set(drawn)])}" if drawn else ""))


def _scores(record: FinetuneRecord) -> ConfigScores:
    return ConfigScores(record.name, record.spec, {}, record.score_after, record.score_after,
                        np.asarray(record.stats), record.hypotheses)


def _test_against(settings: PruneSettings, baseline: ConfigScores, records: List[FinetuneRecord], against: str) -> None:
    """The study's paired test of each fine-tuned configuration against ``baseline``: the fine-tuned unpruned model
    (``against="control"``) or the unpruned model as the study scored it (``"unpruned"``, Budhraja et al.'s
    baseline)."""
    sweep = settings.sweep
    results = compare_with_baseline(baseline, [_scores(r) for r in records], sweep.test, sweep.test_metric)
    for record, result in zip(records, results):
        record.tests[against] = TestAgainst(record.score_after - _metric_score(settings, baseline), result.p_value,
                                            bool(result.p_value < sweep.test.alpha), result.delta_low,
                                            result.delta_high)
        record.significance = sweep.test.to_dict()


def _test_pairs(settings: PruneSettings, records: List[FinetuneRecord]) -> None:
    """The study's paired test of each pair the paper sets side by side (``within_pairs``: Table 5's middle:K and
    top+bottom:K, top:K and bottom:K; Table 6's odd and the halves), the first against the second directly."""
    sweep = settings.sweep
    for first, second in within_pairs(records):
        result = compare_with_baseline(_scores(second), [_scores(first)], sweep.test, sweep.test_metric)[0]
        first.paired[second.label] = TestAgainst(first.score_after - second.score_after, result.p_value,
                                                 bool(result.p_value < sweep.test.alpha), result.delta_low,
                                                 result.delta_high)


def _curve_gaps(record: FinetuneRecord, control: FinetuneRecord) -> None:
    """Each point of a record's curve gets the gap to the control's score at the same point."""
    at_point = {(p.stop, p.at): p.score for p in control.curve}
    for point in record.curve:
        reference = at_point.get((point.stop, point.at))
        point.gap_vs_control = None if reference is None else point.score - reference
