"""Pruning curves and random head budgets on a loaded model (Michel et al. 4.2, 5; Budhraja et al.).

``run_prune`` decides every step's mask (``study.pruning.plan_curves``),
estimating importance where an order needs it (``ImportanceStore``, resumable),
translates all distinct masks in one resumable sweep (or, for a classifier or
language model, scores them: accuracy or Matthews correlation, perplexity)
and tests each against the unpruned model, then writes the tables and
figures, with the metric's own column. ``dynamics`` calls it
once per epoch checkpoint with the same settings.
"""

import dataclasses
import json
import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

from ..constants import ORDERS, SCOPES, TRANSLATION_FAMILY
from ..errors import SettingsError, ResultFileError, StudyError
from ..study.ablation import BASELINE, HeadConfig, baseline_config
from ..study.ablation_tables import write_rows_tsv
from ..study.files import write_json, write_text
from ..study.budgets import parse_layer_budget, parse_type_budget, plan_budgets
from ..study.pruning import (
    PruneStep,
    mask_name,
    markdown_budgets,
    markdown_curves,
    plan_curves,
    pruning_mask,
    read_ablation_rows,
    summarize_budgets,
    summarize_curves,
    given_mask_steps,
    tuned_steps,
)
from ..study.settings import PruneSettings, SweepSettings
from .loading import load_study_model
from .mask_sources import (
    FISHER_DIR,
    FISHER_ORDERS,
    ImportanceStore,
    TuningStore,
    method_costs,
    read_gate_mask,
)
from .ranks import current_ranks
from .scored_sweep import open_split_sweep
from .split_sweep import table_caption, write_result_rows

RESULT_COLUMNS = ("config", "spec", "bleu", "delta", "bleu_tokenized", "bleu_sacrebleu", "p_value", "significant",
                  "ci_low", "ci_high")
TEST_COLUMNS = ("p_value", "significant", "ci_low", "ci_high")


@dataclass
class PruneOutcome:
    """What a finished pruning study reports."""

    split: str
    baseline_score: float  # in the study's metric (BLEU, accuracy, MCC or perplexity)
    curve_summary: List[Dict[str, object]] = field(default_factory=list)  # one row per (scope, order, step)
    step_rows: List[Dict[str, object]] = field(default_factory=list)  # one row per step (and draw)
    budget_summary: List[Dict[str, object]] = field(default_factory=list)
    curve_files: List[str] = field(default_factory=list)  # written for the curves, relative to OUT
    budget_files: str = ""  # written for the budgets
    method_costs: Dict[str, Dict[str, object]] = field(default_factory=dict)  # per order: seconds, sentences


