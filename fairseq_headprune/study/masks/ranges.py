"""Number lists with ranges, as users write them: ``1-3,6`` <-> [1, 2, 3, 6].

One parser and one formatter for every place that takes or shows such a
list: the layers and heads of a head-mask spec, ``--epochs``.
"""

import re
from typing import Iterable, List, Tuple


class RangeError(ValueError):
    """A malformed item or an empty range; callers add what the list was for."""

    def __init__(self, kind: str, item: str):
        super().__init__(f"{kind} {item!r}")
        self.kind, self.item = kind, item  # kind: "malformed item" or "empty range"


def parse_ranges(text: str) -> List[Tuple[int, int]]:
    """``'1,3-4'`` -> ``[(1, 1), (3, 4)]``: inclusive ranges, in the order written."""
    ranges = []
    for item in text.split(","):
        match = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", item)
        if match is None:
            raise RangeError("malformed item", item)
        first = int(match.group(1))
        last = int(match.group(2)) if match.group(2) else first
        if first > last:
            raise RangeError("empty range", item.strip())
        ranges.append((first, last))
    return ranges


def expand_ranges(ranges: Iterable[Tuple[int, int]]) -> List[int]:
    """Inclusive ranges -> the sorted distinct numbers they cover."""
    numbers = set()
    for first, last in ranges:
        numbers.update(range(first, last + 1))
    return sorted(numbers)


def format_ranges(numbers: Iterable[int]) -> str:
    """[1, 2, 3, 6] -> ``'1-3,6'``; ``parse_ranges`` reads it back."""
    runs: List[List[int]] = []
    for number in sorted(set(numbers)):
        if runs and number == runs[-1][1] + 1:
            runs[-1][1] = number
        else:
            runs.append([number, number])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
