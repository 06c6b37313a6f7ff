"""``fairseq-headprune report``: one Markdown report of a study directory.

Every number in the report is read from the result files the study commands
wrote (nothing is typed in), every figure is linked from its own directory,
and every section says how to read it and which command made it (the
commands ``scripts/demos/run_demo.sh`` records under ``commands/``).
"""

import json
import os
import re
from typing import Dict

from fairseq_headprune.constants import ATTENTION_TYPES
from fairseq_headprune.errors import StudyError
from fairseq_headprune.study.budhraja.report import section_finetune
from fairseq_headprune.study.output.files import write_text
from fairseq_headprune.study.output.finding import CONSISTENT, DIFFERS, INCONCLUSIVE, markdown_findings
from fairseq_headprune.study.output.findings import curve_point, paper_findings
from fairseq_headprune.study.output.structures_report import section_structures
from fairseq_headprune.study.pruning.comparison import describe_goal, goal_check, markdown_costs
from fairseq_headprune.study.statistics.metrics import metric_of_record

REPORT = "report.md"
DEFAULT_TITLE = "fairseq-headprune study"


class _Study:
    def __init__(self, directory: str):
        self.directory = directory

    def path(self, *parts: str) -> str:
        return os.path.join(self.directory, *parts)

    def exists(self, *parts: str) -> bool:
        return os.path.exists(self.path(*parts))

    def json(self, *parts: str):
        with open(self.path(*parts), encoding="utf-8") as stream:
            return json.load(stream)

    def text(self, *parts: str) -> str:
        with open(self.path(*parts), encoding="utf-8") as stream:
            return stream.read()

    def command(self, name: str) -> str:
        if not self.exists("commands", name + ".sh"):
            return ""
        return "Made by:\n\n```bash\n" + self.text("commands", name + ".sh").strip() + "\n```\n\n"

    def figure(self, relative: str, caption: str) -> str:
        if not self.exists(relative):
            return ""
        return f"![{caption}]({relative})\n\n"

    def table(self, relative: str) -> str:
        """A Markdown table file without its first paragraph, the caption (the section says it)."""
        caption, _, body = self.text(relative).partition("\n\n")
        return (body or caption).strip() + "\n\n"


def _section_translation(study: _Study) -> str:
    lines = []
    for name in sorted(os.listdir(study.path("generate"))):
        if name.endswith(".txt"):
            match = re.search(r"BLEU4 = ([\d.]+)", study.text("generate", name))
            if match:
                lines.append(f"| {name[:-4]} | {float(match.group(1)):.2f} |")
    if not lines:
        return ""
    return (
        "## Translation with heads masked\n\n"
        "Tokenized BLEU of the test set, as `fairseq-generate` prints it, with no head masked and with "
        "the masks named" + (
            " (`ceiling-majority-references`: the references a perfect model would write, every word translated "
            "by its most frequent choice, scored against the sampled ones)"
            if study.exists("generate", "ceiling-majority-references.txt") else ""
        ) + ".\n\n| configuration | BLEU |\n|---|---:|\n" + "\n".join(lines) + "\n\n"
        + study.command("generate")
    )


def _section_perplexity(study: _Study) -> str:
    lines = []
    for name in sorted(os.listdir(study.path("eval-lm"))):
        if name.endswith(".txt"):
            match = re.search(r"Loss \(base 2\): ([\d.]+), Perplexity: ([\d.]+)", study.text("eval-lm", name))
            if match:
                lines.append(f"| {name[:-4]} | {float(match.group(1)):.4f} | {float(match.group(2)):.2f} |")
    if not lines:
        return ""
    return (
        "## Perplexity with heads masked\n\n"
        "Loss per token (base 2) and perplexity of the test set, as `fairseq-eval-lm` prints them, with no head "
        "masked and with the masks named.\n\n| configuration | loss (base 2) | perplexity |\n|---|---:|---:|\n"
        + "\n".join(lines) + "\n\n" + study.command("eval-lm")
    )


def _loss_name(settings: Dict) -> str:
    criterion = f", {settings['criterion']}" if settings.get("criterion") else ""
    if settings.get("loss", "nll") == "nll":
        return f"plain cross-entropy (NLL{criterion})"
    if settings["loss"] == "mse":
        return f"squared error (regression{criterion})"
    return f"label-smoothed cross-entropy (ε = {settings.get('label_smoothing', 0):g})"


