"""The passes that score heads on a loaded model: importance and the loss under a mask.

Importance (Michel et al. section 4.1) is a forward and backward pass
through the ``headprune_importance`` criterion with the parameters frozen;
its per-head sums come back through fairseq's ``logging_outputs`` and
``reduce_metrics``, as they would from distributed workers.
"""

import contextlib
from typing import Dict, Iterable, List, Optional

import torch

from ..errors import StudyError
from ..study.head_mask import HeadMask
from ..study.importance import ImportanceResult
from ..study.settings import ImportanceSettings
from .loading import iterate_samples, model_device, split_batches


def progress_bar(iterable, total: int, description: str, enabled: bool):
    """A transient tqdm bar over batches (gone when done), off with ``--no-progress``."""
    from tqdm import tqdm

    return tqdm(iterable, total=total, desc=description, unit="batch", disable=not enabled, leave=False)


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
    from fairseq.logging import metrics

    from ..criterions.headprune_importance import fisher_blocks_from_meters, importance_from_meters

    from .ranks import current_ranks

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
        from ..criterions.headprune_importance import HeadPruneImportanceCriterion

        self.model = model
        self.criterion = HeadPruneImportanceCriterion(
            task,
            sentence_avg=False,
            label_smoothing=settings.label_smoothing,
            importance_loss=settings.loss,
            importance_granularity=settings.granularity,
            importance_method=settings.method,
        )
        device = model_device(model)
        self.samples = []
        for split in settings.subsets:
            dataset, batches = split_batches(task, split, settings.max_tokens, settings.max_sentences, settings.limit)
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
        from ..modules.masked_multihead_attention import head_mask_applied

        context = contextlib.nullcontext() if head_mask is None else head_mask_applied(self.model, head_mask)
        with context:
            result = estimate_importance(
                self.model, self.criterion, self.samples, len(self.samples), progress=progress,
                description=description,
            )
        result.settings.update(self.settings)
        return result


def mean_loss(model, criterion, samples: Iterable[dict], head_mask: Optional[HeadMask]) -> float:
    """Criterion loss per target token with ``head_mask`` set (None: no mask)."""
    from ..modules.masked_multihead_attention import head_mask_applied

    loss_sum, tokens = 0.0, 0
    with head_mask_applied(model, head_mask), torch.no_grad():
        for sample in samples:
            loss, _, logging_output = criterion(model, sample)
            loss_sum += float(loss)
            tokens += int(logging_output["ntokens"])
    return loss_sum / tokens


def single_head_loss_increase(
    model,
    criterion,
    samples: List[dict],
    base_mask: Optional[HeadMask],
    layout,
    progress: bool = True,
):
    """Per head: loss per token with that head masked (on top of ``base_mask``) minus without."""
    from ..study.head_mask import full_mask

    start = full_mask(layout) if base_mask is None else {t: m.clone() for t, m in base_mask.items()}
    baseline = mean_loss(model, criterion, samples, start)
    increase = {t: torch.zeros(shape, dtype=torch.float64) for t, shape in layout.items()}
    heads = [(t, layer, head) for t, (layers, n) in layout.items() for layer in range(layers) for head in range(n)]
    for attention_type, layer, head in progress_bar(heads, len(heads), "single-head loss", progress):
        head_mask = {t: m.clone() for t, m in start.items()}
        head_mask[attention_type][layer, head] = 0.0
        increase[attention_type][layer, head] = mean_loss(model, criterion, samples, head_mask) - baseline
    return increase, baseline


def translate_batches(task, model, batches, beam: int = 5):
    """Seconds and best hypotheses (token ids) of fairseq's beam search over ``batches``."""
    import time
    from fairseq.dataclass.configs import GenerationConfig

    generator = task.build_generator([model], GenerationConfig(beam=beam))
    hypotheses = []
    start = time.perf_counter()
    with torch.no_grad():
        for batch in batches:
            for sentence in task.inference_step(generator, [model], batch):
                hypotheses.append(sentence[0]["tokens"].tolist())
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - start, hypotheses
