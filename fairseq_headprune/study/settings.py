"""Typed settings of the studies, validated once where they are made.

The commands turn their parsed options into these dataclasses; everything
below the command layer receives settings, never an argparse namespace. Each
check names the option a user would correct (as peft's configs do), and
raises ``SettingsError``, which the commands print as one line.
"""

from dataclasses import dataclass, field, replace
from typing import Dict, List, Optional, Sequence

from ..constants import (
    ABLATION_MODES,
    ATTENTION_TYPES,
    CLASSIFIER_FAMILY,
    COST_KINDS,
    DEFAULT_CONFIGS_PER_BATCH,
    DEFAULT_GRANULARITY,
    DEFAULT_HELD_ASIDE,
    DEFAULT_IMPORTANCE_LOSS,
    DEFAULT_IMPORTANCE_METHOD,
    DEFAULT_LABEL_SMOOTHING,
    DEFAULT_MAX_PERCENT,
    DEFAULT_MAX_CONDITION,
    DEFAULT_TUNE_LAYERS,
    TUNE_LAYERS,
    DEFAULT_SCALE_BOUND,
    DEFAULT_SEQUENCE_LENGTH,
    DEFAULT_STEP_PERCENT,
    DEFAULT_TUNE_LIMIT,
    EXPORT_FORMATS,
    FAIRSEQ_ENGINE,
    GRANULARITIES,
    IMPORTANCE_LOSSES,
    IMPORTANCE_METHODS,
    LANGUAGE_MODEL_FAMILY,
    LATENCY_ENGINES,
    MODEL_FAMILIES,
    PRUNED_STRUCTURES,
    QUANTIZATIONS,
    TRANSLATION_FAMILY,
)
from ..errors import HeadMaskError, SettingsError
from .masks.head_mask import parse_attention_type
from .statistics.metrics import BLEU_METRICS, CLASSIFICATION_METRICS, PERPLEXITY, Metric
from .statistics.significance import SignificanceSettings

DETOKENIZERS = ("auto", "moses", "none")


def _positive(value: Optional[float], option: str) -> None:
    _refuse(value is not None and value <= 0, f"{option} must be positive, got {value}")


def _refuse(condition: bool, message: str) -> None:
    if condition:
        raise SettingsError(message)


def _one_of(value: str, allowed: Sequence[str], option: str) -> None:
    _refuse(value not in allowed, f"{option} must be one of {', '.join(allowed)}")


def parse_choices(text: str, allowed: Sequence[str], option: str) -> List[str]:
    """Comma- or space-separated values of ``allowed`` (or ``none``), in ``allowed``'s order."""
    if text.strip().lower() == "none":
        return []
    values = [v for v in text.replace(",", " ").split() if v]
    for value in values:
        _refuse(value not in allowed, f"{option}: unknown value {value!r} (expected {', '.join(allowed)})")
    _refuse(not values, f"{option} is empty")
    return [v for v in allowed if v in values]


def parse_types(text: Optional[str]) -> List[str]:
    """``--types``: attention types by any alias (``'enc-dec'``, ``'E,D'``); all three when empty."""
    if not text:
        return list(ATTENTION_TYPES)
    try:
        types = [parse_attention_type(t) for t in text.replace(",", " ").split()]
    except HeadMaskError as error:
        raise SettingsError(f"--types: {error}")
    return [t for t in ATTENTION_TYPES if t in types]


