"""Beam search's options as both engines take them, and the figures of timed passes (plain data; no fairseq).

A speed measured in deployment is only comparable when both engines decode
the same sentences with the same beam, length penalty and length limits, and
when the machine's drift falls on every system alike (the timing itself is
``engine.timing``); this module holds what both sides agree on.
"""

import statistics
from dataclasses import dataclass
from typing import Dict, List, Sequence

from fairseq_headprune.study.output.serialisation import PlainRecord


@dataclass
class DecodingOptions(PlainRecord):
    """Beam search as fairseq-generate's options set it, given to both engines."""

    beam: int = 5
    lenpen: float = 1.0
    max_len_a: float = 0.0
    max_len_b: int = 200
    min_len: int = 1  # fairseq's --min-len; a latency table decodes a fixed length with min_len = max_len_b

    @classmethod
    def of_generation(cls, generation) -> "DecodingOptions":
        """From fairseq's generation config (``--beam``, ``--lenpen``, ``--max-len-a``, ``--max-len-b``,
        ``--min-len``)."""
        return cls(int(generation.beam), float(generation.lenpen), float(generation.max_len_a),
                   int(generation.max_len_b), int(generation.min_len))

    @classmethod
    def fixed_length(cls, beam: int, length: int) -> "DecodingOptions":
        """Beam search that generates exactly ``length`` tokens (the shape a latency table times)."""
        return cls(beam=beam, lenpen=1.0, max_len_a=0.0, max_len_b=length, min_len=length)

    def max_length(self, source_length: int) -> int:
        """fairseq's length limit for a batch whose sources are ``source_length`` tokens (with </s>)."""
        return int(self.max_len_a * source_length + self.max_len_b)


def rate_summary(count: int, seconds: Sequence[float]) -> Dict[str, float]:
    """``count`` items over each timed pass: the median rate and its spread (min, max, interquartile range)."""
    rates: List[float] = sorted(count / s for s in seconds)
    if len(rates) >= 4:
        quartiles = statistics.quantiles(rates, n=4)
        spread = quartiles[2] - quartiles[0]
    else:
        spread = rates[-1] - rates[0]
    return {"median": count / statistics.median(seconds), "min": rates[0], "max": rates[-1], "iqr": spread}
