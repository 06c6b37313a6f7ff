"""``compress --target speedup=Nx``: the structures tried, the one chosen, and what to do when BLEU is lost.

A speed-up in CTranslate2 is not a FLOPs share: embeddings, the output layer
over the vocabulary map's candidates and beam search cost what they cost
whatever is pruned, and a narrowed layer saves less time than its FLOPs. So
the plan measures instead of predicting: a ladder of candidate shapes (whole
layers left out of each stack, then every remaining layer narrowed to a share
of its heads and FFN neurons), each exported and timed in CTranslate2 with
the vocabulary map against the unpruned model with its own map (like for
like), a few shapes at a time beside the unpruned model in rotated timing
runs, at every batch size asked.

Shapes fast enough differ in what they cost in quality: removing two of
three decoder layers and narrowing every layer to half keep about the same
FLOPs but start from very different models. So the plan also measures each
shape's damage before any fine-tuning: the validation loss of the unpruned
model with the shape's layers removed (those the loss misses least, as an
attempt removes them) and every other layer keeping its heads and FFN
neurons of highest Fisher information (the unpruned model's). The chosen
candidate is the least damaged among those the plan times at the speed-up
plus ``PLAN_MARGIN`` at every batch size (the plan's timing of a uniform
shape is within about 10% of the compressed model's; without a margin the
first attempt would often measure just short of the target), or, when none
is, the least damaged that reaches the speed-up itself; equal damage goes to
the run's beam, then to the shape that keeps more decoding FLOPs.

An attempt compresses to the chosen shape (its layers, heads and neurons
searched within the candidate's decoding-FLOPs share), fine-tunes and
evaluates (``search`` decides what follows). Where it loses more than
the tolerance, the next attempt continues the fine-tuning if it ended at its
ceiling, else backs off to the nearest less damaged shape, which may be
slower than asked: the report says so. Where it keeps the BLEU but decodes
slower than asked (the plan times a uniform shape at a fixed length; the
compressed model has its searched mask and its own translations), the next
attempt takes the least damaged shape that the plan, corrected by that
attempt's measured error, expects to be fast enough.

With ``--allow-beam`` every shape is also timed at the smaller beams 1 and 2
(sequence-level distillation lets a small beam approach beam search, Kim &
Rush 2016), against the unpruned model at the run's beam; a shape is then
preferred at the largest beam that is fast enough, and its BLEU is judged
at that beam against the unpruned model at the run's.
"""

import math
from dataclasses import dataclass, field
from typing import ClassVar, Dict, List, Mapping, Optional, Sequence, Tuple

from fairseq_headprune.errors import SettingsError
from fairseq_headprune.study.compression.speed import Speedups
from fairseq_headprune.study.output.serialisation import FLATTENED, OMITTED_WHEN_DEFAULT, PlainRecord, written_as

# the shares of every remaining layer's heads and FFN neurons a candidate keeps (1.0: layers removed only)
WIDTH_SHARES = (1.0, 0.75, 0.5, 0.25)
PLAN_MARGIN = 0.1  # the first choice asks the plan's timing for this much more than the target
SMALLER_BEAMS = (1, 2)  # --allow-beam: the beams a shape is also timed at, below the run's
ORDER_TOLERANCE = 0.8  # a shape that removes more, timed below this share of the speed of one that removes less


def parse_speedup(text: str) -> float:
    """``2x`` or ``2``: a factor above 1."""
    amount = str(text).strip().lower()
    amount = amount[:-1] if amount.endswith(("x", "×")) else amount
    try:
        factor = float(amount)
    except ValueError:
        raise SettingsError(f"--target speedup={text}: expected a factor such as 2x") from None
    if not math.isfinite(factor) or factor <= 1.0:
        raise SettingsError(f"--target speedup={text}: a speed-up is a factor above 1 (e.g. speedup=2x)")
    return factor


