"""Fine-tuning with the pruned units held at zero: its length, learning rate and recovery curve (``prune``'s
configurations after Budhraja et al., and ``compress``)."""

from dataclasses import dataclass
from typing import List, Optional, Tuple

from fairseq_headprune.errors import SettingsError
from fairseq_headprune.study.settings import refuse

FINETUNE_LR_SHARE = 0.1  # default fine-tuning learning rate: this share of the checkpoint's own peak rate


FINETUNE_WARMUP_SHARE = 0.1  # default warm-up: this share of the updates


# the recovery curve's default points (updates), those below the fine-tune's length; its end is always a point
DEFAULT_CURVE_UPDATES = (40, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000)


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

    def __post_init__(self):
        if self.updates < 0 or self.epochs < 0:
            raise SettingsError(f"--finetune-updates and --finetune-epochs must be 0 or more, got "
                                f"{self.updates if self.updates < 0 else self.epochs}")
        if self.updates and self.epochs:
            raise SettingsError("give --finetune-updates N or --finetune-epochs N, not both")
        self._check_rate()
        self._check_curve()

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
        return self.lr if self.lr is not None else FINETUNE_LR_SHARE * checkpoint_lr

    def warmup_updates(self) -> int:
        return self.warmup if self.warmup is not None else int(FINETUNE_WARMUP_SHARE * self.updates)

    def length(self) -> str:
        """``300 updates`` or ``2 epochs``."""
        return f"{self.epochs} epochs" if self.epochs else f"{self.updates} updates"