@dataclass
class ImportanceSettings:
    """How importance I_h = E_x |dL(x)/dxi_h| is estimated (Michel et al. section 4.1)."""

    subsets: List[str] = field(default_factory=lambda: ["valid"])
    limit: Optional[int] = None  # first N sentences of each subset
    max_tokens: Optional[int] = None
    max_sentences: Optional[int] = None
    granularity: str = DEFAULT_GRANULARITY
    loss: str = DEFAULT_IMPORTANCE_LOSS
    label_smoothing: float = DEFAULT_LABEL_SMOOTHING
    method: str = DEFAULT_IMPORTANCE_METHOD  # gradient: I_h (the paper); fisher: F_h = E_x (dL/dxi_h)^2
    option_prefix: str = "--"  # how the options are named where these settings come from
    neurons: bool = False  # also score every FFN neuron (zeta_i) from the same backward pass

    def __post_init__(self):
        for name in ("max_tokens", "max_sentences", "limit"):
            _positive(getattr(self, name), self.option(name))
        _one_of(self.granularity, GRANULARITIES, self.option("granularity"))
        _one_of(self.method, IMPORTANCE_METHODS, "--importance-method")
        _one_of(self.loss, IMPORTANCE_LOSSES, self.option("loss"))
        if not 0.0 <= self.label_smoothing < 1.0:
            raise SettingsError(f"{self.option('label_smoothing')} must be in [0, 1), got {self.label_smoothing}")
        _refuse(not self.subsets, f"{self.option('subset')} names no split")

    def option(self, name: str) -> str:
        return self.option_prefix + name.replace("_", "-")


@dataclass
class SweepSettings:
    """What every command that translates (or scores) a split under many masks shares (ablate, prune, dynamics).

    ``family`` is the checkpoint's kind of model: translation reports the
    BLEU ``bleu`` names; a classifier reports ``metric_name`` (accuracy by
    default, or Matthews correlation); a language model reports perplexity.
    """

    data: str
    checkpoint: str
    out_dir: str
    gen_subset: str = "test"
    bleu: str = "tokenized"  # the reported BLEU: a key of BLEU_METRICS
    test: SignificanceSettings = field(default_factory=SignificanceSettings)
    detokenize: str = "auto"  # how output becomes text for sacreBLEU
    references: Optional[str] = None  # raw references of gen_subset, for sacreBLEU
    configs_per_batch: int = DEFAULT_CONFIGS_PER_BATCH
    share_encoder: bool = True  # one encoder pass for configurations batched together that mask no Enc-Enc head
    cpu: bool = False
    progress: bool = True
    generation_args: List[str] = field(default_factory=list)  # passed to fairseq-generate's parser
    family: str = TRANSLATION_FAMILY
    metric_name: Optional[str] = None  # classifiers: a key of CLASSIFICATION_METRICS (default accuracy)

    def __post_init__(self):
        if self.family not in MODEL_FAMILIES:
            raise SettingsError(f"unknown model family {self.family!r} (expected {', '.join(MODEL_FAMILIES)})")
        self._check_family_options()
        _one_of(self.bleu, BLEU_METRICS, "--bleu")
        _one_of(self.detokenize, DETOKENIZERS, "--sacrebleu-detokenize")
        _refuse(self.configs_per_batch <= 0, f"--configs-per-batch must be positive, got {self.configs_per_batch}")
        self.metric.for_test(self.test.test)  # the test must apply to the metric: say so before any work
        if self.references and self.bleu != "sacrebleu":
            raise SettingsError("--references (raw reference text) is used by --bleu sacrebleu only")
        if not any(a.startswith("--required-batch-size-multiple") for a in self.generation_args):
            # fairseq's generation batching leaves out the last (sentences mod 8) sentences of
            # a split when batches must be multiples of 8 (its default): score every sentence
            self.generation_args = list(self.generation_args) + ["--required-batch-size-multiple", "1"]

    def _check_family_options(self) -> None:
        """Options that belong to another family of models are named, not ignored."""
        if self.family == TRANSLATION_FAMILY:
            if self.metric_name is not None:
                raise SettingsError("--metric is for classifier checkpoints; a translation study reports --bleu")
            return
        kind = "a classifier" if self.family == CLASSIFIER_FAMILY else "a language model"
        if self.bleu != "tokenized" or self.references or self.detokenize != "auto":
            raise SettingsError(f"--bleu, --references and --sacrebleu-detokenize are for translation, not {kind}")
        if self.family == CLASSIFIER_FAMILY and self.metric_name not in (None, *CLASSIFICATION_METRICS):
            raise SettingsError(f"--metric must be one of {', '.join(CLASSIFICATION_METRICS)} for a classifier")
        if self.family == LANGUAGE_MODEL_FAMILY and self.metric_name not in (None, PERPLEXITY.name):
            raise SettingsError(f"--metric {self.metric_name}: a language model is scored by perplexity (ppl)")

    @property
    def metric(self) -> Metric:
        """The metric reported: the BLEU of --bleu, or the classifier's or LM's own."""
        if self.family == CLASSIFIER_FAMILY:
            return CLASSIFICATION_METRICS[self.metric_name or "accuracy"]
        if self.family == LANGUAGE_MODEL_FAMILY:
            return PERPLEXITY
        return BLEU_METRICS[self.bleu]

    def metric_record(self) -> Dict[str, object]:
        """What a result file records of the metric: which BLEU for translation, the family and metric otherwise."""
        if self.family == TRANSLATION_FAMILY:
            return {"bleu": self.bleu}
        return {"family": self.family, "metric": self.metric.name}

    @property
    def score_label(self) -> str:
        """What an axis of scores says: which BLEU for translation, the metric's label otherwise."""
        return f"{self.bleu} BLEU" if self.family == TRANSLATION_FAMILY else self.metric.label

    @property
    def test_metric(self) -> Metric:
        """The metric the significance test resamples."""
        return self.metric.for_test(self.test.test)


