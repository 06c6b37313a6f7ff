"""``fairseq-headprune dynamics``: head importance over training (paper section 6, Figure 5).

For every epoch checkpoint fairseq-train saved, estimate importance on it and
run the pruning curve by importance (``prune_command.run_prune``), then
report each level's BLEU relative to that epoch's unpruned BLEU. Each epoch
is finished (and recorded in ``OUT/epochN/done.json``) before the next one
starts, so a rerun skips the epochs done.
"""

import argparse
import glob
import json
import os
import re
from typing import Dict, List, Optional, Sequence, Tuple

from .ablate_command import add_sweep_arguments, check_sweep_arguments
from .prune_command import add_curve_arguments
from .pruning import dynamics_grid
from .ablation import write_rows_tsv
from .atomic_files import write_json, write_text
from .evaluation import StudyError

EPOCH_CHECKPOINT = re.compile(r"checkpoint(\d+)\.pt$")
DONE = "done.json"


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
                f"{_ranges(sorted(available))})"
            )
        found = [(epoch, path) for epoch, path in found if epoch in set(epochs)]
    return found


def _ranges(numbers: Sequence[int]) -> str:
    parts, start = [], None
    for i, n in enumerate(numbers):
        if start is None:
            start = n
        if i + 1 == len(numbers) or numbers[i + 1] != n + 1:
            parts.append(str(start) if start == n else f"{start}-{n}")
            start = None
    return ",".join(parts)


def parse_epochs(text: Optional[str]) -> Optional[List[int]]:
    """'1-10,15,20' -> [1, ..., 10, 15, 20]."""
    if not text:
        return None
    epochs = set()
    for item in text.split(","):
        match = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", item)
        if match is None:
            raise StudyError(f"--epochs: malformed item {item!r} (expected e.g. 1-10,15,20)")
        first, last = int(match.group(1)), int(match.group(2) or match.group(1))
        if first < 1 or last < first:
            raise StudyError(f"--epochs: empty range {item!r}")
        epochs.update(range(first, last + 1))
    return sorted(epochs)


def architecture(path: str) -> str:
    """What two checkpoints must share for their curves to be comparable, as text."""
    from .checkpoint_info import load_checkpoint_state, model_config, state_head_layout

    state = load_checkpoint_state(path)
    config = model_config(state)
    layout = state_head_layout(state)
    parts = [str(config.get("arch", config.get("_name", "?")))]
    parts += [f"{t}={layers}x{heads}" for t, (layers, heads) in layout.items()]
    for key in ("encoder_embed_dim", "decoder_embed_dim", "encoder_ffn_embed_dim", "decoder_ffn_embed_dim"):
        if key in config:
            parts.append(f"{key}={config[key]}")
    return " ".join(parts)


def check_same_architecture(checkpoints: Sequence[Tuple[int, str]]) -> str:
    first_epoch, first = checkpoints[0]
    expected = architecture(first)
    for epoch, path in checkpoints[1:]:
        found = architecture(path)
        if found != expected:
            raise StudyError(
                f"checkpoints of different architectures: {os.path.basename(path)} is {found}, "
                f"{os.path.basename(first)} is {expected}"
            )
    return expected


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


def command_dynamics(args) -> int:
    from tqdm import tqdm

    from .prune_command import run_prune
    from .sweep import file_sha256

    check_sweep_arguments(args)
    checkpoints = epoch_checkpoints(args.checkpoints, parse_epochs(args.epochs))
    described = check_same_architecture(checkpoints)
    os.makedirs(args.out_dir, exist_ok=True)
    rows = []
    bar = tqdm(checkpoints, desc="epochs", unit="checkpoint", disable=args.no_progress, leave=False)
    for epoch, checkpoint in bar:
        epoch_dir = os.path.join(args.out_dir, f"epoch{epoch}")
        done_path = os.path.join(epoch_dir, DONE)
        sha256 = file_sha256(checkpoint)
        done = None
        if os.path.exists(done_path):
            with open(done_path, encoding="utf-8") as stream:
                done = json.load(stream)
            if done.get("checkpoint_sha256") != sha256:
                raise StudyError(
                    f"{done_path} is for another checkpoint{epoch}.pt (SHA-256 differs); use another --out-dir"
                )
        if done is None:
            epoch_args = argparse.Namespace(**vars(args))
            epoch_args.__dict__.update(
                path=checkpoint, out_dir=epoch_dir, orders="importance", scopes="all", importance=None,
                ablation=None, draws=1, layer_budget=None, type_budget=None, no_progress=True,
                fairseq_args=list(args.fairseq_args),
            )
            unpruned, summary = run_prune(epoch_args, report=False)
            done = {"epoch": epoch, "checkpoint": os.path.abspath(checkpoint), "checkpoint_sha256": sha256,
                    "unpruned_bleu": unpruned, "curve": summary}
            write_json(done, done_path, indent=1)
        rows += relative_rows(epoch, checkpoint, done["unpruned_bleu"], done["curve"])
        if not args.no_progress:
            bar.write(f"epoch {epoch}: unpruned BLEU {done['unpruned_bleu']:.2f}")
    bar.close()
    write_outputs(args, rows, described)
    return 0


