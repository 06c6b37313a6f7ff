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
    NAME/start.pt           the masked start (removed once trained)
    NAME/train/             fairseq-train's save dir: checkpoint_last.pt every SAVE_INTERVAL updates
    NAME/checkpoint.pt      the fine-tuned checkpoint (its mask recorded; loads in generate and stock fairseq)
    NAME/eval/              the sweep that scored it
    NAME/record.json        this configuration's record, written last: a finished configuration

Resumable at two levels: a configuration with ``record.json`` is never
redone, and one killed mid-training resumes from ``train/checkpoint_last.pt``.
Sharded: the configurations are dealt over ``--config-shard I/K`` processes,
then over the torchrun ranks of each; every fine-tune runs in a child
process of its own, outside the ranks' process group.
"""

import dataclasses
import glob
import json
import multiprocessing
import os
import shutil
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import numpy as np
import torch

from ...errors import HeadPruneError, StudyError
from ...study.masks.head_mask import HeadLayout, HeadMask, head_mask_to_spec
from ...study.methods.ablation import BASELINE, ConfigScores, baseline_config, compare_with_baseline
from ...study.methods.pruning import mask_name
from ...study.output.files import write_json, write_text
from ...study.output.finetune_report import markdown_finetuned
from ...study.output.plots import plot_head_heatmaps
from ...study.prune_settings import FinetuneSettings, PruneSettings
from ...modules.masked_multihead_attention import current_head_mask
from ..families import family_named
from ..methods.finetune import finetune_held, write_masked_start
from ..runtime.console import run_quietly
from .compensation import checkpoint_compensation
from ..runtime.ranks import alone, current_ranks

FINETUNE_DIR, RESULTS, RECORD, CHECKPOINT = "finetune", "results.json", "record.json", "checkpoint.pt"
CONTROL = "control"  # the unpruned model, fine-tuned alike
SAVES_PER_FINETUNE = 10  # checkpoint_last.pt this many times per fine-tune (resume points)


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
                                      budget.note, budget.kind, budget.label, budget.pruned_percent(layout)))
    for step in steps:
        if step.tuning is None and any(abs(step.percent - level) < 0.5 + 1e-9 for level in settings.finetune_levels):
            draw = f" draw {step.draw}" if step.draw is not None else ""
            curve = f"{step.scope} {step.order} {step.percent:.0f}%"
            configs.append(FinetuneConfig(step.config_name, curve + draw, step.head_mask,
                                          by_config[step.config_name][column], "", "curve step", curve, step.percent))
    unique: Dict[str, FinetuneConfig] = {}
    for config in configs:
        unique.setdefault(config.name, config)
    return list(unique.values())


def run_finetune_configs(settings: PruneSettings, configs: Sequence[FinetuneConfig]) -> Optional[List[dict]]:
    """This process's share fine-tuned and scored; on rank 0 the merged records (None elsewhere)."""
    out = os.path.join(settings.sweep.out_dir, FINETUNE_DIR)
    os.makedirs(out, exist_ok=True)
    index, count = settings.config_shard
    ranks = current_ranks()
    mine = ranks.share([c for i, c in enumerate(configs) if i % count == index - 1])
    for position, config in enumerate(mine, start=1):
        if not os.path.isfile(os.path.join(out, config.name, RECORD)):
            if settings.sweep.progress:
                print(f"fine-tune {position}/{len(mine)}: {config.label} ({settings.finetune.length()})", flush=True)
            _finetune_and_score(settings, config, os.path.join(out, config.name))
    ranks.barrier()
    if not ranks.is_main:
        return None
    return merge_records(settings, configs, out)


def _finetune_and_score(settings: PruneSettings, config: FinetuneConfig, work: str) -> None:
    """One configuration: masked start, fine-tune (resumable), the study's sweep on the result, its record."""
    sweep_settings = settings.sweep
    checkpoint = os.path.join(work, CHECKPOINT)
    began = time.perf_counter()
    outcome = None
    if not os.path.isfile(checkpoint):
        start = os.path.join(work, "start.pt")
        if not os.path.isfile(start):
            write_masked_start(sweep_settings.checkpoint, start, None if config.head_mask is None else config.spec, None)
        finetune = dataclasses.replace(settings.finetune, save_interval=_save_interval(settings.finetune))
        _whole_resume_point(os.path.join(work, "train"))
        outcome = _finetune_in_child(start, sweep_settings.data, os.path.join(work, "train"),
                                     sweep_settings.family, finetune, sweep_settings.cpu)
        os.replace(outcome["checkpoint"], checkpoint)
        shutil.rmtree(os.path.join(work, "train"))
        os.remove(start)
    scores = _score(settings, checkpoint, os.path.join(work, "eval"))
    compensation = checkpoint_compensation(sweep_settings.checkpoint, checkpoint)  # Figure 2
    write_json(dict(compensation.to_dict(), before=sweep_settings.checkpoint, after=checkpoint),
               os.path.join(work, "compensation.json"), indent=1)
    plot_head_heatmaps({t: compensation.grid(t) for t in compensation.layout}, os.path.join(work, "compensation.png"),
                       f"{config.label}: change of each head's W_q, W_k, W_v while fine-tuning", "mean |ΔW|")
    record = {"name": config.name, "label": config.label, "note": config.note, "kind": config.kind,
              "budget": config.budget, "percent": config.percent, "spec": config.spec,
              "layer_spread": compensation.spread("mean_abs_change"),
              "checkpoint": os.path.abspath(checkpoint), "score_before": config.score_before,
              "metric": sweep_settings.metric.column, "finetune": settings.finetune.length(),
              "score_after": _metric_score(settings, scores), "seconds": time.perf_counter() - began,
              "stats": scores.stats.tolist(), "hypotheses": scores.hypotheses}
    if outcome is not None:
        record.update(updates=outcome["updates"], lr=outcome["lr"], warmup_updates=outcome["warmup"])
    write_json(record, os.path.join(work, RECORD))


