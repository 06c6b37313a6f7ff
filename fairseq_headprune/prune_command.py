"""``fairseq-headprune prune``: pruning curves and random head budgets.

Decides every step's mask (``pruning``), estimating importance where the
order needs it, then translates all distinct masks in one resumable sweep
(``sweep.run_sweep``) and tests each against the unpruned model.
"""

import csv
import json
import os
from typing import Dict, List, Optional, Sequence, Tuple

from .ablate_command import (
    SplitSweep,
    add_sweep_arguments,
    check_sweep_arguments,
    compare_sweep,
    settings_record,
    table_caption,
    write_result_rows,
)
from .ablation import BASELINE, HeadConfig, baseline_config, reported_bleu, write_rows_tsv
from .atomic_files import write_json, write_text
from .evaluation import StudyError
from .head_mask import HeadMask, HeadMaskError, combine_masks, full_mask, head_mask_to_spec
from .pruning import (
    ORDERS,
    SCOPES,
    Budget,
    PruneStep,
    ablation_scores,
    ascending,
    budget_mask,
    curve_steps,
    heads_in_scope,
    importance_scores,
    mask_name,
    markdown_budgets,
    markdown_curves,
    parse_layer_budget,
    parse_type_budget,
    pruning_mask,
    random_order,
    step_counts,
    summarize_budgets,
    summarize_curves,
)

IMPORTANCE_DIR = "importance"


def _choices(text: str, allowed: Sequence[str], option: str) -> List[str]:
    if text.strip().lower() == "none":
        return []
    values = [v for v in text.replace(",", " ").split() if v]
    for value in values:
        if value not in allowed:
            raise StudyError(f"{option}: unknown value {value!r} (expected {', '.join(allowed)})")
    if not values:
        raise StudyError(f"{option} is empty")
    return [v for v in allowed if v in values]


def read_ablation_rows(path: str) -> List[Dict[str, object]]:
    """Rows of an ``ablate --mode single`` result (single.json or single.tsv)."""
    if not os.path.isfile(path):
        raise StudyError(f"--ablation file not found: {path}")
    try:
        if path.endswith(".json"):
            with open(path, encoding="utf-8") as stream:
                rows = json.load(stream)["rows"]
        else:
            with open(path, encoding="utf-8", newline="") as stream:
                rows = list(csv.DictReader(stream, delimiter="\t"))
            for row in rows:
                row["layer"], row["head"] = int(row["layer"]), int(row["head"])
                row["delta"] = float(row["delta"])
        for row in rows:
            float(row["delta"])
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise StudyError(f"--ablation {path} is not an ablate --mode single result ({error})")
    return rows


class ImportanceStore:
    """Importance per mask under OUT/importance, estimated once and reused on rerun."""

    # the importance command's defaults; part of what a stored estimate is checked against
    LOSS, LABEL_SMOOTHING = "label_smoothed", 0.1

    def __init__(self, args, task, model, base_mask: Optional[HeadMask]):
        from .sweep import file_sha256

        self.args, self.task, self.model, self.base_mask = args, task, model, base_mask
        self.directory = os.path.join(args.out_dir, IMPORTANCE_DIR)
        self.identity = {
            "checkpoint_sha256": file_sha256(args.path),
            "data": os.path.abspath(args.data),
            "subsets": list(args.importance_subset),
            "limit_per_subset": args.importance_limit,
            "max_tokens": args.importance_max_tokens,
            "granularity": args.importance_granularity,
            "loss": self.LOSS,
            "label_smoothing": self.LABEL_SMOOTHING,
            "base_mask": head_mask_to_spec(base_mask) if base_mask is not None else "none",
        }
        self._estimator = None

    def importance(self, head_mask: HeadMask, description: str):
        """Raw importance of every head with ``head_mask`` (on top of the model's own mask) set."""
        from .importance import read_importance_file, write_importance_json
        from .sweep import first_difference

        path = os.path.join(self.directory, mask_name(head_mask) + ".json")
        identity = dict(self.identity, pruned=head_mask_to_spec(head_mask))
        if os.path.exists(path):
            result = read_importance_file(path)
            difference = first_difference(result.settings.get("identity", {}), identity)
            if difference is not None:
                raise StudyError(
                    f"{path} was estimated with other settings ({difference}); use another --out-dir"
                )
            return result.importance
        if self._estimator is None:
            from .evaluation import ImportanceEstimator

            self._estimator = ImportanceEstimator(
                self.task, self.model, self.args.importance_subset, limit=self.args.importance_limit,
                max_tokens=self.args.importance_max_tokens, granularity=self.args.importance_granularity,
                loss=self.LOSS, label_smoothing=self.LABEL_SMOOTHING,
            )
        result = self._estimator.estimate(
            combine_masks(self.base_mask, head_mask), progress=not self.args.no_progress, description=description
        )
        result.settings["identity"] = identity
        os.makedirs(self.directory, exist_ok=True)
        write_importance_json(result, path)
        return result.importance


