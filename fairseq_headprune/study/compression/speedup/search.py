"""The attempts of ``compress --target speedup=Nx`` as a plain state machine.

The engine runs what it is told (an attempt: a shape compressed, fine-tuned,
evaluated and timed) and hands the result back; ``SpeedupSearch`` keeps the
state (which shapes were tried, whether the last fine-tuning was continued)
and decides what follows, by the rules of ``study.compression.speedup``:

- within the tolerance and fast enough at every batch size: accept; fast enough is the low end of the
  speed-up's interval over the timing rounds at the target or above (``speed.paired_speedup_interval``), so
  that a speed-up measured a hair above the target with rounds spread below it is not taken;
- no attempt left: give up (the result is ``best_attempt``);
- within the tolerance but slower than asked: prune more (the least damaged
  shape that the plan, corrected by the measured error, expects fast enough);
- beyond the tolerance: continue the fine-tuning once per shape when it ended
  at its ceiling (still improving), else back off to the nearest less damaged
  shape;
- a back-off or prune-more with no shape left gives up.

Every decision reads the result on the decision split (validation); the test
split is translated once, for the attempt ``best()`` names.
"""

from dataclasses import dataclass
from typing import List, Optional, Sequence

from fairseq_headprune.study.compression.speedup.rules import (
    BACK_OFF,
    CONTINUE,
    GIVE_UP,
    PRUNE_MORE,
    AttemptResult,
    back_off,
    best_attempt,
    next_step,
    prune_more,
)
from fairseq_headprune.study.compression.speedup.shapes import PlannedCandidate


@dataclass(frozen=True)
class AttemptPlan:
    """What the engine is to run next: the plan's shape ``shape`` (an index into its candidates), its fine-tuning
    continued from attempt ``continues`` (a number from 1) or started afresh (None)."""

    shape: int
    continues: Optional[int] = None


@dataclass(frozen=True)
class Step:
    """What follows an attempt: the decision, and the attempt to run next (None after accept and give up)."""

    decision: str
    next: Optional[AttemptPlan] = None


class SpeedupSearch:
    """The attempts' state and rules (see the module): ``first()``, then ``decide(result)`` after each attempt
    until it returns a step with nothing next; ``best()`` is the attempt to deploy."""

    def __init__(self, planned: Sequence[PlannedCandidate], chosen: int, factor: float, max_bleu_loss: float,
                 max_attempts: int, can_finetune: bool):
        if max_attempts < 1:
            raise ValueError(f"a speed-up search needs at least one attempt, got {max_attempts}")
        self.planned, self.chosen, self.factor = list(planned), chosen, factor
        self.max_bleu_loss, self.max_attempts, self.can_finetune = max_bleu_loss, max_attempts, can_finetune
        self.attempts: List[AttemptPlan] = []  # what was run, in order
        self.results: List[AttemptResult] = []
        self.decisions: List[str] = []

    def first(self) -> AttemptPlan:
        return self._run(AttemptPlan(self.chosen))

    def _run(self, attempt: AttemptPlan) -> AttemptPlan:
        if len(self.attempts) != len(self.results):
            raise ValueError("an attempt was planned before the last one's result was decided on")
        self.attempts.append(attempt)
        return attempt

    @property
    def tried(self) -> List[int]:
        return [attempt.shape for attempt in self.attempts]

    def decide(self, result: AttemptResult) -> Step:
        """The step after the last attempt planned, from its ``result``."""
        if len(self.results) != len(self.attempts) - 1:
            raise ValueError("decide() follows first() or a step with an attempt to run")
        current = self.attempts[-1]
        self.results.append(result)
        number = len(self.attempts)
        can_continue = self.can_finetune and current.continues is None and result.still_improving
        decision = next_step(-result.delta, self.max_bleu_loss, can_continue, self.max_attempts - number,
                             result.fast_enough_speedups.reaches(self.factor))
        following: Optional[AttemptPlan] = None
        if decision == CONTINUE:
            following = AttemptPlan(current.shape, continues=number)
        elif decision in (BACK_OFF, PRUNE_MORE):
            shape = (back_off(self.planned, current.shape, self.tried) if decision == BACK_OFF else
                     prune_more(self.planned, current.shape, self.factor, result.speedups, self.tried))
            if shape is None:
                decision = GIVE_UP
            else:
                following = AttemptPlan(shape)
        self.decisions.append(decision)
        if following is not None:
            self._run(following)
        return Step(decision, following)

    def best(self) -> int:
        """The attempt to deploy, an index into the attempts decided on."""
        if not self.results:
            raise ValueError("no attempt has been decided on")
        return best_attempt(self.decisions, self.results, self.max_bleu_loss)