@dataclass
class AblationSettings:
    """``ablate``: which study, on which heads (Michel et al. section 3)."""

    sweep: SweepSettings
    mode: str = "single"
    types: List[str] = field(default_factory=lambda: list(ATTENTION_TYPES))
    heads: Optional[str] = None  # spec of the heads to ablate (single, cross-domain)
    select_subset: Optional[str] = None  # all-but-one: choose each layer's head on this split
    cross_subset: Optional[str] = None  # cross-domain: the out-of-domain split
    cross_data: Optional[str] = None  # its data directory (default: the sweep's)

    def __post_init__(self):
        _one_of(self.mode, ABLATION_MODES, "--mode")
        if self.mode == "cross-domain" and not self.cross_subset:
            raise SettingsError("--mode cross-domain needs --cross-subset SPLIT (the out-of-domain test set)")
        _refuse(self.select_subset and self.mode != "all-but-one", "--select-subset is for --mode all-but-one")


@dataclass
class CurveSettings:
    """The pruning curve by importance: levels and how importance is estimated (prune, dynamics)."""

    step_percent: float = DEFAULT_STEP_PERCENT
    max_percent: float = DEFAULT_MAX_PERCENT
    importance: ImportanceSettings = field(
        default_factory=lambda: ImportanceSettings(option_prefix="--importance-")
    )
    raw_importance: bool = False  # rank by raw I_h, not normalised per layer (the paper normalises)


@dataclass
class TuningSettings:
    """Mask tuning by least squares (Kwon et al. 2022, section 4.3): on which data, with which safeguards."""

    subsets: List[str] = field(default_factory=lambda: ["valid"])
    limit: Optional[int] = DEFAULT_TUNE_LIMIT  # first N sentences of each subset
    max_tokens: Optional[int] = None
    scale_bound: float = DEFAULT_SCALE_BOUND
    max_condition: float = DEFAULT_MAX_CONDITION
    held_aside: float = DEFAULT_HELD_ASIDE  # share of the batches each fit must not make worse
    layers: str = DEFAULT_TUNE_LAYERS  # "pruned" sub-layers only, or "downstream": every one from the first pruned on

    def __post_init__(self):
        _refuse(not self.subsets, "--tune-subset names no split")
        _refuse(not 0 < self.held_aside < 1, f"--tune-held-aside must be between 0 and 1, got {self.held_aside:g}")
        if self.layers not in TUNE_LAYERS:
            raise SettingsError(f"--tune-layers must be one of {', '.join(TUNE_LAYERS)}, got {self.layers!r}")
        for name, option in ((self.limit, "--tune-limit"), (self.max_tokens, "--tune-max-tokens")):
            _positive(name, option)
        _refuse(not self.scale_bound > 0, f"--tune-scale-bound must be positive, got {self.scale_bound:g}")
        _refuse(not self.max_condition > 1, f"--tune-max-condition must be above 1, got {self.max_condition:g}")
        tests = [s for s in self.subsets if s.startswith("test")]
        if tests:
            raise SettingsError(
                f"--tune-subset {tests[0]}: masks are tuned on training or validation data, never on a test split"
            )

    def refuse_evaluation_split(self, split: str) -> None:
        """The study's evaluation split must not be tuned on."""
        if split in self.subsets:
            raise SettingsError(
                f"--tune-subset {split} is the split the study is evaluated on (--gen-subset); "
                "tune on training or validation data"
            )


