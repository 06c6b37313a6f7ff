"""Budhraja et al. (2020)'s findings, judged as the paper states them, on configurations fine-tuned as it does.

The paper fine-tunes every pruned configuration before scoring it (section
3.1: 30 epochs for its Transformer, 10 for BERT; the mean of three draws of
ξ) and compares with the unpruned model before pruning (its baseline rows).
Its claims, and how each is judged here (from ``finetune/results.json``):

- Table 1: 60% of the heads pruned at random cost at most 0.15 BLEU; one
  head per layer (87%) 1.62 / 1.03. Judged on the level nearest 60% (and on
  one head per layer), the mean over draws within 1 BLEU (2 for one head per
  layer) of the unpruned model; beside it the stricter comparison with the
  unpruned model fine-tuned alike (this project's control).
- Table 2: keeping or pruning the layers Voita et al. call important makes
  no difference at any level ("the performance of both configurations is
  very similar"): the two configurations of each level within max(1, twice
  the draws' largest std).
- Table 3: no consistent preference between per-type budgets ("each of the
  3 configurations has the highest BLEU score in at least one case"; the
  paper's own table has the fewest-in-DS configuration best at 3 of its 4
  levels and fewest-in-ES at none). Judged within the table: a consistent
  preference is one configuration best at every level by more than
  max(1, twice the largest std).
- Table 4 (BERT): half of the heads pruned at random cost under 1% accuracy.
- Table 5 (BERT): pruning the middle layers hurts more than as many top and
  bottom layers (14 of 16 cases); top against bottom shows no preference
  (2 of 4 cases each way).
- Table 6 (BERT): pruning alternate (odd) layers is better than the top or the
  bottom half (consecutive layers).
- Figure 2 (BERT, "for all experiments in Table 5 and 6"): the layers' mean
  change of the unpruned heads' W_q, W_k, W_v differs by less than 10%;
  judged on every configuration that prunes whole layers (Tables 5 and 6's).

The BERT claims are judged on encoder-only models only; on a translation
model the same measurements are shown as extensions, not judged.

**Strength.** A claim rests on fine-tuning long enough and, where heads are
drawn at random, on the paper's three draws. A verdict is ``inconclusive``
when the fine-tune is shorter than half of the model's own training (the
paper's fine-tunes are as long as a training run), when a random
configuration has fewer draws than 3, or, for a ``no`` against a tolerance,
when the recovery curve is still closing: the gap narrowed by more than the
tolerance over the second half of the fine-tune. A study without
fine-tuning gets its numbers shown, not judged.
"""

import re
import statistics
from typing import Callable, Dict, List, Optional, Sequence

from fairseq_headprune.study.budhraja.budgets import ONE_HEAD_PER_LAYER
from fairseq_headprune.study.budhraja.records import FinetuneRecord
from fairseq_headprune.study.output.finding import INCONCLUSIVE, Finding, verdict_of
from fairseq_headprune.study.pruning.curves import mean_and_std

Load = Callable[[str], Optional[object]]
RESULTS = ("pruning/finetune/results.json",)
NOT_JUDGED = "not judged: the paper fine-tunes every configuration (prune --finetune-updates N)"
PAPER_EPOCHS = {False: 30, True: 10}  # the paper's fine-tuning (Transformer, BERT)
PAPER_DRAWS = 3
LENGTH_SHARE = 0.5  # a fine-tune shorter than this share of the model's own training cannot judge
TOLERANCE = 1.0  # points of the metric: "loses little", "very similar"
ONE_HEAD_TOLERANCE = 2.0  # one head per layer: the paper loses up to 1.62 BLEU
PAPER_SPREAD = 0.10  # Figure 2: "differs by less than 10%"


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def _spread(members: Sequence[FinetuneRecord]) -> float:
    return mean_and_std([r.score_after for r in members])[1]


