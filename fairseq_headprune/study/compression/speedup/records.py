"""``compress --target speedup=Nx``'s records: each attempt, the result and the report (``OUT/report.json``), each
written and read by ``study.output.serialisation`` and read by the console, ``OUT/report.md`` and the plan
benchmark alike.

Every attempt is judged on the decision split (``ScoreChange`` on validation, its speed timed there); the
attempt deployed is evaluated and timed on the run's own split once, in ``OUT/result`` (``SpeedupResult.reported``).

Report format 1 judged attempts on the test split, wrote an attempt's score as flat keys, two facts twice (an
attempt's ``loss``, the negative of its ``delta``; ``fast_enough``, its speed-ups reaching the target, which the
result called ``reached_target``) and named the plan's prediction ``planned``; such reports are read, their scores
as scores on the split they name, the doubled keys derived again, the prediction renamed (``Prediction.RENAMED``).
"""

from dataclasses import dataclass, field
from typing import Any, ClassVar, Dict, List, Mapping, Optional, Tuple

from fairseq_headprune.errors import ResultFileError
from fairseq_headprune.study.compression.records import Prediction, ScoreChange, StageRecord
from fairseq_headprune.study.compression.speed import Speedups
from fairseq_headprune.study.compression.speedup.rules import within_tolerance
from fairseq_headprune.study.compression.speedup.shapes import (
    DisorderedPair,
    PlannedCandidate,
    speed_breakdown,
)
from fairseq_headprune.study.finetune.settings import Validation
from fairseq_headprune.study.masks.layer_drop import LayerChoice
from fairseq_headprune.study.output.serialisation import OMITTED_WHEN_DEFAULT, PlainRecord, to_plain

SPEEDUP_REPORT_FORMAT = "fairseq-headprune compress speedup 2"
READABLE_SPEEDUP_FORMATS = ("fairseq-headprune compress speedup 1", SPEEDUP_REPORT_FORMAT)


@dataclass
class HalvesRecord(StageRecord):
    """``halves/``: the decision split dealt into the half that fits (Fisher scores, damage, tuning, the
    fine-tuning's validations) and the half that decides, in a data directory of their own."""

    data: str = ""
    split: str = ""
    fit: str = ""
    decide: str = ""
    sentences: int = 0
    fit_sentences: int = 0
    decide_sentences: int = 0


@dataclass
class PlanRecord(StageRecord):
    """``plan/`` of ``--target speedup=Nx``: the candidate shapes, their measured speed-ups like for like (each
    exported with the vocabulary map against the unpruned model with its own map), their damage before
    fine-tuning and the one chosen (``study.compression.speedup``); the unpruned model's score on the decision
    split and the decoding its fine-tunings validate with."""

    factor: float = 0.0
    margin: float = 0.0  # the first choice asked the plan's timing for factor x (1 + margin)
    decision_subset: str = ""
    reference: Optional[float] = None  # the unpruned model's score on the decision split
    # the unpruned model's score on the split the fine-tuning validates on, where that is another (--decision-half:
    # the fit half), which its stop target is set from
    stop_subset: str = ""
    stop_reference: Optional[float] = None
    generation: Dict[str, Any] = field(default_factory=dict)  # beam, length penalty and limits of the run
    remove_bpe: Optional[str] = None
    base_loss: Optional[float] = None  # the unpruned model's validation loss (damage = a shape's loss over it)
    damage_sentences: int = 0
    damage_sampled_from: int = 0  # the Fisher split's sentences where the damage sentences are a sample (0: all)
    # the whole layers each shape removes, by its layers' name (Candidate.layers_name): chosen by the loss
    layer_choices: Dict[str, LayerChoice] = field(default_factory=dict)
    batch_sizes: List[int] = field(default_factory=list)
    quantization: str = "float32"
    split: str = ""  # the sentences timed (the Fisher split's first ones, never the evaluation split)
    sentences: int = 0
    beam: int = 0
    target_length: int = 0  # every candidate generates exactly this many tokens
    repeats: int = 0  # the rounds of the shapes whose timing decides (rules.decisive_candidates)
    screen_rounds: int = 0  # every other shape's rounds (0: a plan written before it was recorded: all at repeats)
    candidates: List[PlannedCandidate] = field(default_factory=list)  # in timing order
    chosen: Optional[int] = 0  # index into candidates; None: no shape timed fast enough (no attempt)
    map_gain: Speedups = field(default_factory=Speedups)  # the unpruned model with its map over without
    out_of_order: List[DisorderedPair] = field(default_factory=list)  # speedup.out_of_order: a disturbed timing
    environment: Dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        self.map_gain = Speedups.of(self.map_gain)

    @property
    def screened(self) -> bool:
        """Whether every shape was timed ``screen_rounds`` first and only the decisive ones ``repeats``."""
        return 0 < self.screen_rounds < self.repeats

    @property
    def stop_score(self) -> Optional[float]:
        """The unpruned model's score on the split the fine-tuning validates on: its stop target is set from it."""
        return self.reference if self.stop_reference is None else self.stop_reference


