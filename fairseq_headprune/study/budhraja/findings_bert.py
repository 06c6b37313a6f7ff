"""Budhraja et al. (2020)'s BERT findings on whole layers pruned (Tables 5 and 6, Figure 2), each an estimate with
its 95% interval beside the paper's own figure.

The paper's BERT figures are the mean of its four tasks (``paper_figures``)
at the same share of the layers: a study's K of L layers is compared with
the paper's row for the K nearest K * 12 / L.

- Table 5, middle against top+bottom: per pair, the accuracy with the middle
  layers pruned minus with as many top and bottom ones, against the paper's
  difference and its spread; consistent where the interval excludes 0 (the
  middle no worse) in most pairs, as the paper's "14 of 16 cases".
- Table 5, top against bottom: the paper finds no preference (2 of 4 cases
  each way): differs where every pair's interval lies on the same side of 0,
  consistent where one lies above 0 and another below.
- Table 6: odd layers pruned minus the top half, and minus the bottom half,
  against the paper's differences and their spread; consistent where both
  intervals exclude 0 (odd no better).
- Figure 2: every configuration of Tables 5 and 6 whose layers' mean change
  of W_q, W_k, W_v differs by under 10%. No sampling interval exists (one
  fine-tune per configuration); the unpruned control fine-tuned alike is the
  reference: where its own spread reaches 10%, the measure cannot tell.

A pair's interval (Tables 5 and 6) is the paired test of its two
configurations against each other, where ``prune`` ran it (``pairs``), else
the two tests against the unpruned model combined (``evidence.pair_estimate``);
the verdict follows it.

On a translation model the same measurement is shown per attention type, as
an extension, not judged.
"""

import statistics
from typing import Dict, List, Optional

from fairseq_headprune.study.budhraja.evidence import Evidence, direct_difference, pair_estimate
from fairseq_headprune.study.budhraja.layer_strategies import paper_strategies
from fairseq_headprune.study.budhraja.paper_figures import (
    FIGURE2_SPREAD,
    LAYERS,
    PAPER_DEPTH,
    allowance,
    layers_difference,
    nearest_count,
)
from fairseq_headprune.study.budhraja.records import FinetuneRecord
from fairseq_headprune.study.output.finding import (
    AT_LEAST,
    AT_MOST,
    CONSISTENT,
    DIFFERS,
    INCONCLUSIVE,
    Claim,
    Finding,
    Judgement,
    every,
    judged_row,
    most,
)
from fairseq_headprune.study.statistics.significance import p_value_text

HALF_WIDTHS = ("two configurations' paired-bootstrap half-widths added (each was tested against the unpruned model, "
               "not against the other)")
INTERVAL = "95% interval: the " + HALF_WIDTHS
DIRECT_INTERVAL = "95% interval: the paired test of the two configurations against each other on the same examples"


def _interval_text(pairs) -> str:
    """What the pairs' intervals are: the direct paired test, the half-widths added, or which pairs have which."""
    direct = sum(1 for first, second in pairs if direct_difference(first, second) is not None)
    if direct == len(pairs):
        return DIRECT_INTERVAL
    if not direct:
        return INTERVAL
    return f"{DIRECT_INTERVAL} for {direct} of the {len(pairs)} pairs; for the others the {HALF_WIDTHS}"


def _pair_cell(first: FinetuneRecord, second: FinetuneRecord, evidence: Evidence):
    """The pair's estimate and its text: ``-2.00 [-2.40, -1.60], p < 0.001`` (p: the direct test's, where it ran)."""
    estimate = pair_estimate(first, second)
    test = first.paired.get(second.label) if direct_difference(first, second) is not None else None
    return estimate, estimate.text() + (f", {p_value_text(test.p_value, evidence.resamples)}" if test else "")


def _difference_claim(first, second, side: str) -> Claim:
    """The paper's difference of two layer strategies (the mean of its four tasks) as a claim on the study's side of
    it, with the paper's own spread allowed; the contradiction: no difference, or the other way."""
    figure = layers_difference(first, second)[1]
    spread = allowance(LAYERS[first], LAYERS[second], bert=True)
    distance = -(figure + spread) if side == AT_MOST else figure - spread
    return Claim(figure, side, margin=max(0.0, distance), allowance=spread)


def _strategy_pairs(scores: Dict[str, FinetuneRecord], first: str, second: str):
    pairs = []
    for name, record in scores.items():
        if name.startswith(f"{first}:") and name[len(first) + 1:].isdigit():
            count = int(name[len(first) + 1:])
            if f"{second}:{count}" in scores:
                pairs.append((count, record, scores[f"{second}:{count}"]))
    return sorted(pairs, key=lambda pair: pair[0])


def _depth(count: int, record: FinetuneRecord) -> int:
    """The layers of the model a K-layer strategy pruned ``record.percent`` % of."""
    return max(count, round(100.0 * count / record.percent)) if record.percent else count


