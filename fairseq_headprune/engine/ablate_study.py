"""The ablation studies of Michel et al. (2019, section 3) on a loaded model.

``run_ablation`` loads the checkpoint once, sweeps the study's head-mask
configurations over the split (resumable), tests every configuration against
the unmasked model and writes the paper's tables and figures: Table 1 and
Figure 1 (``single``), Table 2 and appendix A (``all-but-one``), Figure 2
(``cross-domain``). It returns what the command prints.
"""

import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from ..errors import HeadMaskError, StudyError
from ..study.ablation import (
    all_but_one_configs,
    baseline_config,
    best_heads,
    cross_domain_correlation,
    cross_domain_rows,
    latex_best_table,
    latex_single_table,
    markdown_best_table,
    markdown_cross_domain,
    markdown_single_table,
    reported_bleu,
    single_head_configs,
)
from ..study.files import write_text
from ..study.head_mask import parse_head_mask
from ..study.settings import AblationSettings
from .ranks import current_ranks
from .split_sweep import SplitSweep, table_caption, write_result_rows


@dataclass
class AblationOutcome:
    """What a finished ablation study reports on the console."""

    split: str
    baseline_bleu: float
    rows: List[Dict[str, object]]  # one per configuration, with its test
    best: List[Dict[str, object]] = field(default_factory=list)  # all-but-one: best head per layer
    cross_split: Optional[str] = None
    pearson: Optional[Tuple[float, float]] = None  # cross-domain: (r, p) of the two splits' changes
    written: List[str] = field(default_factory=list)  # lines naming the files written


def run_ablation(settings: AblationSettings) -> Optional[AblationOutcome]:
    """The study's outcome (None on ranks other than 0, which only translate their share)."""
    from ..modules.masked_multihead_attention import current_head_mask, head_layout
    from .loading import load_task_and_model
    from .ranks import current_ranks

    sweep_settings = settings.sweep
    cfg, task, model = load_task_and_model(
        sweep_settings.data, sweep_settings.checkpoint, sweep_settings.generation_args, cpu=sweep_settings.cpu
    )
    layout = head_layout(model)
    base_mask = current_head_mask(model)  # --head-mask and the checkpoint's recorded mask
    heads = None
    if settings.heads:
        try:
            heads = parse_head_mask(settings.heads, layout)
        except HeadMaskError as error:
            raise StudyError(f"--heads: {error}")
    if settings.mode == "all-but-one":
        configs = [baseline_config()] + all_but_one_configs(layout, settings.types)
    else:
        configs = [baseline_config()] + [
            c for c in single_head_configs(layout, heads) if c.attention_type in settings.types
        ]
    if len(configs) == 1:
        raise StudyError("no configuration to translate (check --types and --heads)")
    current_ranks().require_work_for_each(len(configs), "configurations")
    os.makedirs(sweep_settings.out_dir, exist_ok=True)
    out = sweep_settings.out_dir

    split = sweep_settings.gen_subset
    sweep = SplitSweep(sweep_settings, cfg, task, model, split, split, sweep_settings.references)
    translated = sweep.run(configs, base_mask)
    other = None  # all-but-one: the selection split; cross-domain: the shifted split
    if settings.mode == "all-but-one" and settings.select_subset:
        other = SplitSweep(sweep_settings, cfg, task, model, settings.select_subset, settings.select_subset)
    elif settings.mode == "cross-domain":
        cross_task, cross_model, name = task, model, settings.cross_subset
        if settings.cross_data:
            _, cross_task, cross_model = load_task_and_model(
                settings.cross_data, sweep_settings.checkpoint, sweep_settings.generation_args,
                cpu=sweep_settings.cpu,
            )
            name = f"{os.path.basename(os.path.normpath(settings.cross_data))}.{settings.cross_subset}"
        other = SplitSweep(sweep_settings, cfg, cross_task, cross_model, settings.cross_subset, name)
    other_translated = other.run(configs, base_mask) if other is not None else None
    if not current_ranks().is_main:
        return None  # rank 0 tests and writes
    baseline, rows = sweep.compare(translated, configs)
    outcome = AblationOutcome(split, reported_bleu(baseline, sweep_settings.bleu), rows)

    if settings.mode == "all-but-one":
        select_rows = other.compare(other_translated, configs)[1] if other is not None else None
        _write_all_but_one(settings, sweep, baseline, rows, select_rows, outcome)
        return outcome

    _write_single(sweep, baseline, rows, os.path.join(out, "single"))
    outcome.written.append(f"{os.path.join(out, 'single')}.{{tsv,json,md,tex}} single_delta.png single_hist.png")
    if settings.mode == "cross-domain":
        cross_baseline, cross_rows = other.compare(other_translated, configs)
        _write_single(other, cross_baseline, cross_rows, os.path.join(out, f"single.{other.name}"))
        _write_cross_domain(sweep, other, baseline, cross_baseline, rows, cross_rows, outcome)
    return outcome


