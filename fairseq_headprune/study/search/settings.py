"""Settings of Kwon et al.'s search, mask tuning and the latency tables, validated where they are made."""

from dataclasses import dataclass, field, replace
from typing import List, Optional

from fairseq_headprune.constants import (
    COST_KINDS,
    DEFAULT_HELD_ASIDE,
    DEFAULT_MAX_CONDITION,
    DEFAULT_SCALE_BOUND,
    DEFAULT_SEQUENCE_LENGTH,
    DEFAULT_TUNE_LAYERS,
    DEFAULT_TUNE_LIMIT,
    FAIRSEQ_ENGINE,
    LATENCY_ENGINES,
    PRUNED_STRUCTURES,
    QUANTIZATIONS,
    TRANSLATION_FAMILY,
    TUNE_LAYERS,
)
from fairseq_headprune.errors import SettingsError
from fairseq_headprune.study.search.costs import SearchBudget
from fairseq_headprune.study.settings import ImportanceSettings, check_one_of, check_positive, refuse


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
        refuse(not self.subsets, "the tune subset names no split", "tune_subset")
        refuse(not 0 < self.held_aside < 1, f"the tune held aside must be between 0 and 1, got {self.held_aside:g}",
               "tune_held_aside")
        if self.layers not in TUNE_LAYERS:
            raise SettingsError(f"the tune layers must be one of {', '.join(TUNE_LAYERS)}, got {self.layers!r}",
                                setting="tune_layers")
        for value, setting in ((self.limit, "tune_limit"), (self.max_tokens, "tune_max_tokens")):
            check_positive(value, setting)
        refuse(not self.scale_bound > 0, f"the tune scale bound must be positive, got {self.scale_bound:g}",
               "tune_scale_bound")
        refuse(not self.max_condition > 1, f"the tune max condition must be above 1, got {self.max_condition:g}",
               "tune_max_condition")
        tests = [s for s in self.subsets if s.startswith("test")]
        if tests:
            raise SettingsError(f"the tune subset {tests[0]}: masks are tuned on training or validation data, never "
                                "on a test split", setting="tune_subset")

    def refuse_evaluation_split(self, split: str) -> None:
        """The study's evaluation split must not be tuned on."""
        if split in self.subsets:
            raise SettingsError(f"the tune subset {split} is the split the study is evaluated on (the gen subset); "
                                "tune on training or validation data", setting=("tune_subset", "gen_subset"))


@dataclass
class SearchSettings:
    """``search``: the mask that minimises the Fisher loss estimate within a budget (Kwon et al. 2022)."""

    data: str
    checkpoint: str
    out_dir: str
    budget: SearchBudget  # an amount (heads, FLOPs per token, ms) or a percentage of the unpruned model's cost
    cost: str = "heads"
    latency_table: Optional[str] = None
    sequence_length: int = DEFAULT_SEQUENCE_LENGTH  # the FLOPs cost's attended positions
    # decoding-flops: the sentence decoded (None: the valid split's mean lengths, fairseq's --beam)
    source_length: Optional[int] = None
    target_length: Optional[int] = None
    beam: Optional[int] = None  # set from fairseq's --beam by the search
    fisher_file: Optional[str] = None  # importance.json estimated with the fisher method; default: estimate
    importance: ImportanceSettings = field(default_factory=lambda: ImportanceSettings(method="fisher"))
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
    # with uniform: the decoder's self- and cross-attention keep one count (CTranslate2)
    tie_decoder_heads: bool = False
    # every layer keeps this share of its heads (and FFN neurons), those of highest Fisher information: the shape a
    # speed-up plan timed, the budget choosing nothing (None: the budget chooses)
    width: Optional[float] = None

    def __post_init__(self):
        check_one_of(self.latency_engine, LATENCY_ENGINES, "latency_engine")
        if self.cost != "latency" and (self.latency_engine != FAIRSEQ_ENGINE or self.latency_precision is not None):
            raise SettingsError("the latency engine and the latency precision go with the cost latency",
                                setting=("latency_engine", "latency_precision", "cost"))
        check_one_of(self.cost, COST_KINDS, "cost")
        check_one_of(self.structure, PRUNED_STRUCTURES, "structure")
        if self.structure != "heads":
            if self.cost == "heads":
                raise SettingsError(f"the structure {self.structure} prunes FFN neurons: a budget of heads cannot "
                                    "count them; use the cost flops or the cost latency", setting=("structure", "cost"))
            self.importance = replace(self.importance, neurons=True)  # an estimate scores the neurons too
        elif self.neuron_step is not None:
            raise SettingsError("the neuron step is for the structure ffn or joint",
                                setting=("neuron_step", "structure"))
        refuse(self.tie_decoder_heads and not self.uniform, "the tie decoder heads goes with the uniform",
               ("tie_decoder_heads", "uniform"))
        if self.uniform and self.structure == "ffn":
            raise SettingsError("the uniform evens the heads kept per attention type: the structure heads or joint",
                                setting=("uniform", "structure"))
        check_positive(self.neuron_step, "neuron_step")
        refuse(self.width is not None and not 0.0 < self.width <= 1.0, "the width is a share above 0, at most 1",
               ("width",))
        if (self.cost == "latency") != (self.latency_table is not None):
            raise SettingsError("the cost latency needs the latency table FILE (from the latency command), "
                                "and the latency table goes with the cost latency", setting=("cost", "latency_table"))
        check_positive(self.sequence_length, "sequence_length")
        check_positive(self.source_length, "source_length")
        check_positive(self.target_length, "target_length")
        if self.cost != "decoding-flops" and (self.source_length is not None or self.target_length is not None):
            raise SettingsError("the source length and the target length shape the sentence the cost decoding-flops "
                                "prices", setting=("source_length", "target_length", "cost"))
        if self.cost == "decoding-flops" and self.family != TRANSLATION_FAMILY:
            raise SettingsError("the cost decoding-flops prices a translation model's beam search; use the cost flops",
                                setting="cost")
        if self.importance.method != "fisher":
            raise SettingsError("the search ranks by Fisher scores: estimate them with the importance method fisher",
                                setting="importance_method")


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
    # what runs the timed layers: fairseq (each layer alone) or ctranslate2 (the exported model)
    engine: str = FAIRSEQ_ENGINE
    quantization: str = "float32"  # for ctranslate2: the compute type the exported model is timed at
    beam: Optional[int] = None  # for ctranslate2: the beam search timed (None: fairseq's --beam among fairseq_args)
    # for ctranslate2: tokens generated (None: the valid split's mean target length)
    target_length: Optional[int] = None

    def __post_init__(self):
        for value, setting in ((self.batch_size, "batch_size"), (self.sequence_length, "sequence_length"),
                               (self.repeats, "repeats"), (self.neuron_step, "neuron_step"), (self.beam, "beam"),
                               (self.target_length, "target_length")):
            check_positive(value, setting)
        if self.engine == FAIRSEQ_ENGINE and self.target_length is not None:
            raise SettingsError("the target length shapes CTranslate2's decoding: add the engine ctranslate2 "
                                "(fairseq's table times each layer alone, on full sequences)",
                                setting=("target_length", "engine"))
        check_one_of(self.engine, LATENCY_ENGINES, "engine")
        check_one_of(self.quantization, QUANTIZATIONS, "quantization")
        if self.engine == FAIRSEQ_ENGINE and self.quantization != "float32":
            raise SettingsError("the quantization times a CTranslate2 model: add the engine ctranslate2",
                                setting=("quantization", "engine"))
