"""What a deployed model is measured and exported with: the decoding-speed settings every timing shares
(``compress``'s speed stage, the benchmarks) and the export's (``export``, ``compress --export``)."""

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

from fairseq_headprune.constants import QUANTIZATIONS
from fairseq_headprune.errors import SettingsError, setting_words
from fairseq_headprune.study.masks.ffn_mask import FfnMask
from fairseq_headprune.study.masks.head_mask import HeadMask
from fairseq_headprune.study.settings import check_one_of, refuse

DEFAULT_SPEED_BATCH_SIZES = (1, 64)
DEFAULT_SPEED_SENTENCES = 300
DEFAULT_SPEED_REPEATS = 5
PRECISIONS = ("float32", "float16", "bfloat16")
DEPLOY_DEVICES = ("cpu", "cuda")


@dataclass
class DeploymentSettings:
    """How decoding speed is measured: the same sentences at each batch size, repeats interleaved."""

    batch_sizes: List[int] = field(default_factory=lambda: list(DEFAULT_SPEED_BATCH_SIZES))
    sentences: Optional[int] = DEFAULT_SPEED_SENTENCES  # first N sentences of the split (None: all)
    repeats: int = DEFAULT_SPEED_REPEATS
    threads: Optional[int] = None  # CPU threads of both engines (None: torch's current setting)
    precision: str = "float32"  # what fairseq translates in (float16, bfloat16: fairseq's --fp16, --bf16)
    beams: List[int] = field(default_factory=list)  # translation: also evaluated and timed at these beam sizes
    device: str = "cpu"  # where the models are timed (and the CTranslate2 weight type checked): the deployment's

    def __post_init__(self):
        if not self.batch_sizes or any(b < 1 for b in self.batch_sizes):
            raise SettingsError(f"the speed batch sizes must be positive numbers, got {self.batch_sizes}",
                                setting="speed_batch_sizes")
        check_one_of(self.precision, PRECISIONS, "precision")
        check_one_of(self.device, DEPLOY_DEVICES, "deploy_device")
        if any(beam < 1 for beam in self.beams):
            raise SettingsError(f"the speed beams must be positive beam sizes, got {self.beams}", setting="speed_beams")
        for value, setting in ((self.sentences, "speed_sentences"), (self.repeats, "repeats"),
                               (self.threads, "threads")):
            if value is not None and value < 1:
                raise SettingsError(f"{setting_words(setting)} must be positive, got {value}", setting=setting)

    def to_dict(self) -> Dict[str, object]:
        return {"batch_sizes": list(self.batch_sizes), "sentences": self.sentences, "repeats": self.repeats,
                "threads": self.threads, **({"beams": list(self.beams)} if self.beams else {}),
                **({"device": self.device} if self.device != "cpu" else {})}


@dataclass
class ExportSettings:
    """What ``export`` writes: a deployable model of a masked, tuned or shrunk checkpoint (``head_mask`` and
    ``ffn_mask``: masks of the model the checkpoint loads as, ``checkpoints.info.loaded_head_layout``)."""

    data: str
    checkpoint: str
    out_dir: str
    format: str = "ctranslate2"
    quantization: Optional[str] = None  # None: the weights' own type (float32)
    head_mask: Optional[HeadMask] = None  # heads left out besides those the checkpoint records
    ffn_mask: Optional[FfnMask] = None
    tuning_file: Optional[str] = None
    cpu: bool = False
    fairseq_args: Sequence[str] = ()
    vocabulary_map: bool = False  # translation: a vocabulary map from the training split, saved as vmap.txt
    vocabulary_map_candidates: int = 20  # candidates per source token
    vocabulary_map_common: int = 100  # the most frequent target tokens, always candidates

    def __post_init__(self):
        refuse(self.vocabulary_map_candidates < 1, "the vocabulary map candidates must be positive, got "
               f"{self.vocabulary_map_candidates}", "vocabulary_map_candidates")
        refuse(self.vocabulary_map_common < 0, "the vocabulary map common must not be negative, got "
               f"{self.vocabulary_map_common}", "vocabulary_map_common")
        if self.quantization is not None and self.quantization not in QUANTIZATIONS:
            raise SettingsError(f"the quantization {self.quantization}: expected one of {', '.join(QUANTIZATIONS)}",
                                setting="quantization")
