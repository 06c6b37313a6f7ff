"""The ``headprune_gates`` criterion: learn which heads to keep, exactly a given number of them.

One hard-concrete gate per head (``study.gates``; Voita et al. 2019) scales
the head's output during training; the loss is the translation loss under
the sampled gates plus a Lagrangian that holds the expected number of open
gates at ``--gate-target-heads`` (CoFi; Sheared-LLaMA), maximised over its
multipliers by reversing their gradient, so fairseq's one optimizer
descends on the gates and ascends on the multipliers. The gates and
multipliers are the criterion's parameters: fairseq optimises them with the
model's and saves them under the checkpoint's ``criterion`` key, leaving the
model's weights and keys as they were. Validation uses the exported mask,
exactly the target number of heads (the largest log_alpha), so
checkpoint_best is the best exact-budget mask. ``fairseq-headprune mask
--from-gates CKPT`` writes that mask as a spec every command reads.

Use from a converged checkpoint: ``fairseq-train --task fairseq-headprune
--criterion headprune_gates --gate-target-heads 36 --restore-file CKPT
--reset-optimizer --reset-dataloader --reset-meters --reset-lr-scheduler``.
"""

import functools
import math
from dataclasses import dataclass, field
from typing import Dict, Optional

import torch
from fairseq import checkpoint_utils
from fairseq.criterions import register_criterion
from fairseq.criterions.label_smoothed_cross_entropy import (
    LabelSmoothedCrossEntropyCriterion,
    LabelSmoothedCrossEntropyCriterionConfig,
)
from fairseq.logging import metrics

from fairseq_headprune.constants import ATTENTION_TYPES, DEFAULT_LABEL_SMOOTHING
from fairseq_headprune.criterions.headprune_importance import translation_logging_output, translation_sample_size
from fairseq_headprune.errors import SettingsError
from fairseq_headprune.modules.masked_multihead_attention import current_head_mask, head_mask_applied
from fairseq_headprune.study.search.gates import (
    deterministic_gates,
    log_alpha_for_open_probability,
    open_probability,
    parse_target_heads,
    sample_gates,
    top_k_mask,
)

CRITERION_NAME = "headprune_gates"
GATE_PARAMETER = "log_alpha_"  # + attention type with '_' for '-'


@dataclass
class HeadPruneGatesConfig(LabelSmoothedCrossEntropyCriterionConfig):
    label_smoothing: float = field(
        default=DEFAULT_LABEL_SMOOTHING,
        metadata={"help": "epsilon for label smoothing of the translation loss under the gates"},
    )
    gate_target_heads: str = field(
        default="50%",
        metadata={"help": "heads to keep: a number, or a percentage of the model's heads; the exported mask "
                          "keeps exactly this many"},
    )
    gate_train_model: bool = field(
        default=False,
        metadata={"help": "also train the model's own parameters (default: frozen, only the gates learn)"},
    )
    gate_init_log_alpha: Optional[float] = field(
        default=None,
        metadata={"help": "initial log_alpha of every gate (default: the value at which the expected number of "
                          "open gates is the target, so that the constraint starts satisfied)"},
    )


class _ReversedGradient(torch.autograd.Function):
    """Identity forward, negated gradient: the optimizer's descent becomes ascent on the multipliers."""

    @staticmethod
    def forward(ctx, value):
        return value.view_as(value)

    @staticmethod
    def backward(ctx, grad):
        return -grad


