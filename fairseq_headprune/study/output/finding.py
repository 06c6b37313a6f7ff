"""A finding of the papers: the study's estimate with its 95% interval beside the paper's own figure, and the verdict
that follows from both.

The verdict: **consistent** with the paper where the interval contains the
paper's figure or lies on the side of it the paper claims, **differs** where
it lies wholly on the other side, **inconclusive** where the run is too
short or too narrow to tell (the rule says why) or gives no interval. No
tolerance is added to the paper's figure.
"""

from dataclasses import asdict, dataclass
from typing import Dict, Optional, Sequence

from fairseq_headprune.study.statistics.intervals import Estimate

CONSISTENT, DIFFERS, INCONCLUSIVE = "consistent", "differs", "inconclusive"
VERDICTS = (CONSISTENT, DIFFERS, INCONCLUSIVE)
AT_LEAST, AT_MOST, WITHIN = "at least", "at most", "within"


@dataclass(frozen=True)
class Claim:
    """The paper's figure and the side of it its claim lies on: the study's value ``at least`` or ``at most`` the
    figure, or ``within`` [figure, upper]."""

    figure: float
    side: str = AT_LEAST
    upper: Optional[float] = None

    def judge(self, estimate: Estimate) -> Optional[str]:
        """CONSISTENT where the interval reaches the paper's side of the figure, DIFFERS where it lies wholly on the
        other side; None without an interval."""
        if not estimate.has_interval:
            return None
        if self.side == AT_LEAST:
            holds = estimate.high >= self.figure
        elif self.side == AT_MOST:
            holds = estimate.low <= self.figure
        else:
            holds = estimate.low <= self.upper and estimate.high >= self.figure
        return CONSISTENT if holds else DIFFERS

    def text(self, unit: str = "", digits: int = 2) -> str:
        """``at least -0.15 BLEU``, ``within ±0.40 BLEU``."""
        suffix = f" {unit}" if unit else ""
        if self.side == WITHIN:
            if self.upper == -self.figure:
                return f"within ±{self.upper:.{digits}f}{suffix}"
            return f"within [{self.figure:+.{digits}f}, {self.upper:+.{digits}f}]{suffix}"
        return f"{self.side} {self.figure:+.{digits}f}{suffix}"


def every(verdicts: Sequence[Optional[str]]) -> Optional[str]:
    """A claim about every case: DIFFERS where one case differs, CONSISTENT where all are, None where a case has no
    interval and none differs."""
    if DIFFERS in verdicts:
        return DIFFERS
    return CONSISTENT if verdicts and all(v == CONSISTENT for v in verdicts) else None


def most(verdicts: Sequence[Optional[str]]) -> Optional[str]:
    """A claim about most cases: the verdict of the majority of the cases (None on a tie or without intervals)."""
    consistent, differs = verdicts.count(CONSISTENT), verdicts.count(DIFFERS)
    if consistent > len(verdicts) / 2:
        return CONSISTENT
    return DIFFERS if differs > len(verdicts) / 2 else None


def verdict_with(outcome: Optional[str], shortfall: Optional[str]) -> str:
    """The verdict: INCONCLUSIVE where the evidence falls short (``shortfall`` says why) or no interval decides."""
    return INCONCLUSIVE if shortfall or outcome is None else outcome


def rule_with(rule: str, outcome: Optional[str], shortfall: Optional[str]) -> str:
    """The rule, and why the verdict is inconclusive where it is."""
    if shortfall:
        return f"{rule}; inconclusive: {shortfall}"
    if outcome is None:
        return f"{rule}; inconclusive: no 95% interval to decide by"
    return rule


@dataclass
class Finding:
    """One row of "What reproduces": the claim, the paper's figure, the study's estimate and 95% interval, the
    protocol and the strength of the evidence, the rule and the verdict (None: not judged, e.g. measured under
    another protocol, or the project's own comparison)."""

    finding: str
    paper: str
    study: str
    rule: str
    verdict: Optional[str]  # CONSISTENT, DIFFERS, INCONCLUSIVE or None
    evidence: str = ""  # the protocol and what the verdict rests on: fine-tuning length against the paper's, draws

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

    def to_dict(self) -> Dict[str, object]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Dict[str, object]) -> "Finding":
        return cls(**data)


def judged_row(finding: str, paper: str, study: str, rule: str, outcome: Optional[str], shortfall: Optional[str],
               evidence: str) -> Finding:
    """A judged finding: the verdict follows from ``outcome`` (the interval against the paper's figure) unless the
    evidence falls short."""
    return Finding(finding, paper, study, rule_with(rule, outcome, shortfall), verdict_with(outcome, shortfall),
                   evidence)
