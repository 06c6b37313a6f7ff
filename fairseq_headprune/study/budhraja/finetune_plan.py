"""What a study fine-tunes (levels that are steps of its curves) and what that will cost, read off the checkpoint's
own training, said before it starts.

Budhraja et al. fine-tune each pruned configuration for 30 (Transformer) or 10
(BERT) epochs; a study's length is best read against the model's own
training, which the checkpoint records (fairseq's ``num_updates``, the epoch
its iterator stands at, and the training's wall-clock seconds).
"""

import statistics
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

from fairseq_headprune.errors import SettingsError
from fairseq_headprune.study.masks.head_mask import HeadLayout
from fairseq_headprune.study.pruning.curves import heads_in_scope, pruned_at_level, step_counts


@dataclass
class TrainingHistory:
    """How a checkpoint was trained: its updates, whole epochs (saved at an epoch's end) and seconds."""

    updates: int
    epochs: Optional[int] = None  # None: saved within an epoch, so the epoch's length is unknown
    seconds: Optional[float] = None  # fairseq's previous_training_time: training and validation
    peak_lr: Optional[float] = None  # its learning rate (--lr), which a fine-tune's default rate is a share of
    seed: Optional[int] = None  # its --seed, which a fine-tune keeps unless given another
    world_size: int = 1  # the processes it trained on (--distributed-world-size), each update summing theirs

    @property
    def updates_per_epoch(self) -> Optional[float]:
        return self.updates / self.epochs if self.epochs else None

    @property
    def batches(self) -> int:
        """The updates of one process that see its training's data: one process accumulates what one of its
        processes did (``engine.finetune``), so the data of each of its updates is ``world_size`` of them."""
        return self.updates * max(self.world_size, 1)

    @property
    def seconds_per_update(self) -> Optional[float]:
        return self.seconds / self.updates if self.seconds and self.updates else None

    def describe(self) -> str:
        """``490 updates (10 epochs)``."""
        return f"{self.updates} updates" + (f" ({self.epochs} epochs)" if self.epochs else "")


def finetune_epochs(updates: int, history: Optional[TrainingHistory]) -> Optional[float]:
    """A fine-tune's length in epochs of the training split, at the checkpoint's own batch size."""
    per_epoch = history.updates_per_epoch if history else None
    return updates / per_epoch if per_epoch else None


def _duration(seconds: float) -> str:
    if seconds >= 5400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 60:.0f} min" if seconds >= 60 else f"{seconds:.0f} s"


def plan_line(configurations: int, todo: int, updates: int, epochs: int, points: int,
              history: Optional[TrainingHistory], left: str = "left to this process") -> str:
    """The line ``prune`` prints before fine-tuning: how many, how long each, and the time it will take."""
    if epochs:
        length = f"{epochs} epochs"
        total_updates = epochs * history.updates_per_epoch if history and history.updates_per_epoch else None
    else:
        length = f"{updates} updates"
        epochs_of_split = finetune_epochs(updates, history)
        if epochs_of_split:
            length += f" ({epochs_of_split:.1f} epochs)"
        total_updates = updates
    line = (f"fine-tuning {configurations} configurations, {length} each"
            + (f", scored at {points} points of the recovery curve" if points else "")
            + (f"; the checkpoint trained {history.describe()}" if history else ""))
    per_update = history.seconds_per_update if history else None
    if not todo:
        line += "; none left"
    elif per_update and total_updates:
        each = per_update * total_updates
        line += (f"; at its training speed ({per_update:.2f} s/update) about {_duration(each)} per configuration, "
                 f"{_duration(each * todo)} for the {todo} {left}")
    return line


def check_finetune_levels(levels: Sequence[float], scopes: Sequence[str], layout: HeadLayout, step_percent: float,
                          max_percent: float) -> None:
    """Every level fine-tuned (``prune --finetune-levels``) must be a step of every curve: as many heads pruned as
    a random level of it; a ``SettingsError`` names the step size that makes it one."""
    for scope in scopes:
        total = len(heads_in_scope(layout, scope))
        counts = step_counts(total, step_percent, max_percent)
        for level in levels:
            if pruned_at_level(level, total) not in counts:
                raise SettingsError(
                    f"the finetune levels {level:g}: no step of the {scope} curves prunes "
                    f"{pruned_at_level(level, total)} of {total} heads ({level:g}%, rounded up); give the step percent "
                    f"S with {level:g} a multiple of S (and the max percent at least {level:g})",
                    setting=("finetune_levels", "step_percent", "max_percent"))


@dataclass
class PlannedConfiguration:
    """One configuration of a fine-tuning plan: what its draws share (a budget's label, a curve's order and level),
    where it comes from (``Table 1``, ``the curves' steps``, ``the control``) and whether it is finished."""

    group: str
    source: str
    finished: bool = False
    seconds: Optional[float] = None  # what a finished one took (its record's seconds)


def plan_text(planned: Sequence[PlannedConfiguration], line: str, share: Optional[str] = None) -> str:
    """The plan ``prune --finetune-plan`` prints: the configurations by where they come from (each budget's draws
    as ``×N``), how many are finished, the time line (``plan_line``) and what the finished ones took."""
    by_source: Dict[str, Dict[str, List[PlannedConfiguration]]] = {}
    for item in planned:
        by_source.setdefault(item.source, {}).setdefault(item.group, []).append(item)
    done = [item for item in planned if item.finished]
    lines = [f"the fine-tuning plan (nothing is run): {len(planned)} configurations, {len(done)} finished"
             + (f"; this process's share {share}" if share else "")]
    for source, groups in by_source.items():
        members = [item for group in groups.values() for item in group]
        lines.append(f"  {source} ({len(members)}, {sum(item.finished for item in members)} finished): "
                     + ", ".join(group + (f" ×{len(items)}" if len(items) > 1 else "") for group, items in
                                 groups.items()))
    lines.append(line)
    timed = [item.seconds for item in done if item.seconds]
    if timed:
        lines.append(f"the {len(timed)} finished took a median {_duration(statistics.median(timed))} each as they ran "
                     "(their record.json; processes that ran at once shared the cores)")
    return "\n".join(lines)
