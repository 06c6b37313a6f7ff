"""The ablation studies' tables: Table 1 and 2 in Markdown and LaTeX.

The rows come from ``ablation.py`` (one per configuration, or the best head
per layer); a significant change is bold (Markdown) or underlined (LaTeX),
as in the paper's tables.
"""

from typing import Dict, Optional, Sequence, Tuple

from fairseq_headprune.constants import ATTENTION_TYPES, TYPE_TITLES


def _delta_cell(row: Optional[Dict[str, object]], latex: bool) -> str:
    if row is None:
        return ""
    text = f"{row['delta']:+.2f}"
    if not row["significant"]:
        return text
    return f"\\underline{{{text}}}" if latex else f"**{text}**"


def _grid(rows: Sequence[Dict[str, object]], attention_type: str):
    cells = {(r["layer"], r["head"]): r for r in rows if r["attention_type"] == attention_type}
    if not cells:
        return None
    layers = max(layer for layer, _ in cells)
    heads = max(head for _, head in cells)
    return cells, layers, heads


def markdown_single_table(rows, baseline_bleu: float, caption: str) -> str:
    """Table 1: BLEU change when one head is masked, layers x heads per attention type."""
    parts = [f"{caption}\n"]
    for attention_type in ATTENTION_TYPES:
        grid = _grid(rows, attention_type)
        if grid is None:
            continue
        cells, layers, heads = grid
        parts.append(f"\n**{TYPE_TITLES[attention_type]}** (baseline {baseline_bleu:.2f})\n\n")
        parts.append("| Layer | " + " | ".join(str(h) for h in range(1, heads + 1)) + " |\n")
        parts.append("|---:|" + "---:|" * heads + "\n")
        for layer in range(1, layers + 1):
            values = [_delta_cell(cells.get((layer, h)), latex=False) for h in range(1, heads + 1)]
            parts.append(f"| {layer} | " + " | ".join(values) + " |\n")
    return "".join(parts)


def latex_single_table(rows, baseline_bleu: float, caption: str) -> str:
    parts = []
    for attention_type in ATTENTION_TYPES:
        grid = _grid(rows, attention_type)
        if grid is None:
            continue
        cells, layers, heads = grid
        parts.append("\\begin{table}[t]\n\\centering\\small\n")
        parts.append("\\begin{tabular}{r|" + "r" * heads + "}\n")
        parts.append("Layer & " + " & ".join(str(h) for h in range(1, heads + 1)) + " \\\\\n\\hline\n")
        for layer in range(1, layers + 1):
            values = [_delta_cell(cells.get((layer, h)), latex=True) for h in range(1, heads + 1)]
            parts.append(f"{layer} & " + " & ".join(values) + " \\\\\n")
        parts.append("\\end{tabular}\n")
        parts.append(
            f"\\caption{{{_latex_escape(caption)} {TYPE_TITLES[attention_type]} heads; "
            f"baseline {baseline_bleu:.2f}.}}\n\\end{{table}}\n\n"
        )
    return "".join(parts)


def markdown_best_table(best_rows, caption: str, selected: Optional[Dict[Tuple[str, int], Dict]] = None) -> str:
    """Table 2: best ΔBLEU per layer when only one head is kept."""
    types = [t for t in ATTENTION_TYPES if any(r["attention_type"] == t for r in best_rows)]
    by_key = {(r["attention_type"], r["layer"]): r for r in best_rows}
    layers = max(r["layer"] for r in best_rows)
    header = ["Layer"] + [TYPE_TITLES[t] for t in types]
    if selected:
        header += [f"{TYPE_TITLES[t]} (chosen on {_selected_split(selected)})" for t in types]
    lines = [f"{caption}\n\n", "| " + " | ".join(header) + " |\n", "|---:|" + "---:|" * (len(header) - 1) + "\n"]
    for layer in range(1, layers + 1):
        values = [_best_cell(by_key.get((t, layer)), False) for t in types]
        if selected:
            values += [_best_cell(selected.get((t, layer)), False) for t in types]
        lines.append(f"| {layer} | " + " | ".join(values) + " |\n")
    return "".join(lines)


def latex_best_table(best_rows, caption: str, selected: Optional[Dict[Tuple[str, int], Dict]] = None) -> str:
    types = [t for t in ATTENTION_TYPES if any(r["attention_type"] == t for r in best_rows)]
    by_key = {(r["attention_type"], r["layer"]): r for r in best_rows}
    layers = max(r["layer"] for r in best_rows)
    columns = len(types) * (2 if selected else 1)
    header = ["Layer"] + [TYPE_TITLES[t] for t in types]
    if selected:
        header += [f"{TYPE_TITLES[t]} (sel.)" for t in types]
    lines = ["\\begin{table}[t]\n\\centering\\small\n", "\\begin{tabular}{r|" + "r" * columns + "}\n"]
    lines.append(" & ".join(header) + " \\\\\n\\hline\n")
    for layer in range(1, layers + 1):
        values = [_best_cell(by_key.get((t, layer)), True) for t in types]
        if selected:
            values += [_best_cell(selected.get((t, layer)), True) for t in types]
        lines.append(f"{layer} & " + " & ".join(values) + " \\\\\n")
    lines.append(f"\\end{{tabular}}\n\\caption{{{_latex_escape(caption)}}}\n\\end{{table}}\n")
    return "".join(lines)


def _best_cell(row: Optional[Dict[str, object]], latex: bool) -> str:
    if row is None:
        return ""
    return f"{_delta_cell(row, latex)} (h{row['head']})"


def _selected_split(selected: Dict[Tuple[str, int], Dict]) -> str:
    return next(iter(selected.values())).get("selected_on", "validation")


def _latex_escape(text: str) -> str:
    for plain, escaped in (("\\", "\\textbackslash{}"), ("&", "\\&"), ("%", "\\%"), ("_", "\\_"), ("#", "\\#")):
        text = text.replace(plain, escaped)
    return text