def _given_importance(args, layout):
    from .importance import read_importance_file

    try:
        return read_importance_file(args.importance, layout).importance
    except HeadMaskError as error:
        raise StudyError(f"--importance: {error}")


def curve_plan(args, layout, orders, scopes, store: Optional[ImportanceStore], ablation_rows, given=None) -> List[PruneStep]:
    """Every step of every requested curve, with its mask (``given``: the --importance scores)."""
    steps: List[PruneStep] = []
    once = None
    if {"importance", "iterative"} & set(orders):
        once = given if given is not None else store.importance(full_mask(layout), "importance")
    normalize = not args.raw_importance
    for scope in scopes:
        candidates = heads_in_scope(layout, scope)
        try:
            counts = step_counts(len(candidates), args.step_percent, args.max_percent)
        except ValueError as error:
            raise StudyError(str(error))
        for order in orders:
            if order == "importance":
                ranking = ascending(importance_scores(once, normalize), candidates)
                steps += curve_steps(layout, scope, order, ranking, counts)
            elif order == "ablation":
                try:
                    scores = ablation_scores(ablation_rows, layout, scope, f"--ablation {args.ablation}")
                except HeadMaskError as error:
                    raise StudyError(str(error))
                steps += curve_steps(layout, scope, order, ascending(scores, candidates), counts)
            elif order == "random":
                for draw in range(1, args.draws + 1):
                    ranking = random_order(candidates, args.seed_pruning, draw, scope)
                    steps += curve_steps(layout, scope, order, ranking, counts, draw=draw)
            else:
                steps += _iterative_steps(args, layout, scope, candidates, counts, once, store, normalize)
    return steps


def _iterative_steps(args, layout, scope, candidates, counts, once, store, normalize) -> List[PruneStep]:
    """Each step prunes the least important remaining heads, importance re-estimated on the pruned model."""
    pruned: List = []
    steps = []
    total = len(candidates)
    for step, count in enumerate(counts):
        if count > len(pruned):
            importance = once if not pruned else store.importance(
                pruning_mask(layout, pruned), f"importance {scope} step {step}/{len(counts) - 1}"
            )
            remaining = [h for h in candidates if h not in set(pruned)]
            pruned += ascending(importance_scores(importance, normalize), remaining)[: count - len(pruned)]
        steps.append(PruneStep(scope, "iterative", None, step, count, total, pruning_mask(layout, pruned)))
    return steps


def budget_plan(args, layout, budgets: Sequence[Budget]):
    """(budget, draw, mask) for every draw of every budget."""
    return [(budget, draw, budget_mask(budget, layout, args.seed_pruning, draw))
            for budget in budgets for draw in range(1, args.draws + 1)]


def command_prune(args) -> int:
    run_prune(args, report=True)
    return 0


