"""``search``'s record, ``OUT/search.json``: what the search kept within its budget, what it estimated and cost, written
and read by ``study.output.serialisation``.

Files written before this record called the heads pruned and their total ``pruned`` and ``total``
(``SearchFile.RENAMED``); they are read under the names compress's records use (``heads_pruned``, ``heads_total``).
"""

from dataclasses import dataclass, field
from typing import Any, ClassVar, Dict, Optional

from fairseq_headprune.study.output.serialisation import OMITTED_WHEN_DEFAULT, PlainRecord


@dataclass
class FlopsKept(PlainRecord):
    """The FLOPs per token of the attention and FFN layers the mask keeps, of the unpruned model's ``full``, with
    ``sequence_length`` attended positions per token (Kwon et al. 2022's cost)."""

    kept: float
    full: float
    unit: str
    sequence_length: int

    @property
    def share(self) -> float:
        return self.kept / self.full if self.full else float("nan")


@dataclass
class DecodingFlops(PlainRecord):
    """``--cost decoding-flops``: the sentence priced (``source_length`` tokens, ``target_steps`` decoder steps at
    ``beam``; </s> included), the FLOPs its attention and FFN layers keep of ``layers_full``, and the output
    projection's, which no pruning removes."""

    source_length: int
    target_steps: int
    beam: int
    layers_kept: float
    layers_full: float
    output_projection: float

    def layers_share(self, layers_full: Optional[float] = None) -> float:
        """The layers' FLOPs kept, of ``layers_full`` (the unpruned model's; default: this search's model's)."""
        return self.layers_kept / (self.layers_full if layers_full is None else layers_full)

    def whole_share(self, layers_full: Optional[float] = None) -> float:
        """The model's FLOPs kept with the output projection."""
        full = self.layers_full if layers_full is None else layers_full
        return (self.layers_kept + self.output_projection) / (full + self.output_projection)


@dataclass
class TuningSummary(PlainRecord):
    """Mask tuning by least squares (``study.search.tuning``): the layers, those fitted, the mean relative errors
    of the binary and the tuned mask, and (compress) the sentences it was fitted on."""

    layers: int
    fitted: int
    mean_error_binary: float
    mean_error_tuned: float
    sentences: Optional[int] = field(default=None, metadata=OMITTED_WHEN_DEFAULT)


@dataclass
class SearchFile(PlainRecord):
    """``OUT/search.json``: the search's settings (``budget`` as given, e.g. ``50%``), the masks it kept (``spec``,
    ``ffn_spec``), how many units it pruned, the FLOPs and decoding FLOPs kept, the latency table's predicted
    speed-up, the seconds of each step, the search's own summary (``result``) and the tuning's (``tuning``)."""

    RENAMED: ClassVar[Dict[str, str]] = {"pruned": "heads_pruned", "total": "heads_total"}

    checkpoint: str
    budget: str
    cost: str
    structure: str
    full_cost: float
    spec: str
    heads_pruned: int
    heads_total: int
    uniform: bool = False
    latency_table: Optional[str] = None
    sequence_length: Optional[int] = None
    fisher: str = ""
    fisher_sentences: Optional[int] = None
    ffn_spec: Optional[str] = None
    neurons_pruned: Optional[int] = None
    neurons_total: Optional[int] = None
    flops: Optional[FlopsKept] = None
    decoding_flops: Optional[DecodingFlops] = None
    predicted_speedup: Optional[float] = None
    prediction_note: Optional[str] = None
    seconds: Dict[str, float] = field(default_factory=dict)
    result: Dict[str, Any] = field(default_factory=dict)
    tuning: Optional[TuningSummary] = None


