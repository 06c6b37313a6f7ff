"""What a Budhraja et al. verdict rests on: the fine-tune's length against the model's own training and the paper's,
the draws, the test, and the 95% intervals of the differences the findings compare with the paper's figures.

A configuration's difference from a baseline has the paired bootstrap's
interval within its draw (``TestAgainst.low``/``high``); a random level's
mean over draws has Student's t interval over the draws, and the decision
interval combines the two in quadrature (``study.statistics.intervals``). Two
configurations (Table 2's kept and pruned, Table 5's middle and top+bottom)
were each tested against the same baseline, not against each other: their
difference gets the sum of the two sides' bootstrap half-widths, the
interval of the difference whatever the two sides' correlation. Where the
two were also tested against each other (one fine-tune a side, the pairs of
``pairs.within_pairs``), that direct paired test's interval is the one.
"""

import re
from typing import Callable, Dict, List, Optional, Sequence

from fairseq_headprune.study.budhraja.records import FinetuneRecord
from fairseq_headprune.study.output.finding import DIFFERS, Claim, Judgement
from fairseq_headprune.study.statistics.intervals import Estimate, combined, t_interval, welch_interval
from fairseq_headprune.study.statistics.significance import p_value_cell

PAPER_EPOCHS = {False: 30, True: 10}  # the paper's fine-tuning (Transformer, BERT)
PAPER_DRAWS = 3
LENGTH_SHARE = 0.5  # a fine-tune shorter than this share of the model's own training cannot judge
TEST_NAMES = {"bootstrap": "paired bootstrap", "compare-mt": "compare-mt's paired bootstrap"}


class Evidence:
    """How long the configurations were fine-tuned against the model's own training and the paper's, the draws, and
    the test."""

    def __init__(self, records: Sequence[FinetuneRecord], bert: bool):
        sample = next((r for r in records if r.updates), records[0])
        self.updates, self.finetune = sample.updates, sample.finetune
        self.trained_updates, self.trained_epochs = sample.trained_updates, sample.trained_epochs
        self.sample = next((r for r in records if r.significance), sample)
        self.significance = self.sample.significance
        self.bert = bert

    @property
    def epochs(self) -> Optional[float]:
        if self.updates and self.trained_updates and self.trained_epochs:
            return self.updates * self.trained_epochs / self.trained_updates
        match = re.fullmatch(r"(\d+) epochs", self.finetune or "")
        return float(match.group(1)) if match else None

    @property
    def resamples(self) -> Optional[int]:
        """What a p-value of 0 is bounded by (None: unknown, or a test that does not resample)."""
        return self.sample.resamples

    def p_value(self, p_value: float) -> str:
        return p_value_cell(p_value, self.resamples)

    def describe(self, draws: Optional[int] = None) -> str:
        """The strength line: ``fine-tuned 500 updates = 10.2 epochs, 0.34 of the paper's 30 (the model trained 490
        updates, 10 epochs); 3 draws (the paper: 3); paired bootstrap, 1000 resamples``."""
        epochs, paper = self.epochs, PAPER_EPOCHS[self.bert]
        text = f"fine-tuned {self.finetune}"
        if epochs and "epochs" not in self.finetune:
            text += f" = {epochs:.1f} epochs"
        text += f", {epochs / paper:.2f} of the paper's {paper}" if epochs else f" (the paper: {paper} epochs)"
        if self.trained_updates:
            text += (f" (the model trained {self.trained_updates} updates"
                     + (f", {self.trained_epochs} epochs" if self.trained_epochs else "") + ")")
        if draws is not None:
            text += f"; {draws} draw{'s' if draws != 1 else ''} (the paper: {PAPER_DRAWS})"
        test = self.significance.get("test")
        if test:
            text += f"; {TEST_NAMES.get(test, test)}" + (f", {self.resamples} resamples" if self.resamples else "")
        return text

    def shortfall(self, draws: Optional[int] = None) -> Optional[str]:
        """Why the evidence cannot carry a verdict (None: it can)."""
        if self.updates and self.trained_updates and self.updates < LENGTH_SHARE * self.trained_updates:
            return f"fine-tuned {self.updates} updates, under half of the model's own {self.trained_updates}"
        if not (self.updates and self.trained_updates) and self.epochs is None:
            return "the fine-tune's length against the model's own training is unknown"
        if draws is not None and draws < PAPER_DRAWS:
            return f"{draws} draw{'s' if draws != 1 else ''}, the paper averages {PAPER_DRAWS}"
        return None


def draws_seeds(members: Sequence[FinetuneRecord]) -> str:
    """Whether a level's draws were fine-tuned under seeds of their own (``prune``: the seed + draw - 1), so that
    the interval over draws holds what the batches' order moves, or on the same batches, where it does not (a record
    without a seed was fine-tuned under the checkpoint's own)."""
    seeds = [member.seed for member in members]
    if len(set(seeds)) == len(seeds):
        return ("each draw fine-tuned under a seed of its own ("
                + ", ".join("the checkpoint's" if seed is None else str(seed) for seed in seeds) + ")")
    return ("the draws fine-tuned on the same batches (one seed): the interval over draws leaves out what the order "
            "moves")