def run_prune(args, report: bool = True) -> Tuple[float, List[Dict[str, object]]]:
    """The whole study of one checkpoint; returns the unpruned BLEU and every step's row (with its test)."""
    from .evaluation import load_task_and_model
    from .masked_multihead_attention import current_head_mask, head_layout

    check_sweep_arguments(args)
    orders = _choices(args.orders, ORDERS, "--orders")
    scopes = _choices(args.scopes, SCOPES, "--scopes")
    if not (orders and scopes) and not (args.layer_budget or args.type_budget):
        raise StudyError("nothing to do: no --orders/--scopes and no --layer-budget/--type-budget")
    if args.draws <= 0:
        raise StudyError(f"--draws must be positive, got {args.draws}")
    if "ablation" in orders and not args.ablation:
        raise StudyError("--orders ablation needs --ablation FILE (single.json of ablate --mode single)")
    if args.importance_limit is not None and args.importance_limit <= 0:
        raise StudyError(f"--importance-limit must be positive, got {args.importance_limit}")
    ablation_rows = read_ablation_rows(args.ablation) if "ablation" in orders else None
    if args.importance and not os.path.isfile(args.importance):
        raise StudyError(f"--importance file not found: {args.importance}")

    cfg, task, model = load_task_and_model(args.data, args.path, args.fairseq_args, cpu=args.cpu)
    layout = head_layout(model)
    try:
        budgets = [parse_layer_budget(text, layout) for text in args.layer_budget or []]
        budgets += [parse_type_budget(text, layout) for text in args.type_budget or []]
    except HeadMaskError as error:
        raise StudyError(str(error))
    # a file for another model fails before any work
    given = _given_importance(args, layout) if args.importance else None
    base_mask = current_head_mask(model)
    os.makedirs(args.out_dir, exist_ok=True)
    needs_store = "iterative" in orders or ({"importance"} & set(orders) and not args.importance)
    store = ImportanceStore(args, task, model, base_mask) if needs_store else None
    steps = curve_plan(args, layout, orders, scopes, store, ablation_rows, given)
    budget_draws = budget_plan(args, layout, budgets)

    configs = {BASELINE: baseline_config()}
    for head_mask in [s.head_mask for s in steps] + [mask for _, _, mask in budget_draws]:
        configs.setdefault(mask_name(head_mask), HeadConfig(mask_name(head_mask), head_mask))
    sweep = SplitSweep(args, cfg, task, model, args.gen_subset, args.gen_subset, args.references)
    scores = sweep.run(list(configs.values()), base_mask)
    baseline, rows = compare_sweep(args, sweep, scores, list(configs.values()))
    by_config = {row["config"]: row for row in rows}
    settings = settings_record(args, sweep, baseline)
    settings.update(
        {
            "orders": orders,
            "scopes": scopes,
            "step_percent": args.step_percent,
            "max_percent": args.max_percent,
            "draws": args.draws,
            "pruning_seed": args.seed_pruning,
            "importance": os.path.abspath(args.importance) if args.importance else (
                None if store is None else os.path.abspath(store.directory)
            ),
            "importance_ranking": "raw" if args.raw_importance else "normalised per layer",
            "ablation": os.path.abspath(args.ablation) if args.ablation else None,
        }
    )
    baseline_bleu = reported_bleu(baseline, args.bleu)
    step_rows = []
    if steps:
        step_rows = write_curve_outputs(args, steps, by_config, settings, baseline_bleu, orders, scopes, report)
    if budget_draws:
        write_budget_outputs(args, layout, budget_draws, by_config, settings, baseline_bleu, report)
    return baseline_bleu, step_rows


def _result_columns(row: Dict[str, object]) -> Dict[str, object]:
    keys = ("config", "spec", "bleu", "delta", "bleu_tokenized", "bleu_sacrebleu", "p_value", "significant",
            "ci_low", "ci_high")
    return {key: row[key] for key in keys}


