"""Timed decoding as records: one row per system and batch size, and the one speed-up estimator.

Every system is timed in its own process, the order rotated round by round
(``engine.timing.isolated``): round i holds one pass of each system, close in
time. A speed-up is therefore the median over the rounds of the two systems'
ratio in that round (``paired_speedup``), so that the machine's drift from one
round to the next cancels; the plan of ``compress --target speedup`` and the
speed stage use this one estimator.
"""

import math
import statistics
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence

from fairseq_headprune.constants import CTRANSLATE2_ENGINE
from fairseq_headprune.study.output.serialisation import OMITTED_WHEN_DEFAULT, PlainRecord

VMAP_SUFFIX = " vmap"  # how a system timed with its vocabulary map is named


# the coverage asked of a speed-up's interval over the timing rounds (``paired_speedup_interval``)
SPEEDUP_CONFIDENCE = 0.9


def round_ratios(reference_seconds: Sequence[float], seconds: Sequence[float]) -> List[float]:
    """Each round's speed-up: the reference's time over the system's in that round (the two lists in round
    order, one pass of each per round)."""
    if not seconds or len(seconds) != len(reference_seconds):
        raise ValueError(f"a paired speed-up needs one pass of each system per round, got {len(reference_seconds)} "
                         f"and {len(seconds)}")
    return [whole / mine for whole, mine in zip(reference_seconds, seconds)]


def paired_speedup(reference_seconds: Sequence[float], seconds: Sequence[float]) -> float:
    """How many times faster a system decodes than ``reference``: the median of the rounds' ratios."""
    return statistics.median(round_ratios(reference_seconds, seconds))


