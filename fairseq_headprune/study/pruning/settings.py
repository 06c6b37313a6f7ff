"""Settings of the pruning curves: their levels and importance (``CurveSettings``), ``prune`` (Michel et al.'s
curves, Budhraja et al.'s budgets, and their fine-tuning) and ``dynamics`` (the curve over training epochs).

Validated where they are made; each check raises ``SettingsError`` naming the option.
"""

import glob
import os
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

from fairseq_headprune.constants import (
    DEFAULT_DRAWS,
    DEFAULT_MAX_PERCENT,
    DEFAULT_PRUNING_SEED,
    DEFAULT_SEQUENCE_LENGTH,
    DEFAULT_STEP_PERCENT,
    ORDERS,
    PRUNED_STRUCTURES,
    SCOPES,
    STRUCTURE_ORDERS,
    X_AXES,
)
from fairseq_headprune.errors import SettingsError, setting_words
from fairseq_headprune.study.finetune.settings import FinetuneSettings
from fairseq_headprune.study.search.settings import TuningSettings
from fairseq_headprune.study.settings import ImportanceSettings, SweepSettings, check_one_of, check_positive, refuse


@dataclass
class CurveSettings:
    """The pruning curve by importance: levels and how importance is estimated (prune, dynamics)."""

    step_percent: float = DEFAULT_STEP_PERCENT
    max_percent: float = DEFAULT_MAX_PERCENT
    importance: ImportanceSettings = field(default_factory=ImportanceSettings)
    raw_importance: bool = False  # rank by raw I_h, not normalised per layer (the paper normalises)

    def __post_init__(self):
        refuse(not 0 < self.step_percent <= 100,
               f"the step percent must be in (0, 100], got {self.step_percent:g}", "step_percent")
        refuse(not 0 <= self.max_percent <= 100,
               f"the max percent (the largest pruning level) must be in [0, 100], got {self.max_percent:g}",
               "max_percent")
        refuse(0 < self.max_percent < self.step_percent,
               f"the step percent ({self.step_percent:g}) is larger than the max percent ({self.max_percent:g}): the "
               "curve would hold the unpruned model only", ("step_percent", "max_percent"))