def write_outputs(args, rows, described: str) -> None:
    from .plots import plot_dynamics

    out = args.out_dir
    settings = {
        "checkpoints": os.path.abspath(args.checkpoints),
        "architecture": described,
        "split": args.gen_subset,
        "importance_subsets": list(args.importance_subset),
        "step_percent": args.step_percent,
        "max_percent": args.max_percent,
        "bleu": args.bleu,
    }
    write_rows_tsv(rows, os.path.join(out, "dynamics.tsv"))
    write_json({"settings": settings, "rows": rows}, os.path.join(out, "dynamics.json"), indent=1)
    caption = (
        f"BLEU on {args.gen_subset} with the least important heads pruned, as % of the same epoch's "
        f"unpruned BLEU (importance estimated on each epoch's checkpoint, on {', '.join(args.importance_subset)})."
    )
    write_text(markdown_dynamics(rows, caption), os.path.join(out, "dynamics.md"))
    plot_dynamics(rows, os.path.join(out, "dynamics.png"), f"{args.bleu} BLEU on {args.gen_subset}")
    grid = dynamics_grid(rows)
    print(f"{len(grid.epochs)} epochs ({_ranges(grid.epochs)}); BLEU as % of each epoch's unpruned BLEU:")
    print("  epoch  unpruned  " + "  ".join(f"{grid.percent[k]:>5.0f}%" for k in grid.levels[1:]))
    for epoch in grid.epochs:
        print(f"  {epoch:>5}  {grid.unpruned_bleu(epoch):>8.2f}  "
              + "  ".join(f"{100 * grid.cell[(epoch, k)]['relative']:>6.1f}" for k in grid.levels[1:]))
    print(f"wrote\t{os.path.join(out, 'dynamics')}.{{tsv,json,md,png}} and epochN/ per checkpoint")


def add_parser(commands) -> None:
    dynamics = commands.add_parser(
        "dynamics",
        help="head importance over training: the pruning curve at every epoch checkpoint (paper section 6)",
        description="For every epoch checkpoint fairseq-train saved in --checkpoints "
        "(checkpoint1.pt, checkpoint2.pt, ...), estimate head importance on that checkpoint, "
        "prune the least important heads in steps (0-90% in 10% steps by default) and translate "
        "--gen-subset at every step; report BLEU relative to the epoch's unpruned BLEU (Figure 5: "
        "epochs on a log scale, one line per pruning level). Each finished epoch is recorded, so a "
        "rerun continues where it stopped. Any other option is passed to fairseq-generate's parser.",
    )
    dynamics.add_argument("data", metavar="DATA", help="fairseq-preprocess output directory")
    dynamics.add_argument("--checkpoints", required=True, metavar="DIR", help="fairseq-train's --save-dir")
    dynamics.add_argument("--epochs", metavar="LIST", help="only these epochs, e.g. '1-10,15,20' (default: all)")
    dynamics.add_argument("--gen-subset", default="test", metavar="SPLIT", help="split to translate (default: test)")
    dynamics.add_argument("--out-dir", required=True, metavar="DIR", help="results directory (resumable)")
    add_curve_arguments(dynamics)
    add_sweep_arguments(dynamics)
    dynamics.set_defaults(handler=command_dynamics, accepts_fairseq_args=True, seed_pruning=1)
