"""A finding of the papers: the study's estimate with its 95% interval beside the paper's own figure, the margin
that would contradict the paper, and the verdict that follows from the three.

The verdict is an equivalence test (Schuirmann 1987's two one-sided tests,
read off the 95% interval). A claim states the paper's figure, the side of
it the paper's sentence puts the truth on, an allowance for the paper's own
reported spread, and a margin: how far beyond the figure (on the claim's
wrong side) a value contradicts the sentence. The verdict is

- **differs** where the interval lies wholly beyond the figure (less its
  allowance) on the wrong side;
- **consistent** where it does not, and it also excludes the contradiction:
  every value the interval holds agrees with the paper within the margin;
- **inconclusive** otherwise (the interval holds both the paper's figure and
  a contradiction: the run cannot tell), or where the evidence falls short
  (the rule says why), or without an interval. ``Judgement.missing`` says how
  much narrower the interval would have to be to decide, and roughly how many
  times the units that set its width (sentences, draws, heads) would do it.

A margin of 0 is a strict claim ("better", "positive"): the interval must
lie wholly on the claim's side.
"""

from dataclasses import dataclass
from typing import List, Optional, Sequence

from fairseq_headprune.study.output.serialisation import PlainRecord
from fairseq_headprune.study.statistics.intervals import Estimate

CONSISTENT, DIFFERS, INCONCLUSIVE = "consistent", "differs", "inconclusive"
VERDICTS = (CONSISTENT, DIFFERS, INCONCLUSIVE)
AT_LEAST, AT_MOST, WITHIN = "at least", "at most", "within"


@dataclass(frozen=True)
class Judgement:
    """A verdict (None: no interval to decide by) and, for an inconclusive one, what is missing."""

    verdict: Optional[str]
    missing: str = ""


@dataclass(frozen=True)
class Claim:
    """The paper's figure and the side of it its sentence lies on (the study's value ``at least`` or ``at most`` the
    figure, or ``within`` [figure, upper]), the paper's own spread around it (``allowance``) and the distance beyond
    figure and allowance at which a value contradicts the sentence (``margin``; 0: a strict claim)."""

    figure: float
    side: str = AT_LEAST
    upper: Optional[float] = None
    margin: float = 0.0
    allowance: float = 0.0

    def __post_init__(self):
        if self.margin < 0 or self.allowance < 0:
            raise ValueError(f"a claim's margin and allowance are not negative, got {self.margin}, {self.allowance}")

    @property
    def bounds(self):
        """(lowest, highest) value the paper's figure allows, its spread included (None: unbounded that way)."""
        if self.side == AT_LEAST:
            return self.figure - self.allowance, None
        if self.side == AT_MOST:
            return None, self.figure + self.allowance
        return self.figure - self.allowance, self.upper + self.allowance

    @property
    def contradictions(self):
        """(below, above): a value at or beyond either contradicts the claim (None: none that way)."""
        low, high = self.bounds
        return (None if low is None else low - self.margin), (None if high is None else high + self.margin)

    def judge(self, estimate: Estimate, units: str = "") -> Judgement:
        """The verdict of ``estimate`` against the claim; ``units``: what sets the interval's width ("test
        sentences"), named in what an inconclusive verdict misses."""
        if not estimate.has_interval:
            return Judgement(None, "no 95% interval to decide by")
        low, high = self.bounds
        if (low is not None and estimate.high < low) or (high is not None and estimate.low > high):
            return Judgement(DIFFERS)
        below, above = self.contradictions
        reaches_below = below is not None and estimate.low <= below
        reaches_above = above is not None and estimate.high >= above
        if not (reaches_below or reaches_above):
            return Judgement(CONSISTENT)
        return Judgement(INCONCLUSIVE, self._missing(estimate, reaches_below, units))

    def _missing(self, estimate: Estimate, below_side: bool, units: str) -> str:
        """How much narrower the interval must be to decide either way, on the side that reaches the contradiction
        (a width falling as 1/sqrt(n): the square of that factor in units)."""
        low, high = self.bounds
        below, above = self.contradictions
        value = estimate.value
        if below_side:
            half, to_consistent = value - estimate.low, value - below
            to_differ = (low - value) if low is not None else 0.0
            beyond = f"the contradiction {below:+.3g}"
        else:
            half, to_consistent = estimate.high - value, above - value
            to_differ = (value - high) if high is not None else 0.0
            beyond = f"the contradiction {above:+.3g}"
        needed = max(to_consistent, to_differ)
        text = f"the interval holds the paper's side and {beyond}"
        if needed <= 0 or half <= 0:
            return text + "; the estimate sits on the line, no length tells"
        factor = half / needed
        return text + (f"; it must be {factor:.1f}x narrower to tell, about {factor ** 2:.0f}x the "
                       f"{units or 'data'}")

    def text(self, unit: str = "", digits: int = 2) -> str:
        """``at least -0.15 BLEU``, ``within ±0.40 BLEU``."""
        suffix = f" {unit}" if unit else ""
        if self.side == WITHIN:
            if self.upper == -self.figure:
                return f"within ±{self.upper:.{digits}f}{suffix}"
            return f"within [{self.figure:+.{digits}f}, {self.upper:+.{digits}f}]{suffix}"
        return f"{self.side} {self.figure:+.{digits}f}{suffix}"

    def margin_text(self, unit: str = "", digits: int = 2, percent: bool = False) -> str:
        """The contradiction, for the finding's margin column: ``below -1.37 BLEU (the paper's spread ±0.22
        allowed)``; ``percent``: shares shown as percentages."""

        def number(value: float) -> str:
            return f"{value:.0%}" if percent else f"{value:+.{digits}f}"

        suffix = f" {unit}" if unit else ""
        below, above = self.contradictions
        parts = ([f"at or below {number(below)}"] if below is not None else []) + (
            [f"at or above {number(above)}"] if above is not None else [])
        text = " or ".join(parts) + suffix
        if self.margin == 0:
            text += " (a strict claim: the interval must exclude the figure)"
        if self.allowance:
            text += f" (the paper's own spread, ±{self.allowance:.{digits}f}, allowed)"
        return text


