"""Typed settings of the studies, validated once where they are made.

The commands turn their parsed options into these dataclasses; everything
below the command layer receives settings, never an argparse namespace. Each
check names the setting a user would correct (as peft's configs do) in plain
words, and raises ``SettingsError`` with that setting, which the commands
print as one line, naming the flag the user gave it by (``errors``).
"""

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Union

from fairseq_headprune.constants import (
    ATTENTION_TYPES,
    CLASSIFIER_FAMILY,
    DEFAULT_CONFIGS_PER_BATCH,
    DEFAULT_GRANULARITY,
    DEFAULT_IMPORTANCE_LOSS,
    DEFAULT_IMPORTANCE_METHOD,
    DEFAULT_LABEL_SMOOTHING,
    GRANULARITIES,
    IMPORTANCE_LOSSES,
    IMPORTANCE_METHODS,
    LANGUAGE_MODEL_FAMILY,
    MODEL_FAMILIES,
    TRANSLATION_FAMILY,
)
from fairseq_headprune.errors import HeadMaskError, SettingsError, setting_words
from fairseq_headprune.study.masks.head_mask import parse_attention_type
from fairseq_headprune.study.statistics.metrics import BLEU_METRICS, CLASSIFICATION_METRICS, PERPLEXITY, Metric
from fairseq_headprune.study.statistics.significance import SignificanceSettings

DETOKENIZERS = ("auto", "moses", "none")


def check_positive(value: Optional[float], setting: str) -> None:
    refuse(value is not None and not value > 0, f"{setting_words(setting)} must be positive, got {value}", setting)


def refuse(condition: bool, message: str, setting: Union[str, Sequence[str], None] = None) -> None:
    """``SettingsError(message, setting)`` if ``condition``."""
    if condition:
        raise SettingsError(message, setting=setting)


def check_one_of(value: str, allowed: Sequence[str], setting: str) -> None:
    refuse(value not in allowed, f"{setting_words(setting)} must be one of {', '.join(allowed)}", setting)


def parse_choices(text: str, allowed: Sequence[str], setting: str) -> List[str]:
    """Comma- or space-separated values of ``allowed`` (or ``none``), in ``allowed``'s order."""
    if text.strip().lower() == "none":
        return []
    values = [v for v in text.replace(",", " ").split() if v]
    for value in values:
        refuse(value not in allowed,
               f"{setting_words(setting)}: unknown value {value!r} (expected {', '.join(allowed)})", setting)
    refuse(not values, f"{setting_words(setting)} is empty", setting)
    return [v for v in allowed if v in values]


def options_as_settings(arguments: Sequence[str]) -> Dict[str, object]:
    """Command-line options passed on (fairseq's ``--beam 5 --lenpen 1``) as settings: option -> its value
    (its values, a list, where it takes several; True where it takes none), the last of an option given twice,
    so that the same options in another order are the same settings."""
    settings: Dict[str, object] = {}
    option = None
    for argument in arguments:
        if argument.startswith("-") and not _is_number(argument):
            option, _, value = argument.partition("=")
            settings[option] = value if value else True
            continue
        if option is None:
            settings.setdefault("", []).append(argument)  # a value before any option: kept, in order
            continue
        held = settings[option]
        settings[option] = argument if held is True else (held if isinstance(held, list) else [held]) + [argument]
    return dict(sorted(settings.items()))


