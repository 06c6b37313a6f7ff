"""Fine-tuning with the pruned units held at zero: its length, learning rate and recovery curve (``prune``'s
configurations after Budhraja et al., and ``compress``), and the rule that stops it once it is enough
(``FinetuneStop``: ``compress --target speedup``)."""

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from fairseq_headprune.errors import SettingsError
from fairseq_headprune.study.output.serialisation import NOT_WRITTEN, PlainRecord
from fairseq_headprune.study.settings import refuse

FINETUNE_LR_SHARE = 0.1  # default fine-tuning learning rate: this share of the checkpoint's own peak rate


FINETUNE_WARMUP_SHARE = 0.1  # default warm-up: this share of the updates
VALIDATIONS_PER_FINETUNE = 10  # a fine-tune until enough validates this many times over its ceiling by default
# ... or sooner: once it has trained on this many times its validation split's target tokens. A validation
# translates that split, and training and translating a token both cost in proportion to the model, so the
# validations stay about the same share of the fine-tune's time at any model size (on the demo model a validation
# takes about 5 s, 50 splits' worth of training 78 updates at 0.555 s), and a large training split is looked at
# long before a tenth of its ceiling. The four documented d = 128 models reach a tenth of their ceiling after 23
# to 39 times their validation split's target tokens, so they validate as before.
VALIDATION_SPLITS = 50
DEFAULT_PATIENCE = 3  # ... and stops after this many validations without a gain (fairseq's --patience)
# stop reasons of a fine-tune until enough
REACHED, PLATEAU, UPDATE_CEILING, TIME_CEILING = "reached", "no gain", "update ceiling", "time ceiling"


# the precision a fine-tune computes in on a GPU (on the CPU fairseq trains in float32 alone): the checkpoint's own
# (its --fp16/--bf16; float32 for a checkpoint trained without) or one named. On the demo model on an H100,
# bfloat16 trained slower than float32 and ended 0.71 BLEU lower on valid (docs/removal-and-export.md), so half
# precision is the user's choice, not the default.
CHECKPOINT_PRECISION = "checkpoint"
FLOAT32, FLOAT16, BFLOAT16 = "float32", "float16", "bfloat16"
FINETUNE_PRECISIONS = (CHECKPOINT_PRECISION, FLOAT32, FLOAT16, BFLOAT16)


def finetune_precision(requested: str, checkpoint_precision: str, on_gpu: bool, bf16_supported: bool) -> str:
    """The precision a fine-tune computes in: float32 on the CPU (the only one fairseq trains in there); on a GPU
    ``requested`` (``FINETUNE_PRECISIONS``), bfloat16 only where the GPU computes it."""
    if not on_gpu:
        refuse(requested in (FLOAT16, BFLOAT16),
               f"fine-tuning in {requested} needs a GPU: on the CPU fairseq trains in float32 (checkpoint or float32)",
               setting="finetune_precision")
        return FLOAT32
    if requested == CHECKPOINT_PRECISION:
        return checkpoint_precision
    refuse(requested == BFLOAT16 and not bf16_supported,
           "fine-tuning in bfloat16 needs a GPU that computes it (compute capability 8.0 or more); "
           "float16 or float32 run here", setting="finetune_precision")
    return requested


MAX_SEED = 2 ** 31  # fairseq adds the epoch and update counts to its seed: room for them in an int
# the recovery curve's default points (updates), those below the fine-tune's length; its end is always a point
DEFAULT_CURVE_UPDATES = (40, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000)


@dataclass(frozen=True)
class FinetuneData(PlainRecord):
    """The fine-tuning's data as its updates see it (``engine.finetune.data``): the updates in one epoch of the
    training split at the checkpoint's batch, that split's target tokens, and the validation split's."""

    updates_per_epoch: int
    target_tokens: int
    validation: str  # the validation split counted
    validation_tokens: int

    @property
    def tokens_per_update(self) -> float:
        return self.target_tokens / max(self.updates_per_epoch, 1)