def every(judgements: Sequence[Judgement]) -> Judgement:
    """A claim about every case: DIFFERS where one case differs, CONSISTENT where all are, else INCONCLUSIVE (None
    where a case has no interval and none differs), saying which case falls short."""
    verdicts = [j.verdict for j in judgements]
    if DIFFERS in verdicts:
        return Judgement(DIFFERS)
    if verdicts and all(v == CONSISTENT for v in verdicts):
        return Judgement(CONSISTENT)
    if None in verdicts:
        return Judgement(None, next(j.missing for j in judgements if j.verdict is None))
    short = [j for j in judgements if j.verdict == INCONCLUSIVE]
    return Judgement(INCONCLUSIVE, f"{len(short)} of {len(judgements)} cases cannot tell (first: {short[0].missing})"
                     if short else "no case")


def most(judgements: Sequence[Judgement]) -> Judgement:
    """A claim about most cases: CONSISTENT where more than half are, DIFFERS where half or more differ (most cannot
    then hold), else INCONCLUSIVE."""
    verdicts = [j.verdict for j in judgements]
    consistent, differs = verdicts.count(CONSISTENT), verdicts.count(DIFFERS)
    if verdicts and consistent > len(verdicts) / 2:
        return Judgement(CONSISTENT)
    if verdicts and differs >= len(verdicts) / 2:
        return Judgement(DIFFERS)
    if not verdicts or all(v is None for v in verdicts):
        return Judgement(None, "no 95% interval to decide by")
    return Judgement(INCONCLUSIVE, f"{consistent} of {len(verdicts)} cases consistent, {differs} differ, "
                     f"{len(verdicts) - consistent - differs} cannot tell: no majority either way")


def verdict_with(judgement: Judgement, shortfall: Optional[str]) -> str:
    """The verdict: INCONCLUSIVE where the evidence falls short (``shortfall`` says why) or no interval decides."""
    return INCONCLUSIVE if shortfall or judgement.verdict is None else judgement.verdict


def rule_with(rule: str, judgement: Judgement, shortfall: Optional[str]) -> str:
    """The rule, and why the verdict is inconclusive where it is."""
    if shortfall:
        return f"{rule}; inconclusive: {shortfall}"
    if judgement.verdict in (None, INCONCLUSIVE):
        return f"{rule}; inconclusive: {judgement.missing}"
    return rule


@dataclass
class Finding(PlainRecord):
    """One row of "What reproduces": the claim, the paper's figure, the study's estimate and 95% interval, the
    margin that would contradict the paper, the protocol and the strength of the evidence, the rule and the verdict
    (None: not judged, e.g. measured under another protocol, or the project's own comparison)."""

    finding: str
    paper: str
    study: str
    rule: str
    verdict: Optional[str]  # CONSISTENT, DIFFERS, INCONCLUSIVE or None
    evidence: str = ""  # the protocol and what the verdict rests on: fine-tuning length against the paper's, draws
    margin: str = ""  # the values that would contradict the paper ("at or below -1.37 BLEU"); "" where not judged

    def __post_init__(self):
        if self.verdict is not None and self.verdict not in VERDICTS:
            raise ValueError(f"a finding's verdict is one of {', '.join(VERDICTS)} or None, got {self.verdict!r}")

    @property
    def judged(self) -> bool:
        return self.verdict is not None

    def shown(self) -> str:
        """The verdict cell: consistent with the paper, **differs**, inconclusive, not judged."""
        return {CONSISTENT: "consistent with the paper", DIFFERS: "**differs**", INCONCLUSIVE: "inconclusive",
                None: "not judged"}[self.verdict]


def judged_row(finding: str, paper: str, study: str, rule: str, judgement: Judgement, shortfall: Optional[str],
               evidence: str, margin: str = "") -> Finding:
    """A judged finding: the verdict follows from ``judgement`` (the interval against the paper's figure and the
    margin) unless the evidence falls short."""
    return Finding(finding, paper, study, rule_with(rule, judgement, shortfall), verdict_with(judgement, shortfall),
                   evidence, margin)


def markdown_findings(rows: List[Finding]) -> str:
    """The findings table of a report: one row per finding, its margin and verdict beside the paper's figure."""
    lines = [
        "| finding of the papers | the paper's figure | this study: estimate [95% interval] | what would contradict "
        "the paper (margin) | protocol and strength of the evidence | verdict rule | verdict |\n",
        "|---|---|---|---|---|---|---|\n",
    ]
    for row in rows:
        lines.append(f"| {row.finding} | {row.paper} | {row.study} | {row.margin or '—'} | {row.evidence} | "
                     f"{row.rule} | {row.shown()} |\n")
    return "".join(lines)
