"""The report's section on configurations fine-tuned after pruning (Budhraja et al. 2020's protocol): the table of
every configuration before and after, its tests against both baselines, and the recovery curves' table."""

from typing import Dict, List, Sequence, Tuple

from fairseq_headprune.study.budhraja.records import FinetuneRecord
from fairseq_headprune.study.pruning.curves import mean_and_std
from fairseq_headprune.study.statistics.significance import p_value_cell

FINETUNE_RESULTS = "pruning/finetune/results.json"


def _tested(record: FinetuneRecord, against: str) -> Tuple[str, str]:
    """The delta (with its 95% interval) and p-value cells of a record's test against ``control`` or ``unpruned``
    (bold: significant; a bootstrap's p of 0 as ``< 1/resamples``)."""
    test = record.tests.get(against)
    if test is None:
        return "", ""
    delta = f"{test.delta:+.2f}"
    delta = f"**{delta}**" if test.significant else delta
    if test.low is not None:
        delta += f" [{test.low:+.2f}, {test.high:+.2f}]"
    return delta, p_value_cell(test.p_value, record.resamples)


def markdown_finetuned(records: Sequence[FinetuneRecord], label: str = "BLEU") -> str:
    """One row per configuration: % pruned, the score without and with fine-tuning, against the fine-tuned control
    and against the unpruned model (Budhraja et al.'s baseline); then the recovery curves' table."""
    lines: List[str] = [
        f"| configuration | from | % pruned | {label} without fine-tuning | {label} fine-tuned "
        f"| Δ vs fine-tuned unpruned | p | Δ vs unpruned | p | layer spread of the change |\n",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    ]
    for record in records:
        spread = record.layer_spread
        cells = [*_tested(record, "control"), *_tested(record, "unpruned")]
        lines.append(
            f"| `{record.label}` | {record.note or record.kind} | {record.percent:.1f} "
            f"| {record.score_before:.2f} | {record.score_after:.2f} | " + " | ".join(cells)
            + f" | {'' if spread is None else format(spread, '.0%')} |\n")
    pairs = markdown_pairs(records)
    curves = markdown_recovery_curves(records, label)
    return "".join(lines) + ("\n" + pairs if pairs else "") + ("\n" + curves if curves else "")


def markdown_pairs(records: Sequence[FinetuneRecord]) -> str:
    """The pairs the paper sets side by side, each tested against the other directly (``FinetuneRecord.paired``)."""
    rows = []
    for record in records:
        for other, test in record.paired.items():
            delta = f"**{test.delta:+.2f}**" if test.significant else f"{test.delta:+.2f}"
            if test.low is not None:
                delta += f" [{test.low:+.2f}, {test.high:+.2f}]"
            p_value = p_value_cell(test.p_value, record.resamples)
            rows.append(f"| `{record.label}` minus `{other}` | {delta} | {p_value} |\n")
    if not rows:
        return ""
    return ("The pairs the paper sets side by side (Tables 5 and 6), each tested against the other on the same "
            "examples (bold: significant; in brackets the test's 95% interval of the difference):\n\n"
            "| pair | Δ fine-tuned | p |\n|---|---:|---:|\n" + "".join(rows))


def recovery_curve_rows(records: Sequence[FinetuneRecord]) -> List[Tuple[str, List[Dict[str, object]]]]:
    """Per budget (its draws together; the control left out): at each point of the curve, the updates done and the
    mean and spread over draws of the gap to the control at the same point."""
    groups: Dict[str, List[FinetuneRecord]] = {}
    for record in records:
        if not record.is_control and record.curve:
            groups.setdefault(record.group, []).append(record)
    rows = []
    for budget, members in groups.items():
        points = []
        for index, point in enumerate(members[0].curve):
            gaps = [m.curve[index].gap_vs_control for m in members if len(m.curve) > index]
            if any(gap is None for gap in gaps):
                continue
            mean, std = mean_and_std(gaps)
            points.append({"updates": point.updates, "mean": mean, "std": std, "draws": len(gaps)})
        if points:
            rows.append((budget, points))
    return rows


def markdown_recovery_curves(records: Sequence[FinetuneRecord], label: str = "BLEU") -> str:
    """The gap to the fine-tuned control at every point of the curve, one row per budget (mean ± std over draws)."""
    rows = recovery_curve_rows(records)
    if not rows:
        return ""
    updates = [p["updates"] for p in max((points for _, points in rows), key=len)]
    lines = ["| budget (draws) | " + " | ".join(str(u) for u in updates) + " |\n",
             "|---|" + "---:|" * len(updates) + "\n"]
    for budget, points in rows:
        cells = {p["updates"]: (f"{p['mean']:+.2f}" + (f" ± {p['std']:.2f}" if p["draws"] > 1 else ""))
                 for p in points}
        lines.append(f"| `{budget}` ({points[0]['draws']}) | " + " | ".join(cells.get(u, "") for u in updates) + " |\n")
    return (f"{label} minus the fine-tuned control's at the same point, by updates of fine-tuning:\n\n"
            + "".join(lines))


def section_finetune(study) -> str:
    data = study.json(FINETUNE_RESULTS)
    if not data:
        return ""
    records = [FinetuneRecord.from_dict(item) for item in data]
    label = "accuracy" if records[0].metric == "accuracy" else records[0].metric.upper()
    missing = records[0].missing_configurations
    text = (
        "## Fine-tuned after pruning (Budhraja et al.'s protocol)\n\n"
        f"Every configuration fine-tuned {records[0].finetune} from the checkpoint with its pruned heads held at "
        "zero (the checkpoint's optimizer, criterion and batch size), then scored again; the unpruned model "
        "fine-tuned alike is the control (this project's: the paper has none), and each configuration is tested "
        "against it and against the unpruned model without fine-tuning, the paper's baseline (bold: significant; "
        "in brackets the test's 95% interval of the difference). "
        "The layer spread is the largest relative difference between two layers' mean change of the unpruned "
        "heads' W_q, W_k, W_v (Figure 2; the paper: below 10%)"
        + (f"; {missing} configurations of another shard are not done yet" if missing else "") + ".\n\n"
    )
    figure = ""
    if study.exists("pruning/finetune/curves.png"):
        figure = ("\n![the gap of each configuration to the fine-tuned control against updates of fine-tuning]"
                  "(pruning/finetune/curves.png)\n")
    return text + markdown_finetuned(records, label) + figure + "\n" + study.command("finetune")
