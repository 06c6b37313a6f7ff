"""``compress``'s records: one dataclass per stage (``OUT/STAGE/stage.json``) and the report that gathers them
(``OUT/report.json``), written and read by ``study.output.serialisation``, and read by the console, the Markdown
report and the next stages alike.

The names are the mask language's: ``spec`` and ``ffn_spec`` are head and FFN-neuron mask specs, ``heads_pruned``
and ``neurons_pruned`` how many units they prune, ``*_total`` how many there were. Report format 2 gave the
shrink stage these names (format 1 called them ``heads_removed``, ``neurons_removed``, ``neuron_spec``) and states
every speed-up like for like (``speedup_like_for_like``: against the unpruned model in the same engine, compute
type and vocabulary-map setting) and against the stock conversion apart (``speedup_vs_stock_conversion``); records
of either format are read.
"""

from dataclasses import dataclass, field
from typing import Any, ClassVar, Dict, List, Mapping, Optional, Tuple, Type

from fairseq_headprune.errors import ResultFileError
from fairseq_headprune.study.compression.decoding import DecodingOptions
from fairseq_headprune.study.compression.deployment_settings import DeploymentSettings
from fairseq_headprune.study.compression.precision import ComputeTypeChoice
from fairseq_headprune.study.compression.speed import SpeedRow
from fairseq_headprune.study.finetune.memory import MemoryPlan
from fairseq_headprune.study.finetune.settings import Validation
from fairseq_headprune.study.masks.layer_drop import LayerStep
from fairseq_headprune.study.output.serialisation import OMITTED_WHEN_DEFAULT, UNKNOWN_KEYS, WRITTEN_LAST, PlainRecord
from fairseq_headprune.study.search.records import DecodingFlops, FlopsKept, TuningSummary
from fairseq_headprune.study.statistics.significance import SignificanceSettings

REPORT_FORMAT = "fairseq-headprune compress report 2"
READABLE_FORMATS = ("fairseq-headprune compress report 1", REPORT_FORMAT)

DEVICE_WORDS = {"cpu": "CPU", "cuda": "GPU"}  # where a fine-tune ran, as reports and consoles say it


def trained_where(device: str, precision: str, processes: int = 1) -> str:
    """Where and in what a fine-tune trained, as the report and the console say it: "on the GPU in bfloat16",
    "on 2 CPU processes in float32"."""
    where = DEVICE_WORDS.get(device, device)
    return f"on {f'{processes} {where} processes' if processes > 1 else f'the {where}'} in {precision}"


@dataclass
class StageRecord(PlainRecord):
    """What every stage records: its own fields, and ``stage`` and ``seconds`` (set when it finishes). Keys a
    stage does not name (a family's extra scores) are kept in ``extra`` and written back as they were."""

    stage: str = field(default="", metadata={**OMITTED_WHEN_DEFAULT, **WRITTEN_LAST})
    seconds: Optional[float] = field(default=None, metadata={**OMITTED_WHEN_DEFAULT, **WRITTEN_LAST})
    extra: Dict[str, Any] = field(default_factory=dict, metadata=UNKNOWN_KEYS)


@dataclass
class BeamResult(PlainRecord):
    """``--speed-beams``: both models' scores at one beam, the compressed one tested against the unpruned one at
    that beam (``delta``, ``p_value``) and at the run's beam (``delta_vs_run_beam``, ``p_value_vs_run_beam``)."""

    beam: int
    unpruned: float
    compressed: float
    delta: float
    p_value: float
    delta_vs_run_beam: float
    p_value_vs_run_beam: float


