"""The rules of ``compress --target speedup=Nx``, one function per decision: the shapes whose timing is refined
(``decisive_candidates``), the shape tried first (``choose_candidate``), what follows an attempt (``next_step``),
the shape after a loss beyond the tolerance (``back_off``) or a speed short of the target (``prune_more``), and
the attempt deployed (``best_attempt``).
``search.SpeedupSearch`` applies them in turn; ``shapes`` describes what they choose among.
"""

import math
from dataclasses import dataclass, field
from typing import List, Mapping, Optional, Sequence

from fairseq_headprune.study.compression.speed import Speedups
from fairseq_headprune.study.compression.speedup.shapes import PLAN_MARGIN, PlannedCandidate
from fairseq_headprune.study.finetune.settings import PLATEAU, REACHED

CONTINUE, BACK_OFF, ACCEPT, GIVE_UP = "continue fine-tuning", "back off", "accept", "give up"
PRUNE_MORE = "prune more"  # within the tolerance but slower than asked: the next shape fast enough
DECISIONS = (ACCEPT, CONTINUE, BACK_OFF, PRUNE_MORE, GIVE_UP)
# the plan first times every shape this many rounds (after a warm-up), then refines at --repeats rounds only the
# shapes whose timing decides (``decisive_candidates``); where most shapes lie near the target, as on the demo
# model, that is most of them and the plan costs what timing all at --repeats costs
SCREEN_ROUNDS = 1
# a shape screened this share below the target at its slowest batch size may still reach it at --repeats rounds:
# on the demo model, whose passes are short and so the noisiest, one round against five differed by -32% to +82%
# (48 shapes of 4 plans; a tenth below -11%)
SCREEN_SHORTFALL = 0.35
# the refined shapes reach down the damage order to this many screened at the target plus the margin: the first
# choice and the two ``prune_more`` takes after it where the attempts measure what the plan timed (a larger
# correction reaches further, to shapes timed one round)
REFINED_REACHING = 3


def screening_rounds(repeats: int) -> int:
    """The rounds every shape of the plan is timed first: ``SCREEN_ROUNDS``, or all of ``repeats`` where they are
    no more (nothing is then timed again)."""
    return min(SCREEN_ROUNDS, repeats)


def within_tolerance(delta: float, max_bleu_loss: float) -> bool:
    """The one tolerance test: a change of the score against the unpruned model (higher is better) that loses at
    most ``max_bleu_loss`` points."""
    return -delta <= max_bleu_loss


@dataclass(frozen=True)
class AttemptResult:
    """What an attempt measured, as the decisions read it: the change of the score against the unpruned model
    on the decision split (``delta``, higher is better), the compressed model's speed-ups per batch size, and
    why its fine-tuning stopped (``study.finetune.settings``'s reasons; None: a fixed length, or none)."""

    delta: float
    speedups: Speedups = field(default_factory=Speedups)
    finetune_stopped: Optional[str] = None
    # the low end of each speed-up's interval over the timing rounds (``speed.paired_speedup_interval``); what
    # "fast enough" reads (empty: the speed-ups themselves)
    speedup_lows: Speedups = field(default_factory=Speedups)

    def __post_init__(self):
        object.__setattr__(self, "speedups", Speedups.of(self.speedups))
        object.__setattr__(self, "speedup_lows", Speedups.of(self.speedup_lows))

    @property
    def fast_enough_speedups(self) -> Speedups:
        return self.speedup_lows or self.speedups

    @property
    def still_improving(self) -> bool:
        """Its fine-tuning ended at a ceiling, not because it was enough or stopped gaining."""
        return self.finetune_stopped not in (REACHED, PLATEAU)


def damage_order(planned: Sequence[PlannedCandidate]) -> List[int]:
    """Indices from the least to the most damaged (a plan without damage: the most decoding FLOPs kept first); at
    equal damage the run's beam before smaller ones, then the most decoding FLOPs kept, the fewest layers
    removed and the fastest."""
    def rank(i):
        candidate = planned[i].candidate
        damage = planned[i].damage if planned[i].damage is not None else -planned[i].flops_share
        return (damage, -(candidate.beam or math.inf), -planned[i].flops_share, sum(candidate.drop_counts.values()),
                -planned[i].speedups.slowest)
    return sorted(range(len(planned)), key=rank)