def _whole_resume_point(train_dir: str) -> None:
    """fairseq writes checkpoints in place: a process killed while saving leaves a cut checkpoint_last.pt. Resume
    from the newest whole one (fairseq keeps the last two interval saves), or start over if none is whole."""
    last = os.path.join(train_dir, "checkpoint_last.pt")
    if not os.path.isfile(last):
        return
    saves = sorted(glob.glob(os.path.join(train_dir, "checkpoint_*_*.pt")), key=os.path.getmtime, reverse=True)
    for candidate in [last] + saves:
        try:
            torch.load(candidate, map_location="cpu", weights_only=False)
        except Exception:  # a cut file raises one of several types
            continue
        if candidate != last:
            shutil.copyfile(candidate, last)
        return
    shutil.rmtree(train_dir)


def _save_interval(finetune: FinetuneSettings) -> int:
    """A resume point every tenth of the fine-tune (with epochs: each epoch's end, where fairseq saves anyway)."""
    return max(1, finetune.updates // SAVES_PER_FINETUNE) if finetune.updates else 0


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
                       cpu: bool) -> Dict[str, object]:
    """``finetune_held`` in a spawned process: fairseq's trainer would otherwise join the ranks' process group."""
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    child = context.Process(target=run_quietly, args=(__name__, "_finetune_child", results, start, data, save_dir,
                                                      family, finetune, cpu, torch.get_num_threads()))
    child.start()
    child.join()
    answer = results.get() if not results.empty() else ("error", f"the fine-tuning process died (exit code "
                                                                  f"{child.exitcode}); rerun to resume it")
    if answer[0] == "error":
        raise StudyError(answer[1])
    return answer[1]


def _finetune_child(results, start, data, save_dir, family, finetune, cpu, threads) -> None:
    torch.set_num_threads(threads)
    try:
        outcome = finetune_held(start, data, save_dir, family, finetune, cpu=cpu, progress=False)
    except HeadPruneError as error:
        results.put(("error", str(error)))
        return
    results.put(("ok", dataclasses.asdict(outcome)))


def merge_records(settings: PruneSettings, configs: Sequence[FinetuneConfig], out: str) -> List[dict]:
    """Every finished record in the configurations' order, tested against the fine-tuned control; results.json."""
    records = []
    for config in configs:
        path = os.path.join(out, config.name, RECORD)
        if os.path.isfile(path):
            with open(path) as stream:
                records.append(json.load(stream))
    missing = len(configs) - len(records)
    control = next((r for r in records if r["name"] == CONTROL), None)
    if control is not None and len(records) > 1:
        _test_against_control(settings, control, [r for r in records if r is not control])
    listed = [{k: v for k, v in r.items() if k not in ("stats", "hypotheses")} for r in records]
    for record in listed:
        record["missing_configurations"] = missing  # > 0: another shard has not finished; merge again after it
    write_json(listed, os.path.join(out, RESULTS), indent=1)
    if listed:
        write_text(markdown_finetuned(listed, settings.sweep.metric.label), os.path.join(out, "results.md"))
    return listed


def _test_against_control(settings: PruneSettings, control: dict, records: List[dict]) -> None:
    """The study's paired test of each fine-tuned configuration against the fine-tuned unpruned model."""
    def scores(record):
        return ConfigScores(record["name"], record["spec"], {}, record["score_after"], record["score_after"],
                            np.asarray(record["stats"]), record.get("hypotheses"))

    sweep = settings.sweep
    results = compare_with_baseline(scores(control), [scores(r) for r in records], sweep.test, sweep.test_metric)
    for record, result in zip(records, results):
        record["delta_vs_control"] = record["score_after"] - control["score_after"]
        record["p_value_vs_control"] = result.p_value
        record["significant_vs_control"] = bool(result.p_value < sweep.test.alpha)
