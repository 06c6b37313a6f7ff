"""A ``compress`` target: what the compressed model keeps (``heads=50%``, ``flops=50%``, ``decoding-flops=50%``,
``latency=60%``: a share of the unpruned model's cost, as ``search --budget`` counts it) or how fast it decodes
(``speedup=2x``: ``study.compression.speedup``), parsed once from its text and handed on as an object."""

import math
from dataclasses import dataclass
from typing import Optional

from fairseq_headprune.errors import SettingsError
from fairseq_headprune.study.compression.speedup.shapes import parse_speedup
from fairseq_headprune.study.search.costs import SearchBudget

# what a target can count, and how it is searched: (search --structure, search --cost)
TARGET_SEARCH = {"heads": ("heads", "heads"), "flops": ("joint", "flops"),
                 "decoding-flops": ("joint", "decoding-flops"), "latency": ("joint", "latency"),
                 "speedup": ("joint", "decoding-flops")}  # speedup: each attempt searches a decoding-FLOPs share
SPEEDUP_TARGET = "speedup"
TARGET_KINDS = tuple(TARGET_SEARCH)
# targets whose cost the engine prices for any depth (a latency table is timed on one model's layers)
LAYER_DROP_TARGETS = ("heads", "flops", "decoding-flops")


@dataclass(frozen=True)
class CompressTarget:
    """What the compressed model keeps: ``percent`` of the unpruned model's heads, FLOPs or latency; a speedup
    target's ``factor`` (``percent``: the share of the decoding time kept, 100 / factor)."""

    kind: str
    percent: float
    factor: Optional[float] = None

    @property
    def text(self) -> str:
        return f"{self.kind}={self.factor:g}x" if self.kind == SPEEDUP_TARGET else f"{self.kind}={self.percent:g}%"

    @property
    def structure(self) -> str:
        """What the search prunes (``search --structure``)."""
        return TARGET_SEARCH[self.kind][0]

    @property
    def cost(self) -> str:
        """What the search's budget counts (``search --cost``)."""
        return TARGET_SEARCH[self.kind][1]

    @property
    def budget(self) -> SearchBudget:
        """The search's budget: the share of the unpruned model's cost kept."""
        return SearchBudget(percent=self.percent)


def parse_target(text: str) -> CompressTarget:
    """``KIND=P%``: KIND one of heads, flops, decoding-flops, latency; P the share kept, above 0 and below 100.
    ``speedup=Nx``: N above 1."""
    kind, separator, amount = str(text).strip().partition("=")
    kind, amount = kind.strip().lower(), amount.strip()
    if not separator or not kind or not amount:
        raise SettingsError(f"the target {text}: expected KIND=P% with KIND one of {', '.join(TARGET_KINDS)} "
                            "(e.g. flops=50%: half of the FLOPs kept), or speedup=Nx", setting="target")
    if kind not in TARGET_SEARCH:
        raise SettingsError(f"the target {text}: unknown target kind {kind!r} (expected {', '.join(TARGET_KINDS)})",
                            setting="target")
    if kind == SPEEDUP_TARGET:
        factor = parse_speedup(amount)
        return CompressTarget(kind, 100.0 / factor, factor)
    if not amount.endswith("%"):
        raise SettingsError(f"the target {text}: the share kept is a percentage of the unpruned model (e.g. "
                            f"{kind}=50%)", setting="target")
    try:
        percent = float(amount[:-1])
    except ValueError:
        raise SettingsError(f"the target {text}: {amount!r} is not a percentage", setting="target") from None
    if not math.isfinite(percent) or percent >= 100:
        raise SettingsError(f"the target {text} keeps as much as the unpruned model has or more (at most 100%); "
                            "nothing would be pruned", setting="target")
    if percent <= 0:
        raise SettingsError(f"the target {text} keeps nothing; give a share above 0%", setting="target")
    return CompressTarget(kind, percent)