def decisive_candidates(planned: Sequence[PlannedCandidate], factor: float, margin: float = PLAN_MARGIN,
                        shortfall: float = SCREEN_SHORTFALL, reaching: int = REFINED_REACHING) -> List[int]:
    """The candidates whose screened timing (``SCREEN_ROUNDS``) may decide the choice, least damaged first: in
    ``damage_order``, every one screened within ``shortfall`` of ``factor`` at every batch size, down to the
    ``reaching``-th screened at ``factor`` plus ``margin``. A shape more damaged than those is chosen only after
    them, and one screened further below the target is not fast enough; timing either longer changes no choice."""
    near, decisive, reached = factor * (1.0 - shortfall), [], 0
    for index in damage_order(planned):
        if planned[index].reaches(near):
            decisive.append(index)
            reached += planned[index].reaches(factor * (1.0 + margin))
            if reached >= reaching:
                break
    return decisive


def choose_candidate(planned: Sequence[PlannedCandidate], factor: float,
                     margin: float = PLAN_MARGIN) -> Optional[int]:
    """The least damaged shape the plan times at ``factor`` plus ``margin`` at every batch size, else the least
    damaged at ``factor`` (``damage_order``); None when none reaches it (``unreached_text`` says how near)."""
    order = damage_order(planned)
    for need in (factor * (1.0 + margin), factor):
        for index in order:
            if planned[index].reaches(need):
                return index
    return None


def unreached_text(planned: Sequence[PlannedCandidate], factor: float) -> str:
    """Why no shape was chosen: the fastest one timed, and its speed-up at its slowest batch size."""
    fastest = max(planned, key=lambda p: p.speedups.slowest)
    slowest_batch = fastest.speedups.slowest_batch
    return (f"--target speedup={factor:g}x: the fastest shape tried ({fastest.candidate.name}) decodes "
            f"{fastest.speedups[slowest_batch]:.2f}x as fast as the unpruned model with its vocabulary map at batch "
            f"{slowest_batch}; ask for less")


def next_step(bleu_loss: float, max_bleu_loss: float, can_continue: bool, attempts_left: int,
              fast_enough: bool = True) -> str:
    """What follows an attempt that lost ``bleu_loss`` points and was (not) measured ``fast_enough``: accept it,
    prune more, continue its fine-tuning (``can_continue``: there is one, not continued yet, still improving),
    back off to a less damaged shape, or give up when no attempt is left."""
    kept = within_tolerance(-bleu_loss, max_bleu_loss)
    if kept and fast_enough:
        return ACCEPT
    if attempts_left <= 0:
        return GIVE_UP
    if kept:
        return PRUNE_MORE
    return CONTINUE if can_continue else BACK_OFF


def back_off(planned: Sequence[PlannedCandidate], current: int, tried: Sequence[int] = ()) -> Optional[int]:
    """The nearest candidate before ``current`` in ``damage_order`` (less damaged) not tried yet, or None."""
    order = damage_order(planned)
    earlier = [index for index in order[:order.index(current)] if index not in tried]
    return earlier[-1] if earlier else None


def prune_more(planned: Sequence[PlannedCandidate], current: int, factor: float, measured: Mapping[int, float],
               tried: Sequence[int] = ()) -> Optional[int]:
    """After ``current``, which kept the BLEU but was measured at ``measured`` (batch size -> speed-up): the least
    damaged candidate not tried yet that the plan expects fast enough once its timing is corrected by
    ``current``'s error at each batch size (the plan's speed-up over the measured one, when above 1), or None."""
    timed, measured = planned[current].speedups, Speedups.of(measured)  # read from a report: batch sizes as text
    needed = {batch: factor * max(1.0, timed[batch] / measured[batch]) for batch in timed if measured.get(batch)}
    for index in damage_order(planned):
        speedups = planned[index].speedups
        if (index != current and index not in tried
                and all(speedups.get(batch, 0.0) >= need for batch, need in needed.items())):
            return index
    return None


def best_attempt(decisions: Sequence[str], results: Sequence[AttemptResult], max_bleu_loss: float) -> int:
    """The attempt to deploy (an index): the first accepted; else the fastest (at its slowest batch size) of those
    within the tolerance; else the one that lost least."""
    accepted = [i for i, decision in enumerate(decisions) if decision == ACCEPT]
    if accepted:
        return accepted[0]
    within = [i for i, result in enumerate(results) if within_tolerance(result.delta, max_bleu_loss)]
    if within:
        return max(within, key=lambda i: results[i].speedups.slowest)
    return max(range(len(results)), key=lambda i: (results[i].delta, -i))
