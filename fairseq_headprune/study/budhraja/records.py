"""One fine-tuned configuration of Budhraja et al.'s protocol, as ``prune`` writes it, reports and judges it.

A record is written by the engine as ``OUT/finetune/NAME/record.json`` (with
the per-sentence statistics and hypotheses its tests need) and merged into
``OUT/finetune/results.json`` (without them); the report and the findings
read it back. The names are the JSON keys, one per fact.
"""

import dataclasses
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from fairseq_headprune.constants import CORRECTNESS_TESTS
from fairseq_headprune.study.finetune.settings import FinetuneRecipe

CONTROL = "control"  # the unpruned model fine-tuned alike
AGAINST = ("control", "unpruned")  # what each configuration is tested against: the fine-tuned control, the plain model
DETAIL = ("stats", "hypotheses")  # kept in record.json for the tests, left out of results.json


@dataclass
class CurvePoint:
    """A point of the recovery curve: the fine-tune scored after ``updates`` (a stop at ``stop`` number ``at``)."""

    stop: str  # "update" or "epoch"
    at: int
    updates: int
    score: float
    gap_vs_control: Optional[float] = None  # the score minus the control's at the same point (after merging)


@dataclass
class TestAgainst:
    """A fine-tuned configuration's paired test against a baseline, with the 95% interval of the difference (the
    paired bootstrap's percentiles; None where the test gives none)."""

    delta: float
    p_value: float
    significant: bool
    low: Optional[float] = None
    high: Optional[float] = None


@dataclass
class FinetuneRecord:
    """A configuration fine-tuned with its pruned heads held at zero, scored before, along the way and after."""

    name: str  # the directory under OUT/finetune
    label: str  # the budget (and draw), or the curve's order and level
    spec: str  # the mask, in the mask language ("none": the control)
    score_before: float  # the study's metric, without fine-tuning
    score_after: float
    metric: str  # the metric's column (bleu, accuracy, ...)
    finetune: str  # "500 updates", "30 epochs"
    checkpoint: str = ""
    note: str = ""  # where it comes from in the paper (Budget.note)
    kind: str = "control"  # level, per-layer, per-type, layers, curve step, control
    budget: str = ""  # what its draws share: the budget's label, or the curve's order and level
    percent: float = 0.0  # of all heads pruned
    tables: List[int] = field(default_factory=list)  # the paper's tables it belongs to
    paper_level: Optional[float] = None  # the level of its row in the paper's table
    arm: str = ""  # which configuration of the row ("important layers kept", "fewest in ES")
    draw: Optional[int] = None  # random budgets: 1..N
    layer_spread: Optional[float] = None  # Figure 2: (max - min) / min of the layers' mean change, all types pooled
    layer_spreads: Dict[str, Optional[float]] = field(default_factory=dict)  # the same within each attention type
    seconds: float = 0.0
    updates: Optional[int] = None
    lr: Optional[float] = None
    warmup_updates: Optional[int] = None
    seed: Optional[int] = None  # the fine-tune's (None: recorded before --finetune-seed, so the checkpoint's own)
    curve: List[CurvePoint] = field(default_factory=list)
    tests: Dict[str, TestAgainst] = field(default_factory=dict)  # AGAINST -> its test
    # the paired test against the other configuration of its pair (Table 5's middle:K and top+bottom:K ...), keyed by
    # that one's label: this configuration's score minus that one's, on the same examples (``pairs.within_pairs``)
    paired: Dict[str, TestAgainst] = field(default_factory=dict)
    significance: Dict[str, object] = field(default_factory=dict)  # the tests' settings (SignificanceSettings)
    trained_updates: Optional[int] = None  # the study's checkpoint's own training
    trained_epochs: Optional[int] = None
    missing_configurations: int = 0  # > 0: another shard has not finished (merged again after it)
    stats: Optional[list] = None  # per-sentence statistics of the test (record.json only)
    hypotheses: Optional[list] = None

    @property
    def is_control(self) -> bool:
        return self.name == CONTROL

    @property
    def resamples(self) -> Optional[int]:
        """What a p-value of 0 is bounded by (``p < 1/resamples``); None: unknown, or a test that does not resample."""
        return None if self.significance.get("test") in CORRECTNESS_TESTS else self.significance.get("samples")

    def recipe(self, checkpoint_seed: Optional[int]) -> FinetuneRecipe:
        """How it was fine-tuned, as far as the record says (``FinetuneRecipe``: None where it does not)."""
        return FinetuneRecipe(self.finetune, self.lr, self.warmup_updates,
                              tuple((point.stop, point.at) for point in self.curve if point.at),
                              checkpoint_seed if self.seed is None else self.seed)

    @property
    def group(self) -> str:
        """What a configuration's draws share: its budget's label (or its own label)."""
        return self.budget or self.label

    def to_dict(self, detail: bool = True) -> Dict[str, object]:
        """The JSON record; ``detail=False`` leaves out the statistics and hypotheses (results.json)."""
        data = dataclasses.asdict(self)
        tests = data.pop("tests")
        for against, test in tests.items():
            data[f"delta_vs_{against}"] = test["delta"]
            data[f"p_value_vs_{against}"] = test["p_value"]
            data[f"significant_vs_{against}"] = test["significant"]
            if test["low"] is not None:
                data[f"delta_low_vs_{against}"], data[f"delta_high_vs_{against}"] = test["low"], test["high"]
        for key in DETAIL:
            if not detail or data[key] is None:
                data.pop(key)
        return data

    @classmethod
    def from_dict(cls, data: Dict[str, object]) -> "FinetuneRecord":
        values = {f.name: data[f.name] for f in dataclasses.fields(cls) if f.name in data and f.name != "tests"}
        values["curve"] = [CurvePoint(**point) for point in data.get("curve") or []]
        values["paired"] = {other: TestAgainst(**test) for other, test in (data.get("paired") or {}).items()}
        values["tests"] = {against: TestAgainst(data[f"delta_vs_{against}"], data[f"p_value_vs_{against}"],
                                                data[f"significant_vs_{against}"], data.get(f"delta_low_vs_{against}"),
                                                data.get(f"delta_high_vs_{against}"))
                           for against in AGAINST if f"delta_vs_{against}" in data}
        return cls(**values)
