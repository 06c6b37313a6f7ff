"""The ablation studies of Michel et al. (2019, section 3) on a loaded model.

``run_ablation`` loads the checkpoint once, sweeps the study's head-mask
configurations over the split (resumable), tests every configuration against
the unmasked model and writes the paper's tables and figures: Table 1 and
Figure 1 (``single``), Table 2 and appendix A (``all-but-one``), Figure 2
(``cross-domain``). It returns what the command prints.

Translation checkpoints are swept by beam search and scored by BLEU
(``split_sweep``); classifier and language-model checkpoints are scored
example by example, by accuracy (or Matthews correlation) and perplexity
(``scored_sweep``), into the same tables with the metric's own column.
"""

import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from fairseq_headprune.engine.families import family_named
from fairseq_headprune.engine.runners.device_batching import sweep_batching
from fairseq_headprune.engine.runtime.ranks import current_ranks
from fairseq_headprune.engine.sweeps.translation_sweep import table_caption, write_result_rows
from fairseq_headprune.errors import HeadMaskError, StudyError
from fairseq_headprune.modules.masked_multihead_attention import current_head_mask, head_layout
from fairseq_headprune.study.importance.ablation import (
    all_but_one_configs,
    baseline_config,
    best_heads,
    cross_domain_correlation,
    cross_domain_rows,
    markdown_cross_domain,
    single_head_configs,
)
from fairseq_headprune.study.importance.settings import AblationSettings
from fairseq_headprune.study.masks.head_mask import parse_head_mask
from fairseq_headprune.study.output.files import write_text
from fairseq_headprune.study.output.plots import plot_cross_domain, plot_delta_heatmaps, plot_score_histogram
from fairseq_headprune.study.output.tables import (
    latex_best_table,
    latex_single_table,
    markdown_best_table,
    markdown_single_table,
)


@dataclass
class AblationOutcome:
    """What a finished ablation study reports on the console."""

    split: str
    baseline_score: float  # in the study's metric (BLEU, accuracy, MCC or perplexity)
    rows: List[Dict[str, object]]  # one per configuration, with its test
    best: List[Dict[str, object]] = field(default_factory=list)  # all-but-one: best head per layer
    cross_split: Optional[str] = None
    pearson: Optional[Tuple[float, float]] = None  # cross-domain: (r, p) of the two splits' changes
    written: List[str] = field(default_factory=list)  # lines naming the files written


def run_ablation(settings: AblationSettings) -> Optional[AblationOutcome]:
    """The study's outcome (None on ranks other than 0, which only translate their share)."""

    sweep_settings = settings.sweep
    family = family_named(sweep_settings.family)
    cfg, task, model = family.load(sweep_settings.data, sweep_settings.checkpoint, sweep_settings.generation_args,
                                   cpu=sweep_settings.cpu)
    layout = head_layout(model)
    base_mask = current_head_mask(model)  # --head-mask and the checkpoint's recorded mask
    heads = None
    if settings.heads:
        try:
            heads = parse_head_mask(settings.heads, layout)
        except HeadMaskError as error:
            raise StudyError(f"the heads: {error}", setting="heads") from error
    types = [t for t in settings.types if t in layout]
    if settings.mode == "all-but-one":
        configs = [baseline_config()] + all_but_one_configs(layout, types)
    else:
        configs = [baseline_config()] + [
            c for c in single_head_configs(layout, heads) if c.attention_type in settings.types
        ]
    if len(configs) == 1:
        raise StudyError(
            f"no configuration to run (check the types and the heads; the model has {', '.join(layout)} attention)",
            setting=("types", "heads"))
    current_ranks().require_work_for_each(len(configs), "configurations")
    os.makedirs(sweep_settings.out_dir, exist_ok=True)
    out = sweep_settings.out_dir
    # on a GPU, what fills it (stated on the console); later loads take the batch size from the settings
    sweep_settings = sweep_batching(sweep_settings, cfg, task, model, sweep_settings.gen_subset, len(configs) - 1)

    split = sweep_settings.gen_subset
    sweep = family.open_split_sweep(sweep_settings, cfg, task, model, split, split, sweep_settings.references)
    translated = sweep.run(configs, base_mask)
    other = None  # all-but-one: the selection split; cross-domain: the shifted split
    if settings.mode == "all-but-one" and settings.select_subset:
        other = family.open_split_sweep(sweep_settings, cfg, task, model, settings.select_subset,
                                        settings.select_subset)
    elif settings.mode == "cross-domain":
        cross_cfg, cross_task, cross_model, name = cfg, task, model, settings.cross_subset
        if settings.cross_data:
            cross_cfg, cross_task, cross_model = family.load(settings.cross_data, sweep_settings.checkpoint,
                                                             sweep_settings.generation_args, cpu=sweep_settings.cpu)
            name = f"{os.path.basename(os.path.normpath(settings.cross_data))}.{settings.cross_subset}"
        other = family.open_split_sweep(sweep_settings, cross_cfg, cross_task, cross_model, settings.cross_subset, name)
    other_translated = other.run(configs, base_mask) if other is not None else None
    if not current_ranks().is_main:
        return None  # rank 0 tests and writes
    baseline, rows = sweep.compare(translated, configs)
    outcome = AblationOutcome(split, sweep.baseline_score(baseline), rows)

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


