"""Budhraja et al. (2020)'s configurations, derived for a model of any depth and head count.

The paper's Transformer has 6 layers of 8 heads in each of Enc-Enc (ES),
Enc-Dec (ED) and Dec-Dec (DS); its BERT 12 layers of 12 heads. Its tables,
as ``Budget`` lists for a model of ``layout``:

1. random levels 25, 35, 50, 55, 60, 75, 81% of all heads, at least one head
   kept in every layer of every type, and "one head per layer of each type"
   (the paper's 87%); a level above what one head per layer allows is left out;
2. heads kept per layer, the layers Voita et al. call important (ES and DS
   bottom, ED top) kept or pruned, at five levels: the paper's counts per layer
   resampled to the model's depth (``resample_profile``) and scaled by H/8,
   the "pruned" configuration the "kept" one reversed (the paper's pairs are
   reversals: ``888444`` / ``444888``);
3. heads kept per type, fewest in one type, at four levels: the paper's counts
   of 48 scaled to the type's heads;
4. BERT: random levels 10 ... 90%, at least one head per layer;
5. and 6. whole layers pruned by position (``layer_strategies.paper_strategies``).

Each configuration's ``note`` names its table and row.
"""

import math
from typing import Dict, List, Sequence

from fairseq_headprune.constants import ATTENTION_TYPES
from fairseq_headprune.errors import HeadMaskError, SettingsError
from fairseq_headprune.study.budhraja.budgets import (
    ONE_HEAD_PER_LAYER,
    Budget,
    level_budget,
    one_head_per_layer_budget,
    parse_layer_budget,
    parse_type_budget,
    strategy_budget,
)
from fairseq_headprune.study.budhraja.layer_strategies import paper_strategies
from fairseq_headprune.study.masks.head_mask import HeadLayout

TABLES = (1, 2, 3, 4, 5, 6)
TRANSLATION_TABLES, ENCODER_TABLES = (1, 2, 3), (4, 5, 6)
PAPER_LAYERS, PAPER_HEADS = 6, 8  # the paper's Transformer-Base, per attention type
TABLE1_LEVELS = (25, 35, 50, 55, 60, 75, 81)  # and 87%: one head per layer of each type
PAPER_ONE_HEAD_LEVEL = 87  # the paper's level of one head per layer (7 of its 8)
TABLE4_LEVELS = (10, 20, 30, 40, 50, 60, 70, 80, 90)
# Table 2: heads kept per layer (ES, ED, DS) with the important layers kept; the paper's level in % pruned
TABLE2 = {
    25: ("888444", "444888", "888444"),
    40: ("777322", "233777", "777332"),
    50: ("666222", "222666", "666222"),
    60: ("555211", "112555", "555211"),
    75: ("333111", "111333", "333111"),
}
# Table 3: heads kept in (ES, ED, DS) of 48 each, fewest in one type; the paper's level in % pruned
TABLE3 = {
    48: ((14, 31, 30), (31, 14, 30), (30, 31, 14)),
    60: ((12, 21, 25), (21, 12, 25), (25, 21, 12)),
    75: ((8, 13, 15), (13, 8, 15), (15, 13, 8)),
    82: ((5, 9, 12), (9, 5, 12), (12, 9, 5)),
}
TYPE_ABBREVIATIONS = {"enc-enc": "ES", "enc-dec": "ED", "dec-dec": "DS"}


def parse_tables(text: str) -> List[int]:
    """``1,2,3`` or ``all`` -> the table numbers (``all``: 1-6, narrowed to the model by ``paper_budgets``)."""
    if str(text).strip().lower() == "all":
        return list(TABLES)
    try:
        tables = sorted({int(item) for item in str(text).replace(" ", "").split(",") if item})
    except ValueError:
        tables = []
    if not tables or any(t not in TABLES for t in tables):
        raise SettingsError(f"the budhraja tables {text}: expected table numbers from 1-6, comma-separated, or all",
                            setting="budhraja_tables")
    return tables