@dataclass
class SearchSettings:
    """``search``: the mask that minimises the Fisher loss estimate within a budget (Kwon et al. 2022)."""

    data: str
    checkpoint: str
    out_dir: str
    budget: str  # a number (heads, FLOPs per token, ms) or a percentage of the unpruned model's cost
    cost: str = "heads"
    latency_table: Optional[str] = None
    sequence_length: int = DEFAULT_SEQUENCE_LENGTH  # the FLOPs cost's attended positions
    # decoding-flops: the sentence decoded (None: the valid split's mean lengths, fairseq's --beam)
    source_length: Optional[int] = None
    target_length: Optional[int] = None
    beam: Optional[int] = None  # set from fairseq's --beam by the search
    fisher_file: Optional[str] = None  # importance.json estimated with the fisher method; default: estimate
    importance: ImportanceSettings = field(
        default_factory=lambda: ImportanceSettings(method="fisher", option_prefix="--importance-")
    )
    rearrange: bool = True
    tuning: Optional[TuningSettings] = None
    family: str = TRANSLATION_FAMILY
    cpu: bool = False
    progress: bool = True
    fairseq_args: List[str] = field(default_factory=list)
    structure: str = "heads"  # heads, ffn (FFN neurons) or joint (both in one search)
    uniform: bool = False  # every layer of an attention type keeps as many heads as the others
    neuron_step: Optional[int] = None  # FFN layers keep multiples of it (None: about 128 counts per layer)
    latency_engine: str = FAIRSEQ_ENGINE  # the engine the latency table must have timed: fairseq or ctranslate2
    latency_precision: Optional[str] = None  # its precision (None: the model's; ctranslate2: float32)
    tie_decoder_heads: bool = False  # with uniform: the decoder's self- and cross-attention keep one count (CTranslate2)

    def __post_init__(self):
        _one_of(self.latency_engine, LATENCY_ENGINES, "--latency-engine")
        if self.cost != "latency" and (self.latency_engine != FAIRSEQ_ENGINE or self.latency_precision is not None):
            raise SettingsError("--latency-engine and --latency-precision go with --cost latency")
        _one_of(self.cost, COST_KINDS, "--cost")
        _one_of(self.structure, PRUNED_STRUCTURES, "--structure")
        if self.structure != "heads":
            if self.cost == "heads":
                raise SettingsError(f"--structure {self.structure} prunes FFN neurons: a budget of heads cannot "
                                    "count them; use --cost flops or --cost latency")
            self.importance = replace(self.importance, neurons=True)  # an estimate scores the neurons too
        elif self.neuron_step is not None:
            raise SettingsError("--neuron-step is for --structure ffn or joint")
        _refuse(self.tie_decoder_heads and not self.uniform, "--tie-decoder-heads goes with --uniform")
        if self.uniform and self.structure == "ffn":
            raise SettingsError("--uniform evens the heads kept per attention type: --structure heads or joint")
        _positive(self.neuron_step, "--neuron-step")
        if (self.cost == "latency") != (self.latency_table is not None):
            raise SettingsError("--cost latency needs --latency-table FILE (from the latency command), "
                                "and --latency-table goes with --cost latency")
        _positive(self.sequence_length, "--sequence-length")
        _positive(self.source_length, "--source-length")
        _positive(self.target_length, "--target-length")
        if self.cost != "decoding-flops" and (self.source_length is not None or self.target_length is not None):
            raise SettingsError("--source-length and --target-length shape the sentence --cost decoding-flops prices")
        if self.cost == "decoding-flops" and self.family != TRANSLATION_FAMILY:
            raise SettingsError("--cost decoding-flops prices a translation model's beam search; use --cost flops")
        if self.importance.method != "fisher":
            raise SettingsError("the search ranks by Fisher scores: estimate them with the fisher method")