def _write_single(sweep: SplitSweep, baseline, rows, prefix: str) -> None:
    """Table 1 (TSV, JSON, Markdown, LaTeX), Figure 1's heat maps and the score histogram."""
    from ..study.plots import plot_delta_heatmaps, plot_score_histogram

    settings = sweep.settings
    record = sweep.settings_record(baseline)
    write_result_rows(prefix, rows, record)
    caption = table_caption(settings, "BLEU change when one head is masked", sweep.split)
    write_text(markdown_single_table(rows, record["baseline_bleu"], caption), prefix + ".md")
    write_text(latex_single_table(rows, record["baseline_bleu"], caption), prefix + ".tex")
    plot_delta_heatmaps(
        rows, prefix + "_delta.png",
        f"ΔBLEU when one head is masked ({sweep.split}; dots: p < {settings.test.alpha:g})",
    )
    plot_score_histogram(
        rows, record["baseline_bleu"], prefix + "_hist.png",
        f"BLEU with one head masked ({sweep.split})", f"{settings.bleu} BLEU",
    )


def _write_all_but_one(settings: AblationSettings, sweep: SplitSweep, baseline, rows, select_rows,
                       outcome: AblationOutcome) -> None:
    """Table 2: every kept head, the best per layer, and (appendix A) the head chosen on another split."""
    from ..study.plots import plot_delta_heatmaps

    out = settings.sweep.out_dir
    record = sweep.settings_record(baseline)
    write_result_rows(os.path.join(out, "all_but_one"), rows, record)
    best, entries, selected = best_heads(rows, select_rows, settings.select_subset)
    if selected is not None:
        record["select_subset"] = settings.select_subset
    prefix = os.path.join(out, "all_but_one_best")
    write_result_rows(prefix, entries, record)
    caption = table_caption(settings.sweep, "Best BLEU change per layer when only one head is kept", sweep.split)
    write_text(markdown_best_table(best, caption, selected), prefix + ".md")
    write_text(latex_best_table(best, caption, selected), prefix + ".tex")
    plot_delta_heatmaps(
        rows, os.path.join(out, "all_but_one_delta.png"),
        f"ΔBLEU when only this head of its layer is kept ({sweep.split}; dots: p < {settings.sweep.test.alpha:g})",
    )
    outcome.best = entries
    outcome.written.append(
        f"{prefix}.{{tsv,json,md,tex}} {os.path.join(out, 'all_but_one')}.{{tsv,json}} all_but_one_delta.png"
    )


def _write_cross_domain(sweep: SplitSweep, cross: SplitSweep, baseline, cross_baseline, rows, cross_rows,
                        outcome: AblationOutcome) -> None:
    """Figure 2: ΔBLEU on the test split against ΔBLEU on the shifted one, with Pearson's r."""
    from ..study.plots import plot_cross_domain

    settings = sweep.settings
    joined = cross_domain_rows(rows, cross_rows)
    (r, p), per_type = cross_domain_correlation(joined)
    record = sweep.settings_record(baseline)
    record.update(
        {
            "cross_split": cross.split,
            "cross_baseline_bleu": reported_bleu(cross_baseline, settings.bleu),
            "pearson_r": r,
            "pearson_p": p,
            "pearson_per_type": {t: {"r": v[0], "p": v[1]} for t, v in per_type.items()},
        }
    )
    prefix = os.path.join(settings.out_dir, "cross_domain")
    write_result_rows(prefix, joined, record)
    write_text(
        markdown_cross_domain((r, p), per_type, sweep.split, cross.split, settings.metric.description),
        prefix + ".md",
    )
    plot_cross_domain(
        joined, prefix + ".png", f"Pearson r = {r:.2f} (p = {p:.2g})",
        f"ΔBLEU on {sweep.split}", f"ΔBLEU on {cross.split}",
    )
    outcome.cross_split, outcome.pearson = cross.split, (r, p)
    outcome.written.append(f"{prefix}.{{tsv,json,md,png}}")
