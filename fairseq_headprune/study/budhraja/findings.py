"""Budhraja et al. (2020)'s findings on configurations fine-tuned as the paper does: each an estimate with its 95%
interval beside the paper's own figure, and the verdict that follows from both.

The paper fine-tunes every pruned configuration before scoring it (section
3.1: 30 epochs for its Transformer, 10 for BERT; the mean of three draws of
ξ) and compares with the unpruned model (its baseline rows). Judged here,
from ``finetune/results.json`` (the paper's numbers: ``paper_figures``):

- Tables 1 and 4, each random level the paper lists (and one head per
  layer): the mean change against the unpruned model over draws, its 95%
  interval (``evidence.group_delta``), against the paper's change at that
  level (Table 1: the larger loss of EN-RU and EN-DE; Table 4: the mean of
  its four tasks), the paper's own spread allowed (its standard deviations,
  0.668% and 0.778% of a score, over its three draws: ``paper_figures``).
  Consistent where the interval excludes a loss one point beyond that (the
  unit of its headline, "a drop of less than 1 BLEU point"); differs where it
  lies wholly below the figure less its spread. The difference against the
  unpruned model fine-tuned alike comes first in the row: this project's
  control, which the paper does not have, holds what the fine-tune itself
  gains; not judged.
- Table 2: at each level, important layers kept minus pruned within the
  paper's largest difference (0.40 BLEU, "very similar") and its spread;
  consistent where every level's interval lies within ±1 point.
- Table 3: differs where one configuration is best at every level with each
  margin's interval above 0 (the consistent preference the paper denies);
  consistent where two configurations are each clearly best at some level
  (the paper: "each of the 3 configurations has the highest BLEU score in at
  least one case"); else inconclusive.
- Tables 5, 6 and Figure 2 (BERT): ``findings_bert``.

**Strength.** A verdict is ``inconclusive`` where the run cannot tell: a
fine-tune shorter than half of the model's own training, fewer than the
paper's three draws of a random configuration, fewer of the paper's levels
or pairs than its claim spans, or a difference that moved towards the
paper's figure over the second half of the fine-tune by at least what its
interval misses it by (``evidence.still_closing``). A study without
fine-tuning gets its numbers shown, not judged.
"""

from typing import Dict, List, Optional

from fairseq_headprune.study.budhraja.budgets import ONE_HEAD_PER_LAYER
from fairseq_headprune.study.budhraja.evidence import (
    Evidence,
    draws_seeds,
    group_delta,
    groups,
    pair_difference,
    second_half_change,
    still_closing,
)
from fairseq_headprune.study.budhraja.findings_bert import compensation_findings, table5_findings, table6_finding
from fairseq_headprune.study.budhraja.paper_figures import (
    CONTRADICTION_POINTS,
    ONE_HEAD_LEVEL,
    TABLE1,
    TABLE2,
    TABLE3,
    TABLE4,
    allowance,
    paper_level,
    table1_figure,
    table1_pair,
    table2_gaps,
    table2_largest_gap,
    table3_best,
    table4_figure,
)
from fairseq_headprune.study.budhraja.records import FinetuneRecord
from fairseq_headprune.study.output.finding import (
    AT_LEAST,
    CONSISTENT,
    DIFFERS,
    INCONCLUSIVE,
    WITHIN,
    Claim,
    Finding,
    Judgement,
    every,
    judged_row,
)
from fairseq_headprune.study.pruning.curves import mean_and_std

RESULTS = ("pruning/finetune/results.json",)
NOT_JUDGED = "not judged: the paper fine-tunes every configuration (prune --finetune-updates N)"
PAPER_WORDS = {  # what the paper says of a level, beside its table's figure (Transformer, BERT)
    False: {60: "\"60% of the attention heads can be pruned with a maximum drop in BLEU score by only 0.15\"",
            75: "the abstract: 75% \"with a drop of less than 1 BLEU point\""},
    True: {50: "\"half of the attention heads can be pruned with an average accuracy drop of under 1%\""},
}