def largest_remainder(values: Sequence[float], total: int, low: int, high: int) -> List[int]:
    """Integers within [low, high] summing to ``total``, each as near its value as the sum allows (Hamilton's
    method)."""
    counts = [min(high, max(low, math.floor(v))) for v in values]
    order = sorted(range(len(values)), key=lambda i: (-(values[i] - math.floor(values[i])), i))
    while sum(counts) < total:
        grown = next((i for i in order if counts[i] < high), None)
        if grown is None:
            break
        counts[grown] += 1
        order.remove(grown)
        order.append(grown)
    while sum(counts) > total:
        shrunk = next((i for i in reversed(order) if counts[i] > low), None)
        if shrunk is None:
            break
        counts[shrunk] -= 1
        order.remove(shrunk)
        order.insert(0, shrunk)
    return counts


def resample_profile(paper_counts: Sequence[int], layers: int, heads: int, paper_heads: int = PAPER_HEADS) -> List[int]:
    """The paper's heads kept per layer at a model's depth and width.

    Each model layer covers 1/``layers`` of the depth and keeps the mean of
    the paper's counts over that share (a paper layer cut in two counts for
    its part), times ``heads / paper_heads``; rounded by largest remainder so
    that the type keeps the paper's share of its heads, at least one per layer.
    """
    paper_layers = len(paper_counts)
    values = []
    for layer in range(layers):
        begin, end = layer * paper_layers / layers, (layer + 1) * paper_layers / layers
        covered = sum(count * max(0.0, min(end, index + 1) - max(begin, index))
                      for index, count in enumerate(paper_counts))
        values.append(covered / (end - begin) * heads / paper_heads)
    share = sum(paper_counts) / (paper_layers * paper_heads)
    total = max(layers, math.floor(share * layers * heads + 0.5))
    return largest_remainder(values, total, 1, heads)


def _types(layout: HeadLayout) -> List[str]:
    return [t for t in ATTENTION_TYPES if t in layout]


def table1_budgets(layout: HeadLayout, levels: Sequence[float] = TABLE1_LEVELS, bert: bool = False) -> List[Budget]:
    """Random levels with one head kept in every layer, and one head per layer (Table 1; Table 4 with ``bert``)."""
    table = 4 if bert else 1
    budgets, most = [], one_head_per_layer_budget(layout)
    for percent in levels:
        try:
            budget = level_budget(percent, layout)
        except HeadMaskError:
            continue  # above one head per layer on this model
        if budget.level < most.level:
            budget.tables, budget.paper_level = (table,), percent
            budgets.append(budget)
    if not bert:
        most.tables, most.paper_level, most.arm = (1,), PAPER_ONE_HEAD_LEVEL, ONE_HEAD_PER_LAYER
        budgets.append(most)
    return budgets


def table2_budgets(layout: HeadLayout) -> List[Budget]:
    """The important layers kept, then pruned (reversed), at the paper's five levels, for a translation model."""
    budgets = []
    for level, profiles in TABLE2.items():
        kept = {t: resample_profile([int(c) for c in profile], *layout[t])
                for t, profile in zip(ATTENTION_TYPES, profiles)}
        for which, per_layer in (("kept", kept), ("pruned", {t: counts[::-1] for t, counts in kept.items()})):
            label = " ".join(_group(counts) for counts in per_layer.values())
            budgets.append(Budget(label, per_layer=per_layer, tables=(2,), paper_level=level,
                                  arm=f"important layers {which}"))
    return budgets