@dataclass
class FinetuneStop(PlainRecord):
    """Fine-tuning until it is enough: fairseq-train validates on ``subset`` every ``interval`` updates with
    fairseq's BLEU (``--eval-bleu`` with ``generation``: beam, length penalty, length limits; ``remove_bpe``) and
    keeps the best checkpoint; it stops once the validation BLEU reaches ``target``, after ``patience``
    validations without a gain (fairseq's ``--patience``), or at the ceiling (``FinetuneSettings.updates``, or
    ``minutes`` of training: fairseq's ``--stop-time-hours``)."""

    subset: str = "valid"
    interval: Optional[int] = None  # None: the ceiling over VALIDATIONS_PER_FINETUNE
    patience: int = DEFAULT_PATIENCE
    target: Optional[float] = None  # None: only the patience and the ceiling stop it
    minutes: Optional[float] = None
    generation: Dict[str, Any] = field(default_factory=dict)
    remove_bpe: Optional[str] = None
    # the data counted (None: not counted, a tenth of the ceiling alone); a measurement, not a setting
    data: Optional[FinetuneData] = field(default=None, compare=False, metadata=NOT_WRITTEN)

    def __post_init__(self):
        refuse(self.interval is not None and self.interval < 1,
               f"--finetune-valid-interval must be positive, got {self.interval}")
        refuse(self.patience < 1, f"--finetune-patience must be at least 1, got {self.patience}")
        refuse(self.minutes is not None and not (math.isfinite(self.minutes) and self.minutes > 0),
               f"--finetune-minutes must be a positive number, got {self.minutes}")

    def validation_interval(self, ceiling: int) -> int:
        """Updates between validations: ``interval`` where given; else a tenth of the ceiling
        (``VALIDATIONS_PER_FINETUNE``), or sooner where the data is counted, once ``VALIDATION_SPLITS`` times the
        validation split's target tokens are trained on."""
        if self.interval:
            return self.interval
        by_tokens = self._interval_by_tokens()
        return _tenth(ceiling) if by_tokens is None else min(_tenth(ceiling), by_tokens)

    def _interval_by_tokens(self) -> Optional[int]:
        data = self.data
        if data is None or data.validation != self.subset or not data.validation_tokens:
            return None
        return max(1, math.ceil(VALIDATION_SPLITS * data.validation_tokens / data.tokens_per_update))

    def interval_rule(self, ceiling: int) -> str:
        """Why the validations come every so many updates, in words."""
        interval = self.validation_interval(ceiling)
        if self.interval:
            return f"every {interval} updates (--finetune-valid-interval)"
        data = self.data
        if self._interval_by_tokens() == interval and interval < _tenth(ceiling):
            return (f"every {interval} updates: {VALIDATION_SPLITS} times {self.subset}'s {data.validation_tokens:,} "
                    f"target tokens, at {data.tokens_per_update:,.0f} an update")
        return f"every {interval} updates: a tenth of the ceiling"


def _tenth(ceiling: int) -> int:
    """A tenth of a fine-tune's ceiling in updates (``VALIDATIONS_PER_FINETUNE``), at least one."""
    return max(1, int(round(ceiling / VALIDATIONS_PER_FINETUNE)))


@dataclass
class Validation(PlainRecord):
    """One validation of a fine-tune until enough: the updates made, and fairseq's BLEU then (None: not scored).
    A fine-tune's validations, in order, are its recovery curve."""

    updates: int
    bleu: Optional[float]


def stop_reason(curve: Sequence[Validation], stop: FinetuneStop, updates: int, ceiling: int) -> str:
    """Why a fine-tune until enough ended, from its validations (``updates``, ``bleu``; in order) and the updates it
    made: it reached the target, had ``patience`` validations without a gain, or hit a ceiling."""
    scores = [point.bleu for point in curve if point.bleu is not None]
    if stop.target is not None and scores and scores[-1] >= stop.target:
        return REACHED
    if len(scores) > stop.patience and max(scores[-stop.patience:]) <= max(scores[:-stop.patience]):
        return PLATEAU
    return UPDATE_CEILING if updates >= ceiling else TIME_CEILING


def patience_state(curve: Sequence[Validation]) -> Tuple[Optional[float], int]:
    """fairseq's --patience state after these validations: the best score and the validations since it."""
    best, since = None, 0
    for point in curve:
        score = point.bleu
        if score is None:
            continue
        if best is None or score > best:
            best, since = score, 0
        else:
            since += 1
    return best, since