@dataclass
class FinetuneSummary(PlainRecord):
    """An attempt's fine-tuning as the decisions and the report read it: the updates made, why it stopped, the
    update count of the checkpoint kept, and its validations (the recovery curve: {updates, bleu})."""

    updates: int = 0
    stopped: Optional[str] = None
    kept_updates: Optional[int] = None
    curve: List[Validation] = field(default_factory=list)
    # its training time (None in reports written before it was recorded); where it trained (cpu, cuda), in what
    # precision, on how many processes
    seconds: Optional[float] = field(default=None, metadata=OMITTED_WHEN_DEFAULT)
    device: str = field(default="", metadata=OMITTED_WHEN_DEFAULT)
    precision: str = field(default="", metadata=OMITTED_WHEN_DEFAULT)
    processes: int = field(default=1, metadata=OMITTED_WHEN_DEFAULT)


@dataclass
class AttemptRecord(PlainRecord):
    """One attempt: the shape it compressed to, its fine-tuning, its score against the unpruned model and its
    measured speed-ups like for like, both on the decision split, and the decision
    that followed."""

    attempt: int  # from 1
    dir: str  # its directory in the run's, attempt-N
    shape: PlannedCandidate
    continued_from: Optional[str]  # the attempt directory whose fine-tuning it continued
    finetune: FinetuneSummary
    score: ScoreChange
    speedups: Speedups
    decision: str
    seconds: Dict[str, float] = field(default_factory=dict)  # each stage's, as it ran (kept stages: their first run)
    # the low end of each speed-up's interval over the timing rounds, what "fast enough" read (empty: a record
    # written before the rule read it; the speed-ups themselves)
    speedup_lows: Speedups = field(default_factory=Speedups)

    # written beside the speed-ups they are the low ends of
    ORDER: ClassVar[Tuple[str, ...]] = ("attempt", "dir", "shape", "continued_from", "finetune", "score", "speedups",
                                        "speedup_lows")

    def __post_init__(self):
        self.speedups, self.speedup_lows = Speedups.of(self.speedups), Speedups.of(self.speedup_lows)

    @classmethod
    def upgrade(cls, data: Mapping[str, Any]) -> Mapping[str, Any]:
        """Format 1 wrote an attempt's score as flat keys (on the split ``SpeedupReport.upgrade`` names) and its
        fine-tuning as its update count."""
        data = dict(data)
        if "score" not in data:
            data["score"] = {"split": data.get("split", ""), "metric": "BLEU",
                             **{key: data.get(key) for key in ("unpruned", "compressed", "delta", "p_value",
                                                               "samples", "before_finetune")}}
        if "finetune" not in data:
            data["finetune"] = {"updates": int(data.get("finetune_updates", 0))}
        return data


@dataclass
class SpeedupResult(PlainRecord):
    """The attempt deployed: its score change on the decision split (what the decisions read) and on the run's
    own split (``reported``: translated once, for this result), its speed-ups timed there, the plan's prediction
    of them per batch size, and its files (the report of its evaluation, the compressed checkpoint, the CTranslate2
    model)."""

    attempt: int
    decided: ScoreChange
    reported: ScoreChange
    speedups: Speedups
    prediction: Dict[int, Prediction]  # batch size -> the plan's speed-up beside the measured one
    report: str
    checkpoint: str
    exported: str
    seconds: Dict[str, float] = field(default_factory=dict)  # what the result measured again: evaluate, speed

    def __post_init__(self):
        self.speedups = Speedups.of(self.speedups)
        self.prediction = {int(batch): row for batch, row in self.prediction.items()}


