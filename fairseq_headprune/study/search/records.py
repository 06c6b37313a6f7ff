"""``search``'s record, ``OUT/search.json``: what the search kept within its budget, what it estimated and cost, written
and read by ``study.output.serialisation``.

Files written before this record called the heads pruned and their total ``pruned`` and ``total``
(``SearchFile.RENAMED``); they are read under the names compress's records use (``heads_pruned``, ``heads_total``).
"""

from dataclasses import dataclass, field
from typing import Any, ClassVar, Dict, Optional

from fairseq_headprune.study.output.serialisation import PlainRecord


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
    flops: Dict[str, Any] = field(default_factory=dict)
    decoding_flops: Optional[Dict[str, Any]] = None
    predicted_speedup: Optional[float] = None
    prediction_note: Optional[str] = None
    seconds: Dict[str, float] = field(default_factory=dict)
    result: Dict[str, Any] = field(default_factory=dict)
    tuning: Optional[Dict[str, Any]] = None