def median_interval_rank(rounds: int, confidence: float = SPEEDUP_CONFIDENCE) -> int:
    """The rank k (from 1) of the distribution-free interval for a median from ``rounds`` values: the k-th
    smallest to the k-th largest covers the median with probability 1 - 2 P(B < k), B ~ Binomial(rounds, 1/2)
    (the sign test's interval, Conover, Practical Nonparametric Statistics, 3.2); the largest k whose coverage
    is at least ``confidence``, and 1 (the smallest to the largest) when too few rounds reach it."""
    fitting = [k for k in range(1, rounds // 2 + 1) if _coverage(rounds, k) >= confidence]
    return max(fitting, default=1)


def _coverage(rounds: int, k: int) -> float:
    return 1.0 - 2.0 * sum(math.comb(rounds, i) for i in range(k)) / 2.0 ** rounds


def median_interval_coverage(rounds: int, confidence: float = SPEEDUP_CONFIDENCE) -> float:
    """What the interval of ``median_interval_rank`` covers: 1 - 2 P(B < k)."""
    return _coverage(rounds, median_interval_rank(rounds, confidence))


def paired_speedup_interval(reference_seconds: Sequence[float], seconds: Sequence[float],
                            confidence: float = SPEEDUP_CONFIDENCE) -> List[float]:
    """The interval, over the timing rounds, of the paired speed-up: the rounds' ratios' k-th smallest and k-th
    largest (``median_interval_rank``), [low, high]. The accept rule of ``compress --target speedup`` reads its
    low end: a speed-up measured a hair above the target with rounds spread far below it is not fast enough."""
    ratios = sorted(round_ratios(reference_seconds, seconds))
    k = median_interval_rank(len(ratios), confidence)
    return [ratios[k - 1], ratios[-k]]


def round_share(seconds: Sequence[float], whole_seconds: Sequence[float]) -> float:
    """A system's time as a share of the whole model's, with the same pairing as ``paired_speedup``: the median
    over the rounds of the ratio of their passes in that round."""
    return statistics.median(mine / whole for mine, whole in zip(seconds, whole_seconds))


@dataclass
class SpeedRow(PlainRecord):
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
    # --speed-beams: the beam this row decoded at (None: the run's; a row at the run's beam has no beam columns)
    beam: Optional[int] = field(default=None, metadata=OMITTED_WHEN_DEFAULT)
    run_beam_seconds: Optional[List[float]] = field(default=None, metadata=OMITTED_WHEN_DEFAULT)
    speedup_vs_run_beam: Optional[float] = field(default=None, metadata=OMITTED_WHEN_DEFAULT)
    # [low, high] over the timing rounds (``paired_speedup_interval``) of the like-for-like and run-beam speed-ups
    speedup_like_for_like_interval: Optional[List[float]] = field(default=None, metadata=OMITTED_WHEN_DEFAULT)
    speedup_vs_run_beam_interval: Optional[List[float]] = field(default=None, metadata=OMITTED_WHEN_DEFAULT)

    @property
    def compressed(self) -> bool:
        return self.weights == "compressed"

    @property
    def ctranslate2(self) -> bool:
        return self.engine == CTRANSLATE2_ENGINE

    @classmethod
    def upgrade(cls, data: Mapping[str, Any]) -> Mapping[str, Any]:
        """Rows written before ``vocabulary_mapped`` was a field say it by the name's suffix; rows of compress
        report format 1 are read into format 2's speed-ups (``_speedups_of_format_1``)."""
        data = _speedups_of_format_1(data)
        data.setdefault("vocabulary_mapped", str(data.get("system", "")).endswith(VMAP_SUFFIX))
        data.setdefault("precision", "")
        return data


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


class Speedups(Dict[int, float]):
    """Speed-ups over the unpruned model, one per batch size (an int), in the order timed. A target is reached when
    the slowest batch size's reaches it; JSON holds them as ``{"8": 2.1}`` (``to_dict``), read back by ``of``."""

    @classmethod
    def of(cls, data: Optional[Mapping[Any, float]]) -> "Speedups":
        return cls({int(batch): float(value) for batch, value in (data or {}).items()})

    from_plain = of  # how study.output.serialisation reads them

    @property
    def slowest_batch(self) -> Optional[int]:
        return min(self, key=self.get) if self else None

    @property
    def slowest(self) -> float:
        """The speed-up at the slowest batch size (0 when nothing was timed)."""
        return min(self.values(), default=0.0)

    def reaches(self, factor: float) -> bool:
        """The one test of fast enough: ``factor`` or more at every batch size."""
        return bool(self) and self.slowest >= factor

    def over(self, base: Mapping[int, float]) -> "Speedups":
        """What these buy on top of ``base`` at each batch size both hold."""
        return Speedups({batch: value / base[batch] for batch, value in self.items() if batch in base})

    def text(self, batches: Optional[Sequence[int]] = None, lows: Optional[Mapping[int, float]] = None) -> str:
        """``2.10x at batch 1, 1.95x at batch 8`` (``batches``: those, in that order, where timed; ``lows``: each
        with the low end of its interval, ``2.10x (low 2.02x)``)."""
        shown = [batch for batch in (self if batches is None else batches) if batch in self]
        return ", ".join(f"{self[batch]:.2f}x"
                         + ("" if lows is None else f" (low {lows.get(batch, self[batch]):.2f}x)")
                         + f" at batch {batch}" for batch in shown)

    def to_dict(self) -> Dict[str, float]:
        return {str(batch): value for batch, value in self.items()}


def compressed_speedups(rows: Sequence[SpeedRow], engine: str = CTRANSLATE2_ENGINE, vocabulary_mapped: bool = True,
                        against_run_beam: bool = False) -> Speedups:
    """The compressed model's speed-up per batch size in ``engine`` with (or without) the vocabulary map:
    like for like, or, for rows at another beam, against the unpruned model at the run's beam."""
    return Speedups({batch: value for batch, value, _ in _compressed(rows, engine, vocabulary_mapped,
                                                                     against_run_beam)})


def compressed_speedup_lows(rows: Sequence[SpeedRow], engine: str = CTRANSLATE2_ENGINE, vocabulary_mapped: bool = True,
                            against_run_beam: bool = False) -> Speedups:
    """The low end of each of ``compressed_speedups``'s speed-ups over the timing rounds; a row written without
    its interval gives its speed-up itself."""
    return Speedups({batch: interval[0] if interval else value
                     for batch, value, interval in _compressed(rows, engine, vocabulary_mapped, against_run_beam)})


def _compressed(rows, engine, vocabulary_mapped, against_run_beam):
    """(batch size, speed-up, its interval or None) of each compressed row of ``engine`` and map setting."""
    for row in rows:
        value, interval = ((row.speedup_vs_run_beam, row.speedup_vs_run_beam_interval) if against_run_beam else
                           (row.speedup_like_for_like, row.speedup_like_for_like_interval))
        if row.compressed and row.engine == engine and row.vocabulary_mapped == vocabulary_mapped and value is not None:
            yield int(row.batch_size), value, interval