def write_curve_outputs(args, steps, by_config, settings, baseline_bleu, orders, scopes, report=True):
    """Per scope: every step, the curves and their figure; then the tables and Figure 4 of every scope in OUT.

    Separate runs (one per attention type, as the prune_*.sh scripts do) into one
    output directory thus add up to the paper's Figure 4.
    """
    from .plots import plot_pruning_curves

    out = args.out_dir
    written, step_rows, summaries = [], [], []
    for scope in scopes:
        rows = []
        for step in (s for s in steps if s.scope == scope):
            row = {
                "scope": step.scope, "order": step.order, "draw": step.draw, "step": step.step,
                "pruned": step.pruned, "total": step.total, "percent": step.percent,
            }
            row.update(_result_columns(by_config[step.config_name]))
            rows.append(row)
        write_result_rows(os.path.join(out, f"prune_steps.{scope}"), rows, settings)
        step_rows += rows
        summary = summarize_curves(rows)
        summaries += summary
        write_result_rows(os.path.join(out, f"prune_curves.{scope}"), summary, settings)
        plot_pruning_curves(
            summary, scope, baseline_bleu, os.path.join(out, f"prune_curves.{scope}.png"),
            f"{args.bleu} BLEU on {args.gen_subset}",
        )
        written.append(f"prune_curves.{scope}.{{tsv,json,png}} prune_steps.{scope}.{{tsv,json}}")
    written += write_combined_curves(args, baseline_bleu)
    if not report:
        return step_rows
    print(f"unpruned BLEU {baseline_bleu:.2f} on {args.gen_subset}; BLEU with x% of the heads pruned:")
    for scope in scopes:
        for order in orders:
            points = [r for r in summaries if r["scope"] == scope and r["order"] == order]
            text = "  ".join(f"{r['percent']:.0f}%:{r['bleu']:.2f}" for r in points)
            print(f"  {scope:<7} {order:<10} {text}")
    print(f"wrote\t{out}: " + " ".join(written))
    return step_rows


def summarize_curves_of(out_dir: str, scope: str) -> List[Dict[str, object]]:
    path = os.path.join(out_dir, f"prune_curves.{scope}.json")
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as stream:
        return json.load(stream)["rows"]


def write_combined_curves(args, baseline_bleu: float) -> List[str]:
    """prune_curves.md and prune_types.png from every scope's curves in the output directory."""
    from .plots import plot_pruning_by_type

    out = args.out_dir
    summary = [row for scope in SCOPES for row in summarize_curves_of(out, scope)]
    caption = table_caption(
        args, "BLEU as more and more heads are pruned (random: mean ± std over its draws)", args.gen_subset,
    )
    write_text(markdown_curves(summary, baseline_bleu, caption), os.path.join(out, "prune_curves.md"))
    written = ["prune_curves.md"]
    types = {r["scope"] for r in summary if r["scope"] != "all"}
    if types:
        # the paper's Figure 4 uses the importance order; otherwise the first order every type has
        shared = [o for o in ORDERS if all(any(r["scope"] == t and r["order"] == o for r in summary) for t in types)]
        if shared:
            plot_pruning_by_type(
                summary, shared[0], baseline_bleu, os.path.join(out, "prune_types.png"),
                f"{args.bleu} BLEU on {args.gen_subset}",
            )
            written.append("prune_types.png")
    return written


def write_budget_outputs(args, layout, budget_draws, by_config, settings, baseline_bleu, report=True) -> None:
    out = args.out_dir
    rows = []
    for budget, draw, head_mask in budget_draws:
        row = {"budget": budget.label, "kind": budget.kind, "draw": draw,
               "percent": budget.pruned_percent(layout)}
        row.update(_result_columns(by_config[mask_name(head_mask)]))
        rows.append(row)
    write_result_rows(os.path.join(out, "budgets"), rows, settings)
    summary = summarize_budgets(rows)
    write_rows_tsv(summary, os.path.join(out, "budgets_summary.tsv"))
    write_json({"settings": settings, "rows": summary}, os.path.join(out, "budgets_summary.json"), indent=1)
    caption = table_caption(
        args, f"Heads kept at random within each budget (mean ± std over {args.draws} draws)", args.gen_subset
    )
    write_text(markdown_budgets(summary, baseline_bleu, caption), os.path.join(out, "budgets_summary.md"))
    if not report:
        return
    print(f"random heads within budgets (heads kept), {args.draws} draws each:")
    for row in summary:
        print(f"  {row['budget']:<24} {row['percent']:5.1f}% pruned  BLEU {row['bleu']:.2f} ± {row['bleu_std']:.2f}"
              f"  ({row['delta']:+.2f}; {row['significant']} of {row['draws']} draws significant)")
    print(f"wrote\t{os.path.join(out, 'budgets')}.{{tsv,json}} budgets_summary.{{tsv,json,md}}")