@dataclass
class Prediction(PlainRecord):
    """A speed-up predicted before compressing (a latency table's, or the speed-up plan's timing of the shape)
    beside the one measured on the compressed model; ``relative_error`` is (predicted - measured) / measured."""

    predicted: float
    measured: Optional[float]
    batch_size: Optional[int] = None
    beam: Optional[int] = None

    RENAMED: ClassVar[Dict[str, str]] = {"planned": "predicted"}  # the speed-up report's older name
    DERIVED: ClassVar[Tuple[str, ...]] = ("relative_error",)

    @property
    def relative_error(self) -> Optional[float]:
        return None if not self.measured else (self.predicted - self.measured) / self.measured


@dataclass
class ParameterCounts(PlainRecord):
    """A model's parameters before and after a stage (shared embeddings counted once): the unpruned model's, and the
    compressed one's (``shrink/``) or the shallower one's with whole layers removed (``layers/``)."""

    unpruned: int
    compressed: Optional[int] = field(default=None, metadata=OMITTED_WHEN_DEFAULT)
    kept: Optional[int] = field(default=None, metadata=OMITTED_WHEN_DEFAULT)


@dataclass
class WordDistillation(PlainRecord):
    """``--distill word``: the teacher (the unpruned checkpoint) and the weight of its word distributions' loss."""

    teacher: str
    weight: float


@dataclass
class DeployedFiles(PlainRecord):
    """What a compress run deploys: the compressed checkpoint, and its export (None: not exported)."""

    checkpoint: str
    exported: Optional[str] = None


@dataclass
class StageStatus(PlainRecord):
    """A stage of this run: ``ran`` or ``kept`` (from an earlier run of the same settings), and its seconds."""

    status: Optional[str]
    seconds: Optional[float] = None


@dataclass
class LayersRecord(StageRecord):
    """``layers/``: whole layers removed first, those the validation loss misses least."""

    checkpoint: str = ""
    spec: str = ""  # the layers removed, as ``decoder:2-3``
    counts: Dict[str, int] = field(default_factory=dict)  # layers asked of each stack
    base_loss: float = 0.0  # the validation loss with every layer
    steps: List[LayerStep] = field(default_factory=list)  # each removal
    subsets: List[str] = field(default_factory=list)
    sentences: int = 0
    cost: str = ""
    unit: str = ""
    full_cost: float = 0.0
    kept_cost: float = 0.0
    flops_full: Optional[float] = None
    parameters: Optional[ParameterCounts] = None
    chosen_by: str = "loss"  # loss: measured here; plan: the speed-up plan's choice, measured there


@dataclass
class DistillRecord(StageRecord):
    """``distill/``: the unpruned model's translations of the training sources."""

    data: str = ""
    kind: str = ""
    split: str = ""
    sentences: int = 0
    target_tokens: int = 0
    reference_tokens: int = 0
    identical_to_reference: int = 0
    seconds_translating: float = 0.0


@dataclass
class FisherRecord(StageRecord):
    """``fisher/``: the masks' Fisher information."""

    file: str = ""
    subsets: List[str] = field(default_factory=list)
    sentences: int = 0
    neurons: bool = False


@dataclass
class SearchRecord(StageRecord):
    """``search/``: the mask within the target, rearranged and tuned."""

    target: str = ""
    structure: str = ""
    cost: str = ""
    budget: float = 0.0
    unit: str = ""
    mask_cost: float = 0.0
    full_cost: float = 0.0
    heads_pruned: int = 0
    heads_total: int = 0
    spec: Optional[str] = None
    neurons_pruned: int = 0
    neurons_total: int = 0
    ffn_spec: Optional[str] = None
    flops: Optional[FlopsKept] = None
    decoding_flops: Optional[DecodingFlops] = None
    tuned: bool = False
    tuning_skipped: Optional[str] = None
    tuning: Optional[TuningSummary] = None
    step_seconds: Dict[str, Any] = field(default_factory=dict)
    latency_table: Optional[str] = None
    latency_table_shape: Optional[Dict[str, Any]] = None
    predicted_speedup: Optional[float] = None
    prediction_note: Optional[str] = None