@dataclass
class DynamicsSettings:
    """``dynamics``: the importance-order pruning curve at every epoch checkpoint (section 6)."""

    sweep: SweepSettings  # its checkpoint is unused: every epoch's is swept in turn
    checkpoints: str
    curve: CurveSettings = field(default_factory=CurveSettings)
    epochs: Optional[List[int]] = None  # None: every epoch found


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
    budhraja_draws: Optional[int] = None  # draws of the tables' random configurations not given by hand (None: draws)
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
        if not 0 <= self.pruning_seed < 2 ** 32:  # numpy's RandomState draws the random masks
            raise SettingsError(f"the pruning seed must be from 0 to {2 ** 32 - 1}, got {self.pruning_seed}",
                                setting="pruning_seed")
        self._check_structure()
        self._check_finetune()
        for path in self.gate_masks:  # before any work: the masks are read only after the curves' importance
            refuse(not os.path.isfile(path), f"the gate masks: file not found: {path}", "gate_masks")
        if self.gate_masks and "gates" not in self.orders:
            self.orders = list(self.orders) + ["gates"]
        if "gates" in self.orders and not self.gate_masks:
            raise SettingsError("the orders gates needs the gate masks FILE... (mask --from-gates of trained gates)",
                                setting=("orders", "gate_masks"))
        if "gates" in self.orders and self.scopes != ["all"]:
            raise SettingsError("the gate masks: learned masks cover every attention type; use the scopes all",
                                setting=("gate_masks", "scopes"))
        if self.tuning is not None:
            self.tuning.refuse_evaluation_split(self.sweep.gen_subset)
            unknown = [o for o in self.tune_orders if o not in self.orders]
            if unknown:
                raise SettingsError(f"the tune orders {unknown[0]}: not one of the orders ({', '.join(self.orders)})",
                                    setting=("tune_orders", "orders"))
        for value, allowed, setting in ((self.orders, ORDERS, "orders"), (self.scopes, SCOPES, "scopes")):
            unknown = [v for v in value if v not in allowed]
            if unknown:
                raise SettingsError(f"the {setting}: unknown value {unknown[0]!r} (expected {', '.join(allowed)})",
                                    setting=setting)
        if not (self.orders and self.scopes) and not self.has_budgets:
            raise SettingsError("nothing to do: neither the orders with the scopes nor the layer budget, the type "
                                "budget, the random level, the layer strategy or the budhraja tables",
                                setting=("orders", "scopes", "layer_budget", "type_budget", "random_level",
                                         "layer_strategy", "budhraja_tables"))
        for level in self.random_levels:
            refuse(not 0 < level < 100, f"the random level {level:g}: a share of the heads pruned, above 0 and below "
                   "100", "random_level")
        refuse(self.draws <= 0, f"the draws must be positive, got {self.draws}", "draws")
        if self.budhraja_draws is not None:
            refuse(self.budhraja_draws <= 0, f"the budhraja draws must be positive, got {self.budhraja_draws}",
                   "budhraja_draws")
            refuse(not self.budhraja_tables, "the budhraja draws goes with the budhraja tables",
                   ("budhraja_draws", "budhraja_tables"))
        if "ablation" in self.orders and not self.ablation_file:
            raise SettingsError("the orders ablation needs the ablation file FILE (single.json of ablate --mode "
                                "single)", setting=("orders", "ablation"))

    def _check_finetune(self) -> None:
        index, count = self.config_shard
        refuse(not 1 <= index <= count, f"the config shard {index}/{count}: expected I/K with 1 <= I <= K",
               "config_shard")
        enabled = self.finetune is not None and self.finetune.enabled
        if not enabled:
            refuse(bool(self.finetune_levels), "the finetune levels goes with the finetune updates/the finetune "
                   "epochs N", ("finetune_levels", "finetune_updates", "finetune_epochs"))
            refuse(count > 1, "the config shard shares the fine-tuned configurations: add the finetune updates N",
                   ("config_shard", "finetune_updates"))
            return
        refuse(self.structure != "heads", "the finetune updates: the study fine-tunes head configurations only",
               "finetune_updates")
        # fairseq's binarized splits: translation train.SRC-TGT.SRC.bin, LMs train.bin, RoBERTa input0/train.bin
        refuse(not glob.glob(os.path.join(self.sweep.data, "**", "train*.bin"), recursive=True),
               f"the finetune updates: {self.sweep.data} has no training split (train*.bin) to fine-tune on",
               "finetune_updates")
        refuse(not (self.has_budgets or self.finetune_levels),
               "the finetune updates: nothing to fine-tune; add budgets (the random level, the layer strategy, "
               "the budhraja tables ...) or the finetune levels P,... for the curves' steps",
               ("finetune_updates", "random_level", "layer_strategy", "budhraja_tables", "finetune_levels"))
        for level in self.finetune_levels:
            refuse(not 0 < level < 100, f"the finetune levels {level:g}: a share of the heads pruned, above 0, below "
                   "100", "finetune_levels")
        refuse(bool(self.finetune_levels) and not (self.orders and self.scopes),
               "the finetune levels fine-tunes the curves' steps: give the orders (e.g. importance)",
               ("finetune_levels", "orders"))

    @property
    def has_budgets(self) -> bool:
        """Whether any of Budhraja et al.'s configurations is asked for."""
        return bool(self.layer_budgets or self.type_budgets or self.random_levels or self.layer_strategies
                    or self.budhraja_tables)

    def _check_structure(self) -> None:
        """FFN and joint curves: every FFN layer (scope all), their own orders, no head budgets, tuning or gates."""
        check_one_of(self.structure, PRUNED_STRUCTURES, "structure")
        if self.x_axis is None:
            self.x_axis = "flops" if self.structure == "joint" else "units"
        check_one_of(self.x_axis, X_AXES, "x_axis")
        check_positive(self.sequence_length, "sequence_length")
        if self.structure == "heads":
            return
        if self.x_axis == "units" and self.structure == "joint":
            raise SettingsError("the structure joint prunes heads and neurons together: its x-axis is the x axis flops",
                                setting=("structure", "x_axis"))
        unknown = [o for o in self.orders if o not in STRUCTURE_ORDERS[self.structure]]
        if unknown:
            raise SettingsError(f"the orders {unknown[0]}: not an order of the structure {self.structure} "
                                f"({', '.join(STRUCTURE_ORDERS[self.structure])})", setting=("orders", "structure"))
        for given, setting in ((self.scopes != ["all"], "scopes"), (self.layer_budgets, "layer_budget"),
                               (self.type_budgets, "type_budget"), (self.random_levels, "random_level"),
                               (self.layer_strategies, "layer_strategy"), (self.budhraja_tables, "budhraja_tables"),
                               (self.gate_masks, "gate_masks")):
            refuse(given, f"{setting_words(setting)}: for head curves only; the structure {self.structure} prunes "
                   "every FFN layer",
                   (setting, "structure"))