@register_criterion(CRITERION_NAME, dataclass=HeadPruneGatesConfig)
class HeadPruneGatesCriterion(LabelSmoothedCrossEntropyCriterion):
    """Translation loss under learned hard-concrete head gates, with the head budget as a constraint."""

    def __init__(self, task, sentence_avg, label_smoothing, gate_target_heads="50%", gate_train_model=False,
                 gate_init_log_alpha=None, ignore_prefix_size=0, report_accuracy=False):
        super().__init__(task, sentence_avg, label_smoothing, ignore_prefix_size, report_accuracy)
        layout = getattr(task, "model_head_layout", None)
        if not layout:
            raise SettingsError(f"the criterion {CRITERION_NAME} needs the task fairseq-headprune (the model's heads)",
                                setting=("criterion", "task"))
        total = sum(layers * heads for layers, heads in layout.values())
        target = parse_target_heads(gate_target_heads, total)
        self.layout = dict(layout)
        self.gate_train_model = bool(gate_train_model)
        if gate_init_log_alpha is None:
            gate_init_log_alpha = log_alpha_for_open_probability(min(target / total, 0.99))
        for attention_type, shape in self.layout.items():
            self.register_parameter(
                GATE_PARAMETER + attention_type.replace("-", "_"),
                torch.nn.Parameter(torch.full(shape, float(gate_init_log_alpha))),
            )
        self.lambda_1 = torch.nn.Parameter(torch.zeros(()))
        self.lambda_2 = torch.nn.Parameter(torch.zeros(()))
        self.register_buffer("target_heads", torch.tensor(float(target)))
        self._model_frozen = False
        self._restore_checkpoints_without_criterion_state()

    @staticmethod
    def _restore_checkpoints_without_criterion_state() -> None:
        """Let fairseq's trainer restore a checkpoint that has no ``criterion`` entry.

        For a criterion with parameters the trainer reads ``state["criterion"]``,
        which old-format checkpoints (the released WMT14 En-Fr model) lack: the
        KeyError surfaces as "Cannot load model parameters ... architectures
        match". The loader the trainer calls is wrapped (once, while this
        criterion is in use) so such a state says None, as fairseq's own writer
        does for a criterion without parameters; ``load_state_dict`` then keeps
        the initial gates.
        """
        load = checkpoint_utils.load_checkpoint_to_cpu
        if getattr(load, "fills_criterion_entry", False):
            return

        @functools.wraps(load)
        def load_with_criterion_entry(*args, **kwargs):
            state = load(*args, **kwargs)
            state.setdefault("criterion", None)
            return state

        load_with_criterion_entry.fills_criterion_entry = True
        checkpoint_utils.load_checkpoint_to_cpu = load_with_criterion_entry

    def load_state_dict(self, state_dict, strict: bool = True):
        """A converged model's checkpoint has no gates yet (``criterion`` is None): start from the initial ones."""
        if not state_dict or not any(key.startswith(GATE_PARAMETER) for key in state_dict):
            return None
        return super().load_state_dict(state_dict, strict)

    def log_alpha(self) -> Dict[str, torch.Tensor]:
        return {t: getattr(self, GATE_PARAMETER + t.replace("-", "_")) for t in ATTENTION_TYPES if t in self.layout}

    def _freeze(self, model) -> None:
        """The model's parameters get no gradient (once); the optimizer then skips them."""
        if not self._model_frozen and not self.gate_train_model:
            for parameter in model.parameters():
                parameter.requires_grad_(False)
        self._model_frozen = True

    def forward(self, model, sample, reduce=True):
        self._freeze(model)
        log_alpha = self.log_alpha()
        training = model.training and torch.is_grad_enabled()
        if training:
            gates = {t: sample_gates(v) for t, v in log_alpha.items()}
        else:
            gates = top_k_mask({t: v.detach() for t, v in log_alpha.items()}, int(self.target_heads))
        base = current_head_mask(model)
        device = next(model.parameters()).device
        gates = {t: g.to(device) * (1.0 if base is None or t not in base else base[t].to(device))
                 for t, g in gates.items()}
        with head_mask_applied(model, gates):
            net_output = model(**sample["net_input"])
        loss, nll_loss = self.compute_loss(model, net_output, sample, reduce=reduce)
        sample_size = translation_sample_size(sample, self.sentence_avg)
        expected = sum(open_probability(v).sum() for v in log_alpha.values())
        gap = expected - self.target_heads
        if training:
            lagrangian = (_ReversedGradient.apply(self.lambda_1) * gap
                          + _ReversedGradient.apply(self.lambda_2) * gap ** 2)
            loss = loss + lagrangian * sample_size
        open_gates = sum(int((deterministic_gates(v.detach()) > 0).sum()) for v in log_alpha.values())
        logging_output = translation_logging_output(loss, nll_loss, sample, sample_size)
        logging_output.update({
            # per batch, averaged over batches in reduce_metrics
            "gate_batches": 1,
            "gate_expected_heads": float(expected.detach()),
            "gate_open_heads": open_gates,
            "gate_lambda_1": float(self.lambda_1.detach()),
            "gate_lambda_2": float(self.lambda_2.detach()),
        })
        return loss, sample_size, logging_output

    @classmethod
    def reduce_metrics(cls, logging_outputs) -> None:
        super().reduce_metrics(logging_outputs)
        batches = sum(log.get("gate_batches", 0) for log in logging_outputs)
        if not batches:
            return
        for key, name in (("gate_expected_heads", "heads_expected"), ("gate_open_heads", "heads_open"),
                          ("gate_lambda_1", "lambda1"), ("gate_lambda_2", "lambda2")):
            total = sum(log.get(key, 0.0) for log in logging_outputs)
            metrics.log_scalar(name, total / batches, batches, round=3)

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return False


def gate_mask_from_state(criterion_state: Dict[str, torch.Tensor]):
    """The exported mask of a checkpoint's gates (exactly its target number of heads), and that number."""
    log_alpha = {
        t: criterion_state[GATE_PARAMETER + t.replace("-", "_")].detach().float()
        for t in ATTENTION_TYPES if GATE_PARAMETER + t.replace("-", "_") in criterion_state
    }
    if not log_alpha or "target_heads" not in criterion_state:
        return None, None
    kept = int(round(float(criterion_state["target_heads"])))
    return top_k_mask(log_alpha, kept), kept


def gate_summary(criterion_state: Dict[str, torch.Tensor]) -> Dict[str, float]:
    """Expected and deterministically open gates of a checkpoint's criterion state."""
    log_alpha = [v.detach().float() for k, v in criterion_state.items() if k.startswith(GATE_PARAMETER)]
    return {
        "expected_heads": float(sum(open_probability(v).sum() for v in log_alpha)),
        "open_heads": float(sum((deterministic_gates(v) > 0).sum() for v in log_alpha)),
        "lambda_1": float(criterion_state.get("lambda_1", torch.tensor(math.nan))),
        "lambda_2": float(criterion_state.get("lambda_2", torch.tensor(math.nan))),
    }
