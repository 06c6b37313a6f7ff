"""The ``headprune_importance`` criterion: translation loss + head importance.

It computes the usual translation loss and, during the backward pass that
fairseq runs anyway, accumulates I_h = E_x |dL(x)/dxi_h| for every head, or
with ``--importance-method fisher`` F_h = E_x (dL(x)/dxi_h)^2 (see
``importance.py`` for both and the granularities).  Sums and counts travel in
``logging_outputs`` as (layers, heads) tensors, so fairseq adds them up
across data-parallel workers before ``reduce_metrics`` logs them.
"""

import contextlib
import math
from dataclasses import dataclass, field
from typing import Dict, Iterator, Optional

import torch
from fairseq.criterions import register_criterion
from fairseq.criterions.label_smoothed_cross_entropy import (
    LabelSmoothedCrossEntropyCriterion,
    LabelSmoothedCrossEntropyCriterionConfig,
)
from fairseq.dataclass import ChoiceEnum
from fairseq.logging import metrics

from fairseq_headprune.constants import (
    ATTENTION_TYPES,
    DEFAULT_GRANULARITY,
    DEFAULT_IMPORTANCE_LOSS,
    DEFAULT_IMPORTANCE_METHOD,
    DEFAULT_LABEL_SMOOTHING,
    FFN_TYPES,
    GRANULARITIES,
    IMPORTANCE_LOSSES,
    IMPORTANCE_METHODS,
)
from fairseq_headprune.modules.masked_ffn import ffn_layers, install_ffn_masks
from fairseq_headprune.modules.masked_multihead_attention import install_masked_attention
from fairseq_headprune.study.importance.scores import HeadScores, fisher_block_terms, reduce_contributions

CRITERION_NAME = "headprune_importance"
IMPORTANCE_SUM_KEY = "head_importance_sum:"  # + attention type
IMPORTANCE_COUNT_KEY = "head_importance_count"
FISHER_BLOCK_SUM_KEY = "head_fisher_block_sum:"  # + attention type; the fisher method only
NEURON_SUM_KEY = "neuron_importance_sum:"  # + FFN type; with importance_neurons only
# hidden meters (fairseq does not print keys starting with "_")
IMPORTANCE_METER = "_head_importance_sum:"
COUNT_METER = "_head_importance_count"
FISHER_BLOCK_METER = "_head_fisher_block_sum:"
NEURON_METER = "_neuron_importance_sum:"


@dataclass
class HeadPruneImportanceConfig(LabelSmoothedCrossEntropyCriterionConfig):
    label_smoothing: float = field(
        default=DEFAULT_LABEL_SMOOTHING,
        metadata={"help": "epsilon for label smoothing (0.1 as the WMT14 En-Fr model was trained)"},
    )
    importance_loss: ChoiceEnum(list(IMPORTANCE_LOSSES)) = field(
        default=DEFAULT_IMPORTANCE_LOSS,
        metadata={
            "help": "the loss L whose gradient scores the heads, and that this "
            "criterion returns: plain NLL (the default, as the authors' code) or "
            "label-smoothed cross-entropy (pass label_smoothed to train with it)"
        },
    )
    importance_granularity: ChoiceEnum(list(GRANULARITIES)) = field(
        default=DEFAULT_GRANULARITY,
        metadata={
            "help": "where |dL/dxi_h| is taken: per sentence (the paper's E_x), per "
            "target token (the authors' released code) or per batch"
        },
    )
    importance_method: ChoiceEnum(list(IMPORTANCE_METHODS)) = field(
        default=DEFAULT_IMPORTANCE_METHOD,
        metadata={
            "help": "gradient: I_h = E_x |dL(x)/dxi_h| (Michel et al. 2019); fisher: F_h = E_x (dL(x)/dxi_h)^2, "
            "the mask's diagonal Fisher information (Kwon et al. 2022), from the same backward pass"
        },
    )
    importance_neurons: bool = field(
        default=False,
        metadata={"help": "also score every FFN neuron: E_x |dL(x)/dzeta_i| (or its square) of a mask variable on "
                  "fc2's input, from the same backward pass (Kwon et al. 2022)"},
    )
    importance_save_dir: Optional[str] = field(
        default=None,
        metadata={
            "help": "in fairseq-train: write the importance accumulated over the "
            "epoch so far to DIR/importance_epochN.{json,tsv} whenever validation runs"
        },
    )


