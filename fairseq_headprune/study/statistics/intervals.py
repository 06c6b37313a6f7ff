"""95% intervals of the differences the findings compare with the papers' figures.

Over draws: Student's t interval of a mean (n >= 2). Within a draw: the
paired bootstrap's percentile interval of the difference (``significance``).
A finding's decision interval combines the two (``combined``): the t
interval alone misses the test set's own sampling noise, which every draw
shares, and the bootstrap alone misses the spread between draws; the two
are independent sources, so their half-widths add in quadrature. For shares
of heads or layers: Wilson's score interval (Wilson 1927); for a correlation:
Fisher's z transform (Fisher 1921).
"""

import math
from dataclasses import dataclass
from typing import Optional, Sequence

CONFIDENCE = 0.95
NORMAL_975 = 1.959963984540054  # the normal distribution's 97.5% point: a 95% half-width in standard errors


@dataclass(frozen=True)
class Estimate:
    """A measured difference with its 95% interval (``low``/``high`` None: no interval) and how it was found."""

    value: float
    low: Optional[float] = None
    high: Optional[float] = None
    method: str = ""  # "t over 3 draws; paired bootstrap within each"

    @property
    def has_interval(self) -> bool:
        return self.low is not None and self.high is not None

    def text(self, unit: str = "", signed: bool = True, digits: int = 2) -> str:
        """``-1.13 BLEU [-1.55, -0.71]``: the value and, where there is one, the 95% interval."""
        number = f"{{:{'+' if signed else ''}.{digits}f}}"
        text = number.format(self.value) + (f" {unit}" if unit else "")
        if self.has_interval:
            text += f" [{number.format(self.low)}, {number.format(self.high)}]"
        return text


def t_quantile(degrees_of_freedom: int) -> float:
    """Student's t 97.5% point."""
    from scipy.stats import t

    return float(t.ppf(0.5 + CONFIDENCE / 2, degrees_of_freedom))


def t_interval(values: Sequence[float]) -> Estimate:
    """The mean of ``values`` with Student's t interval (no interval for a single value)."""
    count = len(values)
    mean = sum(values) / count
    if count < 2:
        return Estimate(mean, method="one value")
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (count - 1))
    half = t_quantile(count - 1) * std / math.sqrt(count)
    return Estimate(mean, mean - half, mean + half, f"t over {count} draws")


def welch_interval(first: Sequence[float], second: Sequence[float]) -> Estimate:
    """mean(first) - mean(second) with a t interval on the smaller group's degrees of freedom (conservative)."""
    difference = sum(first) / len(first) - sum(second) / len(second)
    smaller = min(len(first), len(second))
    if smaller < 2:
        return Estimate(difference, method="one value a side")

    def variance(values):
        mean = sum(values) / len(values)
        return sum((v - mean) ** 2 for v in values) / (len(values) - 1)

    half = t_quantile(smaller - 1) * math.sqrt(variance(first) / len(first) + variance(second) / len(second))
    return Estimate(difference, difference - half, difference + half, f"t over {smaller} draws a side")


def combined(value: float, *intervals: Optional[Estimate], method: str = "") -> Estimate:
    """``value`` with the half-widths of independent sources of noise added in quadrature, each side on its own
    (those without an interval left out; none: no interval)."""
    given = [i for i in intervals if i is not None and i.has_interval]
    if not given:
        return Estimate(value, method=method)
    below = math.sqrt(sum((i.value - i.low) ** 2 for i in given))
    above = math.sqrt(sum((i.high - i.value) ** 2 for i in given))
    return Estimate(value, value - below, value + above, method)


def wilson_interval(successes: int, count: int) -> Estimate:
    """A share ``successes / count`` with Wilson's score interval."""
    share, z = successes / count, NORMAL_975
    centre = (share + z ** 2 / (2 * count)) / (1 + z ** 2 / count)
    half = z * math.sqrt(share * (1 - share) / count + z ** 2 / (4 * count ** 2)) / (1 + z ** 2 / count)
    low = 0.0 if successes == 0 else max(0.0, centre - half)  # exact at the ends (the float sum is not)
    high = 1.0 if successes == count else min(1.0, centre + half)
    return Estimate(share, low, high, f"Wilson, {count} units")


def correlation_interval(r: float, count: int) -> Estimate:
    """Pearson's r over ``count`` pairs with Fisher's z interval (no interval under 4 pairs or at |r| = 1)."""
    if count < 4 or abs(r) >= 1.0:
        return Estimate(r, method=f"{count} pairs")
    z, half = math.atanh(r), NORMAL_975 / math.sqrt(count - 3)
    return Estimate(r, math.tanh(z - half), math.tanh(z + half), f"Fisher z, {count} pairs")
