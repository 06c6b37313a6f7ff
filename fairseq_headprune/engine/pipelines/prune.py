"""Pruning curves and random head budgets on a loaded model (Michel et al. 4.2, 5; Budhraja et al.).

``run_prune`` decides every step's mask (``study.pruning.curves.plan_curves``; FFN
neurons and the joint search of heads and neurons in steps of FLOPs:
``study.structure_curves``), estimating importance where an order needs it
(``ImportanceStore``, resumable), translates all distinct masks in one
resumable sweep (or, for a classifier or language model, scores them:
accuracy or Matthews correlation, perplexity) and tests each against the
unpruned model, then writes the tables and figures, with the metric's own
column. ``dynamics`` calls it once per epoch checkpoint with the same settings.
"""

import dataclasses
import json
import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

from fairseq_headprune.constants import ORDERS, SCOPES
from fairseq_headprune.engine.families import family_named
from fairseq_headprune.engine.pipelines.finetune_configs import finetune_configurations, run_finetune_configs
from fairseq_headprune.engine.runners.batches import load_split
from fairseq_headprune.engine.runners.device_batching import sweep_batching
from fairseq_headprune.engine.runtime.ranks import current_ranks
from fairseq_headprune.engine.search.mask_sources import (
    FISHER_DIR,
    FISHER_ORDERS,
    ImportanceStore,
    TuningStore,
    method_costs,
    read_gate_mask,
)
from fairseq_headprune.engine.search.model_costs import model_architecture, model_flops
from fairseq_headprune.engine.sweeps.translation_sweep import table_caption, write_result_rows
from fairseq_headprune.errors import ResultFileError, SettingsError, StudyError, setting_words
from fairseq_headprune.modules.masked_ffn import current_ffn_mask, ffn_layout
from fairseq_headprune.modules.masked_multihead_attention import current_head_mask, head_layout
from fairseq_headprune.study.budhraja.budgets import draws_text, plan_budgets
from fairseq_headprune.study.budhraja.configurations import requested_budgets
from fairseq_headprune.study.budhraja.records import FinetuneRecord
from fairseq_headprune.study.importance.ablation import BASELINE, HeadConfig, baseline_config
from fairseq_headprune.study.importance.scores import read_fisher_file, read_importance_file
from fairseq_headprune.study.output.files import write_json, write_rows_tsv, write_text
from fairseq_headprune.study.output.plots import plot_pruning_by_type, plot_pruning_curves
from fairseq_headprune.study.pruning.curves import (
    TUNED_SUFFIX,
    CurvePlan,
    CurveScores,
    PruneStep,
    given_mask_steps,
    markdown_budgets,
    markdown_curves,
    mask_name,
    plan_curves,
    pruning_mask,
    read_ablation_rows,
    summarize_budgets,
    summarize_curves,
    tuned_steps,
)
from fairseq_headprune.study.pruning.settings import PruneSettings
from fairseq_headprune.study.pruning.structure_curves import (
    FLOPS_AXIS_TITLE,
    SHARED_COLUMNS,
    StructureScores,
    StructureStep,
    axis_title,
    flops_axis_steps,
    markdown_structure_curves,
    plan_structure_curves,
)
from fairseq_headprune.study.settings import SweepSettings

# neuron scores of the FFN curves: estimated with the heads', stored apart from head-only estimates
NEURON_IMPORTANCE_DIR = "importance-ffn"
NEURON_FISHER_DIR = "importance-fisher-ffn"


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
    finetune_records: List[FinetuneRecord] = field(default_factory=list)  # Budhraja et al.'s protocol
    finetune_results: str = ""  # their file
    method_costs: Dict[str, Dict[str, object]] = field(default_factory=dict)  # per order: seconds, sentences
    curve_scopes: List[str] = field(default_factory=list)  # the curves' scopes (ffn, joint: the structure's)
    x_title: str = "the heads pruned"  # what the curves' x% is a share of


