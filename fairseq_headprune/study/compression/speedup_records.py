"""``compress --target speedup=Nx``'s records: each attempt, the result and the report (``OUT/report.json``), each
written and read by one ``to_dict``/``from_dict`` and read by the console, ``OUT/report.md`` and the plan
benchmark alike.

Report format 1 wrote two facts twice (an attempt's ``loss``, the negative of its ``delta``; ``fast_enough``,
its speed-ups reaching the target, which the result calls ``reached_target``) and named the plan's prediction
``planned``; such reports are read, those keys derived again or renamed (``Prediction.RENAMED``).
"""

from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional

from fairseq_headprune.study.compression.records import PlanRecord, Prediction
from fairseq_headprune.study.compression.speedup import PlannedCandidate, reaches, speed_breakdown

SPEEDUP_REPORT_FORMAT = "fairseq-headprune compress speedup 2"
READABLE_SPEEDUP_FORMATS = ("fairseq-headprune compress speedup 1", SPEEDUP_REPORT_FORMAT)


@dataclass
class AttemptRecord:
    """One attempt: the shape it compressed to, its fine-tuning, its score against the unpruned model and its
    measured speed-ups like for like (batch size as text -> factor), and the decision that followed."""

    attempt: int  # from 1
    dir: str  # its directory in the run's, attempt-N
    shape: PlannedCandidate
    continued_from: Optional[str]  # the attempt directory whose fine-tuning it continued
    finetune_updates: int
    metric: str
    unpruned: float
    compressed: float
    delta: float
    p_value: float
    samples: Optional[int]  # the paired test's resamples
    speedups: Dict[str, float]
    decision: str

    def fast_enough(self, factor: float) -> bool:
        return reaches(self.speedups, factor)

    def to_dict(self) -> Dict[str, Any]:
        return {"attempt": self.attempt, "dir": self.dir, "shape": self.shape.to_dict(),
                "continued_from": self.continued_from, "finetune_updates": self.finetune_updates,
                "metric": self.metric, "unpruned": self.unpruned, "samples": self.samples,
                "compressed": self.compressed, "delta": self.delta, "p_value": self.p_value,
                "speedups": dict(self.speedups), "decision": self.decision}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "AttemptRecord":
        return cls(attempt=int(data["attempt"]), dir=str(data["dir"]), shape=PlannedCandidate.from_dict(data["shape"]),
                   continued_from=data.get("continued_from"), finetune_updates=int(data.get("finetune_updates", 0)),
                   metric=str(data["metric"]), unpruned=float(data["unpruned"]), compressed=float(data["compressed"]),
                   delta=float(data["delta"]), p_value=float(data["p_value"]), samples=data.get("samples"),
                   speedups={str(k): float(v) for k, v in data["speedups"].items()}, decision=str(data["decision"]))


@dataclass
class SpeedupResult:
    """The attempt deployed: its speed-ups and score change, the plan's prediction of its speed-up per batch size,
    and its files (its own report, the compressed checkpoint, the CTranslate2 model)."""

    attempt: int
    speedups: Dict[str, float]
    delta: float
    p_value: float
    samples: Optional[int]
    prediction: Dict[str, Prediction]
    report: str
    checkpoint: str
    exported: str

    def to_dict(self) -> Dict[str, Any]:
        return {"attempt": self.attempt, "speedups": dict(self.speedups), "delta": self.delta,
                "p_value": self.p_value, "samples": self.samples,
                "prediction": {batch: p.to_dict() for batch, p in self.prediction.items()},
                "report": self.report, "checkpoint": self.checkpoint, "exported": self.exported}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "SpeedupResult":
        return cls(attempt=int(data["attempt"]), speedups={str(k): float(v) for k, v in data["speedups"].items()},
                   delta=float(data["delta"]), p_value=float(data["p_value"]), samples=data.get("samples"),
                   prediction={str(b): Prediction.from_dict(p) for b, p in (data.get("prediction") or {}).items()},
                   report=str(data["report"]), checkpoint=str(data["checkpoint"]), exported=str(data["exported"]))


@dataclass
class SpeedupReport:
    """``OUT/report.json`` of a speed-up run: the target, the plan, every attempt and the result."""

    checkpoint: str
    target: str
    factor: float
    max_bleu_loss: float
    plan: PlanRecord
    attempts: List[AttemptRecord] = field(default_factory=list)
    result: Optional[SpeedupResult] = None
    format: str = SPEEDUP_REPORT_FORMAT

    @property
    def chosen(self) -> PlannedCandidate:
        """The shape the plan chose."""
        return self.plan.candidates[self.plan.chosen]

    @property
    def breakdown(self) -> Dict[str, Dict[str, float]]:
        """What each step of the chosen shape bought (``speedup.speed_breakdown``)."""
        return speed_breakdown(self.plan.candidates, self.plan.chosen, self.plan.map_gain)

    @property
    def within_tolerance(self) -> bool:
        return self.result is not None and -self.result.delta <= self.max_bleu_loss

    @property
    def reached_target(self) -> bool:
        return self.result is not None and reaches(self.result.speedups, self.factor)

    def to_dict(self) -> Dict[str, Any]:
        result = None if self.result is None else {
            **self.result.to_dict(), "within_tolerance": self.within_tolerance, "reached_target": self.reached_target}
        return {"format": self.format, "checkpoint": self.checkpoint, "target": self.target, "factor": self.factor,
                "max_bleu_loss": self.max_bleu_loss,
                "plan": {**self.plan.to_dict(), "chosen_name": self.chosen.candidate.name,
                         "breakdown": self.breakdown},
                "attempts": [attempt.to_dict() for attempt in self.attempts], "result": result}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "SpeedupReport":
        if data.get("format") not in READABLE_SPEEDUP_FORMATS:
            raise ValueError(f"not a speed-up report of a known format: {data.get('format')!r}")
        plan = {key: value for key, value in data["plan"].items() if key not in ("chosen_name", "breakdown")}
        return cls(checkpoint=str(data["checkpoint"]), target=str(data["target"]), factor=float(data["factor"]),
                   max_bleu_loss=float(data["max_bleu_loss"]), plan=PlanRecord.from_dict(plan),
                   attempts=[AttemptRecord.from_dict(a) for a in data.get("attempts", [])],
                   result=None if data.get("result") is None else SpeedupResult.from_dict(data["result"]))