@dataclass
class FinetuneSettings:
    """Fine-tuning with the pruned units held at zero (fairseq-train, the plugin's task and masks)."""

    updates: int = 0  # 0: no fine-tuning (unless epochs)
    lr: Optional[float] = None  # None: FINETUNE_LR_SHARE of the checkpoint's peak learning rate
    warmup: Optional[int] = None  # None: FINETUNE_WARMUP_SHARE of the updates (0 with epochs)
    epochs: int = 0  # instead of updates: whole passes over the training split (Budhraja et al.: 30, BERT 10)
    save_interval: int = 0  # also save checkpoint_last.pt (with the optimizer) every N updates, to resume from
    # the recovery curve: updates after which the fine-tune is scored (None: DEFAULT_CURVE_UPDATES below its
    # length; []: no curve); with epochs, every epoch's end
    curve: Optional[List[int]] = None
    until: Optional[FinetuneStop] = None  # fine-tune until enough: ``updates`` is then the ceiling
    lr_share: float = FINETUNE_LR_SHARE  # the learning rate, when not given: this share of the checkpoint's peak
    # how the arithmetic runs, like the device (not part of a run's identity): FINETUNE_PRECISIONS
    precision: str = CHECKPOINT_PRECISION
    seed: Optional[int] = None  # fairseq's --seed for the fine-tune (batches' order, dropout); None: the checkpoint's
    # data-parallel processes it trains on (fairseq's distributed training on this machine), each update seeing the
    # batches one process would accumulate; like the device, not part of a run's identity
    processes: int = 1
    memory_gb: Optional[float] = None  # the memory it may plan to use on its device (None: what is free there)

    def __post_init__(self):
        if self.updates < 0 or self.epochs < 0:
            raise SettingsError(f"--finetune-updates and --finetune-epochs must be 0 or more, got "
                                f"{self.updates if self.updates < 0 else self.epochs}")
        if self.updates and self.epochs:
            raise SettingsError("give --finetune-updates N or --finetune-epochs N, not both")
        self._check_rate()
        self._check_curve()
        refuse(self.until is not None and (not self.updates or bool(self.curve)),
               "fine-tuning until enough needs a ceiling in updates (--finetune-updates N) and no --finetune-curve")
        refuse(self.precision not in FINETUNE_PRECISIONS, f"the fine-tune's precision must be one of "
               f"{', '.join(FINETUNE_PRECISIONS)}, got {self.precision!r}", setting="finetune_precision")
        refuse(not 0 < self.lr_share, f"the learning rate's share of the checkpoint's must be positive, got "
               f"{self.lr_share:g}")
        refuse(self.seed is not None and not 0 <= self.seed < MAX_SEED,
               f"--finetune-seed must be from 0 to {MAX_SEED - 1}, got {self.seed}")
        refuse(self.processes < 1, f"--finetune-processes must be at least 1, got {self.processes}")
        refuse(self.memory_gb is not None and not (math.isfinite(self.memory_gb) and self.memory_gb > 0),
               f"--finetune-memory must be a positive number of GB, got {self.memory_gb}")
        refuse(self.seed is not None and not self.enabled,
               "--finetune-seed goes with --finetune-updates/--finetune-epochs N")
        refuse(self.processes > 1 and not self.enabled,
               "--finetune-processes goes with --finetune-updates/--finetune-epochs N")
        refuse(self.memory_gb is not None and not self.enabled,
               "--finetune-memory goes with --finetune-updates/--finetune-epochs N")

    @property
    def enabled(self) -> bool:
        return bool(self.updates or self.epochs)

    def _check_rate(self) -> None:
        if self.lr is not None and not self.lr > 0:
            raise SettingsError(f"--finetune-lr must be positive, got {self.lr:g}")
        if self.warmup is not None and self.warmup < 0:
            raise SettingsError(f"--finetune-warmup must be 0 or more, got {self.warmup}")
        if not self.enabled and (self.lr is not None or self.warmup is not None):
            raise SettingsError("--finetune-lr and --finetune-warmup go with --finetune-updates/--finetune-epochs N")
        if self.save_interval < 0:
            raise SettingsError(f"the fine-tune's save interval must be 0 or more, got {self.save_interval}")

    def _check_curve(self) -> None:
        if not self.curve:
            return
        refuse(not self.enabled, "--finetune-curve goes with --finetune-updates N")
        refuse(bool(self.epochs), "--finetune-curve: with --finetune-epochs the curve is scored at every epoch's end")
        for point in self.curve:
            refuse(not 0 < point < self.updates,
                    f"--finetune-curve {point}: a point is an update count above 0 and below --finetune-updates "
                    f"{self.updates} (whose end is always scored)")

    def curve_stops(self) -> List[Tuple[str, int]]:
        """Where the fine-tune is scored on its way, in order, its end last: ``("update", U)`` or ``("epoch", E)``;
        empty without a curve (only the end is scored, as the fine-tuned checkpoint)."""
        if not self.enabled or self.curve == []:
            return []
        if self.epochs:
            return [("epoch", epoch) for epoch in range(1, self.epochs + 1)]
        points = self.curve if self.curve is not None else [u for u in DEFAULT_CURVE_UPDATES if u < self.updates]
        return [("update", u) for u in sorted(set(points))] + [("update", self.updates)]

    def learning_rate(self, checkpoint_lr: float) -> float:
        return self.lr if self.lr is not None else self.lr_share * checkpoint_lr

    def warmup_updates(self) -> int:
        return self.warmup if self.warmup is not None else int(FINETUNE_WARMUP_SHARE * self.updates)

    def length(self) -> str:
        """``300 updates`` or ``2 epochs``."""
        return f"{self.epochs} epochs" if self.epochs else f"{self.updates} updates"

    def recipe(self, checkpoint_lr: Optional[float], checkpoint_seed: Optional[int]) -> "FinetuneRecipe":
        """This fine-tune's recipe from a checkpoint trained at peak rate ``checkpoint_lr`` under ``checkpoint_seed``
        (None: the checkpoint does not say)."""
        lr = self.lr if self.lr is not None or checkpoint_lr is None else self.learning_rate(checkpoint_lr)
        return FinetuneRecipe(self.length(), lr, self.warmup_updates(), tuple(self.curve_stops()),
                              checkpoint_seed if self.seed is None else self.seed)