def run_prune(settings: PruneSettings) -> Optional[PruneOutcome]:
    """The whole study of one checkpoint (None on ranks other than 0, which only do their share)."""
    sweep_settings = settings.sweep
    ablation_rows = read_ablation_rows(settings.ablation_file) if "ablation" in settings.orders else None
    if settings.importance_file and not os.path.isfile(settings.importance_file):
        raise StudyError(f"the importance file {settings.importance_file} is not found", setting="importance")

    family = family_named(sweep_settings.family)
    cfg, task, model = family.load(sweep_settings.data, sweep_settings.checkpoint, sweep_settings.generation_args,
                                   cpu=sweep_settings.cpu)
    load_split(task, sweep_settings.gen_subset)  # the split every step translates, found before any work
    layout = head_layout(model)
    budgets = requested_budgets(settings, layout)
    # a file for another model fails before any work
    given = _given_importance(settings, layout)
    base_mask = current_head_mask(model)
    plan = CurvePlan(settings.orders, settings.scopes, normalize=not settings.curve.raw_importance,
                     step_percent=settings.curve.step_percent, max_percent=settings.curve.max_percent,
                     draws=settings.draws, seed=settings.pruning_seed)
    flops = None
    if settings.structure != "heads" or settings.x_axis == "flops":
        flops = model_flops(model, model_architecture(model), settings.sequence_length)
    tuning_store = None
    if settings.structure == "heads":
        os.makedirs(sweep_settings.out_dir, exist_ok=True)
        steps, store, fisher_store, tuning_store = _head_curve_steps(
            settings, (family, cfg, task, model), plan, given, ablation_rows, base_mask)
        if flops is not None:
            steps = _on_flops_axis(steps, flops)
    else:
        structure_scores, store, fisher_store = _structure_scores(settings, family, cfg, task, model, base_mask)
        os.makedirs(sweep_settings.out_dir, exist_ok=True)
        steps = plan_structure_curves(settings.structure, layout, ffn_layout(model), flops, plan, structure_scores,
                                      settings.x_axis)
        if settings.tuning is not None:
            tuning_store = TuningStore(sweep_settings, settings.tuning, task, model, base_mask,
                                       loss=family.tuning_loss(cfg, task))
            steps += _tuned_structure_steps(steps, settings.tune_orders, tuning_store)
    budget_draws = plan_budgets(budgets, layout, settings.pruning_seed, settings.draws)

    configs = {BASELINE: baseline_config()}
    for step in steps:
        tuning = step.tuning if step.tuning is not None and step.tuning.layers else None
        ffn_mask = step.ffn_mask if isinstance(step, StructureStep) else None
        configs.setdefault(step.config_name, HeadConfig(step.config_name, step.head_mask, tuning=tuning,
                                                        ffn_mask=ffn_mask))
    for head_mask in [mask for _, _, mask in budget_draws]:
        configs.setdefault(mask_name(head_mask), HeadConfig(mask_name(head_mask), head_mask))
    split = sweep_settings.gen_subset
    sweep_settings = sweep_batching(sweep_settings, cfg, task, model, split, len(configs) - 1)  # GPU: fill it
    sweep = family.open_split_sweep(sweep_settings, cfg, task, model, split, split, sweep_settings.references)
    translated = sweep.run(list(configs.values()), base_mask)
    ranks = current_ranks()
    outcome = None
    if ranks.is_main:  # rank 0 tests and writes
        outcome, by_config = _tested_and_written(settings, layout, sweep, translated, configs, steps, budget_draws,
                                                 (store, fisher_store, tuning_store), flops)
    if settings.finetune is not None and settings.finetune.enabled:
        chosen = finetune_configurations(settings, layout, steps, budget_draws, by_config, outcome.baseline_score
                                         ) if ranks.is_main else None
        records = run_finetune_configs(settings, ranks.main_value(chosen),
                                       translated.get(BASELINE) if ranks.is_main else None)
        if outcome is not None:
            outcome.finetune_records = records
            outcome.finetune_results = os.path.join(settings.sweep.out_dir, "finetune", "results.json")
    return outcome


def _tested_and_written(settings: PruneSettings, layout, sweep, translated, configs, steps, budget_draws, stores,
                        flops):
    """Rank 0: every configuration tested against the baseline, the curves' and budgets' files written."""
    store, fisher_store, tuning_store = stores
    split = settings.sweep.gen_subset
    baseline, rows = sweep.compare(translated, list(configs.values()))
    by_config = {row["config"]: sweep.result_columns(row) for row in rows}  # a step's columns in the metric
    record = dict(sweep.settings_record(baseline), **_study_record(settings, store, fisher_store, tuning_store, steps))
    outcome = PruneOutcome(split, sweep.baseline_score(baseline), method_costs=record["method_costs"],
                           curve_scopes=_curve_scopes(settings))
    if flops is not None:
        outcome.x_title = FLOPS_AXIS_TITLE if settings.x_axis == "flops" else "the FFN neurons pruned"
    if steps:
        _write_curves(settings, steps, by_config, record, outcome)
    if budget_draws:
        _write_budgets(settings, layout, budget_draws, by_config, record, outcome)
    return outcome, by_config


