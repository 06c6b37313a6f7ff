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

from ...constants import ORDERS, SCOPES
from ...errors import SettingsError, ResultFileError, StudyError
from ...study.methods.ablation import BASELINE, HeadConfig, baseline_config
from ...study.output.files import write_rows_tsv
from ...study.output.files import write_json, write_text
from ...study.methods.importance import read_fisher_file, read_importance_file
from ...study.methods.budgets import parse_layer_budget, parse_type_budget, plan_budgets
from ...study.methods.pruning import (
    CurvePlan,
    CurveScores,
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
from ...study.settings import PruneSettings, SweepSettings
from ...modules.masked_multihead_attention import current_head_mask, head_layout
from ..families import family_named
from ..methods.mask_sources import FISHER_DIR, FISHER_ORDERS, ImportanceStore, TuningStore, method_costs, read_gate_mask
from ..runtime.ranks import current_ranks
from ..sweeps.translation_sweep import table_caption, write_result_rows

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
    sweep_settings = settings.sweep
    ablation_rows = read_ablation_rows(settings.ablation_file) if "ablation" in settings.orders else None
    if settings.importance_file and not os.path.isfile(settings.importance_file):
        raise StudyError(f"--importance file not found: {settings.importance_file}")

    family = family_named(sweep_settings.family)
    cfg, task, model = family.load(sweep_settings.data, sweep_settings.checkpoint, sweep_settings.generation_args,
                                   cpu=sweep_settings.cpu)
    layout = head_layout(model)
    budgets = [parse_layer_budget(text, layout) for text in settings.layer_budgets]
    budgets += [parse_type_budget(text, layout) for text in settings.type_budgets]
    # a file for another model fails before any work
    given = _given_importance(settings, layout)
    base_mask = current_head_mask(model)
    os.makedirs(sweep_settings.out_dir, exist_ok=True)
    needs_store = "iterative" in settings.orders or ("importance" in settings.orders and given is None)
    store = (
        ImportanceStore(family, sweep_settings, settings.curve.importance, cfg, task, model, base_mask)
        if needs_store else None
    )

    def importance_of(pruned, description):
        if not pruned and given is not None:
            return given
        return store.importance(pruning_mask(layout, pruned), description)

    fisher, fisher_store = _fisher_scores(settings, family, cfg, task, model, base_mask)

    plan = CurvePlan(settings.orders, settings.scopes, normalize=not settings.curve.raw_importance,
                     step_percent=settings.curve.step_percent, max_percent=settings.curve.max_percent,
                     draws=settings.draws, seed=settings.pruning_seed)
    scores = CurveScores(importance_of, ablation_rows, f"--ablation {settings.ablation_file}",
                         higher_is_better=sweep_settings.metric.higher_is_better, fisher=fisher)
    steps = plan_curves(layout, plan, scores)
    if settings.gate_masks:
        steps += given_mask_steps(layout, "gates", [read_gate_mask(path, layout) for path in settings.gate_masks])
    tuning_store = None
    if settings.tuning is not None:
        tuning_store = TuningStore(sweep_settings, settings.tuning, task, model, base_mask)
        steps += _tuned_steps(steps, settings.tune_orders, tuning_store)
    budget_draws = plan_budgets(budgets, layout, settings.pruning_seed, settings.draws)

    configs = {BASELINE: baseline_config()}
    for step in steps:
        tuning = step.tuning if step.tuning is not None and step.tuning.layers else None
        configs.setdefault(step.config_name, HeadConfig(step.config_name, step.head_mask, tuning=tuning))
    for head_mask in [mask for _, _, mask in budget_draws]:
        configs.setdefault(mask_name(head_mask), HeadConfig(mask_name(head_mask), head_mask))
    split = sweep_settings.gen_subset
    sweep = family.open_split_sweep(sweep_settings, cfg, task, model, split, split, sweep_settings.references)
    translated = sweep.run(list(configs.values()), base_mask)
    if not current_ranks().is_main:
        return None  # rank 0 tests and writes
    baseline, rows = sweep.compare(translated, list(configs.values()))
    by_config = {row["config"]: sweep.result_columns(row) for row in rows}  # a step's columns in the metric
    record = dict(sweep.settings_record(baseline), **_study_record(settings, store, fisher_store, tuning_store, steps))
    outcome = PruneOutcome(split, sweep.baseline_score(baseline), method_costs=record["method_costs"])
    if steps:
        _write_curves(settings, steps, by_config, record, outcome)
    if budget_draws:
        _write_budgets(settings, layout, budget_draws, by_config, record, outcome)
    return outcome


def _given_importance(settings: PruneSettings, layout):
    """The scores of ``--importance FILE`` (None without one): the first step's ranking."""
    if not settings.importance_file:
        return None
    try:
        given = read_importance_file(settings.importance_file, layout)
    except ResultFileError as error:
        raise ResultFileError(f"--importance: {error}") from error
    method = settings.curve.importance.method
    if given.method != method:  # the first step would rank by one score, the next by the other
        raise SettingsError(
            f"--importance {settings.importance_file} holds {given.method} scores, "
            f"but --importance-method is {method}"
        )
    return given.importance


def _fisher_scores(settings: PruneSettings, family, cfg, task, model, base_mask):
    """(scores, blocks) of the fisher orders, from ``--fisher FILE`` or estimated once (stored); and the store."""
    if not FISHER_ORDERS & set(settings.orders):
        return None, None
    layout = head_layout(model)
    fisher_store = None
    if settings.fisher_file:
        fisher_result = read_fisher_file(settings.fisher_file, layout)
    else:
        fisher_settings = dataclasses.replace(settings.curve.importance, method="fisher")
        fisher_store = ImportanceStore(family, settings.sweep, fisher_settings, cfg, task, model, base_mask,
                                       FISHER_DIR)
        fisher_result = fisher_store.result(pruning_mask(layout, []), "Fisher information")
    return (fisher_result.importance, fisher_result.fisher_blocks), fisher_store


def _tuned_steps(steps: Sequence[PruneStep], tune_orders, tuning_store: TuningStore) -> List[PruneStep]:
    """The chosen curves' steps again, each with its mask tuned (fitted once, stored)."""
    tuned = tuned_steps(steps, tune_orders)
    tuning_store.fit_all([step.head_mask for step in tuned])
    for step in tuned:
        step.tuning = tuning_store.tuning(step.head_mask)
    return tuned


def _study_record(settings: PruneSettings, store, fisher_store, tuning_store, steps) -> Dict[str, object]:
    """What the result files record of the study's settings and the cost of its mask sources."""
    return {
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


def _axis_label(sweep: SweepSettings) -> str:
    return f"{sweep.score_label} on {sweep.gen_subset}"


def _write_curves(settings: PruneSettings, steps: Sequence[PruneStep], by_config, record, outcome: PruneOutcome):
    """Per scope: every step, the curves and their figure; then the tables and Figure 4 of every scope in OUT.

    Separate runs (one per attention type, as the prune_*.sh scripts do) into one
    output directory thus add up to the paper's Figure 4.
    """
    from ...study.output.plots import plot_pruning_curves

    out = settings.sweep.out_dir
    for scope in settings.scopes:
        rows = []
        for step in (s for s in steps if s.scope == scope):
            row = {
                "scope": step.scope, "order": step.order, "draw": step.draw, "step": step.step,
                "pruned": step.pruned, "total": step.total, "percent": step.percent,
            }
            row.update(by_config[step.config_name])
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
    from ...study.output.plots import plot_pruning_by_type

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
        row.update(by_config[mask_name(head_mask)])
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
