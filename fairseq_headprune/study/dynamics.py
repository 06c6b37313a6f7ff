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

from ..errors import SettingsError, StudyError
from .ranges import RangeError, expand_ranges, format_ranges, parse_ranges

EPOCH_CHECKPOINT = re.compile(r"checkpoint(\d+)\.pt$")


def parse_epochs(text: Optional[str]) -> Optional[List[int]]:
    """``--epochs '1-10,15,20'`` -> [1, ..., 10, 15, 20]; None when not given."""
    if not text:
        return None
    try:
        ranges = parse_ranges(text)
    except RangeError as error:
        if error.kind == "empty range":
            raise SettingsError(f"--epochs: empty range {error.item!r}")
        raise SettingsError(f"--epochs: malformed item {error.item!r} (expected e.g. 1-10,15,20)")
    if any(first < 1 for first, _ in ranges):
        raise SettingsError("--epochs: epochs are numbered from 1")
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
                f"--epochs: no checkpoint{missing[0]}.pt in {directory} (epochs there: "
                f"{format_ranges(available)})"
            )
        found = [(epoch, path) for epoch, path in found if epoch in set(epochs)]
    return found


def relative_rows(epoch: int, checkpoint: str, unpruned: float, curve: Sequence[Dict[str, object]]):
    """One row per pruning level: BLEU relative to the same epoch's unpruned BLEU."""
    rows = []
    for point in sorted(curve, key=lambda r: r["step"]):
        rows.append(
            {
                "epoch": epoch,
                "checkpoint": os.path.basename(checkpoint),
                "level": point["step"],
                "pruned": point["pruned"],
                "percent": point["percent"],
                "bleu": point["bleu"],
                "unpruned_bleu": unpruned,
                "relative": point["bleu"] / unpruned if unpruned > 0 else float("nan"),
                "p_value": point.get("p_value"),
                "significant": point.get("significant"),
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

    def unpruned_bleu(self, epoch: int) -> float:
        return self.cell[(epoch, self.levels[0])]["unpruned_bleu"]


def dynamics_grid(rows: Sequence[Dict[str, object]]) -> DynamicsGrid:
    return DynamicsGrid(
        epochs=sorted({r["epoch"] for r in rows}),
        levels=sorted({r["level"] for r in rows}),
        percent={r["level"]: r["percent"] for r in rows},
        cell={(r["epoch"], r["level"]): r for r in rows},
    )


def markdown_dynamics(rows: Sequence[Dict[str, object]], caption: str) -> str:
    """Epochs down, pruning levels across: BLEU as % of the epoch's unpruned BLEU."""
    grid = dynamics_grid(rows)
    lines = [f"{caption}\n\n", "| epoch | unpruned BLEU | "
             + " | ".join(f"{grid.percent[k]:.0f}%" for k in grid.levels) + " |\n"]
    lines.append("|---:|---:|" + "---:|" * len(grid.levels) + "\n")
    for epoch in grid.epochs:
        cells = [
            f"{100 * grid.cell[(epoch, k)]['relative']:.1f}" if (epoch, k) in grid.cell else "" for k in grid.levels
        ]
        lines.append(f"| {epoch} | {grid.unpruned_bleu(epoch):.2f} | " + " | ".join(cells) + " |\n")
    return "".join(lines)