def _mean(values) -> float:
    return sum(values) / len(values)


def random_level_findings(records: List[FinetuneRecord], bert: bool, label: str) -> List[Finding]:
    """Table 1 (each level, and one head per layer) or Table 4: against the unpruned model, the control beside it."""
    evidence = Evidence(records, bert)
    control = next((r for r in records if r.is_control), None)
    levels = list(TABLE4) if bert else [level for level in TABLE1 if level != ONE_HEAD_LEVEL]
    rows = []
    found = groups(records, lambda r: r.kind == "level" or r.arm == ONE_HEAD_PER_LAYER)
    for members in sorted(found.values(), key=lambda m: m[0].percent):
        one_head = members[0].arm == ONE_HEAD_PER_LAYER
        if one_head and bert:
            continue
        seen = members[0].paper_level if members[0].paper_level is not None else members[0].percent
        level = ONE_HEAD_LEVEL if one_head else paper_level(seen, levels)
        if level is not None and all("unpruned" in m.tests for m in members):
            rows.append(_level_row(members, control, evidence, bert, label, level))
    return rows


def _paper_level_text(bert: bool, level: int, one_head: bool) -> str:
    if bert:
        mnli, mean = table4_figure(level)
        text = f"{level}%: {mean:+.2f} (the mean of its 4 tasks; MNLI-M {mnli:+.2f}) against the unpruned model"
    else:
        ru, de = table1_figure(level)
        text = (("one head per layer (87%)" if one_head else f"{level}%")
                + f": {ru:+.2f} (EN-RU), {de:+.2f} (EN-DE) BLEU against the unpruned model")
    words = None if one_head else PAPER_WORDS[bert].get(level)
    return text + (f"; {words}" if words else "")


def _level_row(members, control, evidence: Evidence, bert: bool, label: str, level: int) -> Finding:
    one_head = members[0].arm == ONE_HEAD_PER_LAYER
    draws = len(members)
    figure = table4_figure(level)[1] if bert else min(table1_figure(level))
    spread = allowance(TABLE4[level] if bert else table1_pair(level), bert=bert)
    claim = Claim(figure, AT_LEAST, margin=CONTRADICTION_POINTS, allowance=spread)
    estimate = group_delta(members, "unpruned")
    judgement = claim.judge(estimate, "draws and test examples")
    shortfall = evidence.shortfall(draws) or still_closing(claim, estimate, judgement, second_half_change(members))
    unpruned = members[0].score_after - members[0].tests["unpruned"].delta
    before = _mean([m.score_before for m in members]) - unpruned
    p_values = ", ".join(evidence.p_value(m.tests["unpruned"].p_value) for m in members)
    against_control = group_delta(members, "control") if control is not None else None
    study = f"{members[0].percent:.0f}% pruned at random, fine-tuned: "
    if against_control is not None:
        study += (f"{against_control.text(label)} against the unpruned model fine-tuned alike (this project's control, "
                  "not the paper's; not judged); ")
    study += (f"{estimate.text(label)} against the unpruned model (the paper's baseline; judged)"
              + (f" (mean of {draws} draws, std {mean_and_std([m.score_after for m in members])[1]:.2f})"
                 if draws > 1 else "")
              + f", p {p_values}; without fine-tuning {before:+.2f}")
    what = ("one head kept per layer of each type" if one_head
            else f"{level}% of the heads pruned at random")
    source = "larger loss of its two language pairs" if not bert else "mean of its four tasks"
    return judged_row(
        f"{what}, fine-tuned, cost no more than in the paper, against the unpruned model (Budhraja et al. "
        f"Table {4 if bert else 1})",
        _paper_level_text(bert, level, one_head),
        study,
        f"the change against the unpruned model at least the paper's {claim.figure:+.2f} {label} (the {source} at "
        "this level), less its own spread",
        judgement, shortfall, evidence.describe(draws) + (f"; {draws_seeds(members)}" if draws > 1 else "")
        + f"; 95% interval: {estimate.method}",
        claim.margin_text(label) + " (a loss one point beyond the paper's)")