def _head_curve_steps(settings: PruneSettings, loaded, plan: CurvePlan, given, ablation_rows, base_mask):
    """The head curves' steps (tuned ones too); the importance, Fisher and tuning stores they used."""
    family, cfg, task, model = loaded
    layout, sweep_settings = head_layout(model), settings.sweep
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
    scores = CurveScores(importance_of, ablation_rows, settings.ablation_file,
                         higher_is_better=sweep_settings.metric.higher_is_better, fisher=fisher)
    steps = plan_curves(layout, plan, scores)
    if settings.gate_masks:
        steps += given_mask_steps(layout, "gates", [read_gate_mask(path, layout) for path in settings.gate_masks])
    tuning_store = None
    if settings.tuning is not None:
        tuning_store = TuningStore(sweep_settings, settings.tuning, task, model, base_mask,
                                   loss=family.tuning_loss(cfg, task))
        steps += _tuned_steps(steps, settings.tune_orders, tuning_store)
    return steps, store, fisher_store, tuning_store


def _curve_scopes(settings: PruneSettings) -> List[str]:
    return list(settings.scopes) if settings.structure == "heads" else [settings.structure]


def _on_flops_axis(steps: Sequence[PruneStep], flops) -> List[StructureStep]:
    """Head curves placed on the FLOPs axis (their tunings kept)."""
    placed = flops_axis_steps(steps, flops)
    for new, old in zip(placed, steps):
        new.tuning = old.tuning
    return placed


def _structure_scores(settings: PruneSettings, family, cfg, task, model, base_mask):
    """Neuron scores of the FFN and joint curves: from --importance / --fisher or estimated (stored); the stores."""
    if current_ffn_mask(model) is not None:
        raise StudyError(f"{settings.sweep.checkpoint} has FFN neurons masked; prune FFN neurons of the full model")
    layout, shapes = head_layout(model), dict(ffn_layout(model))
    scores, store, fisher_store = StructureScores(), None, None
    if "importance" in settings.orders:
        given = _given_result(settings, layout)
        if given is None:
            neuron_settings = dataclasses.replace(settings.curve.importance, neurons=True)
            store = ImportanceStore(family, settings.sweep, neuron_settings, cfg, task, model, base_mask,
                                    NEURON_IMPORTANCE_DIR)
            given = store.result(pruning_mask(layout, []), "importance")
        scores.neuron_importance = _neuron_scores(given, "importance", settings.importance_file, shapes,
                                                  "importance --importance-structures heads,ffn")
    if any(order.startswith("fisher") for order in settings.orders):
        if settings.fisher_file:
            result = read_fisher_file(settings.fisher_file, layout)
        else:
            fisher_settings = dataclasses.replace(settings.curve.importance, method="fisher", neurons=True)
            fisher_store = ImportanceStore(family, settings.sweep, fisher_settings, cfg, task, model, base_mask,
                                           NEURON_FISHER_DIR)
            result = fisher_store.result(pruning_mask(layout, []), "Fisher information")
        scores.neuron_fisher = _neuron_scores(result, "fisher", settings.fisher_file, shapes,
                                              "importance --importance-method fisher --importance-structures heads,ffn")
        scores.fisher, scores.fisher_blocks = result.importance, result.fisher_blocks
    return scores, store, fisher_store


def _neuron_scores(result, setting: str, path, shapes, remedy: str):
    """The neuron scores of an importance result (the file ``path`` of ``setting``, importance or fisher, or
    estimated); a file without them (or of another model) is named."""
    source = f"{setting_words(setting)} {path}"
    if result.neuron_importance is None:
        raise ResultFileError(f"{source} has no FFN neuron scores; estimate them with {remedy}", setting=setting)
    found = {t: tuple(s.shape) for t, s in result.neuron_importance.items()}
    if found != shapes:
        raise ResultFileError(f"{source} scores the FFN neurons of another model ({found}, not {shapes})",
                              setting=setting)
    return result.neuron_importance


def _given_importance(settings: PruneSettings, layout):
    """The scores of ``--importance FILE`` (None without one): the first step's ranking."""
    given = _given_result(settings, layout)
    return None if given is None else given.importance


def _given_result(settings: PruneSettings, layout):
    """``--importance FILE`` read and checked (None without one)."""
    if not settings.importance_file:
        return None
    try:
        given = read_importance_file(settings.importance_file, layout)
    except ResultFileError as error:
        raise ResultFileError(f"the importance file: {error}", setting="importance") from error
    method = settings.curve.importance.method
    if given.method != method:  # the first step would rank by one score, the next by the other
        raise SettingsError(f"the importance file {settings.importance_file} holds {given.method} scores, but the "
                            f"importance method is {method}", setting=("importance", "importance_method"))
    return given


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