def table3_budgets(layout: HeadLayout) -> List[Budget]:
    """Heads kept per type, fewest in ES, ED or DS, at the paper's four levels, scaled to the model's heads."""
    budgets = []
    paper_type_heads = PAPER_LAYERS * PAPER_HEADS
    for level, triples in TABLE3.items():
        for triple in triples:
            per_type = {t: max(1, math.floor(count / paper_type_heads * layout[t][0] * layout[t][1] + 0.5))
                        for t, count in zip(ATTENTION_TYPES, triple)}
            fewest = TYPE_ABBREVIATIONS[min(per_type, key=lambda t: triple[ATTENTION_TYPES.index(t)])]
            label = "(" + ",".join(str(per_type[t]) for t in ATTENTION_TYPES) + ")"
            budgets.append(Budget(label, per_type=per_type, tables=(3,), paper_level=level, arm=f"fewest in {fewest}"))
    return budgets


def strategy_budgets(layout: HeadLayout, tables: Sequence[int]) -> List[Budget]:
    """Tables 5 and 6 for each attention type of the model (one type: the paper's BERT), the paper's K scaled."""
    budgets: Dict[str, Budget] = {}
    types = _types(layout)
    for attention_type in types:
        for table in (5, 6):
            if table not in tables:
                continue
            for strategy in paper_strategies(layout[attention_type][0], (table,),
                                             attention_type if len(types) > 1 else None):
                budget = budgets.setdefault(strategy.label, Budget(strategy.label, strategy=strategy))
                if table not in budget.tables:
                    budget.tables += (table,)
    return list(budgets.values())


def paper_budgets(tables: Sequence[int], layout: HeadLayout) -> List[Budget]:
    """Every configuration of the chosen tables for a model of ``layout``.

    Tables 1-3 need the three attention types of a translation model; Table 4
    is the encoder-only levels (any model: one head per layer kept); 5 and 6
    prune whole layers of each type.
    """
    types = _types(layout)
    three_types = len(types) == len(ATTENTION_TYPES)
    budgets: List[Budget] = []
    for table in tables:
        if table in (2, 3) and not three_types:
            raise SettingsError(f"the budhraja tables {table}: Table {table} budgets the three attention types of a "
                                f"translation model; this model has {', '.join(types)}", setting="budhraja_tables")
    if 1 in tables:
        budgets += table1_budgets(layout)
    if 2 in tables:
        budgets += table2_budgets(layout)
    if 3 in tables:
        budgets += table3_budgets(layout)
    if 4 in tables:
        budgets += table1_budgets(layout, TABLE4_LEVELS, bert=True)
    if 5 in tables or 6 in tables:
        budgets += strategy_budgets(layout, tables)
    return budgets


def _group(counts: Sequence[int]) -> str:
    """A layer budget's group as ``parse_layer_budget`` reads it: digits, or comma-separated past 9."""
    return "".join(map(str, counts)) if max(counts) < 10 else ",".join(map(str, counts))


def requested_budgets(settings, layout: HeadLayout) -> List[Budget]:
    """The configurations a ``PruneSettings`` asks for, in the order given, each once (by label); a budget the
    model cannot take is a ``HeadMaskError`` (checked by the command before fairseq is imported).

    A table's configuration also given by hand (``--random-level 50`` and Table 1's 50%) is the hand-given one,
    with its draws (``--draws``) and the table's place; the tables' others take ``budhraja_draws`` (None:
    ``--draws``)."""
    budgets = [parse_layer_budget(text, layout) for text in settings.layer_budgets]
    budgets += [parse_type_budget(text, layout) for text in settings.type_budgets]
    budgets += [level_budget(level, layout) for level in settings.random_levels]
    budgets += [strategy_budget(text, layout) for text in settings.layer_strategies]
    tables = paper_budgets(settings.budhraja_tables, layout) if settings.budhraja_tables else []
    for budget in tables:
        budget.draws = settings.budhraja_draws
    unique: Dict[str, Budget] = {}
    for budget in budgets + tables:
        kept = unique.setdefault(budget.label, budget)
        if kept is not budget and budget.tables and not kept.tables:  # given by hand and in a table: the table's row
            kept.tables, kept.paper_level, kept.arm = budget.tables, budget.paper_level, budget.arm
    return list(unique.values())