def _by_level(records: List[FinetuneRecord], table: int) -> Dict[float, Dict[str, List[FinetuneRecord]]]:
    by_level: Dict[float, Dict[str, List[FinetuneRecord]]] = {}
    for record in records:
        if table in record.tables and record.paper_level is not None and not record.is_control:
            by_level.setdefault(record.paper_level, {}).setdefault(record.arm, []).append(record)
    return by_level


def table2_finding(records: List[FinetuneRecord], label: str) -> Optional[Finding]:
    """Table 2: at each level, the important layers kept minus pruned, against the paper's largest difference."""
    pairs = {level: arms for level, arms in _by_level(records, 2).items() if len(arms) == 2}
    if not pairs:
        return None
    evidence = Evidence(records, False)
    largest = table2_largest_gap()
    spread = max(allowance((kept,), (pruned,), bert=False) for kept, pruned in TABLE2.values())
    claim = Claim(-largest, WITHIN, largest, margin=max(0.0, CONTRADICTION_POINTS - largest - spread),
                  allowance=spread)
    cells, judgements, closing, draws = [], [], [], None
    for level, arms in sorted(pairs.items()):
        kept, pruned = arms["important layers kept"], arms["important layers pruned"]
        estimate = pair_difference(kept, pruned)
        judgement = claim.judge(estimate, "draws and test examples")
        judgements.append(judgement)
        closing.append(still_closing(claim, estimate, judgement, second_half_change(kept, pruned)))
        cells.append(f"{level:g}% {estimate.text()}" + (" (differs)" if judgement.verdict == DIFFERS else ""))
        draws = min(len(kept), len(pruned), draws if draws is not None else len(kept))
    judgement = every(judgements)
    shortfall = evidence.shortfall(draws)
    if not shortfall and judgement.verdict == DIFFERS and all(
            note for note, j in zip(closing, judgements) if j.verdict == DIFFERS):
        shortfall = next(note for note in closing if note)
    if not shortfall and judgement.verdict != DIFFERS and len(pairs) < len(TABLE2):
        shortfall = f"{len(pairs)} of the paper's {len(TABLE2)} levels"
    return judged_row(
        "keeping or pruning the layers called important makes no difference after fine-tuning (Budhraja et al. "
        "Table 2)",
        "kept minus pruned: " + ", ".join(f"{level}% {gap:+.2f}" for level, gap in table2_gaps().items())
        + " BLEU; \"the performance of both configurations is very similar\"",
        f"important layers kept minus pruned: {', '.join(cells)} {label}",
        f"at every level kept minus pruned within ±{largest:.2f} {label} (the paper's largest difference), less its "
        "own spread",
        judgement, shortfall, evidence.describe(draws) + "; 95% interval: t over draws (each side) and both sides' "
        "paired-bootstrap half-widths added, combined in quadrature",
        claim.margin_text(label) + " (a difference of a full point is not \"very similar\")")