class Evidence:
    """How long the configurations were fine-tuned against the model's own training and the paper's, and the draws."""

    def __init__(self, records: Sequence[FinetuneRecord], bert: bool):
        sample = next((r for r in records if r.updates), records[0])
        self.updates, self.finetune = sample.updates, sample.finetune
        self.trained_updates, self.trained_epochs = sample.trained_updates, sample.trained_epochs
        self.bert = bert

    @property
    def epochs(self) -> Optional[float]:
        if self.updates and self.trained_updates and self.trained_epochs:
            return self.updates * self.trained_epochs / self.trained_updates
        match = re.fullmatch(r"(\d+) epochs", self.finetune or "")
        return float(match.group(1)) if match else None

    def describe(self, draws: Optional[int] = None) -> str:
        """``fine-tuned 500 updates = 10.2 epochs (the model trained 490 updates, 10 epochs; the paper 30 epochs);
        3 draws (the paper: 3)``."""
        epochs = self.epochs
        text = f"fine-tuned {self.finetune}" + (f" = {epochs:.1f} epochs" if epochs and "epochs" not in self.finetune
                                                 else "")
        trained = (f"the model trained {self.trained_updates} updates"
                   + (f", {self.trained_epochs} epochs" if self.trained_epochs else "") + "; "
                   if self.trained_updates else "")
        text += f" ({trained}the paper: {PAPER_EPOCHS[self.bert]} epochs)"
        if draws is not None:
            text += f"; {draws} draw{'s' if draws != 1 else ''} (the paper: {PAPER_DRAWS})"
        return text

    def shortfall(self, draws: Optional[int] = None) -> Optional[str]:
        """Why the evidence cannot carry a verdict (None: it can)."""
        if self.updates and self.trained_updates and self.updates < LENGTH_SHARE * self.trained_updates:
            return (f"fine-tuned {self.updates} updates, under half of the model's own {self.trained_updates}")
        if not (self.updates and self.trained_updates) and self.epochs is None:
            return "the fine-tune's length against the model's own training is unknown"
        if draws is not None and draws < PAPER_DRAWS:
            return f"{draws} draw{'s' if draws != 1 else ''}, the paper averages {PAPER_DRAWS}"
        return None


def _still_closing(members: Sequence[FinetuneRecord], baseline_at: Callable[[int], Optional[float]]) -> bool:
    """Whether the mean gap to a baseline narrowed by more than the tolerance over the second half of the fine-tune."""
    curves = [m.curve for m in members if len(m.curve) > 2]
    if not curves:
        return False
    points = curves[0]
    end = points[-1].updates
    middle = min(range(len(points)), key=lambda i: abs(points[i].updates - end / 2))

    def gap(index):
        values = [c[index].score - baseline_at(index) for c in curves if baseline_at(index) is not None]
        return _mean(values) if values else None

    late, half = gap(len(points) - 1), gap(middle)
    return late is not None and half is not None and late - half > TOLERANCE


def _judge(holds: bool, evidence: Evidence, draws: Optional[int], closing: bool = False) -> Optional[str]:
    """The verdict with its strength: inconclusive where the evidence falls short (``Evidence.shortfall``), or where a
    ``no`` comes from a gap still closing at the end of the fine-tune."""
    if evidence.shortfall(draws) or (not holds and closing):
        return INCONCLUSIVE
    return verdict_of(holds)


def _strength_note(evidence: Evidence, draws: Optional[int], closing: bool, holds: bool) -> str:
    reason = evidence.shortfall(draws)
    if reason:
        return f"; inconclusive: {reason}"
    if closing and not holds:
        return "; inconclusive: the gap was still closing over the second half of the fine-tune"
    return ""


def _groups(records: Sequence[FinetuneRecord], keep: Callable[[FinetuneRecord], bool]) -> Dict[str, List]:
    groups: Dict[str, List[FinetuneRecord]] = {}
    for record in records:
        if not record.is_control and keep(record):
            groups.setdefault(record.group, []).append(record)
    return groups


def random_level_findings(records: List[FinetuneRecord], bert: bool, label: str) -> List[Finding]:
    """Table 1 (60%, and one head per layer) or Table 4 (50%): against the unpruned model, and the control."""
    level = 50 if bert else 60
    groups = _groups(records, lambda r: r.kind == "level" and r.arm != ONE_HEAD_PER_LAYER)
    control = next((r for r in records if r.is_control), None)
    evidence = Evidence(records, bert)
    findings = []
    if groups:
        members = min(groups.values(), key=lambda m: abs(m[0].percent - level))
        findings += _level_rows(members, control, evidence, bert, label, level)
    if not bert:
        most = _groups(records, lambda r: r.arm == ONE_HEAD_PER_LAYER)
        for members in most.values():
            findings += _level_rows(members, control, evidence, bert, label, None)[:1]
    return findings