class HeadImportanceRecorder:
    """Collects per-head |dL/dxi_h| sums (and, asked, per-neuron |dL/dzeta_i|) from the backward pass of one forward.

    While active, every attention module (and FFN) has a mask that requires
    grad (ones, or a copy of the mask already set), so the backward pass
    reaches each head's scaled output (each neuron's scaled activation) even
    when the parameters are frozen; a tensor hook there turns the output
    gradient into per-position contributions.
    """

    def __init__(self, model, granularity: str, method: str = DEFAULT_IMPORTANCE_METHOD, neurons: bool = False):
        self.granularity = granularity
        self.method = method
        self.modules = install_masked_attention(model)
        # FFN neurons (Kwon et al. 2022): the same |dL/dzeta_i| sums, from fc2's input
        self.neuron_masks = install_ffn_masks(model) if neurons else {}
        self.neuron_widths = {key: layer.fc2.in_features for key, layer in ffn_layers(model).items()} if neurons else {}
        self.neuron_sums: HeadScores = {}
        device = next(model.parameters()).device
        for ffn_type in FFN_TYPES:
            widths = [width for (kind, _), width in sorted(self.neuron_widths.items()) if kind == ffn_type]
            if widths:
                self.neuron_sums[ffn_type] = torch.zeros(len(widths), max(widths), dtype=torch.float64, device=device)
        layers: Dict[str, int] = {}
        heads: Dict[str, int] = {}
        for (attention_type, layer_index), module in self.modules.items():
            layers[attention_type] = max(layers.get(attention_type, 0), layer_index + 1)
            heads[attention_type] = max(heads.get(attention_type, 0), module.num_heads)
        # running sums, filled in place by the backward pass
        self.sums: HeadScores = {
            t: torch.zeros(layers[t], heads[t], dtype=torch.float64, device=device)
            for t in ATTENTION_TYPES
            if t in layers
        }
        # the fisher method also sums g g^T over each layer's heads (Kwon et al.'s block-diagonal Fisher)
        self.blocks: HeadScores = {
            t: torch.zeros(layers[t], heads[t], heads[t], dtype=torch.float64, device=device)
            for t in self.sums
        } if method == "fisher" else {}

    def _on_head_outputs(self, module, head_outputs: torch.Tensor, scaled: torch.Tensor) -> None:
        if not scaled.requires_grad:
            return
        sums = self.sums[module.attention_type][module.layer_index]
        blocks = self.blocks[module.attention_type][module.layer_index] if self.blocks else None
        granularity, method = self.granularity, self.method

        def accumulate(grad: torch.Tensor) -> None:
            contributions = (head_outputs.detach() * grad).sum(dim=-1).to(torch.float64)  # T x B x H
            heads = contributions.size(-1)
            sums[:heads] += reduce_contributions(contributions, granularity, method)
            if blocks is not None:
                blocks[:heads, :heads] += fisher_block_terms(contributions, granularity)

        scaled.register_hook(accumulate)

    def _on_neuron_outputs(self, neuron_mask, hidden: torch.Tensor, scaled: torch.Tensor) -> None:
        if not scaled.requires_grad:
            return
        sums = self.neuron_sums[neuron_mask.ffn_type][neuron_mask.layer_index]
        granularity, method = self.granularity, self.method

        def accumulate(grad: torch.Tensor) -> None:
            contributions = (hidden.detach() * grad).to(torch.float64)  # T x B x F: zeta_i's gradient terms
            sums[:contributions.size(-1)] += reduce_contributions(contributions, granularity, method)

        scaled.register_hook(accumulate)

    @contextlib.contextmanager
    def recording(self) -> Iterator["HeadImportanceRecorder"]:
        saved = {key: module.head_mask for key, module in self.modules.items()}
        saved_neurons = {key: hook.mask for key, hook in self.neuron_masks.items()}
        try:
            for hook in self.neuron_masks.values():
                width = self.neuron_widths[(hook.ffn_type, hook.layer_index)]
                mask = hook.mask if hook.mask is not None else torch.ones(
                    width, device=self.neuron_sums[hook.ffn_type].device)
                hook.mask = mask.detach().clone().float().requires_grad_(True)
                hook.output_hook = self._on_neuron_outputs
            for module in self.modules.values():
                device = module.out_proj.weight.device
                mask = module.head_mask
                if mask is None:
                    mask = torch.ones(module.num_heads, device=device)
                module.head_mask = mask.detach().clone().requires_grad_(True)
                module.head_output_hook = self._on_head_outputs
            yield self
        finally:
            for key, module in self.modules.items():
                module.head_mask = saved[key]
                module.head_output_hook = None
            for key, hook in self.neuron_masks.items():
                hook.mask = saved_neurons[key]
                hook.output_hook = None