def _tuned_structure_steps(steps: Sequence[StructureStep], tune_orders, tuning_store: TuningStore):
    """The chosen FFN or joint curves' steps again, heads and neurons tuned together (fitted once, stored)."""
    tuned = [dataclasses.replace(s, order=s.order + TUNED_SUFFIX) for s in steps if s.order in tune_orders]
    tuning_store.fit_all([(step.head_mask, step.ffn_mask) for step in tuned])
    for step in tuned:
        step.tuning = tuning_store.tuning(step.head_mask, step.ffn_mask)
    return tuned


def _study_record(settings: PruneSettings, store, fisher_store, tuning_store, steps) -> Dict[str, object]:
    """What the result files record of the study's settings and the cost of its mask sources."""
    record = {
        "orders": list(settings.orders),
        "scopes": list(settings.scopes),
        "step_percent": settings.curve.step_percent,
        "max_percent": settings.curve.max_percent,
        "draws": settings.draws,
        "budhraja_draws": settings.budhraja_draws,
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
    if settings.structure != "heads" or settings.x_axis == "flops":
        record.update(structure=settings.structure, x_axis=settings.x_axis, sequence_length=settings.sequence_length)
    return record


def _axis_label(sweep: SweepSettings) -> str:
    return f"{sweep.score_label} on {sweep.gen_subset}"


def _write_curves(settings: PruneSettings, steps: Sequence[PruneStep], by_config, record, outcome: PruneOutcome):
    """Per scope: every step, the curves and their figure; then the tables and Figure 4 of every scope in OUT.

    Separate runs (one per attention type, as the prune_*.sh scripts do) into one
    output directory thus add up to the paper's Figure 4.
    """

    out = settings.sweep.out_dir
    for scope in outcome.curve_scopes:
        rows = []
        for step in (s for s in steps if s.scope == scope):
            row = {
                "scope": step.scope, "order": step.order, "draw": step.draw, "step": step.step,
                "pruned": step.pruned, "total": step.total, "percent": step.percent,
            }
            if isinstance(step, StructureStep):
                row.update(step.columns())
            row.update(by_config[step.config_name])
            rows.append(row)
        write_result_rows(os.path.join(out, f"prune_steps.{scope}"), rows, record)
        outcome.step_rows += rows
        column = settings.sweep.metric.column
        structured = "x_axis" in rows[0]
        summary = summarize_curves(rows, column, SHARED_COLUMNS if structured else ())
        outcome.curve_summary += summary
        write_result_rows(os.path.join(out, f"prune_curves.{scope}"), summary, record)
        plot_pruning_curves(
            summary, scope, outcome.baseline_score, os.path.join(out, f"prune_curves.{scope}.png"),
            _axis_label(settings.sweep), column=column, metric_label=settings.sweep.metric.label,
            xlabel=axis_title(scope, settings.x_axis, rows[0]["total"]) if structured else None,
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

    out, metric = sweep.out_dir, sweep.metric
    summary = [row for scope in SCOPES + ("ffn", "joint") for row in curves_of(out, scope)]
    structured = [row for row in summary if "x_axis" in row]  # FFN, joint and FLOPs-axis curves
    summary = [row for row in summary if "x_axis" not in row]
    what = "heads are pruned" if not structured else "heads or FFN neurons are pruned"
    caption = table_caption(
        sweep, f"{metric.label} as more and more {what} (random: mean ± std over its draws)", sweep.gen_subset,
    )
    text = markdown_curves(summary, baseline_score, caption, metric.column, metric.label)
    if structured:
        text += markdown_structure_curves(structured, baseline_score, metric.column, metric.label)
    write_text(text, os.path.join(out, "prune_curves.md"))
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
               "percent": budget.pruned_percent(layout), "note": budget.note}
        row.update(by_config[mask_name(head_mask)])
        rows.append(row)
    write_result_rows(os.path.join(out, "budgets"), rows, record)
    metric = settings.sweep.metric
    summary = summarize_budgets(rows, metric.column)
    write_rows_tsv(summary, os.path.join(out, "budgets_summary.tsv"))
    write_json({"settings": record, "rows": summary}, os.path.join(out, "budgets_summary.json"), indent=1)
    caption = table_caption(
        settings.sweep, "Heads kept at random within each budget (mean ± std over "
        + draws_text([row["draws"] for row in summary if row["kind"] != "layers"] or [settings.draws])
        + "; whole-layer strategies: one fixed mask)",
        settings.sweep.gen_subset,
    )
    write_text(markdown_budgets(summary, outcome.baseline_score, caption, metric.column, metric.label),
               os.path.join(out, "budgets_summary.md"))
    outcome.budget_summary = summary
    outcome.budget_files = (f"{os.path.join(out, 'budgets')}.{{tsv,json}} budgets_summary.{{tsv,json,md}}")
