"""Head importance over training (Michel et al. section 6, Figure 5), on epoch checkpoints.

For every epoch checkpoint fairseq-train saved, estimate importance on it and
run the pruning curve by importance (``prune_study.run_prune``), then report
each level's BLEU (a classifier's accuracy, an LM's perplexity) relative to
that epoch's unpruned score. Each epoch is
finished (and recorded in ``OUT/epochN/done.json``) before the next one
starts, so a rerun skips the epochs done.
"""

import dataclasses
import json
import os
from typing import Dict, List, Optional, Sequence, Tuple

from tqdm import tqdm

from fairseq_headprune.engine.checkpoints.info import load_checkpoint_state, model_config, state_head_layout
from fairseq_headprune.engine.families import family_named
from fairseq_headprune.engine.pipelines.prune import run_prune
from fairseq_headprune.engine.runners.batches import load_split
from fairseq_headprune.engine.runtime.ranks import current_ranks
from fairseq_headprune.errors import StudyError
from fairseq_headprune.study.importance.dynamics import epoch_checkpoints, markdown_dynamics, relative_rows
from fairseq_headprune.study.output.files import file_sha256, write_json, write_rows_tsv, write_text
from fairseq_headprune.study.output.plots import plot_dynamics
from fairseq_headprune.study.pruning.settings import DynamicsSettings, PruneSettings

DONE = "done.json"


def architecture(path: str) -> str:
    """What two checkpoints must share for their curves to be comparable, as text."""

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


def epoch_prune_settings(settings: DynamicsSettings, checkpoint: str, epoch_dir: str) -> PruneSettings:
    """The pruning study of one epoch: the importance order over all heads, its own directory."""
    sweep = dataclasses.replace(settings.sweep, checkpoint=checkpoint, out_dir=epoch_dir, progress=False)
    return PruneSettings(sweep=sweep, curve=settings.curve, orders=["importance"], scopes=["all"], draws=1)


def _check_split_found(settings: DynamicsSettings, checkpoint: str) -> None:
    """The splits every epoch reads (importance, then translation), found before the first epoch's work starts."""
    sweep = settings.sweep
    _, task, _ = family_named(sweep.family).load(sweep.data, checkpoint, sweep.generation_args, cpu=True)
    for split in dict.fromkeys([*settings.curve.importance.subsets, sweep.gen_subset]):
        load_split(task, split)


def run_dynamics(settings: DynamicsSettings) -> Optional[List[Dict[str, object]]]:
    """One row per epoch and pruning level: BLEU relative to the epoch's unpruned BLEU (rank 0; others None)."""
    ranks = current_ranks()
    checkpoints = epoch_checkpoints(settings.checkpoints, settings.epochs)
    described = check_same_architecture(checkpoints)
    _check_split_found(settings, checkpoints[0][1])
    out, metric = settings.sweep.out_dir, settings.sweep.metric
    unpruned_key = f"unpruned_{metric.column}"
    os.makedirs(out, exist_ok=True)
    rows = []
    # a context: an error in the first epoch (a split not found) clears the bar before its line is printed
    with tqdm(checkpoints, desc="epochs", unit="checkpoint", disable=not settings.sweep.progress,
              leave=False) as bar:
        for epoch, checkpoint in bar:
            epoch_dir = os.path.join(out, f"epoch{epoch}")
            done_path = os.path.join(epoch_dir, DONE)
            sha256 = file_sha256(checkpoint)
            done = None
            if ranks.main_value(os.path.exists(done_path)):
                with open(done_path, encoding="utf-8") as stream:
                    done = json.load(stream)
                if done.get("checkpoint_sha256") != sha256:
                    raise StudyError(f"{done_path} is for another checkpoint{epoch}.pt (SHA-256 differs); "
                                     "use another output directory")
            if done is None:
                outcome = run_prune(epoch_prune_settings(settings, checkpoint, epoch_dir))
                if not ranks.is_main:
                    continue  # rank 0 records the epoch
                done = {"epoch": epoch, "checkpoint": os.path.abspath(checkpoint), "checkpoint_sha256": sha256,
                        unpruned_key: outcome.baseline_score, "curve": outcome.step_rows}
                write_json(done, done_path, indent=1)
            rows += relative_rows(epoch, checkpoint, done[unpruned_key], done["curve"], metric.column)
            if settings.sweep.progress:
                bar.write(f"epoch {epoch}: unpruned {metric.label} {done[unpruned_key]:.2f}")
    if not ranks.is_main:
        return None
    _write_outputs(settings, rows, described)
    return rows


def _write_outputs(settings: DynamicsSettings, rows, described: str) -> None:

    out, sweep = settings.sweep.out_dir, settings.sweep
    record = {
        "checkpoints": os.path.abspath(settings.checkpoints),
        "architecture": described,
        "split": sweep.gen_subset,
        "importance_subsets": list(settings.curve.importance.subsets),
        "step_percent": settings.curve.step_percent,
        "max_percent": settings.curve.max_percent,
        **sweep.metric_record(),
    }
    write_rows_tsv(rows, os.path.join(out, "dynamics.tsv"))
    write_json({"settings": record, "rows": rows}, os.path.join(out, "dynamics.json"), indent=1)
    label = sweep.metric.label
    caption = (
        f"{sweep.metric.title} on {sweep.gen_subset} with the least important heads pruned, as % of "
        f"the same epoch's unpruned {label} (importance estimated on each epoch's checkpoint, on "
        f"{', '.join(settings.curve.importance.subsets)})."
    )
    write_text(markdown_dynamics(rows, caption, label), os.path.join(out, "dynamics.md"))
    plot_dynamics(rows, os.path.join(out, "dynamics.png"), f"{sweep.score_label} on {sweep.gen_subset}", label)