def _paper_count(name: str, count: int, depth: int) -> int:
    return nearest_count(name, count * PAPER_DEPTH / depth)


def _pairs_expected(first: str, depth: int) -> int:
    return sum(1 for s in paper_strategies(depth, (5,)) if s.name == first)


def table5_findings(records: List[FinetuneRecord], label: str) -> List[Finding]:
    """Table 5 (BERT): middle against top+bottom, and top against bottom, at the same K."""
    scores = {r.label: r for r in records if r.kind == "layers"}
    evidence = Evidence(records, True)
    findings = []
    pairs = _strategy_pairs(scores, "middle", "top+bottom")
    if pairs:
        depth = _depth(pairs[0][0], pairs[0][1])
        cells, paper_cells, judgements, margins = [], [], [], []
        for count, middle, ends in pairs:
            paper = _paper_count("middle", count, depth)
            claim = _difference_claim(("middle", paper), ("top+bottom", paper), AT_MOST)
            estimate, text = _pair_cell(middle, ends, evidence)
            judgements.append(claim.judge(estimate, "test examples"))
            margins.append(f"K={count}: {claim.margin_text()}")
            cells.append(f"K={count}: {text} ({middle.score_after:.2f} vs {ends.score_after:.2f})")
            paper_cells.append(f"K={count} of {depth} as K={paper} of 12: {claim.figure:+.2f}")
        expected = _pairs_expected("middle", depth)
        shortfall = evidence.shortfall(None) or (f"{len(pairs)} of the {expected} pairs of Table 5 at {depth} layers"
                                                 if len(pairs) < expected else None)
        findings.append(judged_row(
            "pruning the middle layers hurts more than as many top and bottom layers (Budhraja et al. Table 5)",
            "middle minus top+bottom (the mean of its 4 tasks): " + ", ".join(paper_cells)
            + " points; middle worse in 14 of 16 cases",
            f"middle minus top+bottom pruned: {', '.join(cells)} {label}",
            "in most pairs middle minus top+bottom at most the paper's difference at the same share of layers, less "
            "its own spread (the middle at least as much worse)",
            most(judgements), shortfall, evidence.describe() + "; one fine-tune per configuration; "
            + _interval_text([(middle, ends) for _, middle, ends in pairs]),
            "; ".join(margins) + " points (the middle no worse)"))
    pairs = _strategy_pairs(scores, "top", "bottom")
    if pairs:
        depth = _depth(pairs[0][0], pairs[0][1])
        cells = [_pair_cell(top, bottom, evidence) for _, top, bottom in pairs]
        estimates = [estimate for estimate, _ in cells]
        if not all(e.has_interval for e in estimates):
            judgement = Judgement(None, "no 95% interval to decide by")
        elif len(estimates) > 1 and (all(e.low > 0 for e in estimates) or all(e.high < 0 for e in estimates)):
            judgement = Judgement(DIFFERS)  # every pair clearly the same way: a preference
        elif any(e.low > 0 for e in estimates) and any(e.high < 0 for e in estimates):
            judgement = Judgement(CONSISTENT)  # pairs clearly each way, as the paper's 2 of 4
        else:
            judgement = Judgement(INCONCLUSIVE, "no pair clearly each way (an interval above 0 and one below), nor "
                                  "every pair the same way")
        expected = _pairs_expected("top", depth)
        shortfall = evidence.shortfall(None) or (f"{len(pairs)} of the {expected} pairs of Table 5 at {depth} layers"
                                                 if len(pairs) < max(2, expected) else None)
        paper_cells = [f"K={k}: {layers_difference(('top', k), ('bottom', k))[1]:+.2f}" for k in (1, 3, 6, 8)]
        findings.append(judged_row(
            "no preference between pruning top and bottom layers (Budhraja et al. Table 5)",
            f"top minus bottom pruned (the mean of its 4 tasks, 12 layers): {', '.join(paper_cells)} points: 2 of 4 "
            "cases each way",
            "top minus bottom pruned: " + ", ".join(f"K={k}: {text}" for (k, _, _), (_, text) in zip(pairs, cells))
            + f" {label}",
            "differs where every pair's 95% interval lies on the same side of 0 (a preference); consistent where one "
            "lies above 0 and another below (each way, as the paper's)",
            judgement, shortfall, evidence.describe() + "; one fine-tune per configuration; "
            + _interval_text([(top, bottom) for _, top, bottom in pairs]),
            "every pair's interval on the same side of 0"))
    return findings