def _section_importance(study: _Study) -> str:
    payload = study.json("importance", "importance.json")
    settings = payload["settings"]
    text = (
        "## Head importance\n\n"
        f"I_h = E_x |∂L/∂ξ_h| on {int(settings['sentences'])} sentences of "
        f"{', '.join(settings.get('subsets', []))}, {payload['granularity']} level, L = {_loss_name(settings)}; "
        "the heat maps show it normalised per layer (darker: less important).\n\n"
    )
    rho = payload.get("spearman_importance_vs_loss_increase")
    if rho:
        text += (
            f"Spearman correlation between importance and the loss increase when each head alone is masked: "
            f"ρ = {rho['rho']:.3f} (p = {rho['p']:.2g})"
        )
        other = "importance-label-smoothed/importance.json"
        other_rho = study.json(other).get("spearman_importance_vs_loss_increase") if study.exists(other) else None
        if other_rho:
            text += (
                f"; with L = {_loss_name(study.json(other)['settings'])} (in importance-label-smoothed/) "
                f"ρ = {other_rho['rho']:.3f} (p = {other_rho['p']:.2g})"
            )
        text += ".\n\n"
    return text + study.figure("importance/importance.png", "head importance") + study.command("importance")


def _worst(rows, metric):
    """The row whose change is the most harmful (the largest drop, or for perplexity the largest rise)."""
    return (min if metric.higher_is_better else max)(rows, key=lambda r: r["delta"])


def _section_single(study: _Study) -> str:
    table = study.json("ablation", "single.json")
    rows, settings = table["rows"], table["settings"]
    metric = metric_of_record(settings)
    label = metric.label
    significant = [r for r in rows if r["significant"]]
    worst = _worst(rows, metric)
    alpha = settings["test"]["alpha"]
    text = (
        "## Masking one head at a time (Table 1, Figure 1)\n\n"
        f"{metric.title} change on {settings['split']} when each head alone is masked; bold: "
        f"significant at p < {alpha:g} ({settings['test']['test']}, {settings['test']['samples']} resamples). "
        f"Baseline {settings[f'baseline_{metric.column}']:.2f}; {len(significant)} of {len(rows)} heads change "
        f"{label} significantly; the largest {'drop' if metric.higher_is_better else 'rise'} is "
        f"{worst['delta']:+.2f} ({worst['attention_type']} layer {worst['layer']} head {worst['head']}).\n\n"
    )
    text += study.table("ablation/single.md")
    text += study.figure("ablation/single_delta.png", f"Δ{label} per masked head")
    text += study.figure("ablation/single_hist.png", f"{label} with one head masked")
    if study.exists("ablation", "cross_domain.json"):
        cross = study.json("ablation", "cross_domain.json")["settings"]
        per_type = ", ".join(f"{t} {v['r']:.2f}" for t, v in cross["pearson_per_type"].items())
        text += (
            "### The same on a domain-shifted test set (Figure 2)\n\n"
            f"Each dot is a head: its Δ{label} on {cross['split']} against that on {cross['cross_split']} "
            f"(baseline {cross[f'cross_baseline_{metric.column}']:.2f}). Pearson r = {cross['pearson_r']:.3f} "
            f"(p = {cross['pearson_p']:.2g}); per type {per_type}.\n\n"
        )
        text += study.figure("ablation/cross_domain.png", f"Δ{label} on two test sets")
    return text + study.command("ablate-single")


def _section_all_but_one(study: _Study) -> str:
    table = study.json("ablation", "all_but_one_best.json")
    rows, settings = table["rows"], table["settings"]
    metric = metric_of_record(settings)
    worst = _worst(rows, metric)
    text = (
        "## Keeping one head per layer (Table 2, appendix A)\n\n"
        f"Per layer, the best Δ{metric.label} on {settings['split']} when all heads but one are masked (the kept "
        "head in brackets; bold: significant)"
    )
    if settings.get("select_subset"):
        agree = sum(1 for r in rows if r.get("selected_head") == r["head"])
        text += (
            f", and the score of the head chosen on {settings['select_subset']} instead: it is the test set's "
            f"best in {agree} of {len(rows)} layers"
        )
    text += (
        f". The most sensitive layer is {worst['attention_type']} layer {worst['layer']} "
        f"({worst['delta']:+.2f}).\n\n"
    )
    text += study.table("ablation/all_but_one_best.md")
    text += study.figure("ablation/all_but_one_delta.png", f"Δ{metric.label} when one head is kept")
    return text + study.command("ablate-all-but-one")