def _level_rows(members, control, evidence: Evidence, bert: bool, label: str, level: Optional[int]) -> List[Finding]:
    table = 4 if bert else 1
    one_head = level is None
    tolerance = ONE_HEAD_TOLERANCE if one_head else TOLERANCE
    draws = len(members)
    what = ("one head kept per layer of each type" if one_head
            else f"{'half of' if bert else '60% of'} the heads pruned at random")
    paper = ("87%: −1.62 / −1.03 BLEU against the unpruned model" if one_head
             else "50%: average accuracy drop under 1%" if bert
             else "60%: at most −0.15 BLEU against the unpruned model")
    rows = []
    for against, name in (("unpruned", "the unpruned model (the paper's baseline)"),
                          ("control", "the unpruned model fine-tuned alike (this project's stricter control)")):
        tests = [m.tests.get(against) for m in members]
        if any(test is None for test in tests) or (against == "control" and control is None):
            continue
        gap = _mean([t.delta for t in tests])
        holds = gap >= -tolerance
        unpruned = members[0].score_after - members[0].tests["unpruned"].delta if "unpruned" in members[0].tests \
            else control.score_before
        if against == "unpruned":
            def baseline_at(index, value=unpruned):
                return value
        else:
            def baseline_at(index, curve=control.curve):
                return curve[index].score if index < len(curve) else None
        closing = _still_closing(members, baseline_at)
        significant = sum(t.significant for t in tests)
        before = _mean([m.score_before for m in members]) - unpruned
        rows.append(Finding(
            f"{what}, fine-tuned, lose little against {name} (Budhraja et al. Table {table})",
            paper,
            f"{members[0].percent:.0f}% pruned at random, fine-tuned: {gap:+.2f} {label}"
            + (f" (mean of {draws} draws, std {_spread(members):.2f})" if draws > 1 else "")
            + f", {significant} of {draws} significantly different; without fine-tuning {before:+.2f}",
            f"the mean over draws within {tolerance:g} {label} of {name.split(' (')[0]}"
            + _strength_note(evidence, draws, closing, holds),
            _judge(holds, evidence, draws, closing),
            evidence.describe(draws),
        ))
    return rows


def table2_finding(records: List[FinetuneRecord], label: str) -> Optional[Finding]:
    """Table 2: at each level, the important layers kept against pruned."""
    by_level: Dict[float, Dict[str, List[FinetuneRecord]]] = {}
    for record in records:
        if 2 in record.tables and record.paper_level is not None:
            by_level.setdefault(record.paper_level, {}).setdefault(record.arm, []).append(record)
    pairs = {level: arms for level, arms in by_level.items() if len(arms) == 2}
    if not pairs:
        return None
    evidence = Evidence(records, False)
    gaps, draws, allowed = [], None, True
    for level, arms in sorted(pairs.items()):
        kept, pruned = arms["important layers kept"], arms["important layers pruned"]
        gap = _mean([r.score_after for r in kept]) - _mean([r.score_after for r in pruned])
        room = max(TOLERANCE, 2 * max(_spread(kept), _spread(pruned)))
        allowed &= abs(gap) <= room
        gaps.append(f"{level:g}% {gap:+.2f}")
        draws = min(len(kept), len(pruned)) if draws is None else min(draws, len(kept), len(pruned))
    return Finding(
        "keeping or pruning the layers called important makes no difference after fine-tuning (Budhraja et al. "
        "Table 2)",
        "both configurations very similar at each of 5 levels (within 0.43 BLEU)",
        f"important layers kept minus pruned: {', '.join(gaps)} {label}",
        f"at every level the two within max(1 {label}, twice the larger std over draws)"
        + _strength_note(evidence, draws, False, allowed),
        _judge(allowed, evidence, draws),
        evidence.describe(draws),
    )