def translation_sample_size(sample, sentence_avg: bool):
    """What fairseq's label-smoothed criterion divides the batch's loss by: sentences or target tokens."""
    return sample["target"].size(0) if sentence_avg else sample["ntokens"]


def translation_logging_output(loss, nll_loss, sample, sample_size):
    """The entries fairseq's label-smoothed criterion logs for one batch."""
    return {
        "loss": loss.data,
        "nll_loss": nll_loss.data,
        "ntokens": sample["ntokens"],
        "nsentences": sample["target"].size(0),
        "sample_size": sample_size,
    }


def importance_count(sample, granularity: str) -> float:
    """What the importance sums of one batch are averaged over."""
    if granularity == "sentence":
        return float(sample["target"].size(0))
    if granularity == "token":
        return float(sample["ntokens"])
    return 1.0


@register_criterion(CRITERION_NAME, dataclass=HeadPruneImportanceConfig)
class HeadPruneImportanceCriterion(LabelSmoothedCrossEntropyCriterion):
    """Label-smoothed (or plain NLL) translation loss that also scores heads.

    Works in any loop that calls ``loss.backward()`` after the forward pass:
    fairseq-train (to watch importance while training) and the
    ``fairseq-headprune importance`` command (frozen parameters, no update).
    Forward passes without gradients (validation) record nothing.
    """

    def __init__(
        self,
        task,
        sentence_avg,
        label_smoothing,
        importance_loss=DEFAULT_IMPORTANCE_LOSS,
        importance_granularity=DEFAULT_GRANULARITY,
        importance_method=DEFAULT_IMPORTANCE_METHOD,
        importance_neurons=False,
        importance_save_dir=None,
        ignore_prefix_size=0,
        report_accuracy=False,
    ):
        super().__init__(task, sentence_avg, label_smoothing, ignore_prefix_size, report_accuracy)
        # fairseq passes ChoiceEnum members; keep plain strings
        self.importance_loss = str(importance_loss)
        self.importance_granularity = str(importance_granularity)
        self.importance_method = str(importance_method)
        self.importance_neurons = bool(importance_neurons)
        self.importance_save_dir = importance_save_dir

    def forward(self, model, sample, reduce=True):
        recorder = HeadImportanceRecorder(model, self.importance_granularity, self.importance_method,
                                          self.importance_neurons)
        recording = reduce and torch.is_grad_enabled()
        with recorder.recording() if recording else contextlib.nullcontext():
            net_output = model(**sample["net_input"])
        loss, nll_loss = self.compute_loss(model, net_output, sample, reduce=reduce)
        if self.importance_loss == "nll":
            loss = nll_loss
        sample_size = translation_sample_size(sample, self.sentence_avg)
        logging_output = translation_logging_output(loss, nll_loss, sample, sample_size)
        # the sums are filled in place when fairseq runs loss.backward()
        logging_output[IMPORTANCE_COUNT_KEY] = (importance_count(sample, self.importance_granularity)
                                                if recording else 0.0)
        for attention_type, sums in recorder.sums.items():
            logging_output[IMPORTANCE_SUM_KEY + attention_type] = sums
        for attention_type, blocks in recorder.blocks.items():
            logging_output[FISHER_BLOCK_SUM_KEY + attention_type] = blocks
        for ffn_type, sums in recorder.neuron_sums.items():
            logging_output[NEURON_SUM_KEY + ffn_type] = sums
        if self.report_accuracy:
            n_correct, total = self.compute_accuracy(model, net_output, sample)
            logging_output["n_correct"] = n_correct.item()
            logging_output["total"] = total.item()
        return loss, sample_size, logging_output

    @classmethod
    def reduce_metrics(cls, logging_outputs) -> None:
        super().reduce_metrics(logging_outputs)
        count = sum(float(log.get(IMPORTANCE_COUNT_KEY, 0)) for log in logging_outputs)
        if count <= 0:
            return
        metrics.log_scalar_sum(COUNT_METER, count)
        for attention_type in ATTENTION_TYPES:
            key = IMPORTANCE_SUM_KEY + attention_type
            sums = [log[key] for log in logging_outputs if key in log]
            if not sums:
                continue
            total = torch.stack([s.detach().to("cpu", torch.float64) for s in sums]).sum(dim=0)
            metrics.log_scalar_sum(IMPORTANCE_METER + attention_type, total)
            blocks = [log[FISHER_BLOCK_SUM_KEY + attention_type] for log in logging_outputs
                      if FISHER_BLOCK_SUM_KEY + attention_type in log]
            if blocks:
                metrics.log_scalar_sum(
                    FISHER_BLOCK_METER + attention_type,
                    torch.stack([b.detach().to("cpu", torch.float64) for b in blocks]).sum(dim=0),
                )
            # one readable number per type in the training log: mean I_h
            metrics.log_derived(
                "imp_" + attention_type.replace("-", "_"),
                _mean_importance_of(attention_type),
            )
        for ffn_type in FFN_TYPES:
            sums = [log[NEURON_SUM_KEY + ffn_type] for log in logging_outputs if NEURON_SUM_KEY + ffn_type in log]
            if sums:
                metrics.log_scalar_sum(NEURON_METER + ffn_type,
                                       torch.stack([s.detach().to("cpu", torch.float64) for s in sums]).sum(dim=0))

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return True