def _section_pruning(study: _Study) -> str:
    text = "## Pruning curves (Figures 3 and 4)\n\n"
    if study.exists("pruning", "prune_curves.all.json"):
        curves = study.json("pruning", "prune_curves.all.json")
        summary, settings = curves["rows"], curves["settings"]
        metric = metric_of_record(settings)
        column, sign = metric.column, 1.0 if metric.higher_is_better else -1.0
        best_order = max({r["order"] for r in summary}, key=lambda o: sign * curve_point(summary, o, 50)[column])
        point = curve_point(summary, best_order, 50)
        text += (
            f"{metric.title} on {settings['split']} as the heads are pruned, by "
            f"order (random: mean ± std over {settings['draws']} draws, band: ±1 std); dashed: unpruned "
            f"({settings[f'baseline_{column}']:.2f}). At {point['percent']:.0f}% of the heads pruned the best "
            f"order is {best_order} ({point[column]:.2f}).\n\n"
        )
        text += study.figure("pruning/prune_curves.all.png", "pruning curves, all heads")
        text += study.command("prune-all")
    types = [t for t in ATTENTION_TYPES if study.exists("pruning", f"prune_curves.{t}.json")]
    if types:
        parts = []
        for attention_type in types:
            summary = study.json("pruning", f"prune_curves.{attention_type}.json")["rows"]
            last = max((r for r in summary if r["order"] == "importance"), key=lambda r: r["percent"])
            parts.append(f"{attention_type} {last['bleu']:.2f} at {last['percent']:.0f}%")
        text += (
            "Pruning one attention type at a time, by importance: BLEU against the share of that type's heads "
            f"pruned (Figure 4). With the most heads pruned: {'; '.join(parts)}.\n\n"
        )
        text += study.figure("pruning/prune_types.png", "pruning one attention type at a time")
    if study.exists("pruning", "prune_curves.md"):
        text += "Every curve (bold: significant against the unpruned model):\n\n"
        text += study.table("pruning/prune_curves.md")
    if study.exists("pruning", "budgets_summary.md"):
        text += (
            "### Random heads within budgets (Budhraja et al.)\n\n"
            "Heads kept per layer (one digit per layer, a group per attention type: Enc-Enc, Enc-Dec, Dec-Dec "
            "as the model has them) or per type; the heads are drawn at random within the budget.\n\n"
        )
        text += study.table("pruning/budgets_summary.md")
    return text + study.command("prune-types")


def _section_comparison(study: _Study) -> str:
    """Issue 17's comparison: post-training pruning to a budget and learned gates against the paper's orders."""

    curves = study.json("comparison", "prune_curves.all.json")
    summary, settings = curves["rows"], curves["settings"]
    metric = metric_of_record(settings)
    column = metric.column
    baseline = settings[f"baseline_{column}"]
    text = (
        "## Pruning to a budget: Fisher search, rearrangement, mask tuning and learned gates\n\n"
        f"{metric.title} on {settings['split']} at every pruning level, by Michel et al.'s importance (estimated "
        "once, and re-estimated each step), Kwon et al.'s (2022) search with the mask's diagonal Fisher "
        "information, the same rearranged with each layer's block of the Fisher matrix, then with every mask "
        "tuned by least squares on the validation set (scales of the kept heads, a bias correction per "
        "pruned layer), hard-concrete gates trained to keep exactly the heads of a level (Voita et al. 2019, "
        "with a Lagrangian), and random (mean ± std over "
        f"{settings['draws']} draws). Dashed black: unpruned ({baseline:.2f}).\n\n"
    )
    text += study.figure("comparison/prune_curves.all.png", "pruning methods compared")
    if study.exists("comparison", "prune_curves.md"):
        text += "Every point (bold: significantly different from the unpruned model, paired bootstrap):\n\n"
        text += study.table("comparison/prune_curves.md")
    goal = goal_check(summary, baseline, column, higher_is_better=metric.higher_is_better)
    if goal is not None:
        text += describe_goal(goal, metric.label) + "\n\n"
    costs = settings.get("method_costs")
    if costs:
        text += ("What finding the masks cost (seconds on this machine; the sentences the scores were estimated "
                 "on, and the sentences tuning fitted on or the gates were trained on):\n\n")
        text += markdown_costs(costs) + "\n"
    for name in ("gates", "comparison"):
        text += study.command(name)
    return text