def table3_finding(records: List[FinetuneRecord], label: str) -> Optional[Finding]:
    """Table 3: per-type budgets, no configuration consistently best across the levels."""
    by_level: Dict[float, Dict[str, List[FinetuneRecord]]] = {}
    for record in records:
        if 3 in record.tables and record.paper_level is not None:
            by_level.setdefault(record.paper_level, {}).setdefault(record.arm, []).append(record)
    levels = {level: arms for level, arms in by_level.items() if len(arms) > 1}
    if not levels:
        return None
    evidence = Evidence(records, False)
    best, draws, clear = [], None, []
    for level, arms in sorted(levels.items()):
        means = {arm: _mean([r.score_after for r in members]) for arm, members in arms.items()}
        ranked = sorted(means, key=means.get, reverse=True)
        room = max(TOLERANCE, 2 * max(_spread(members) for members in arms.values()))
        best.append((level, ranked[0].replace("fewest in ", "")))
        clear.append(means[ranked[0]] - means[ranked[1]] > room)
        smallest = min(len(members) for members in arms.values())
        draws = smallest if draws is None else min(draws, smallest)
    consistent = len({arm for _, arm in best}) == 1 and all(clear)
    return Finding(
        "no consistent preference between per-type budgets after fine-tuning (Budhraja et al. Table 3)",
        "\"each of the 3 configurations has the highest BLEU score in at least one case\"; its own table: "
        "fewest in DS best at 3 of 4 levels, fewest in ES at none",
        "best at each level (fewest heads in): " + ", ".join(f"{level:g}% {arm}" for level, arm in best),
        f"no configuration best at every level by more than max(1 {label}, twice the largest std over draws)"
        + _strength_note(evidence, draws, False, not consistent),
        _judge(not consistent, evidence, draws),
        evidence.describe(draws),
    )


def _strategy_pairs(scores: Dict[str, FinetuneRecord], first: str, second: str):
    pairs = []
    for name, record in scores.items():
        match = re.fullmatch(rf"{re.escape(first)}:(\d+)", name)
        if match and f"{second}:{match.group(1)}" in scores:
            pairs.append((int(match.group(1)), record, scores[f"{second}:{match.group(1)}"]))
    return sorted(pairs, key=lambda pair: pair[0])


def table5_findings(records: List[FinetuneRecord], label: str) -> List[Finding]:
    """Table 5 (BERT): middle against top+bottom, and top against bottom, at the same K."""
    scores = {r.label: r for r in records if r.kind == "layers"}
    evidence = Evidence(records, True)
    findings = []
    pairs = _strategy_pairs(scores, "middle", "top+bottom")
    if pairs:
        worse = sum(middle.score_after < ends.score_after for _, middle, ends in pairs)
        holds = worse > len(pairs) / 2
        findings.append(Finding(
            "pruning the middle layers hurts more than as many top and bottom layers (Budhraja et al. Table 5)",
            "middle worse in 14 of 16 cases (BERT, 4 tasks)",
            f"middle worse in {worse} of {len(pairs)} pairs ("
            + ", ".join(f"K={k}: {m.score_after:.2f} vs {e.score_after:.2f}" for k, m, e in pairs) + f" {label})",
            "middle worse in more than half of the pairs" + _strength_note(evidence, None, False, holds),
            _judge(holds, evidence, None),
            evidence.describe(),
        ))
    pairs = _strategy_pairs(scores, "top", "bottom")
    if pairs:
        better = [t.score_after - b.score_after for _, t, b in pairs]
        one_way = all(g > TOLERANCE for g in better) or all(g < -TOLERANCE for g in better)
        findings.append(Finding(
            "no preference between pruning top and bottom layers (Budhraja et al. Table 5)",
            "2 of 4 cases favour each (BERT, 4 tasks)",
            "top minus bottom pruned: " + ", ".join(f"K={k}: {g:+.2f}" for (k, _, _), g in zip(pairs, better))
            + f" {label}",
            f"not every K favouring the same side by more than {TOLERANCE:g} {label}"
            + _strength_note(evidence, None, False, not one_way),
            _judge(not one_way, evidence, None),
            evidence.describe(),
        ))
    return findings