@dataclass(frozen=True)
class Candidate(PlainRecord):
    """One shape: ``dropped`` whole layers of each stack, and every remaining layer keeping ``width`` of its
    heads and neurons."""

    DERIVED: ClassVar[Tuple[str, ...]] = ("name",)

    # (stack, layers removed), stacks in a fixed order; JSON holds {stack: layers removed}
    dropped: Tuple[Tuple[str, int], ...] = field(metadata=written_as(
        dict, lambda counts: tuple(sorted((str(stack), int(count)) for stack, count in counts.items()))))
    width: float
    beam: Optional[int] = None  # decoded at this smaller beam (None: the run's)

    @property
    def drop_counts(self) -> Dict[str, int]:
        return {stack: count for stack, count in self.dropped if count}

    @property
    def layers_name(self) -> str:
        """The whole layers it removes, as a reader says it: ``2 decoder layers`` or ``no layer``."""
        return ", ".join(f"{count} {stack} layer{'s' if count > 1 else ''}" for stack, count in self.dropped
                         if count) or "no layer"

    @property
    def name(self) -> str:
        return f"{self.layers_name} removed, {self.width:.0%} width" + (f", beam {self.beam}" if self.beam else "")


def candidate_ladder(depths: Mapping[str, int], widths: Sequence[float] = WIDTH_SHARES,
                     beams: Sequence[int] = ()) -> List[Candidate]:
    """Every shape the plan times but the unpruned one: the decoder keeping 1 to all of its layers, the
    encoder all or half of them, each at every width; at the run's beam and at each of ``beams``."""
    decoder = depths.get("decoder", 0)
    encoder = depths.get("encoder", 0)
    encoder_drops = sorted({0, encoder // 2}) if encoder > 1 else [0]
    ladder = []
    for encoder_dropped in encoder_drops:
        for decoder_dropped in range(max(decoder, 1)):
            for width in widths:
                dropped = tuple(sorted(((("decoder", decoder_dropped),) if decoder else ())
                                       + ((("encoder", encoder_dropped),) if encoder else ())))
                candidate = Candidate(dropped, float(width))
                if candidate.drop_counts or width < 1.0:
                    ladder += [candidate] + [Candidate(dropped, float(width), beam) for beam in beams]
    return ladder


def ladder_shapes(ladder: Sequence[Candidate]) -> List[Tuple[Tuple[Tuple[str, int], ...], float]]:
    """The distinct shapes (layers removed, width) of a ladder, in its order: what is exported and timed once,
    whatever beams its candidates decode at."""
    return list(dict.fromkeys((candidate.dropped, candidate.width) for candidate in ladder))


@dataclass
class PlannedCandidate(PlainRecord):
    """A candidate with what the plan found: its decoding-FLOPs share of the unpruned model's layers, its
    measured speed-up over the unpruned model (with the map both) at each batch size, and its damage: the
    validation loss increase over the unpruned model before fine-tuning (None: not measured), with its standard
    error (``damage.paired_damage``; None in plans written before it was recorded), and the timing rounds its
    speed-ups are the median of (0: a plan written before it was recorded, every shape at --repeats), and for a
    shape timed again at length its screening round's (``screened``; empty otherwise)."""

    candidate: Candidate = field(metadata=FLATTENED)
    flops_share: float
    speedups: Speedups = field(default_factory=Speedups)
    damage: Optional[float] = None
    damage_se: Optional[float] = field(default=None, metadata=OMITTED_WHEN_DEFAULT)
    rounds: int = field(default=0, metadata=OMITTED_WHEN_DEFAULT)
    screened: Speedups = field(default_factory=Speedups, metadata=OMITTED_WHEN_DEFAULT)

    def __post_init__(self):
        self.speedups = Speedups.of(self.speedups)
        self.screened = Speedups.of(self.screened)

    def reaches(self, factor: float) -> bool:
        return self.speedups.reaches(factor)


def removes_at_least(smaller: Candidate, larger: Candidate) -> bool:
    """Whether ``smaller`` removes at least the layers of ``larger`` in every stack, at no greater width and the
    same beam: it does less work, so it cannot decode more slowly."""
    counts, other = smaller.drop_counts, larger.drop_counts
    return (smaller != larger and smaller.beam == larger.beam and smaller.width <= larger.width
            and all(counts.get(stack, 0) >= count for stack, count in other.items()))


@dataclass(frozen=True)
class DisorderedPair(PlainRecord):
    """Two shapes the plan timed against their order: ``smaller`` removes at least what ``larger`` removes, yet was
    timed at ``ratio`` of its speed-up at ``batch``."""

    smaller: str
    larger: str
    batch: int = field(metadata=written_as(str, int))  # as text, as a batch size keys a dict of speed-ups
    ratio: float


def out_of_order(planned: Sequence[PlannedCandidate], tolerance: float = ORDER_TOLERANCE,
                 repeats: Optional[int] = None) -> List[DisorderedPair]:
    """The pairs of shapes the plan timed against their order: one that removes at least what another removes
    (``removes_at_least``) timed at below ``tolerance`` of the other's speed-up, worst first. Such pairs mean
    the timing was disturbed (another process on the cores, too few repeats), and a choice made from it is
    not to be trusted. With ``repeats``, only pairs of which one shape was timed that many rounds: two shapes
    timed a screening round only are neither near the choice nor timed to be compared
    (``rules.decisive_candidates``)."""
    found = []
    for smaller in planned:
        for larger in planned:
            if not removes_at_least(smaller.candidate, larger.candidate):
                continue
            if repeats is not None and repeats not in (smaller.rounds, larger.rounds):
                continue
            for batch, speedup in smaller.speedups.items():
                ratio = speedup / larger.speedups[batch]
                if ratio < tolerance:
                    found.append(DisorderedPair(smaller.candidate.name, larger.candidate.name, batch, ratio))
    return sorted(found, key=lambda pair: pair.ratio)


def disturbed_plan_text(pairs: Sequence[DisorderedPair], plan_dir: str) -> str:
    """What a user reads of ``out_of_order`` pairs, and what to do about them."""
    worst = pairs[0]
    return (f"{len(pairs)} pair{'s' if len(pairs) > 1 else ''} of shapes timed against their order; the worst: "
            f"{worst.smaller} at {worst.ratio:.2f} of the speed-up of {worst.larger} at batch "
            f"{worst.batch}, though it removes more. The timing was disturbed (another process on the cores?) "
            f"and the shape chosen from it may be wrong: remove {plan_dir} and run again with the cores to "
            "itself, or with more --repeats")


def speed_breakdown(planned: Sequence[PlannedCandidate], chosen: int,
                    map_gain: Speedups) -> Dict[str, Speedups]:
    """What each step bought at each batch size, from the plan's own timing run: the vocabulary map on the
    unpruned model; the chosen candidate's layers removed at full width; its narrowing on top."""
    candidate = planned[chosen].candidate
    layers_only = next((p for p in planned if p.candidate.dropped == candidate.dropped and p.candidate.width == 1.0
                        and p.candidate.beam is None), None)
    steps: Dict[str, Speedups] = {"vocabulary map (unpruned model)": Speedups(map_gain)}
    if candidate.drop_counts:
        steps["layers removed"] = Speedups(layers_only.speedups) if layers_only is not None else Speedups()
    narrowed = next((p for p in planned if p.candidate.dropped == candidate.dropped
                     and p.candidate.width == candidate.width and p.candidate.beam is None), None)
    if candidate.width < 1.0 and narrowed is not None:
        base = layers_only.speedups if layers_only is not None else {b: 1.0 for b in narrowed.speedups}
        steps["heads and neurons narrowed"] = narrowed.speedups.over(base)
    if candidate.beam is not None and narrowed is not None:
        steps[f"beam {candidate.beam}"] = planned[chosen].speedups.over(narrowed.speedups)
    return steps