def _section_speed(study: _Study) -> str:
    payload = study.json("shrink", "speed.json")
    lines = [
        "## Removing heads for real\n\n",
        f"The least important heads removed from the checkpoint (`fairseq-headprune shrink`), then the same "
        f"sentences translated by the unpruned model, the model with those heads masked and the shrunk one "
        f"({payload['device']}, {payload['threads']} threads; median seconds; the shrunk checkpoints are in "
        f"shrink/).\n\n",
        "| heads removed | batch | unpruned | masked | shrunk | speed-up | same output | "
        "parameters (before → after) |\n",
        "|---:|---:|---:|---:|---:|---:|---|---|\n",
    ]
    for m in payload["measurements"]:
        seconds = m["median_seconds"]
        size = m["parameters"]
        lines.append(
            f"| {m['removed_heads']} of {m['total_heads']} | {m['batch_size']} | {seconds['unpruned']:.2f} | "
            f"{seconds['masked']:.2f} | {seconds['shrunk']:.2f} | {m['speedup_shrunk_vs_unpruned']:.2f}x | "
            f"{'yes' if _same_masked_shrunk(m) else 'no'} | "
            f"{size['unpruned']:,} → {size['shrunk']:,} |\n"
        )
    return "".join(lines) + "\n" + study.command("speed")


def _same_masked_shrunk(measurement: Dict) -> bool:
    """benchmark_speed.py's check that masked and shrunk models translated alike (older files: a flat key)."""
    same = measurement.get("same_hypotheses")
    if isinstance(same, dict):
        return bool(same["masked_shrunk"])
    return bool(measurement["same_hypotheses_masked_shrunk"])


def _section_classifier_speed(study: _Study) -> str:
    payload = study.json("shrink", "classifier_speed.json")
    lines = [
        "## Removing heads for real (Table 4)\n\n",
        f"The least important heads removed from the checkpoint (`fairseq-headprune shrink`), then the same "
        f"examples classified by the unpruned model, the model with those heads masked and the shrunk one "
        f"({payload['device']}, {payload['threads']} threads; median examples per second of the repeats). "
        f"The paper's Table 4 (BERT-base, MNLI-matched, GTX 1080Ti): up to 17.5% faster with half of the heads "
        f"removed at large batches, little at batch 1.\n\n",
        "| heads removed | batch | unpruned | masked | shrunk | speed-up | same labels | "
        "parameters (before → after) |\n",
        "|---:|---:|---:|---:|---:|---:|---|---|\n",
    ]
    for m in payload["measurements"]:
        rate, size = m["median_examples_per_second"], m["parameters"]
        lines.append(
            f"| {m['removed_heads']} of {m['total_heads']} | {m['batch_size']} | {rate['unpruned']:.1f} | "
            f"{rate['masked']:.1f} | {rate['shrunk']:.1f} | {m['speedup_shrunk_vs_unpruned']:.2f}x | "
            f"{'yes' if m['same_labels_as_masked'] else 'no'} | {size['unpruned']:,} → {size['shrunk']:,} |\n"
        )
    return "".join(lines) + "\n" + study.command("speed")


def _section_lm_speed(study: _Study) -> str:
    payload = study.json("shrink", "lm_speed.json")
    lines = [
        "## Removing heads for real\n\n",
        f"The least important heads removed from the checkpoint (`fairseq-headprune shrink`), then the same "
        f"sentences scored (fairseq's SequenceScorer) and continued (fairseq's SequenceGenerator, as the mode says) "
        f"by the unpruned model, the model with those heads masked and the shrunk one ({payload['device']}, "
        f"{payload['threads']} threads; median tokens per second).\n\n",
        "| heads removed | mode | batch | unpruned | masked | shrunk | speed-up | same output | "
        "parameters (before → after) |\n",
        "|---:|---|---:|---:|---:|---:|---:|---|---|\n",
    ]
    for m in payload["measurements"]:
        rate, size = m["median_tokens_per_second"], m["parameters"]
        lines.append(
            f"| {m['removed_heads']} of {m['total_heads']} | {m['mode']} | {m['batch_size']} | "
            f"{rate['unpruned']:.0f} | {rate['masked']:.0f} | {rate['shrunk']:.0f} | "
            f"{m['speedup_shrunk_vs_unpruned']:.2f}x | {'yes' if m['same_output_as_masked'] else 'no'} | "
            f"{size['unpruned']:,} → {size['shrunk']:,} |\n"
        )
    return "".join(lines) + "\n" + study.command("speed")