def table6_finding(records: List[FinetuneRecord], label: str) -> Optional[Finding]:
    """Table 6 (BERT): alternate (odd) layers pruned against the top and the bottom half."""
    scores = {r.label: r for r in records if r.kind == "layers"}
    odd = scores.get("odd")
    halves = [r for r in records if r.kind == "layers" and 6 in r.tables and r.label.split(":")[0] in ("top", "bottom")]
    if odd is None or len(halves) < 2:
        return None
    evidence = Evidence(records, True)
    holds = all(odd.score_after > half.score_after for half in halves)
    return Finding(
        "pruning alternate layers is better than pruning consecutive ones (Budhraja et al. Table 6)",
        "odd layers pruned better than the top and the bottom half (BERT)",
        f"odd {odd.score_after:.2f}; " + ", ".join(f"{h.label} {h.score_after:.2f}" for h in halves) + f" {label}",
        "odd better than both halves" + _strength_note(evidence, None, False, holds),
        _judge(holds, evidence, None),
        evidence.describe(),
    )


def compensation_findings(records: List[FinetuneRecord], bert: bool) -> List[Finding]:
    """Figure 2: judged on BERT's Table 5 and 6 configurations; on a translation model shown per attention type."""
    evidence = Evidence(records, bert)
    if bert:
        spreads = [(r.label, r.layer_spread) for r in records  # whole layers pruned: Tables 5 and 6's kind
                   if r.layer_spread is not None and r.kind == "layers"]
        if not spreads:
            return []
        largest = max(spreads, key=lambda item: item[1])
        holds = largest[1] < PAPER_SPREAD
        return [Finding(
            "the unpruned heads of all layers compensate alike during fine-tuning (Budhraja et al. Figure 2)",
            "for all experiments in Tables 5 and 6 the average change of any two layers differs by less than 10%",
            f"largest relative difference between two layers' mean absolute change: {largest[1]:.0%} (`{largest[0]}`);"
            f" median {statistics.median(s for _, s in spreads):.0%} over {len(spreads)} Table 5 and 6 configurations",
            "below 10% in every Table 5 and 6 configuration" + _strength_note(evidence, None, False, holds),
            _judge(holds, evidence, None),
            evidence.describe(),
        )]
    by_type: Dict[str, List[float]] = {}
    for record in records:
        if not record.is_control:
            for attention_type, spread in record.layer_spreads.items():
                if spread is not None:
                    by_type.setdefault(attention_type, []).append(spread)
    if not by_type:
        return []
    return [Finding(
        "the layers of each attention type compensate alike during fine-tuning (extension: the paper's Figure 2 is "
        "BERT's)",
        "BERT: under 10% between any two layers (Tables 5 and 6)",
        "median relative difference between two layers' mean absolute change: "
        + ", ".join(f"{t} {statistics.median(v):.0%}" for t, v in by_type.items())
        + f" (over {max(len(v) for v in by_type.values())} configurations)",
        "not judged: the paper states it for BERT",
        None,
        evidence.describe(),
    )]


def importance_extension(records: List[FinetuneRecord], label: str) -> List[Finding]:
    """This project's comparison (the paper makes none): importance-ordered masks against random draws of the same
    level, fine-tuned alike."""
    ordered = {round(r.percent): r for r in records if r.kind == "curve step" and " importance " in f" {r.label} "}
    random = _groups(records, lambda r: r.kind == "level")
    findings = []
    for members in sorted(random.values(), key=lambda m: m[0].percent):
        match = ordered.get(round(members[0].percent))
        if match is None:
            continue
        mean = _mean([r.score_after for r in members])
        findings.append(Finding(
            f"{members[0].percent:.0f}% pruned by importance against at random, fine-tuned alike (extension: this "
            "project's comparison; the paper makes none)",
            "—",
            f"importance {match.score_after:.2f}, random {mean:.2f} ± {_spread(members):.2f} ({len(members)} draws) "
            f"{label}; before fine-tuning {match.score_before:.2f} and "
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


def budhraja_findings(load: Load, bert: bool, label: str) -> List[Finding]:
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