def table3_finding(records: List[FinetuneRecord], label: str) -> Optional[Finding]:
    """Table 3: per-type budgets; a consistent preference is one configuration best at every level, clearly."""
    levels = {level: arms for level, arms in _by_level(records, 3).items() if len(arms) > 1}
    if not levels:
        return None
    evidence = Evidence(records, False)
    best, margins, draws = [], [], None
    for level, arms in sorted(levels.items()):
        means = {arm: _mean([r.score_after for r in members]) for arm, members in arms.items()}
        ranked = sorted(means, key=means.get, reverse=True)
        margin = pair_difference(arms[ranked[0]], arms[ranked[1]])
        best.append((level, ranked[0].replace("fewest in ", "")))
        margins.append(margin)
        smallest = min(len(members) for members in arms.values())
        draws = smallest if draws is None else min(draws, smallest)
    if not all(m.has_interval for m in margins):
        judgement = Judgement(None, "no 95% interval to decide by")
    elif len({arm for _, arm in best}) == 1 and len(best) > 1 and all(m.low > 0 for m in margins):
        judgement = Judgement(DIFFERS)  # one configuration clearly best at every level: a consistent preference
    elif len({arm for (_, arm), m in zip(best, margins) if m.low > 0}) > 1:
        judgement = Judgement(CONSISTENT)  # two configurations each clearly best somewhere: no consistent preference
    else:
        judgement = Judgement(INCONCLUSIVE, "no two configurations are each clearly best at a level (a margin's "
                              "interval above 0), nor one at every level")
    shortfall = evidence.shortfall(draws)
    if not shortfall and len(levels) < len(TABLE3):
        shortfall = f"{len(levels)} of the paper's {len(TABLE3)} levels"
    paper_best = ", ".join(f"{level}% {arm} {margin:+.2f}" for level, (arm, margin) in table3_best().items())
    return judged_row(
        "no consistent preference between per-type budgets after fine-tuning (Budhraja et al. Table 3)",
        f"best at each level (fewest heads in) and its margin over the second: {paper_best} BLEU; \"each of the 3 "
        "configurations has the highest BLEU score in at least one case\" (its own table: ES at none)",
        "best at each level (fewest heads in) and its margin over the second: "
        + ", ".join(f"{level:g}% {arm} {margin.text()}" for (level, arm), margin in zip(best, margins)) + f" {label}",
        "differs where one configuration is best at every level with each margin's 95% interval above 0 (a "
        "consistent preference); consistent where two configurations are each best at some level with the margin's "
        "interval above 0",
        judgement, shortfall, evidence.describe(draws) + "; 95% interval: t over draws (each side) and both sides' "
        "paired-bootstrap half-widths added, combined in quadrature",
        "one configuration best at every level, each margin's interval above 0")


def importance_extension(records: List[FinetuneRecord], label: str) -> List[Finding]:
    """This project's comparison (the paper makes none): importance-ordered masks against random draws of the same
    level, fine-tuned alike."""
    ordered = {round(r.percent): r for r in records if r.kind == "curve step" and " importance " in f" {r.label} "}
    random = groups(records, lambda r: r.kind == "level")
    findings = []
    for members in sorted(random.values(), key=lambda m: m[0].percent):
        match = ordered.get(round(members[0].percent))
        if match is None:
            continue
        difference = pair_difference([match], members)
        findings.append(Finding(
            f"{members[0].percent:.0f}% pruned by importance against at random, fine-tuned alike (extension: this "
            "project's comparison; the paper makes none)",
            "—",
            f"importance {match.score_after:.2f}, random {_mean([r.score_after for r in members]):.2f} ± "
            f"{mean_and_std([r.score_after for r in members])[1]:.2f} ({len(members)} draws) {label}: "
            f"{difference.text(label)}; before fine-tuning {match.score_before:.2f} and "
            f"{_mean([r.score_before for r in members]):.2f}",
            "not judged: no claim of the papers",
            None,
            Evidence(records, False).describe(len(members)),
        ))
    return findings


def unjudged(finding: str, paper: str, study: str, evidence: str = "no fine-tuning") -> Finding:
    """A finding the study measured without fine-tuning: shown, not judged."""
    return Finding(f"{finding} (without fine-tuning: not the paper's protocol)", paper, study, NOT_JUDGED, None,
                   evidence)


def budhraja_findings(load, bert: bool, label: str) -> List[Finding]:
    """The rows judged on fine-tuned configurations (none if the study fine-tuned nothing)."""
    data = next((records for records in (load(path) for path in RESULTS) if records), [])
    if not data:
        return []
    records = [FinetuneRecord.from_dict(item) for item in data]
    found: List[Optional[Finding]] = [*random_level_findings(records, bert, label)]
    if bert:
        found += [*table5_findings(records, label), table6_finding(records, label)]
    else:
        found += [table2_finding(records, label), table3_finding(records, label)]
    found += [*compensation_findings(records, bert), *importance_extension(records, label)]
    return [finding for finding in found if finding is not None]