def _section_dynamics(study: _Study) -> str:
    table = study.json("dynamics", "dynamics.json")
    rows, settings = table["rows"], table["settings"]
    epochs = sorted({r["epoch"] for r in rows})
    metric = metric_of_record(settings)
    label, verb = metric.label, ("keeps" if metric.higher_is_better else "is at")
    level = max(r["level"] for r in rows if r["percent"] <= 50.0 + 1e-9)
    # an epoch whose unpruned model scores 0 has no relative score
    at_level = {r["epoch"]: r for r in rows if r["level"] == level and r["relative"] == r["relative"]}
    scored = [e for e in epochs if e in at_level]
    if not scored:
        raise ValueError(f"no epoch has a {label} above 0")
    first, last = at_level[scored[0]], at_level[scored[-1]]
    text = (
        "## Importance over training (Figure 5)\n\n"
        f"At each epoch's checkpoint, importance is estimated on that checkpoint and the least important heads "
        f"are pruned; each line is a pruning level, its {label} on {settings['split']} as % of the same epoch's "
        f"unpruned {label}, which the upper panel shows. With {first['percent']:.0f}% of the heads pruned the "
        f"model {verb} {100 * first['relative']:.1f}% of its {label} at epoch {first['epoch']} and "
        f"{100 * last['relative']:.1f}% at epoch {last['epoch']}.\n\n"
    )
    text += study.figure("dynamics/dynamics.png", "pruning curves over training")
    text += study.table("dynamics/dynamics.md")
    return text + study.command("dynamics")


def _section_findings(study: _Study) -> str:
    rows = paper_findings(lambda relative: study.json(relative) if study.exists(relative) else None)
    if not rows:
        return ""
    counts = {verdict: sum(1 for row in rows if row.verdict == verdict)
              for verdict in (CONSISTENT, DIFFERS, INCONCLUSIVE)}
    shown = sum(1 for row in rows if not row.judged)
    return (
        "## What reproduces\n\n"
        "Each finding of the papers: the paper's own figure, this study's estimate with its 95% interval, the "
        "values that would contradict the paper (the margin), the protocol and the strength of the evidence, and "
        "the verdict that follows by the rule in the sixth column (consistent with the paper where the interval "
        "holds the paper's side of its figure and excludes the contradiction, differs where it lies wholly on the "
        f"other side of the figure): {counts[CONSISTENT]} consistent, {counts[DIFFERS]} differ"
        + (f", {counts[INCONCLUSIVE]} inconclusive (the interval holds both the paper's figure and a "
           "contradiction, the run is too short, or there is no interval: the rule says which, and how much "
           "narrower the interval must be)" if counts[INCONCLUSIVE] else "")
        + (f"; {shown} shown, not judged (another protocol than the paper's, or this project's own comparison)"
           if shown else "")
        + ".\n\n" + markdown_findings(rows) + "\n"
    )


SECTIONS = [
    ("generate", _section_translation),
    ("eval-lm", _section_perplexity),
    ("importance/importance.json", _section_importance),
    ("ablation/single.json", _section_single),
    ("ablation/all_but_one_best.json", _section_all_but_one),
    ("pruning", _section_pruning),
    ("pruning/finetune/results.json", section_finetune),
    ("comparison/prune_curves.all.json", _section_comparison),
    ("structures", section_structures),
    ("shrink/speed.json", _section_speed),
    ("shrink/lm_speed.json", _section_lm_speed),
    ("shrink/classifier_speed.json", _section_classifier_speed),
    ("dynamics/dynamics.json", _section_dynamics),
    (".", _section_findings),
]


def write_report(directory: str, title: str = DEFAULT_TITLE) -> str:
    """Write ``directory/report.md`` from the result files there; returns its path."""
    if not os.path.isdir(directory):
        raise StudyError(f"study directory not found: {directory}")
    study = _Study(directory)
    parts = [
        f"# {title}\n\n",
        "Every number below is read from the result files in this directory; every figure is one of them. "
        "Each section ends with the command that made it.\n\n",
    ]
    if study.exists("environment.txt"):  # run_demo.sh records what the numbers depend on
        parts.append(f"Run with {study.text('environment.txt').strip()}.\n\n")
    found = 0
    for required, section in SECTIONS:
        if study.exists(required):
            try:
                text = section(study)
            except (OSError, ValueError, KeyError, TypeError) as error:
                raise StudyError(f"cannot read the results for {required} in {directory}: {error}") from error
            parts.append(text)
            found += bool(text)
    if not found:
        raise StudyError(f"{directory} holds no study results (importance/, ablation/, pruning/, ...)")
    path = os.path.join(directory, REPORT)
    write_text("".join(parts), path)
    return path
