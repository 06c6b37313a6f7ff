"""The ``headprune_word_distillation`` criterion: word-level knowledge distillation from the unpruned model.

Kim & Rush (2016, section 3.1): at every target position the student is
trained towards the teacher's whole distribution over the vocabulary, not
only the reference word: the loss is ``(1 - w) * label-smoothed NLL + w *
sum_k -q_teacher(k) log p_student(k)``, summed over the target tokens as
fairseq's label-smoothed criterion sums its loss. The teacher is a frozen
fairseq checkpoint (the unpruned model) loaded with its own task on the same
data; it is kept out of the criterion's parameters, so fairseq neither
trains nor saves it. ``compress --distill word`` fine-tunes with it.

``fairseq-train --task fairseq-headprune --criterion headprune_word_distillation
--distill-teacher UNPRUNED.pt --distill-weight 0.5 ...``
"""

import math
from dataclasses import dataclass, field

import torch
from fairseq import checkpoint_utils, utils
from fairseq.criterions import register_criterion
from fairseq.criterions.label_smoothed_cross_entropy import (
    LabelSmoothedCrossEntropyCriterion,
    LabelSmoothedCrossEntropyCriterionConfig,
)
from fairseq.logging import metrics

from fairseq_headprune.constants import DEFAULT_LABEL_SMOOTHING
from fairseq_headprune.errors import SettingsError
from fairseq_headprune.study.compression.settings import DEFAULT_DISTILL_WEIGHT, WORD_DISTILLATION

CRITERION_NAME = WORD_DISTILLATION


@dataclass
class HeadPruneWordDistillationConfig(LabelSmoothedCrossEntropyCriterionConfig):
    label_smoothing: float = field(
        default=DEFAULT_LABEL_SMOOTHING,
        metadata={"help": "epsilon for label smoothing of the reference part of the loss"},
    )
    distill_teacher: str = field(
        default="",
        metadata={"help": "the teacher: a fairseq checkpoint (the unpruned model) with this task's dictionaries"},
    )
    distill_weight: float = field(
        default=DEFAULT_DISTILL_WEIGHT,
        metadata={"help": "share of the teacher's distribution in the loss (0: the references alone, 1: the teacher "
                          "alone)"},
    )


class _Frozen:
    """Holds the teacher outside the criterion's modules, so that fairseq neither optimises nor saves it."""

    def __init__(self, model):
        self.model = model


@register_criterion(CRITERION_NAME, dataclass=HeadPruneWordDistillationConfig)
class HeadPruneWordDistillationCriterion(LabelSmoothedCrossEntropyCriterion):
    """Label-smoothed cross-entropy interpolated with the cross-entropy against a teacher's distributions."""

    def __init__(self, task, sentence_avg, label_smoothing, distill_teacher="", distill_weight=DEFAULT_DISTILL_WEIGHT,
                 ignore_prefix_size=0, report_accuracy=False):
        super().__init__(task, sentence_avg, label_smoothing, ignore_prefix_size, report_accuracy)
        if not distill_teacher:
            raise SettingsError(f"the criterion {CRITERION_NAME} needs the distill teacher CHECKPOINT",
                                setting=("criterion", "distill_teacher"))
        if not 0.0 <= distill_weight <= 1.0:
            raise SettingsError(f"the distill weight must be between 0 and 1, got {distill_weight:g}",
                                setting="distill_weight")
        self.distill_weight = float(distill_weight)
        models, _ = checkpoint_utils.load_model_ensemble([distill_teacher],
                                                         arg_overrides={"data": task.cfg.data})
        teacher = models[0]
        if len(teacher.decoder.dictionary) != len(task.target_dictionary):
            raise SettingsError(f"the distill teacher {distill_teacher} has {len(teacher.decoder.dictionary)} "
                                f"target words, the data {len(task.target_dictionary)}", setting="distill_teacher")
        teacher.eval()
        for parameter in teacher.parameters():
            parameter.requires_grad_(False)
        self._teacher = _Frozen(teacher)

    def teacher_lprobs(self, sample) -> torch.Tensor:
        """The teacher's log-probabilities at every target position, (batch * length, vocabulary)."""
        teacher = self._teacher.model
        device = sample["target"].device
        if next(teacher.parameters()).device != device:
            teacher.to(device)
        with torch.no_grad():
            output = teacher(**sample["net_input"])
            lprobs = teacher.get_normalized_probs(output, log_probs=True).float()
        if self.ignore_prefix_size > 0:
            lprobs = lprobs[:, self.ignore_prefix_size:, :]
        return lprobs.reshape(-1, lprobs.size(-1))

    def forward(self, model, sample, reduce=True):
        net_output = model(**sample["net_input"])
        reference_loss, nll_loss = self.compute_loss(model, net_output, sample, reduce=reduce)
        lprobs, target = self.get_lprobs_and_target(model, net_output, sample)
        tokens = target.ne(self.padding_idx)
        teacher = self.teacher_lprobs(sample)
        distill_loss = -(teacher.exp() * lprobs.float()).sum(-1)[tokens]
        distill_loss = distill_loss.sum() if reduce else distill_loss
        loss = (1.0 - self.distill_weight) * reference_loss + self.distill_weight * distill_loss
        sample_size = sample["target"].size(0) if self.sentence_avg else sample["ntokens"]
        logging_output = {
            "loss": loss.data,
            "nll_loss": nll_loss.data,
            "distill_loss": distill_loss.data,
            "ntokens": sample["ntokens"],
            "nsentences": sample["target"].size(0),
            "sample_size": sample_size,
        }
        if self.report_accuracy:
            n_correct, total = self.compute_accuracy(model, net_output, sample)
            logging_output["n_correct"] = utils.item(n_correct.data)
            logging_output["total"] = utils.item(total.data)
        return loss, sample_size, logging_output

    @classmethod
    def reduce_metrics(cls, logging_outputs) -> None:
        """fairseq's label-smoothed metrics, and the teacher part per target token (base 2), summed over workers."""
        super().reduce_metrics(logging_outputs)
        distill = sum(log.get("distill_loss", 0) for log in logging_outputs)
        tokens = sum(log.get("ntokens", 0) for log in logging_outputs)
        metrics.log_scalar("distill_loss", distill / max(tokens, 1) / math.log(2), tokens, round=3)

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return True