def _write_single(sweep, baseline, rows, prefix: str) -> None:
    """Table 1 (TSV, JSON, Markdown, LaTeX), Figure 1's heat maps and the score histogram."""

    settings, metric = sweep.settings, sweep.metric
    record = sweep.settings_record(baseline)
    write_result_rows(prefix, rows, record)
    baseline_score = sweep.baseline_score(baseline)
    caption = table_caption(settings, f"{metric.title} change when one head is masked", sweep.split)
    write_text(markdown_single_table(rows, baseline_score, caption), prefix + ".md")
    write_text(latex_single_table(rows, baseline_score, caption), prefix + ".tex")
    plot_delta_heatmaps(
        rows, prefix + "_delta.png",
        f"Δ{metric.label} when one head is masked ({sweep.split}; dots: p < {settings.test.alpha:g})",
        colorbar_label=f"Δ{metric.label}",
    )
    plot_score_histogram(
        rows, baseline_score, prefix + "_hist.png",
        f"{metric.label} with one head masked ({sweep.split})", settings.score_label, column=metric.column,
    )


def _write_all_but_one(settings: AblationSettings, sweep, baseline, rows, select_rows,
                       outcome: AblationOutcome) -> None:
    """Table 2: every kept head, the best per layer, and (appendix A) the head chosen on another split."""

    out = settings.sweep.out_dir
    record = sweep.settings_record(baseline)
    write_result_rows(os.path.join(out, "all_but_one"), rows, record)
    metric = sweep.metric
    best, entries, selected = best_heads(
        rows, select_rows, settings.select_subset, metric.column, metric.higher_is_better
    )
    if selected is not None:
        record["select_subset"] = settings.select_subset
    prefix = os.path.join(out, "all_but_one_best")
    write_result_rows(prefix, entries, record)
    caption = table_caption(
        settings.sweep, f"Best {metric.label} change per layer when only one head is kept", sweep.split
    )
    write_text(markdown_best_table(best, caption, selected), prefix + ".md")
    write_text(latex_best_table(best, caption, selected), prefix + ".tex")
    plot_delta_heatmaps(
        rows, os.path.join(out, "all_but_one_delta.png"),
        f"Δ{metric.label} when only this head of its layer is kept "
        f"({sweep.split}; dots: p < {settings.sweep.test.alpha:g})",
        colorbar_label=f"Δ{metric.label}",
    )
    outcome.best = entries
    outcome.written.append(
        f"{prefix}.{{tsv,json,md,tex}} {os.path.join(out, 'all_but_one')}.{{tsv,json}} all_but_one_delta.png"
    )


def _write_cross_domain(sweep, cross, baseline, cross_baseline, rows, cross_rows,
                        outcome: AblationOutcome) -> None:
    """Figure 2: the change on the test split against the change on the shifted one, with Pearson's r."""

    settings, label = sweep.settings, sweep.metric.label
    joined = cross_domain_rows(rows, cross_rows)
    (r, p), per_type = cross_domain_correlation(joined)
    record = sweep.settings_record(baseline)
    record.update(
        {
            "cross_split": cross.split,
            f"cross_baseline_{sweep.metric.column}": cross.baseline_score(cross_baseline),
            "pearson_r": r,
            "pearson_p": p,
            "pearson_per_type": {t: {"r": v[0], "p": v[1]} for t, v in per_type.items()},
        }
    )
    prefix = os.path.join(settings.out_dir, "cross_domain")
    write_result_rows(prefix, joined, record)
    write_text(
        markdown_cross_domain((r, p), per_type, sweep.split, cross.split, settings.metric.description, label),
        prefix + ".md",
    )
    plot_cross_domain(
        joined, prefix + ".png", f"Pearson r = {r:.2f} (p = {p:.2g})",
        f"Δ{label} on {sweep.split}", f"Δ{label} on {cross.split}",
    )
    outcome.cross_split, outcome.pearson = cross.split, (r, p)
    outcome.written.append(f"{prefix}.{{tsv,json,md,png}}")