@dataclass(frozen=True)
class FinetuneRecipe(PlainRecord):
    """What makes two fine-tunes of one configuration the same run, so that a finished or half-trained one is reused
    only under the same recipe: the length, learning rate, warm-up, the curve's stops and the seed (fairseq draws
    the batches' order and dropout from it). ``None`` in a recorded recipe: not recorded, not compared."""

    length: str  # "500 updates", "3 epochs"
    lr: Optional[float]
    warmup_updates: Optional[int]
    stops: Optional[Tuple[Tuple[str, int], ...]]  # FinetuneSettings.curve_stops(): the end last; () without a curve
    seed: Optional[int]

    def difference(self, recorded: "FinetuneRecipe") -> Optional[str]:
        """How ``recorded`` (a fine-tune found on disk) differs from this one, in words; None: the same run."""
        if recorded.length != self.length:
            return f"fine-tuned {recorded.length}, not {self.length}"
        if recorded.lr is not None and self.lr is not None and not math.isclose(recorded.lr, self.lr, rel_tol=1e-9):
            return f"fine-tuned at learning rate {recorded.lr:g}, not {self.lr:g}"
        if recorded.warmup_updates is not None and recorded.warmup_updates != self.warmup_updates:
            return f"fine-tuned with {recorded.warmup_updates} warm-up updates, not {self.warmup_updates}"
        if recorded.stops is not None and tuple(map(tuple, recorded.stops)) != self.stops:
            return f"scored at {_stops_text(recorded.stops)}, not {_stops_text(self.stops)}"
        if recorded.seed is not None and self.seed is not None and recorded.seed != self.seed:
            return f"fine-tuned under seed {recorded.seed}, not {self.seed}"
        return None

    def for_draw(self, draw: Optional[int]) -> "FinetuneRecipe":
        """The recipe of a random budget's draw ``draw`` (1, 2, ...): its own seed, ``seed + draw - 1``. Budhraja et
        al. sample ξ and fine-tune anew for each of their three draws, so a draw's batches' order and dropout vary
        with its mask and the interval over draws holds both; draw 1 and every configuration without draws (the
        control, layer strategies, curve steps) share the seed, so those are compared on the same batches."""
        if draw is None or draw == 1 or self.seed is None:
            return self
        return dataclasses.replace(self, seed=self.seed + draw - 1)


def _stops_text(stops) -> str:
    """``update 25, 50, 500`` (the curve's stops); ``the end only`` without a curve."""
    if not stops:
        return "the end only"
    return f"{stops[0][0]} " + ", ".join(str(at) for _, at in stops)