@dataclass
class SpeedupReport(PlainRecord):
    """``OUT/report.json`` of a speed-up run: the target, the plan, every attempt and the result."""

    checkpoint: str
    target: str
    factor: float
    max_bleu_loss: float
    plan: PlanRecord
    attempts: List[AttemptRecord] = field(default_factory=list)
    result: Optional[SpeedupResult] = None
    format: str = SPEEDUP_REPORT_FORMAT
    halves: Optional[HalvesRecord] = field(default=None, metadata=OMITTED_WHEN_DEFAULT)  # --decision-half's

    ORDER: ClassVar[Tuple[str, ...]] = ("format",)

    @property
    def chosen(self) -> PlannedCandidate:
        """The shape the plan chose."""
        return self.plan.candidates[self.plan.chosen]

    @property
    def breakdown(self) -> Dict[str, Speedups]:
        """What each step of the chosen shape bought (``speedup.speed_breakdown``)."""
        return speed_breakdown(self.plan.candidates, self.plan.chosen, self.plan.map_gain)

    @property
    def within_tolerance(self) -> bool:
        """The result within the tolerance on the decision split (what decided)."""
        return self.result is not None and within_tolerance(self.result.decided.delta, self.max_bleu_loss)

    @property
    def within_tolerance_reported(self) -> bool:
        """The result within the tolerance on the run's own split."""
        return self.result is not None and within_tolerance(self.result.reported.delta, self.max_bleu_loss)

    @property
    def reached_target(self) -> bool:
        return self.result is not None and self.result.speedups.reaches(self.factor)

    @property
    def minutes(self) -> Dict[str, float]:
        """What the run cost: the plan, each attempt (its fine-tuning apart) and the result's measurements; a stage
        an attempt took from an earlier one (the same record, linked) counts once, in the earlier."""
        spent = {"plan": (self.plan.seconds or 0.0) / 60.0}
        counted = set()
        for attempt in self.attempts:
            own = {stage: seconds for stage, seconds in attempt.seconds.items() if (stage, seconds) not in counted}
            counted.update(own.items())
            if "finetune" in own and attempt.finetune.seconds is not None:
                # a fine-tune resumed after a kill: its stage's seconds count each earlier process up to its last
                # save, fairseq's training clock (FinetuneSummary.seconds) up to its last resume point; the longer
                own["finetune"] = max(own["finetune"], attempt.finetune.seconds)
            spent[f"attempt {attempt.attempt}"] = sum(own.values()) / 60.0
            spent[f"attempt {attempt.attempt} fine-tuning"] = own.get("finetune", 0.0) / 60.0
        if self.result is not None:
            spent["result"] = sum(self.result.seconds.values()) / 60.0
        spent["in all"] = sum(v for k, v in spent.items() if not k.endswith("fine-tuning"))
        return spent

    def to_dict(self) -> Dict[str, Any]:
        """The report, with what it derives written beside the plan (the chosen shape's name, what each step of it
        bought) and the result (within the tolerance where it decided and where it is reported, target reached)."""
        plain = to_plain(self)
        plain["plan"].update(chosen_name=self.chosen.candidate.name, breakdown=to_plain(self.breakdown))
        if self.result is not None:
            plain["result"].update(within_tolerance=self.within_tolerance,
                                   within_tolerance_reported=self.within_tolerance_reported,
                                   reached_target=self.reached_target)
        return plain

    @classmethod
    def upgrade(cls, data: Mapping[str, Any]) -> Mapping[str, Any]:
        """What the report derives dropped; format 1's attempts scored on its test split, and its result decided and
        reported with the score of its attempt."""
        if data.get("format") not in READABLE_SPEEDUP_FORMATS:
            raise ResultFileError(f"not a speed-up report of a known format: {data.get('format')!r}")
        data = dict(data)
        data["plan"] = {key: value for key, value in data["plan"].items() if key not in ("chosen_name", "breakdown")}
        if data["format"] != SPEEDUP_REPORT_FORMAT:
            data["attempts"] = [AttemptRecord.upgrade({"split": "test", **attempt})
                                for attempt in data.get("attempts", [])]
            if data.get("result") is not None and "reported" not in data["result"]:
                attempt = int(data["result"]["attempt"])
                score = next(a["score"] for a in data["attempts"] if int(a["attempt"]) == attempt)
                data["result"] = {**data["result"], "decided": score, "reported": score}
        data["format"] = SPEEDUP_REPORT_FORMAT
        return data