@dataclass
class FinetuneStageRecord(StageRecord):
    """``finetune/``: fairseq-train with the pruned units held."""

    checkpoint: str = ""
    before: str = ""  # the pruned model before fine-tuning, removed for real
    updates: int = 0
    seconds_training: float = 0.0
    lr: float = 0.0
    warmup_updates: int = 0
    lr_schedule: str = ""
    train_subset: str = ""
    targets: str = ""  # references or distilled
    word_distillation: Optional[WordDistillation] = None
    start: str = ""  # tuned or masked
    # fine-tuning until enough: the rule (FinetuneStop.to_dict, with its validation interval and ceiling), every
    # validation ({updates, bleu}: the recovery curve), why it stopped, and the update count of the checkpoint kept
    until: Optional[Dict[str, Any]] = None
    curve: List[Validation] = field(default_factory=list)
    stopped: Optional[str] = None
    kept_updates: Optional[int] = None
    device: str = ""  # where it trained (cpu, cuda; empty in records written before it was recorded)
    precision: str = ""  # what it trained in (float32 on a CPU; on a GPU as --finetune-precision chose)
    processes: int = 1  # the data-parallel processes it trained on (--finetune-processes)
    update_freq: int = 0  # the batches each of them accumulated per update (0: not recorded)
    memory: Optional[MemoryPlan] = None  # its memory plan


@dataclass
class ShrinkRecord(StageRecord):
    """``shrink/``: the pruned units removed for real, the tuning folded in."""

    RENAMED: ClassVar[Dict[str, str]] = {"heads_removed": "heads_pruned", "neurons_removed": "neurons_pruned",
                                         "neuron_spec": "ffn_spec"}

    checkpoint: str = ""
    shrunk_from: str = ""
    tuning_folded: bool = False
    heads_pruned: int = 0
    heads_total: int = 0
    spec: str = ""
    neurons_pruned: int = 0
    neurons_total: int = 0
    ffn_spec: Optional[str] = None
    parameters: Optional[ParameterCounts] = None
    report: List[str] = field(default_factory=list)


@dataclass
class ExportRecord(StageRecord):
    """``export/``: CTranslate2 models of the compressed and the unpruned model."""

    format: str = ""
    quantization: Optional[str] = None
    quantization_choice: Optional[ComputeTypeChoice] = None
    models: Dict[str, Dict[str, Any]] = field(default_factory=dict)


@dataclass
class ScoreChange(PlainRecord):
    """The compressed model against the unpruned one on one split: both scores, the change (higher is better),
    the paired test's p-value and resamples, and the compressed model before fine-tuning (None: not scored). What
    a speed-up attempt is judged by and its result reported with (``EvaluationRecord.change``)."""

    split: str
    metric: str
    unpruned: float
    compressed: float
    delta: float
    p_value: float
    samples: Optional[int] = None
    before_finetune: Optional[float] = None


@dataclass
class EvaluationRecord(StageRecord):
    """``evaluate/``: both models on the evaluation split, tested against each other (``extra``: the family's
    other scores, e.g. both BLEUs of a translation model)."""

    metric: str = ""
    label: str = ""
    description: str = ""
    higher_is_better: bool = True
    split: str = ""
    sentences: int = 0
    unpruned: float = 0.0
    compressed: float = 0.0
    delta: float = 0.0
    p_value: float = 1.0
    significant: bool = False
    ci_low: Optional[float] = None
    ci_high: Optional[float] = None
    test: SignificanceSettings = field(default_factory=SignificanceSettings)
    before_finetune: Optional[float] = None
    beams: List[BeamResult] = field(default_factory=list)  # --speed-beams

    def change(self, beam: Optional[int] = None) -> ScoreChange:
        """The compressed model against the unpruned one at the run's beam, or (``beam``, one of ``--speed-beams``)
        the compressed model at that beam against the unpruned one at the run's; None where that beam was not
        evaluated."""
        samples = self.test.samples
        if beam is None:
            return ScoreChange(self.split, self.label, self.unpruned, self.compressed, self.delta, self.p_value,
                               samples, self.before_finetune)
        row = next((r for r in self.beams if r.beam == beam), None)
        return None if row is None else ScoreChange(self.split, self.label, self.unpruned, row.compressed,
                                                    row.delta_vs_run_beam, row.p_value_vs_run_beam, samples)


