"""Settings of ``prune`` (Michel et al.'s curves, Budhraja et al.'s budgets) and of fine-tuning with units held.

Split from ``settings`` for size; the same conventions: validated where made,
``SettingsError`` naming the option.
"""

import glob
import os
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

from ..constants import (
    DEFAULT_DRAWS,
    DEFAULT_PRUNING_SEED,
    DEFAULT_SEQUENCE_LENGTH,
    ORDERS,
    PRUNED_STRUCTURES,
    SCOPES,
    STRUCTURE_ORDERS,
    X_AXES,
)
from ..errors import SettingsError
from .settings import CurveSettings, SweepSettings, TuningSettings, _one_of, _positive, _refuse

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
        _refuse(not self.enabled, "--finetune-curve goes with --finetune-updates N")
        _refuse(bool(self.epochs), "--finetune-curve: with --finetune-epochs the curve is scored at every epoch's end")
        for point in self.curve:
            _refuse(not 0 < point < self.updates,
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


@dataclass
class PruneSettings:
    """``prune``: pruning curves (Michel et al. sections 4.2, 5) and random budgets (Budhraja et al.)."""

    sweep: SweepSettings
    curve: CurveSettings = field(default_factory=CurveSettings)
    orders: List[str] = field(default_factory=lambda: ["importance"])
    scopes: List[str] = field(default_factory=lambda: ["all"])
    importance_file: Optional[str] = None  # importance.json to rank by, instead of estimating
    ablation_file: Optional[str] = None  # single.json/.tsv of ablate --mode single
    draws: int = DEFAULT_DRAWS
    pruning_seed: int = DEFAULT_PRUNING_SEED
    layer_budgets: List[str] = field(default_factory=list)
    type_budgets: List[str] = field(default_factory=list)
    random_levels: List[float] = field(default_factory=list)  # % of heads pruned at random, >= 1 head per layer kept
    layer_strategies: List[str] = field(default_factory=list)  # whole layers pruned by position (top:K, middle:K ...)
    budhraja_tables: List[int] = field(default_factory=list)  # every configuration of these tables of Budhraja et al.
    fisher_file: Optional[str] = None  # Fisher scores and blocks for the fisher orders, instead of estimating
    tuning: Optional[TuningSettings] = None  # --tune-masks: also every curve of tune_orders with tuned masks
    tune_orders: List[str] = field(default_factory=list)
    gate_masks: List[str] = field(default_factory=list)  # masks learned by headprune_gates: the gates order
    structure: str = "heads"  # heads; ffn: FFN neurons by an order or searched; joint: heads and neurons searched
    x_axis: Optional[str] = None  # units (heads or neurons pruned) or flops (layers' FLOPs removed); None: by structure
    sequence_length: int = DEFAULT_SEQUENCE_LENGTH  # attended positions of the attention FLOPs (the flops axis)
    # Budhraja et al.'s protocol: every budget's draws, and the curves' steps at these levels, fine-tuned
    finetune: Optional[FinetuneSettings] = None
    finetune_levels: List[float] = field(default_factory=list)  # % pruned: the curves' steps fine-tuned
    config_shard: Tuple[int, int] = (1, 1)  # this process fine-tunes the I-th of K shares of the configurations

    def __post_init__(self):
        self._check_structure()
        self._check_finetune()
        if self.gate_masks and "gates" not in self.orders:
            self.orders = list(self.orders) + ["gates"]
        if "gates" in self.orders and not self.gate_masks:
            raise SettingsError("--orders gates needs --gate-masks FILE... (mask --from-gates of trained gates)")
        if "gates" in self.orders and self.scopes != ["all"]:
            raise SettingsError("--gate-masks: learned masks cover every attention type; use --scopes all")
        if self.tuning is not None:
            self.tuning.refuse_evaluation_split(self.sweep.gen_subset)
            unknown = [o for o in self.tune_orders if o not in self.orders]
            if unknown:
                raise SettingsError(f"--tune-orders {unknown[0]}: not one of --orders ({', '.join(self.orders)})")
        for value, allowed, option in ((self.orders, ORDERS, "--orders"), (self.scopes, SCOPES, "--scopes")):
            unknown = [v for v in value if v not in allowed]
            if unknown:
                raise SettingsError(f"{option}: unknown value {unknown[0]!r} (expected {', '.join(allowed)})")
        if not (self.orders and self.scopes) and not self.has_budgets:
            raise SettingsError("nothing to do: no --orders/--scopes and no --layer-budget/--type-budget/"
                                "--random-level/--layer-strategy/--budhraja-tables")
        for level in self.random_levels:
            _refuse(not 0 < level < 100, f"--random-level {level:g}: a share of the heads pruned, above 0 and below 100")
        _refuse(self.draws <= 0, f"--draws must be positive, got {self.draws}")
        if "ablation" in self.orders and not self.ablation_file:
            raise SettingsError("--orders ablation needs --ablation FILE (single.json of ablate --mode single)")

    def _check_finetune(self) -> None:
        index, count = self.config_shard
        _refuse(not 1 <= index <= count, f"--config-shard {index}/{count}: expected I/K with 1 <= I <= K")
        enabled = self.finetune is not None and self.finetune.enabled
        if not enabled:
            _refuse(bool(self.finetune_levels), "--finetune-levels goes with --finetune-updates/--finetune-epochs N")
            _refuse(count > 1, "--config-shard shares the fine-tuned configurations: add --finetune-updates N")
            return
        _refuse(self.structure != "heads", "--finetune-updates: the study fine-tunes head configurations only")
        # fairseq's binarized splits: translation train.SRC-TGT.SRC.bin, LMs train.bin, RoBERTa input0/train.bin
        _refuse(not glob.glob(os.path.join(self.sweep.data, "**", "train*.bin"), recursive=True),
                f"--finetune-updates: {self.sweep.data} has no training split (train*.bin) to fine-tune on")
        _refuse(not (self.has_budgets or self.finetune_levels),
                "--finetune-updates: nothing to fine-tune; add budgets (--random-level, --layer-strategy, "
                "--budhraja-tables ...) or --finetune-levels P,... for the curves' steps")
        for level in self.finetune_levels:
            _refuse(not 0 < level < 100, f"--finetune-levels {level:g}: a share of the heads pruned, above 0, below 100")
        _refuse(bool(self.finetune_levels) and not (self.orders and self.scopes),
                "--finetune-levels fine-tunes the curves' steps: give --orders (e.g. importance)")

    @property
    def has_budgets(self) -> bool:
        """Whether any of Budhraja et al.'s configurations is asked for."""
        return bool(self.layer_budgets or self.type_budgets or self.random_levels or self.layer_strategies
                    or self.budhraja_tables)

    def _check_structure(self) -> None:
        """FFN and joint curves: every FFN layer (scope all), their own orders, no head budgets, tuning or gates."""
        _one_of(self.structure, PRUNED_STRUCTURES, "--structure")
        if self.x_axis is None:
            self.x_axis = "flops" if self.structure == "joint" else "units"
        _one_of(self.x_axis, X_AXES, "--x-axis")
        _positive(self.sequence_length, "--sequence-length")
        if self.structure == "heads":
            return
        what = f"--structure {self.structure}"
        if self.x_axis == "units" and self.structure == "joint":
            raise SettingsError(f"{what} prunes heads and neurons together: its x-axis is --x-axis flops")
        unknown = [o for o in self.orders if o not in STRUCTURE_ORDERS[self.structure]]
        if unknown:
            raise SettingsError(f"--orders {unknown[0]}: not an order of {what} "
                                f"({', '.join(STRUCTURE_ORDERS[self.structure])})")
        for given, option in ((self.scopes != ["all"], "--scopes"), (self.layer_budgets, "--layer-budget"),
                              (self.type_budgets, "--type-budget"), (self.random_levels, "--random-level"),
                              (self.layer_strategies, "--layer-strategy"), (self.budhraja_tables, "--budhraja-tables"),
                              (self.gate_masks, "--gate-masks")):
            _refuse(given, f"{option}: for head curves only; {what} prunes every FFN layer")