def table6_finding(records: List[FinetuneRecord], label: str) -> Optional[Finding]:
    """Table 6 (BERT): alternate (odd) layers pruned against the top and the bottom half."""
    scores = {r.label: r for r in records if r.kind == "layers"}
    odd = scores.get("odd")
    halves = [r for r in records if r.kind == "layers" and 6 in r.tables and r.label.split(":")[0] in ("top", "bottom")]
    if odd is None or len(halves) < 2:
        return None
    evidence = Evidence(records, True)
    cells, paper_cells, judgements, margins = [], [], [], []
    for half in halves:
        name = half.label.split(":")[0]
        claim = _difference_claim(("odd", 6), (name, 6), AT_LEAST)
        estimate, text = _pair_cell(odd, half, evidence)
        judgements.append(claim.judge(estimate, "test examples"))
        margins.append(f"minus {name}: {claim.margin_text()}")
        cells.append(f"minus {half.label} {text}")
        paper_cells.append(f"minus {name} 6 {claim.figure:+.2f}")
    return judged_row(
        "pruning alternate layers is better than pruning consecutive ones (Budhraja et al. Table 6)",
        f"odd layers pruned (the mean of its 4 tasks): {', '.join(paper_cells)} points",
        f"odd {odd.score_after:.2f}: {', '.join(cells)} {label}",
        "both differences at least the paper's, less its own spread (odd at least as much better)",
        every(judgements), evidence.shortfall(None),
        evidence.describe() + "; one fine-tune per configuration; " + _interval_text([(odd, h) for h in halves]),
        "; ".join(margins) + " points (odd no better)")


def compensation_findings(records: List[FinetuneRecord], bert: bool) -> List[Finding]:
    """Figure 2: judged on BERT's Table 5 and 6 configurations against the control's own spread; on a translation
    model shown per attention type."""
    evidence = Evidence(records, bert)
    control = next((r for r in records if r.is_control), None)
    if bert:
        return _figure2(records, control, evidence)
    by_type: Dict[str, List[float]] = {}
    for record in records:
        if not record.is_control:
            for attention_type, spread in record.layer_spreads.items():
                if spread is not None:
                    by_type.setdefault(attention_type, []).append(spread)
    if not by_type:
        return []
    reference = ""
    if control is not None and control.layer_spreads:
        reference = "; the unpruned control fine-tuned alike: " + ", ".join(
            f"{t} {s:.0%}" for t, s in control.layer_spreads.items() if s is not None)
    return [Finding(
        "the layers of each attention type compensate alike during fine-tuning (extension: the paper's Figure 2 is "
        "BERT's)",
        "BERT: under 10% between any two layers (Tables 5 and 6)",
        "median relative difference between two layers' mean absolute change: "
        + ", ".join(f"{t} {statistics.median(v):.0%}" for t, v in by_type.items())
        + f" (over {max(len(v) for v in by_type.values())} configurations){reference}",
        "not judged: the paper states it for BERT",
        None,
        evidence.describe(),
    )]


def _figure2(records: List[FinetuneRecord], control: Optional[FinetuneRecord], evidence: Evidence) -> List[Finding]:
    spreads = [(r.label, r.layer_spread) for r in records  # whole layers pruned: Tables 5 and 6's kind
               if r.layer_spread is not None and r.kind == "layers"]
    if not spreads:
        return []
    largest = max(spreads, key=lambda item: item[1])
    counted = next((r for r in records if r.kind == "layers" and r.label.split(":")[-1].isdigit()), None)
    depth = _depth(int(counted.label.split(":")[-1]), counted) if counted else None
    expected = len(paper_strategies(depth, (5, 6))) if depth else None
    reference = control.layer_spread if control is not None else None
    shortfall = evidence.shortfall(None)
    if not shortfall and expected and len(spreads) < expected:
        shortfall = (f"{len(spreads)} of the {expected} configurations of Tables 5 and 6 at {depth} layers (the "
                     "paper pools both tables)")
    if not shortfall and reference is None:
        shortfall = "the unpruned control's own spread, the reference, is not recorded"
    if not shortfall and reference >= FIGURE2_SPREAD:
        shortfall = (f"the unpruned control's own spread, {reference:.0%}, reaches the paper's 10%: the measure "
                     "cannot tell compensation from the layers' own differences")
    judgement = Judgement(CONSISTENT if largest[1] < FIGURE2_SPREAD else DIFFERS)
    return [judged_row(
        "the unpruned heads of all layers compensate alike during fine-tuning (Budhraja et al. Figure 2)",
        "for all experiments in Tables 5 and 6 the average change of any two layers differs by less than 10%",
        f"largest relative difference between two layers' mean absolute change: {largest[1]:.0%} (`{largest[0]}`);"
        f" median {statistics.median(s for _, s in spreads):.0%} over {len(spreads)} Table 5 and 6 configurations"
        + (f"; the unpruned control fine-tuned alike (the reference): {reference:.0%}" if reference is not None
           else ""),
        "every configuration below 10%, the control's own spread below it (no sampling interval: one fine-tune per "
        "configuration)",
        judgement, shortfall, evidence.describe(), "a configuration at or above 10%")]