@dataclass
class LatencySettings:
    """``latency``: each attention layer's time keeping 0 .. H heads, measured on this device."""

    data: str
    checkpoint: str
    out: str
    batch_size: int = 32
    # positions (fairseq: of every timed layer; ctranslate2: of the source sentences); None: fairseq 32,
    # ctranslate2 the mean source length of the data's valid split
    sequence_length: Optional[int] = None
    repeats: int = 20
    cpu: bool = False
    progress: bool = True
    fairseq_args: List[str] = field(default_factory=list)
    neuron_step: Optional[int] = None  # FFN layers timed keeping multiples of it (None: 16 steps per layer)
    engine: str = FAIRSEQ_ENGINE  # what runs the timed layers: fairseq (each layer alone) or ctranslate2 (the exported model)
    quantization: str = "float32"  # for ctranslate2: the compute type the exported model is timed at
    beam: Optional[int] = None  # for ctranslate2: the beam search timed (None: fairseq's --beam among fairseq_args)
    target_length: Optional[int] = None  # for ctranslate2: tokens generated (None: the valid split's mean target length)

    def __post_init__(self):
        for value, option in ((self.batch_size, "--batch-size"), (self.sequence_length, "--sequence-length"),
                              (self.repeats, "--repeats"), (self.neuron_step, "--neuron-step"), (self.beam, "--beam"),
                              (self.target_length, "--target-length")):
            _positive(value, option)
        if self.engine == FAIRSEQ_ENGINE and self.target_length is not None:
            raise SettingsError("--target-length shapes CTranslate2's decoding: add --engine ctranslate2 "
                                "(fairseq's table times each layer alone, on full sequences)")
        _one_of(self.engine, LATENCY_ENGINES, "--engine")
        _one_of(self.quantization, QUANTIZATIONS, "--quantization")
        if self.engine == FAIRSEQ_ENGINE and self.quantization != "float32":
            raise SettingsError("--quantization times a CTranslate2 model: add --engine ctranslate2")


@dataclass
class DynamicsSettings:
    """``dynamics``: the importance-order pruning curve at every epoch checkpoint (section 6)."""

    sweep: SweepSettings  # its checkpoint is unused: every epoch's is swept in turn
    checkpoints: str
    curve: CurveSettings = field(default_factory=CurveSettings)
    epochs: Optional[List[int]] = None  # None: every epoch found


@dataclass
class ExportSettings:
    """What ``export`` writes: a deployable model of a masked, tuned or shrunk checkpoint."""

    data: str
    checkpoint: str
    out_dir: str
    format: str = "ctranslate2"
    quantization: Optional[str] = None  # None: the weights' own type (float32)
    head_mask: Optional[str] = None
    ffn_mask: Optional[str] = None
    tuning_file: Optional[str] = None
    cpu: bool = False
    fairseq_args: Sequence[str] = ()
    vocabulary_map: bool = False  # translation: a vocabulary map from the training split, saved as vmap.txt
    vocabulary_map_candidates: int = 20  # candidates per source token
    vocabulary_map_common: int = 100  # the most frequent target tokens, always candidates

    def __post_init__(self):
        _refuse(self.vocabulary_map_candidates < 1, "--vocabulary-map-candidates must be positive, got "
                f"{self.vocabulary_map_candidates}")
        _refuse(self.vocabulary_map_common < 0, "--vocabulary-map-common must not be negative, got "
                f"{self.vocabulary_map_common}")
        if self.format not in EXPORT_FORMATS:
            raise SettingsError(f"--format {self.format}: expected one of {', '.join(EXPORT_FORMATS)}")
        if self.quantization is not None and self.quantization not in QUANTIZATIONS:
            raise SettingsError(f"--quantization {self.quantization}: expected one of {', '.join(QUANTIZATIONS)}")