def _bootstrap(members: Sequence[FinetuneRecord], against: str) -> Optional[Estimate]:
    """The draws' mean paired-bootstrap interval (None where a draw has none): the test set's noise they share."""
    tests = [m.tests.get(against) for m in members]
    if any(t is None or t.low is None for t in tests):
        return None
    mean = sum(t.delta for t in tests) / len(tests)
    return Estimate(mean, sum(t.low for t in tests) / len(tests), sum(t.high for t in tests) / len(tests))


def group_delta(members: Sequence[FinetuneRecord], against: str) -> Optional[Estimate]:
    """The mean difference of a level's draws from ``against``, the t interval over draws and the draws'
    paired-bootstrap interval combined in quadrature (None where a draw was not tested against it)."""
    if any(against not in m.tests for m in members):
        return None
    over_draws = t_interval([m.tests[against].delta for m in members])
    within = _bootstrap(members, against)
    parts = ([over_draws.method] if over_draws.has_interval else []) + (["paired bootstrap within each draw"]
                                                                         if within else [])
    return combined(over_draws.value, over_draws, within, method=" and ".join(parts) or "no interval")


def pair_difference(first: Sequence[FinetuneRecord], second: Sequence[FinetuneRecord],
                    against: str = "unpruned") -> Estimate:
    """mean(first) - mean(second) after fine-tuning: the t interval over draws and the two sides' bootstrap
    half-widths added, combined in quadrature (each side was tested against ``against``, not against the other)."""
    difference = (sum(r.score_after for r in first) / len(first)) - (sum(r.score_after for r in second) / len(second))
    over_draws = welch_interval([r.score_after for r in first], [r.score_after for r in second])
    one, other = _bootstrap(first, against), _bootstrap(second, against)
    within = None
    if one is not None and other is not None:
        within = Estimate(difference, difference - (one.value - one.low) - (other.high - other.value),
                          difference + (one.high - one.value) + (other.value - other.low))
    parts = ([over_draws.method] if over_draws.has_interval else []) + (["both sides' bootstrap half-widths added"]
                                                                         if within else [])
    return combined(difference, over_draws, within, method=" and ".join(parts) or "no interval")


DIRECT = "the paired test of the two against each other"


def direct_difference(first: FinetuneRecord, second: FinetuneRecord) -> Optional[Estimate]:
    """first - second after fine-tuning by the paired test of the two against each other on the same examples
    (``first.paired``, written by ``prune`` for the pairs of ``pairs.within_pairs``); None where it did not run."""
    test = first.paired.get(second.label)
    if test is None or test.low is None:
        return None
    return Estimate(test.delta, test.low, test.high, DIRECT)


def pair_estimate(first: FinetuneRecord, second: FinetuneRecord) -> Estimate:
    """One fine-tune a side: the direct paired test where it ran, else the two tests' half-widths added."""
    return direct_difference(first, second) or pair_difference([first], [second])


def _mean_curve(members: Sequence[FinetuneRecord]) -> Dict[int, float]:
    """The draws' mean score at each point of the recovery curve they all have."""
    shared = set.intersection(*[{p.updates for p in m.curve} for m in members]) if members else set()
    return {u: sum(next(p.score for p in m.curve if p.updates == u) for m in members) / len(members)
            for u in shared}


def second_half_change(members: Sequence[FinetuneRecord],
                       others: Optional[Sequence[FinetuneRecord]] = None) -> Optional[float]:
    """How much the mean score (minus ``others``' at the same points) rose over the second half of the fine-tune
    (None: no curve of three points or more)."""
    curve = _mean_curve(members)
    if others is not None:
        other = _mean_curve(others)
        curve = {u: s - other[u] for u, s in curve.items() if u in other}
    if len(curve) < 3:
        return None
    points = sorted(curve)
    end = points[-1]
    middle = min(points, key=lambda u: abs(u - end / 2))
    return curve[end] - curve[middle]


def still_closing(claim: Claim, estimate: Estimate, judgement: Judgement, change: Optional[float]) -> Optional[str]:
    """Why a DIFFERS is not yet one: the difference moved towards the paper's figure over the second half of the
    fine-tune by at least the distance its interval misses the figure (and its allowance) by (as long again could
    reach it)."""
    if judgement.verdict != DIFFERS or change is None or not estimate.has_interval:
        return None
    low, high = claim.bounds
    if high is not None and estimate.low > high:
        towards, missing = -change, estimate.low - high
    else:
        towards, missing = change, low - estimate.high
    if towards >= missing:
        return (f"still closing: the difference moved {towards:.2f} towards the paper's figure over the second half "
                f"of the fine-tune, the interval misses it by {missing:.2f}")
    return None


def groups(records: Sequence[FinetuneRecord], keep: Callable[[FinetuneRecord], bool]) -> Dict[str, List]:
    """The configurations that ``keep`` selects (the control left out), their draws together."""
    found: Dict[str, List[FinetuneRecord]] = {}
    for record in records:
        if not record.is_control and keep(record):
            found.setdefault(record.group, []).append(record)
    return found