@dataclass
class SpeedRecord(StageRecord):
    """``speed/``: both models (and their exports) timed, each in its own process."""

    split: str = ""
    environment: Dict[str, Any] = field(default_factory=dict)
    settings: DeploymentSettings = field(default_factory=DeploymentSettings)
    unit: str = ""
    decoding: Optional[DecodingOptions] = None
    rows: List[SpeedRow] = field(default_factory=list)
    # --speed-beams: the same systems timed at other beam sizes (each row's beam), the compressed ones also
    # against the unpruned model at the run's beam (speedup_vs_run_beam)
    beam_rows: List[SpeedRow] = field(default_factory=list)


# each stage of a compress run and its record (the speed-up's own stages keep theirs in ``speedup.records``)
STAGE_RECORDS: Dict[str, Type[StageRecord]] = {
    "layers": LayersRecord, "distill": DistillRecord, "fisher": FisherRecord, "search": SearchRecord,
    "finetune": FinetuneStageRecord, "shrink": ShrinkRecord, "export": ExportRecord, "evaluate": EvaluationRecord,
    "speed": SpeedRecord,
}


def speedup_prediction(search: SearchRecord, speed: Optional[SpeedRecord]) -> Optional[Prediction]:
    """The search's predicted speed-up (a CTranslate2 latency table's) beside the one measured after export, at the
    table's batch size: the exported compressed model against the exported unpruned one at the same precision
    (the table is timed without a map); None when nothing was predicted."""
    predicted, shape = search.predicted_speedup, search.latency_table_shape or {}
    if predicted is None or speed is None:
        return None
    batch_size = shape.get("batch_size")
    measured = next((row.speedup_like_for_like for row in speed.rows
                     if row.batch_size == batch_size and row.ctranslate2 and row.compressed
                     and not row.vocabulary_mapped), None)
    return Prediction(predicted, measured, batch_size, shape.get("beam"))


@dataclass
class CompressReport(PlainRecord):
    """``OUT/report.json``: the stages' records, the files to deploy and what each stage cost."""

    checkpoint: str
    data: str
    family: str
    target: str
    fisher: FisherRecord
    search: SearchRecord
    shrink: ShrinkRecord
    evaluation: EvaluationRecord
    speed: SpeedRecord
    layers: Optional[LayersRecord] = None
    distill: Optional[DistillRecord] = None
    finetune: Optional[FinetuneStageRecord] = None
    export: Optional[ExportRecord] = None
    speedup_prediction: Optional[Prediction] = None
    files: Optional[DeployedFiles] = None
    stages: Dict[str, StageStatus] = field(default_factory=dict)
    format: str = REPORT_FORMAT

    ORDER: ClassVar[Tuple[str, ...]] = (
        "format", "checkpoint", "data", "family", "target", "layers", "distill", "fisher", "search", "finetune",
        "shrink", "export", "evaluation", "speed", "speedup_prediction", "files", "stages")

    @classmethod
    def upgrade(cls, data: Mapping[str, Any]) -> Mapping[str, Any]:
        if data.get("format") not in READABLE_FORMATS:
            raise ResultFileError(f"not a compress report of a known format: {data.get('format')!r}")
        return {**data, "format": REPORT_FORMAT}

    @property
    def flops_kept_share(self) -> float:
        """The attention and FFN layers' FLOPs per token the compressed model keeps, as a share of the unpruned
        model's (layers removed first count as removed)."""
        flops = self.search.flops
        full = (self.layers.flops_full if self.layers is not None else None) or flops.full
        return flops.kept / full if full else float("nan")