def add_curve_arguments(parser) -> None:
    """Options of the importance-ordered pruning curve (prune and dynamics)."""
    parser.add_argument("--step-percent", type=float, default=10.0, help="pruning step, %% of the heads in scope (default 10)")
    parser.add_argument("--max-percent", type=float, default=90.0, help="largest pruning level, %% (default 90)")
    parser.add_argument(
        "--importance-subset", nargs="+", default=["valid"], metavar="SPLIT",
        help="splits to estimate importance on (default: valid)",
    )
    parser.add_argument("--importance-limit", type=int, metavar="N", help="first N sentences of each importance split")
    parser.add_argument("--importance-max-tokens", type=int, metavar="N", help="tokens per importance batch")
    parser.add_argument(
        "--importance-granularity", choices=["sentence", "token", "batch"], default="sentence",
        help="|dL/dxi_h| per sentence (the paper, default), per target token or per batch",
    )
    parser.add_argument(
        "--raw-importance", action="store_true",
        help="rank heads by raw importance, not importance normalised per layer (the paper normalises)",
    )


def add_parser(commands) -> None:
    prune = commands.add_parser(
        "prune",
        help="pruning curves by importance, ablation score or at random; random head budgets "
        "(paper sections 4.2 and 5; Budhraja et al. 2020)",
        description="Prune heads in steps (default 10% of the heads in scope per step, rounded "
        "up) and translate --gen-subset at every step, testing each against the unpruned "
        "model. Orders: importance (I_h estimated once on the unpruned model, lowest first; "
        "default), iterative (I_h re-estimated on the pruned model after each step), ablation "
        "(the head whose masking alone cost the least BLEU first, from ablate --mode single), "
        "random (seeded, --draws permutations, mean and std). Scopes: all heads together, or "
        "one attention type. --layer-budget / --type-budget add Budhraja et al.'s random "
        "configurations. Results are stored per mask as they finish: a rerun continues where "
        "it stopped. Any other option is passed to fairseq-generate's parser.",
    )
    prune.add_argument("data", metavar="DATA", help="fairseq-preprocess output directory")
    prune.add_argument("--path", required=True, metavar="CKPT", help="fairseq checkpoint")
    prune.add_argument("--gen-subset", default="test", metavar="SPLIT", help="split to translate (default: test)")
    prune.add_argument("--out-dir", required=True, metavar="DIR", help="results directory (resumable)")
    prune.add_argument(
        "--orders", default="importance", metavar="ORDERS",
        help=f"pruning orders, comma-separated, from {', '.join(ORDERS)}, or none "
        "(only budgets) (default: importance)",
    )
    prune.add_argument(
        "--scopes", default="all", metavar="SCOPES",
        help=f"heads to prune, comma-separated, from {', '.join(SCOPES)}: all types together "
        "(Figure 3) or one type (Figure 4) (default: all)",
    )
    add_curve_arguments(prune)
    prune.add_argument(
        "--importance", metavar="FILE",
        help="importance.json (from the importance command) to rank by; default: estimate it "
        "on --importance-subset and store it under OUT/importance",
    )
    prune.add_argument("--ablation", metavar="FILE", help="single.json (or .tsv) of ablate --mode single, for --orders ablation")
    prune.add_argument("--draws", type=int, default=3, metavar="N", help="random draws per random curve or budget (default 3)")
    prune.add_argument(
        "--pruning-seed", dest="seed_pruning", type=int, default=1, metavar="SEED",
        help="seed of the random orders and budgets (default 1)",
    )
    prune.add_argument(
        "--layer-budget", action="append", metavar="BUDGET",
        help="heads kept per layer, one group per attention type (Enc-Enc, Enc-Dec, Dec-Dec), "
        "one digit per layer or comma-separated numbers, e.g. '888444 444888 888444' "
        "(Budhraja et al. Table 2); repeatable",
    )
    prune.add_argument(
        "--type-budget", action="append", metavar="BUDGET",
        help="heads kept in each attention type, e.g. '(14,31,30)' (Budhraja et al. Table 3); repeatable",
    )
    add_sweep_arguments(prune)
    prune.set_defaults(handler=command_prune, accepts_fairseq_args=True)
