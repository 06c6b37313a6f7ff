"""Head importance over training (Michel et al. section 6, Figure 5), as plain functions.

Which epoch checkpoints a study covers, and how each epoch's pruning curve
becomes BLEU relative to that epoch's unpruned BLEU (rows, a grid of epochs
x pruning levels, a Markdown table). Nothing here touches fairseq.
"""

import glob
import os
import re
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from fairseq_headprune.errors import SettingsError, StudyError
from fairseq_headprune.study.masks.ranges import RangeError, expand_ranges, format_ranges, parse_ranges

EPOCH_CHECKPOINT = re.compile(r"checkpoint(\d+)\.pt$")


def parse_epochs(text: Optional[str]) -> Optional[List[int]]:
    """``--epochs '1-10,15,20'`` -> [1, ..., 10, 15, 20]; None when not given."""
    if not text:
        return None
    try:
        ranges = parse_ranges(text)
    except RangeError as error:
        if error.kind == "empty range":
            raise SettingsError(f"the epochs: empty range {error.item!r}", setting="epochs") from error
        raise SettingsError(f"the epochs: malformed item {error.item!r} (expected e.g. 1-10,15,20)",
                            setting="epochs") from error
    if any(first < 1 for first, _ in ranges):
        raise SettingsError("the epochs: epochs are numbered from 1", setting="epochs")
    return expand_ranges(ranges)


def epoch_checkpoints(directory: str, epochs: Optional[Sequence[int]] = None) -> List[Tuple[int, str]]:
    """(epoch, path) of fairseq-train's per-epoch checkpoints (checkpointN.pt), by epoch."""
    if not os.path.isdir(directory):
        raise StudyError(f"checkpoint directory not found: {directory}")
    found = []
    for path in glob.glob(os.path.join(directory, "checkpoint*.pt")):
        match = EPOCH_CHECKPOINT.search(os.path.basename(path))
        if match:
            found.append((int(match.group(1)), path))
    if not found:
        raise StudyError(
            f"no epoch checkpoints (checkpoint1.pt, checkpoint2.pt, ...) in {directory}; "
            "fairseq-train saves them unless --no-epoch-checkpoints is given"
        )
    found.sort()
    if epochs is not None:
        available = {epoch for epoch, _ in found}
        missing = [e for e in epochs if e not in available]
        if missing:
            raise StudyError(
                f"the epochs: no checkpoint{missing[0]}.pt in {directory} (epochs there: "
                f"{format_ranges(available)})", setting="epochs"
            )
        found = [(epoch, path) for epoch, path in found if epoch in set(epochs)]
    return found


def relative_rows(epoch: int, checkpoint: str, unpruned: float, curve: Sequence[Dict[str, object]],
                  column: str = "bleu"):
    """One row per pruning level: the score (BLEU, or ``column``) relative to the same epoch's unpruned score."""
    rows = []
    for point in sorted(curve, key=lambda r: r["step"]):
        rows.append(
            {
                "epoch": epoch,
                "checkpoint": os.path.basename(checkpoint),
                "level": point["step"],
                "pruned": point["pruned"],
                "percent": point["percent"],
                column: point[column],
                f"unpruned_{column}": unpruned,
                "relative": point[column] / unpruned if unpruned > 0 else float("nan"),
                "p_value": point.get("p_value"),
                "significant": point.get("significant"),
                "ci_low": point.get("ci_low"),  # the pruned model's bootstrap interval, in the metric
                "ci_high": point.get("ci_high"),
            }
        )
    return rows


@dataclass
class DynamicsGrid:
    """Dynamics rows as epochs x pruning levels."""

    epochs: List[int]
    levels: List[int]  # 0 is the unpruned model
    percent: Dict[int, float]  # level -> % of the heads pruned
    cell: Dict[Tuple[int, int], Dict[str, object]]  # (epoch, level) -> row
    unpruned_key: str = "unpruned_bleu"  # unpruned_<metric column>

    def unpruned_score(self, epoch: int) -> float:
        return self.cell[(epoch, self.levels[0])][self.unpruned_key]


def dynamics_grid(rows: Sequence[Dict[str, object]]) -> DynamicsGrid:
    return DynamicsGrid(
        epochs=sorted({r["epoch"] for r in rows}),
        levels=sorted({r["level"] for r in rows}),
        percent={r["level"]: r["percent"] for r in rows},
        cell={(r["epoch"], r["level"]): r for r in rows},
        unpruned_key=next(key for key in rows[0] if key.startswith("unpruned_")),
    )


def markdown_dynamics(rows: Sequence[Dict[str, object]], caption: str, label: str = "BLEU") -> str:
    """Epochs down, pruning levels across: the score as % of the epoch's unpruned score."""
    grid = dynamics_grid(rows)
    lines = [f"{caption}\n\n", f"| epoch | unpruned {label} | "
             + " | ".join(f"{grid.percent[k]:.0f}%" for k in grid.levels) + " |\n"]
    lines.append("|---:|---:|" + "---:|" * len(grid.levels) + "\n")
    for epoch in grid.epochs:
        cells = [
            f"{100 * grid.cell[(epoch, k)]['relative']:.1f}" if (epoch, k) in grid.cell else "" for k in grid.levels
        ]
        lines.append(f"| {epoch} | {grid.unpruned_score(epoch):.2f} | " + " | ".join(cells) + " |\n")
    return "".join(lines)