def settings_as_options(settings) -> List[str]:
    """``options_as_settings`` undone: the options as a command line again (a list recorded before options were
    settings is returned as it is)."""
    if isinstance(settings, (list, tuple)):
        return list(settings)
    arguments: List[str] = list(settings.get("", []))
    for option, value in settings.items():
        if option == "":
            continue
        arguments.append(option)
        if value is not True:
            arguments += list(value) if isinstance(value, list) else [value]
    return arguments


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def parse_types(text: Optional[str]) -> List[str]:
    """``types``: attention types by any alias (``'enc-dec'``, ``'E,D'``); all three when not given (None)."""
    if text is None:
        return list(ATTENTION_TYPES)
    refuse(not text.replace(",", " ").split(), "the types is empty: name attention types (e.g. 'enc-dec' or 'E,D'), "
           "or leave the option out for all three", "types")
    try:
        types = [parse_attention_type(t) for t in text.replace(",", " ").split()]
    except HeadMaskError as error:
        raise SettingsError(f"the types: {error}", setting="types") from error
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
    neurons: bool = False  # also score every FFN neuron (zeta_i) from the same backward pass

    def __post_init__(self):
        for name in ("max_tokens", "max_sentences", "limit"):
            check_positive(getattr(self, name), self.setting(name))
        check_one_of(self.granularity, GRANULARITIES, self.setting("granularity"))
        check_one_of(self.method, IMPORTANCE_METHODS, self.setting("method"))
        check_one_of(self.loss, IMPORTANCE_LOSSES, self.setting("loss"))
        if not 0.0 <= self.label_smoothing < 1.0:
            raise SettingsError(f"the importance label smoothing must be in [0, 1), got {self.label_smoothing}",
                                setting=self.setting("label_smoothing"))
        refuse(not self.subsets, "the importance subset names no split", self.setting("subset"))

    @staticmethod
    def setting(name: str) -> str:
        """The setting a field is named by (``importance_limit``): the commands' ``--importance-*`` options."""
        return "importance_" + ("batch_size" if name == "max_sentences" else name)


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
    # None: left open, the engine decides (the CPU's default, or what the GPU's free memory takes)
    configs_per_batch: Optional[int] = None
    share_encoder: bool = True  # one encoder pass for configurations batched together that mask no Enc-Enc head
    cpu: bool = False
    progress: bool = True
    generation_args: List[str] = field(default_factory=list)  # passed to fairseq-generate's parser
    family: str = TRANSLATION_FAMILY
    metric_name: Optional[str] = None  # classifiers: a key of CLASSIFICATION_METRICS (default accuracy)
    # configs_per_batch chosen for the device: a batch of configurations that runs out of its memory is split
    configs_per_batch_chosen: bool = False

    def __post_init__(self):
        if self.family not in MODEL_FAMILIES:
            raise SettingsError(f"unknown model family {self.family!r} (expected {', '.join(MODEL_FAMILIES)})")
        self._check_family_options()
        check_one_of(self.bleu, BLEU_METRICS, "bleu")
        check_one_of(self.detokenize, DETOKENIZERS, "sacrebleu_detokenize")
        check_positive(self.configs_per_batch, "configs_per_batch")
        self.metric.for_test(self.test.test)  # the test must apply to the metric: say so before any work
        if self.references and self.bleu != "sacrebleu":
            raise SettingsError("the references (raw reference text) is used by the BLEU sacrebleu only",
                                setting=("references", "bleu"))
        if not any(a.startswith("--required-batch-size-multiple") for a in self.generation_args):
            # fairseq's generation batching leaves out the last (sentences mod 8) sentences of
            # a split when batches must be multiples of 8 (its default): score every sentence
            self.generation_args = list(self.generation_args) + ["--required-batch-size-multiple", "1"]

    def _check_family_options(self) -> None:
        """Options that belong to another family of models are named, not ignored."""
        if self.family == TRANSLATION_FAMILY:
            if self.metric_name is not None:
                raise SettingsError("the metric is for classifier checkpoints; a translation study reports the BLEU",
                                    setting=("metric", "bleu"))
            return
        kind = "a classifier" if self.family == CLASSIFIER_FAMILY else "a language model"
        if self.bleu != "tokenized" or self.references or self.detokenize != "auto":
            raise SettingsError(f"the BLEU, the references and the sacreBLEU detokenizer are for translation, not "
                                f"{kind}", setting=("bleu", "references", "sacrebleu_detokenize"))
        if self.family == CLASSIFIER_FAMILY and self.metric_name not in (None, *CLASSIFICATION_METRICS):
            raise SettingsError(f"the metric must be one of {', '.join(CLASSIFICATION_METRICS)} for a classifier",
                                setting="metric")
        if self.family == LANGUAGE_MODEL_FAMILY and self.metric_name not in (None, PERPLEXITY.name):
            raise SettingsError(f"the metric {self.metric_name}: a language model is scored by perplexity (ppl)",
                                setting="metric")

    @property
    def batch_configs(self) -> int:
        """Configurations translated together: as given or chosen, else the default."""
        return self.configs_per_batch or DEFAULT_CONFIGS_PER_BATCH

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