def run_prune(settings: PruneSettings) -> Optional[PruneOutcome]:
    """The whole study of one checkpoint (None on ranks other than 0, which only do their share)."""
    from ..modules.masked_multihead_attention import current_head_mask, head_layout
    from ..study.importance import read_importance_file

    sweep_settings = settings.sweep
    ablation_rows = read_ablation_rows(settings.ablation_file) if "ablation" in settings.orders else None
    if settings.importance_file and not os.path.isfile(settings.importance_file):
        raise StudyError(f"--importance file not found: {settings.importance_file}")

    cfg, task, model = load_study_model(sweep_settings, sweep_settings.data)
    layout = head_layout(model)
    budgets = [parse_layer_budget(text, layout) for text in settings.layer_budgets]
    budgets += [parse_type_budget(text, layout) for text in settings.type_budgets]
    # a file for another model fails before any work
    given = None
    if settings.importance_file:
        try:
            given_result = read_importance_file(settings.importance_file, layout)
        except ResultFileError as error:
            raise ResultFileError(f"--importance: {error}")
        method = settings.curve.importance.method
        if given_result.method != method:  # the first step would rank by one score, the next by the other
            raise SettingsError(
                f"--importance {settings.importance_file} holds {given_result.method} scores, "
                f"but --importance-method is {method}"
            )
        given = given_result.importance
    base_mask = current_head_mask(model)
    os.makedirs(sweep_settings.out_dir, exist_ok=True)
    needs_store = "iterative" in settings.orders or ("importance" in settings.orders and given is None)
    store = (
        ImportanceStore(sweep_settings, settings.curve.importance, cfg, task, model, base_mask) if needs_store else None
    )

    def importance_of(pruned, description):
        if not pruned and given is not None:
            return given
        return store.importance(pruning_mask(layout, pruned), description)

    fisher, fisher_store = None, None
    if FISHER_ORDERS & set(settings.orders):
        if settings.fisher_file:
            from .search_study import read_fisher_file

            fisher_result = read_fisher_file(settings.fisher_file, layout)
        else:
            fisher_settings = dataclasses.replace(settings.curve.importance, method="fisher")
            fisher_store = ImportanceStore(sweep_settings, fisher_settings, cfg, task, model, base_mask, FISHER_DIR)
            fisher_result = fisher_store.result(pruning_mask(layout, []), "Fisher information")
        fisher = (fisher_result.importance, fisher_result.fisher_blocks)

    steps = plan_curves(
        layout, settings.orders, settings.scopes, importance_of, normalize=not settings.curve.raw_importance,
        step_percent=settings.curve.step_percent, max_percent=settings.curve.max_percent,
        ablation_rows=ablation_rows, ablation_source=f"--ablation {settings.ablation_file}",
        higher_is_better=sweep_settings.metric.higher_is_better,
        draws=settings.draws, seed=settings.pruning_seed, fisher=fisher,
    )
    if settings.gate_masks:
        steps += given_mask_steps(layout, "gates", [read_gate_mask(path, layout) for path in settings.gate_masks])
    tuning_store = None
    if settings.tuning is not None:
        tuned = tuned_steps(steps, settings.tune_orders)
        tuning_store = TuningStore(sweep_settings, settings.tuning, task, model, base_mask)
        tuning_store.fit_all([step.head_mask for step in tuned])
        for step in tuned:
            step.tuning = tuning_store.tuning(step.head_mask)
        steps += tuned
    budget_draws = plan_budgets(budgets, layout, settings.pruning_seed, settings.draws)

    configs = {BASELINE: baseline_config()}
    for step in steps:
        tuning = step.tuning if step.tuning is not None and step.tuning.layers else None
        configs.setdefault(step.config_name, HeadConfig(step.config_name, step.head_mask, tuning=tuning))
    for head_mask in [mask for _, _, mask in budget_draws]:
        configs.setdefault(mask_name(head_mask), HeadConfig(mask_name(head_mask), head_mask))
    split = sweep_settings.gen_subset
    sweep = open_split_sweep(sweep_settings, cfg, task, model, split, split, sweep_settings.references)
    translated = sweep.run(list(configs.values()), base_mask)
    if not current_ranks().is_main:
        return None  # rank 0 tests and writes
    baseline, rows = sweep.compare(translated, list(configs.values()))
    by_config = {row["config"]: row for row in rows}
    record = sweep.settings_record(baseline)
    record.update(
        {
            "orders": list(settings.orders),
            "scopes": list(settings.scopes),
            "step_percent": settings.curve.step_percent,
            "max_percent": settings.curve.max_percent,
            "draws": settings.draws,
            "pruning_seed": settings.pruning_seed,
            "importance": os.path.abspath(settings.importance_file) if settings.importance_file else (
                None if store is None else os.path.abspath(store.directory)
            ),
            "importance_ranking": "raw" if settings.curve.raw_importance else "normalised per layer",
            "importance_method": settings.curve.importance.method,
            "ablation": os.path.abspath(settings.ablation_file) if settings.ablation_file else None,
            "fisher": os.path.abspath(settings.fisher_file) if settings.fisher_file else (
                None if fisher_store is None else os.path.abspath(fisher_store.directory)
            ),
            "tuning": None if tuning_store is None else dict(tuning_store.identity, orders=list(settings.tune_orders)),
            "method_costs": method_costs(settings, store, fisher_store, tuning_store, steps),
        }
    )
    outcome = PruneOutcome(split, sweep.baseline_score(baseline), method_costs=record["method_costs"])
    if steps:
        _write_curves(settings, steps, by_config, record, outcome)
    if budget_draws:
        _write_budgets(settings, layout, budget_draws, by_config, record, outcome)
    return outcome


def _result_columns(row: Dict[str, object], sweep: SweepSettings) -> Dict[str, object]:
    """A step's result: the translation columns, or the metric's own (with the loss per token for perplexity)."""
    if sweep.family == TRANSLATION_FAMILY:
        return {key: row[key] for key in RESULT_COLUMNS}
    column = sweep.metric.column
    keys = ("config", "spec", column, "delta") + (("loss",) if "loss" in row else ()) + TEST_COLUMNS
    return {key: row[key] for key in keys}


def _axis_label(sweep: SweepSettings) -> str:
    return f"{sweep.score_label} on {sweep.gen_subset}"


