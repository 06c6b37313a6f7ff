"""Timed decoding as records: one row per system and batch size, and the one speed-up estimator.

Every system is timed in its own process, the order rotated round by round
(``engine.timing.isolated``): round i holds one pass of each system, close in
time. A speed-up is therefore the median over the rounds of the two systems'
ratio in that round (``paired_speedup``), so that the machine's drift from one
round to the next cancels; the plan of ``compress --target speedup`` and the
speed stage use this one estimator.
"""

import statistics
from dataclasses import dataclass, field, fields
from typing import Any, Dict, List, Mapping, Optional, Sequence

from fairseq_headprune.constants import CTRANSLATE2_ENGINE

VMAP_SUFFIX = " vmap"  # how a system timed with its vocabulary map is named


def paired_speedup(reference_seconds: Sequence[float], seconds: Sequence[float]) -> float:
    """How many times faster a system decodes than ``reference``: the median over the rounds of the reference's
    time over the system's in that round (the two lists in round order, one pass of each per round)."""
    if not seconds or len(seconds) != len(reference_seconds):
        raise ValueError(f"a paired speed-up needs one pass of each system per round, got {len(reference_seconds)} "
                         f"and {len(seconds)}")
    return statistics.median(whole / mine for whole, mine in zip(reference_seconds, seconds))


def round_share(seconds: Sequence[float], whole_seconds: Sequence[float]) -> float:
    """A system's time as a share of the whole model's, with the same pairing as ``paired_speedup``: the median
    over the rounds of the ratio of their passes in that round."""
    return statistics.median(mine / whole for mine, whole in zip(seconds, whole_seconds))


@dataclass
class SpeedRow:
    """One system timed at one batch size (``engine.compression.deployment.speed_rows``): its rates and its
    speed-ups. ``speedup_like_for_like`` is against the unpruned model in the same engine, compute type and
    vocabulary-map setting at the run's beam; ``speedup_vs_stock_conversion`` against the unpruned model converted as
    it is (same compute type, no map); with ``beam`` (``--speed-beams``) ``speedup_vs_run_beam`` is against the
    unpruned model at the run's beam, timed in the same rotation (``run_beam_seconds``)."""

    batch_size: int
    system: str  # "fairseq compressed", "ct2 unpruned float32 vmap"
    engine: str
    weights: str  # unpruned or compressed
    precision: str  # fairseq's dtype or CTranslate2's compute type
    seconds: List[float] = field(default_factory=list)  # one pass per round, in round order
    sentences: int = 0
    sentences_per_second: float = 0.0  # median over the rounds
    sentences_per_second_min: float = 0.0
    sentences_per_second_max: float = 0.0
    sentences_per_second_iqr: float = 0.0
    tokens_per_second: float = 0.0
    speedup_vs_fairseq_unpruned: Optional[float] = None
    speedup_like_for_like: Optional[float] = None
    speedup_vs_stock_conversion: Optional[float] = None
    bleu: Optional[float] = None  # sacreBLEU on the timed sentences' tokens (translation)
    same_hypotheses_as: Optional[str] = None
    same_hypotheses: Optional[int] = None
    vocabulary_mapped: bool = False  # decoded with CTranslate2's vocabulary map
    beam: Optional[int] = None  # --speed-beams: the beam this row decoded at (None: the run's)
    run_beam_seconds: Optional[List[float]] = None
    speedup_vs_run_beam: Optional[float] = None

    @property
    def compressed(self) -> bool:
        return self.weights == "compressed"

    @property
    def ctranslate2(self) -> bool:
        return self.engine == CTRANSLATE2_ENGINE

    def to_dict(self) -> Dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        if self.beam is None:  # a row at the run's beam has no beam columns
            del data["beam"], data["speedup_vs_run_beam"]
        if self.run_beam_seconds is None:
            del data["run_beam_seconds"]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "SpeedRow":
        """A row as written. Rows written before ``vocabulary_mapped`` was a field say it by the name's suffix;
        rows of compress report format 1 are read into format 2's speed-ups (``_speedups_of_format_1``)."""
        data = _speedups_of_format_1(data)
        known = {f.name for f in fields(cls)}
        values = {key: value for key, value in data.items() if key in known}
        values.setdefault("vocabulary_mapped", str(data.get("system", "")).endswith(VMAP_SUFFIX))
        values.setdefault("precision", "")
        return cls(**values)


def _speedups_of_format_1(row: Mapping[str, Any]) -> Dict[str, Any]:
    """A speed row of compress report format 1 (``speedup_vs_ct2_unpruned_same_precision``: against the unpruned
    model without a map; ``speedup_vs_ct2_unpruned_vmap``: a mapped model against the mapped unpruned one) in format
    2's names; a row of format 2 as it is."""
    row = dict(row)
    if "speedup_like_for_like" in row:
        return row
    stock, mapped = row.pop("speedup_vs_ct2_unpruned_same_precision", None), row.pop("speedup_vs_ct2_unpruned_vmap",
                                                                                       None)
    ct2 = row.get("engine") == CTRANSLATE2_ENGINE
    if row.get("weights") != "compressed":
        like = None
    elif not ct2:
        like = row.get("speedup_vs_fairseq_unpruned")
    else:
        like = mapped if row.get("system", "").endswith(VMAP_SUFFIX) else stock
    row.update(speedup_like_for_like=like, speedup_vs_stock_conversion=stock if ct2 else None)
    return row


def compressed_speedups(rows: Sequence[SpeedRow], engine: str = CTRANSLATE2_ENGINE, vocabulary_mapped: bool = True,
                        against_run_beam: bool = False) -> Dict[str, float]:
    """The compressed model's speed-up per batch size (as text) in ``engine`` with (or without) the vocabulary map:
    like for like, or, for rows at another beam, against the unpruned model at the run's beam."""
    speedups = {}
    for row in rows:
        value = row.speedup_vs_run_beam if against_run_beam else row.speedup_like_for_like
        if row.compressed and row.engine == engine and row.vocabulary_mapped == vocabulary_mapped and value is not None:
            speedups[str(row.batch_size)] = value
    return speedups
