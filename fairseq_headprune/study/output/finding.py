"""A finding of the papers, checked against a study's numbers by a stated rule, with the evidence it rests on."""

from dataclasses import asdict, dataclass
from typing import Dict, Optional

YES, NO, INCONCLUSIVE = "yes", "no", "inconclusive"
VERDICTS = (YES, NO, INCONCLUSIVE)


@dataclass
class Finding:
    """One row of "What reproduces": the claim, what the paper and the study found, the protocol and evidence, the
    rule and the verdict (None: not judged, e.g. measured under another protocol, or the project's own comparison)."""

    finding: str
    paper: str
    study: str
    rule: str
    verdict: Optional[str]  # YES, NO, INCONCLUSIVE or None
    evidence: str = ""  # the protocol and what the verdict rests on: fine-tuning length against the paper's, draws

    def __post_init__(self):
        if self.verdict is not None and self.verdict not in VERDICTS:
            raise ValueError(f"a finding's verdict is one of {', '.join(VERDICTS)} or None, got {self.verdict!r}")

    @property
    def judged(self) -> bool:
        return self.verdict is not None

    def shown(self) -> str:
        """The verdict cell: yes, **no**, inconclusive, not judged."""
        return {YES: "yes", NO: "**no**", INCONCLUSIVE: "inconclusive", None: "not judged"}[self.verdict]

    def to_dict(self) -> Dict[str, object]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Dict[str, object]) -> "Finding":
        return cls(**data)


def verdict_of(holds: bool) -> str:
    """A rule's outcome as a verdict."""
    return YES if holds else NO