def _write_curves(settings: PruneSettings, steps: Sequence[PruneStep], by_config, record, outcome: PruneOutcome):
    """Per scope: every step, the curves and their figure; then the tables and Figure 4 of every scope in OUT.

    Separate runs (one per attention type, as the prune_*.sh scripts do) into one
    output directory thus add up to the paper's Figure 4.
    """
    from ..study.plots import plot_pruning_curves

    out = settings.sweep.out_dir
    for scope in settings.scopes:
        rows = []
        for step in (s for s in steps if s.scope == scope):
            row = {
                "scope": step.scope, "order": step.order, "draw": step.draw, "step": step.step,
                "pruned": step.pruned, "total": step.total, "percent": step.percent,
            }
            row.update(_result_columns(by_config[step.config_name], settings.sweep))
            rows.append(row)
        write_result_rows(os.path.join(out, f"prune_steps.{scope}"), rows, record)
        outcome.step_rows += rows
        column = settings.sweep.metric.column
        summary = summarize_curves(rows, column)
        outcome.curve_summary += summary
        write_result_rows(os.path.join(out, f"prune_curves.{scope}"), summary, record)
        plot_pruning_curves(
            summary, scope, outcome.baseline_score, os.path.join(out, f"prune_curves.{scope}.png"),
            _axis_label(settings.sweep), column=column, metric_label=settings.sweep.metric.label,
        )
        outcome.curve_files.append(f"prune_curves.{scope}.{{tsv,json,png}} prune_steps.{scope}.{{tsv,json}}")
    outcome.curve_files += _write_combined_curves(settings.sweep, outcome.baseline_score)


def curves_of(out_dir: str, scope: str) -> List[Dict[str, object]]:
    """The curve summary a run wrote for ``scope`` into ``out_dir`` (empty if none)."""
    path = os.path.join(out_dir, f"prune_curves.{scope}.json")
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as stream:
        return json.load(stream)["rows"]


def _write_combined_curves(sweep: SweepSettings, baseline_score: float) -> List[str]:
    """prune_curves.md and prune_types.png from every scope's curves in the output directory."""
    from ..study.plots import plot_pruning_by_type

    out, metric = sweep.out_dir, sweep.metric
    summary = [row for scope in SCOPES for row in curves_of(out, scope)]
    caption = table_caption(
        sweep, f"{metric.label} as more and more heads are pruned (random: mean ± std over its draws)",
        sweep.gen_subset,
    )
    write_text(markdown_curves(summary, baseline_score, caption, metric.column, metric.label),
               os.path.join(out, "prune_curves.md"))
    written = ["prune_curves.md"]
    types = {r["scope"] for r in summary if r["scope"] != "all"}
    if types:
        # the paper's Figure 4 uses the importance order; otherwise the first order every type has
        shared = [o for o in ORDERS if all(any(r["scope"] == t and r["order"] == o for r in summary) for t in types)]
        if shared:
            plot_pruning_by_type(
                summary, shared[0], baseline_score, os.path.join(out, "prune_types.png"), _axis_label(sweep),
                column=metric.column, metric_label=metric.label,
            )
            written.append("prune_types.png")
    return written


def _write_budgets(settings: PruneSettings, layout, budget_draws, by_config, record, outcome: PruneOutcome) -> None:
    out = settings.sweep.out_dir
    rows = []
    for budget, draw, head_mask in budget_draws:
        row = {"budget": budget.label, "kind": budget.kind, "draw": draw,
               "percent": budget.pruned_percent(layout)}
        row.update(_result_columns(by_config[mask_name(head_mask)], settings.sweep))
        rows.append(row)
    write_result_rows(os.path.join(out, "budgets"), rows, record)
    metric = settings.sweep.metric
    summary = summarize_budgets(rows, metric.column)
    write_rows_tsv(summary, os.path.join(out, "budgets_summary.tsv"))
    write_json({"settings": record, "rows": summary}, os.path.join(out, "budgets_summary.json"), indent=1)
    caption = table_caption(
        settings.sweep, f"Heads kept at random within each budget (mean ± std over {settings.draws} draws)",
        settings.sweep.gen_subset,
    )
    write_text(markdown_budgets(summary, outcome.baseline_score, caption, metric.column, metric.label),
               os.path.join(out, "budgets_summary.md"))
    outcome.budget_summary = summary
    outcome.budget_files = (f"{os.path.join(out, 'budgets')}.{{tsv,json}} budgets_summary.{{tsv,json,md}}")
