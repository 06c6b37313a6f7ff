"""The passes that score heads on a loaded model: importance and the loss under a mask.

Importance (Michel et al. section 4.1) is a forward and backward pass
through the ``headprune_importance`` criterion with the parameters frozen;
its per-head sums come back through fairseq's ``logging_outputs`` and
``reduce_metrics``, as they would from distributed workers.
"""

import contextlib
from typing import Dict, Iterable, Optional

import torch
from fairseq.logging import metrics

from fairseq_headprune.criterions.headprune_importance import (
    HeadPruneImportanceCriterion,
    fisher_blocks_from_meters,
    importance_from_meters,
    neuron_importance_from_meters,
)
from fairseq_headprune.engine.runners.batches import iterate_samples, model_device, split_batches
from fairseq_headprune.engine.runners.device_batching import importance_batching
from fairseq_headprune.engine.runtime.progress import progress_bar
from fairseq_headprune.engine.runtime.ranks import current_ranks
from fairseq_headprune.errors import StudyError
from fairseq_headprune.modules.masked_multihead_attention import head_layout, head_mask_applied
from fairseq_headprune.study.importance.scores import ImportanceResult
from fairseq_headprune.study.masks.head_mask import HeadMask
from fairseq_headprune.study.settings import ImportanceSettings


def _sum_logging_outputs(total: Dict[str, object], logging_output: Dict[str, object]) -> None:
    """What fairseq's trainer does across workers, done across batches."""
    for key, value in logging_output.items():
        if torch.is_tensor(value):
            value = value.detach().to("cpu", torch.float64)
        total[key] = total[key] + value if key in total else value


@contextlib.contextmanager
def frozen_parameters(model):
    """No parameter gradients: backward then only reaches the head masks."""
    previous = [p.requires_grad for p in model.parameters()]
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    try:
        yield model
    finally:
        for parameter, flag in zip(model.parameters(), previous):
            parameter.requires_grad_(flag)


def estimate_importance(
    model,
    criterion,
    samples: Iterable[dict],
    total_batches: int,
    progress: bool = True,
    description: str = "importance",
) -> ImportanceResult:
    """Run forward and backward over ``samples`` and read the criterion's importance.

    ``criterion`` is a ``HeadPruneImportanceCriterion``.  Parameters stay
    frozen and unchanged; dropout is off (eval mode).  Under several ranks
    each takes every world_size-th batch and the sums are added over ranks.
    """

    ranks = current_ranks()
    samples = ranks.share(list(samples))
    total: Dict[str, object] = {}
    model.eval()
    with frozen_parameters(model), torch.enable_grad():
        for sample in progress_bar(samples, len(samples), description, progress):
            loss, _, logging_output = criterion(model, sample)
            loss.backward()  # fills the importance sums in logging_output
            _sum_logging_outputs(total, logging_output)
    if ranks.sharded:  # each rank had every world_size-th batch: sum over ranks, in rank order
        shares, total = ranks.gather(total), {}
        for share in shares:
            _sum_logging_outputs(total, share)
    if not total:
        raise StudyError("no batches to estimate importance on")
    with metrics.aggregate(new_root=True) as meters:
        criterion.__class__.reduce_metrics([total])
    found = importance_from_meters(meters)
    if found is None:
        raise StudyError("no gradient reached the head masks")
    scores, count = found
    return ImportanceResult(
        importance=scores,
        granularity=criterion.importance_granularity,
        method=criterion.importance_method,
        count=count,
        fisher_blocks=fisher_blocks_from_meters(meters, count),
        neuron_importance=neuron_importance_from_meters(meters, count),
        settings={
            "loss": criterion.importance_loss,
            "label_smoothing": criterion.eps if criterion.importance_loss == "label_smoothed" else 0.0,
            "sentences": float(total["nsentences"]),
            "target_tokens": float(total["ntokens"]),
            "batches": total_batches,
            "mean_loss_per_token": float(total["loss"]) / float(total["ntokens"]),
        },
    )


class ImportanceEstimator:
    """Head importance on fixed batches of some splits, under any head mask.

    The batches are collated once, so re-estimating on a pruned model (the
    iterative pruning order) costs only the forward and backward passes.
    """

    def __init__(self, task, model, settings: ImportanceSettings):
        self.model = model
        settings = importance_batching(settings, task, model)  # on a GPU, the batch that fills it (stated)
        self.layout = head_layout(model)
        self.criterion = HeadPruneImportanceCriterion(
            task,
            sentence_avg=False,
            label_smoothing=settings.label_smoothing,
            importance_loss=settings.loss,
            importance_granularity=settings.granularity,
            importance_method=settings.method,
            importance_neurons=settings.neurons,
        )
        device = model_device(model)
        self.samples = []
        for split in settings.subsets:
            dataset, batches = split_batches(task, split, settings.max_tokens, settings.max_sentences, settings.limit,
                                             settings.setting("max_tokens"))
            self.samples.extend(iterate_samples(dataset, batches, device))
        self.settings = {
            "subsets": list(settings.subsets),
            "limit_per_subset": settings.limit,
            "max_tokens": settings.max_tokens,
            "max_sentences": settings.max_sentences,
            "device": str(device),
        }

    def estimate(self, head_mask: Optional[HeadMask], progress: bool = True, description: str = "importance"):
        """Importance of every head with ``head_mask`` set (None: the model's own mask)."""
        context = contextlib.nullcontext() if head_mask is None else head_mask_applied(self.model, head_mask)
        with context:
            result = estimate_importance(
                self.model, self.criterion, self.samples, len(self.samples), progress=progress,
                description=description,
            )
        result.settings.update(self.settings)
        return result


