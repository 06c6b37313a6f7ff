"""``prune --finetune-plan``: what a study would fine-tune, how much of it is finished and what the rest costs, said
without scoring or fine-tuning anything (nor loading the model: the checkpoint's layout and training history are
read from its state).

The configurations are the ones ``prune`` fine-tunes (``finetune_configs.finetune_configurations``), in its order:
the control, every budget's draws (named by their masks, as ``OUT/finetune/NAME``), then the curves' steps at
``--finetune-levels`` (known by their labels: their masks need the importance the run estimates). A configuration is
finished where its ``record.json`` exists; one fine-tuned or begun under another recipe is refused, as the run
would refuse it.
"""

import json
import os
from typing import Dict, List, Optional, Tuple

from fairseq_headprune.engine.checkpoints.info import checkpoint_head_layout, training_history
from fairseq_headprune.engine.pipelines.finetune_configs import FINETUNE_DIR, RECORD, checked_recipe
from fairseq_headprune.study.budhraja.budgets import Budget, plan_budgets
from fairseq_headprune.study.budhraja.configurations import requested_budgets
from fairseq_headprune.study.budhraja.finetune_plan import PlannedConfiguration, plan_line, plan_text
from fairseq_headprune.study.budhraja.records import CONTROL
from fairseq_headprune.study.masks.head_mask import HeadLayout
from fairseq_headprune.study.pruning.curves import heads_in_scope, mask_name, pruned_at_level
from fairseq_headprune.study.pruning.settings import PruneSettings

CURVE_STEPS = "the curves' steps"


def _finished(out: str) -> Dict[str, dict]:
    """Every finished configuration under OUT/finetune: its directory name -> its record's label, kind, seconds."""
    found = {}
    for name in sorted(os.listdir(out)) if os.path.isdir(out) else []:
        path = os.path.join(out, name, RECORD)
        if os.path.isfile(path):
            with open(path) as stream:
                record = json.load(stream)
            found[name] = {key: record.get(key) for key in ("label", "kind", "seconds")}
    return found


def _source(budget: Budget) -> str:
    if not budget.tables:
        return "given by hand (--random-level, --layer-strategy ...)"
    return ("Table " if len(budget.tables) == 1 else "Tables ") + ", ".join(map(str, budget.tables))


def _curve_steps(settings: PruneSettings, layout: HeadLayout) -> List[Tuple[PlannedConfiguration, str, Optional[int]]]:
    """The curves' steps ``prune`` fine-tunes, in its order (scope, order, draw, level), each with the label its
    record has (``finetune_configs.finetune_configurations``) and its draw."""
    steps = []
    for scope in settings.scopes:
        total = len(heads_in_scope(layout, scope))
        counts = sorted({pruned_at_level(level, total) for level in settings.finetune_levels})
        for order in [o for o in settings.orders if o != "gates"]:
            for draw in range(1, settings.draws + 1) if order == "random" else [None]:
                for pruned in counts:
                    label = f"{scope} {order} {100.0 * pruned / total:.0f}%"
                    steps.append((PlannedConfiguration(label, CURVE_STEPS),
                                  label + (f" draw {draw}" if draw is not None else ""), draw))
    return steps


def finetune_plan(settings: PruneSettings) -> str:
    """The plan: every configuration by where it comes from, how many are finished, what the rest cost."""
    checkpoint = settings.sweep.checkpoint
    layout, history = checkpoint_head_layout(checkpoint), training_history(checkpoint)
    finished = _finished(os.path.join(settings.sweep.out_dir, FINETUNE_DIR))
    planned = [PlannedConfiguration("unpruned (control)", "the control")]
    names, draws = [CONTROL], [None]
    for budget, draw, head_mask in plan_budgets(requested_budgets(settings, layout), layout, settings.pruning_seed,
                                                settings.draws):
        if mask_name(head_mask) not in names:  # a mask two budgets share is fine-tuned once, as the first's
            planned.append(PlannedConfiguration(budget.label, _source(budget)))
            names.append(mask_name(head_mask))
            draws.append(draw if budget.random else None)
    steps = {r["label"]: name for name, r in finished.items() if r["kind"] == "curve step"}
    for step, label, draw in _curve_steps(settings, layout):
        planned.append(step)
        names.append(steps.get(label, ""))
        draws.append(draw)
    # what the run would refuse, the plan refuses
    checked_recipe(os.path.join(settings.sweep.out_dir, FINETUNE_DIR),
                   [(name, draw) for name, draw in zip(names, draws) if name], settings.finetune, history)
    for item, name in zip(planned, names):
        if name in finished:
            item.finished, item.seconds = True, finished[name]["seconds"]
    index, count = settings.config_shard
    todo = sum(1 for i, item in enumerate(planned) if i % count == index - 1 and not item.finished)
    finetune = settings.finetune
    stops = finetune.curve_stops()
    line = plan_line(len(planned), todo, finetune.updates, finetune.epochs, len(stops) + 1 if stops else 0, history,
                     "left" + (f" to share {index}/{count}" if count > 1 else "") + ", one at a time")
    if stops and todo and history.seconds_per_update:
        line += f" (training alone: scoring the {len(stops) + 1} points of the recovery curve comes on top)"
    return plan_text(planned, line, f"{index}/{count}" if count > 1 else None)
