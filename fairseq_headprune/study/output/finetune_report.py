"""The report's section on configurations fine-tuned after pruning (Budhraja et al. 2020's protocol)."""

from typing import Dict, List, Sequence

FINETUNE_RESULTS = "pruning/finetune/results.json"


def markdown_finetuned(records: Sequence[Dict[str, object]], label: str = "BLEU") -> str:
    """One row per configuration: % pruned, the score without and with fine-tuning, against the control."""
    lines: List[str] = [
        f"| configuration | from | % pruned | {label} without fine-tuning | {label} fine-tuned "
        f"| Δ vs fine-tuned unpruned | p | layer spread of the change |\n",
        "|---|---|---:|---:|---:|---:|---:|---:|\n",
    ]
    for record in records:
        delta = f"{record['delta_vs_control']:+.2f}" if "delta_vs_control" in record else ""
        p_value = f"{record['p_value_vs_control']:.3f}" if "p_value_vs_control" in record else ""
        if record.get("significant_vs_control"):
            delta = f"**{delta}**"
        spread = record.get("layer_spread")
        lines.append(
            f"| `{record['label']}` | {record.get('note') or record.get('kind', '')} | {record.get('percent', 0.0):.1f} "
            f"| {record['score_before']:.2f} | {record['score_after']:.2f} | {delta} | {p_value} "
            f"| {'' if spread is None else format(spread, '.0%')} |\n")
    return "".join(lines)


def section_finetune(study) -> str:
    records = study.json(FINETUNE_RESULTS)
    if not records:
        return ""
    label = "accuracy" if records[0].get("metric") == "accuracy" else records[0].get("metric", "BLEU").upper()
    missing = records[0].get("missing_configurations", 0)
    text = (
        "## Fine-tuned after pruning (Budhraja et al.'s protocol)\n\n"
        f"Every configuration fine-tuned {records[0]['finetune']} from the checkpoint with its pruned heads held at "
        "zero (the checkpoint's optimizer, criterion and batch size), then scored again; the unpruned model "
        "fine-tuned alike is the control, and each configuration is tested against it (bold: significant). "
        "The layer spread is the largest relative difference between two layers' mean change of the unpruned "
        "heads' W_q, W_k, W_v (Figure 2; the paper: below 10%)"
        + (f"; {missing} configurations of another shard are not done yet" if missing else "") + ".\n\n"
    )
    return text + markdown_finetuned(records, label) + "\n" + study.command("finetune")