def _mean_importance_of(attention_type: str):
    def mean_importance(meters) -> float:
        total = meters[IMPORTANCE_METER + attention_type].sum
        count = meters[COUNT_METER].sum
        return round(float(total.mean()) / count, 6) if count else math.nan

    return mean_importance


def _means_from_meters(meters, prefix: str, types, count: float) -> Optional[HeadScores]:
    """Per type, the summed meter ``prefix + type`` divided by ``count``, or None when no type has one."""
    means = {kind: meters[prefix + kind].sum.to(torch.float64) / count for kind in types if prefix + kind in meters}
    return means or None


def fisher_blocks_from_meters(meters, count: float) -> Optional[HeadScores]:
    """Per type, the mean g g^T of each layer's heads (the fisher method), or None."""
    return _means_from_meters(meters, FISHER_BLOCK_METER, ATTENTION_TYPES, count)


def importance_from_meters(meters) -> Optional[tuple]:
    """(scores per type, count) from an aggregator's meters, or None if empty."""
    if COUNT_METER not in meters:
        return None
    count = float(meters[COUNT_METER].sum)
    if count <= 0:
        return None
    scores = {}
    for attention_type in ATTENTION_TYPES:
        key = IMPORTANCE_METER + attention_type
        if key in meters:
            scores[attention_type] = meters[key].sum.to(torch.float64) / count
    return scores, count


def neuron_importance_from_meters(meters, count: float) -> Optional[HeadScores]:
    """Per FFN type, the mean |dL/dzeta_i| (or its square) of every neuron, or None when not scored."""
    return _means_from_meters(meters, NEURON_METER, FFN_TYPES, count)
