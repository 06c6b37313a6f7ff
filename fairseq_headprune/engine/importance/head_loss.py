"""The loss under a head mask, and its increase when each head alone is masked.

The check of the importance proxy (Michel et al. section 4.1): the loss
increase of masking head h alone, beside I_h. Any family's criterion.
"""

from typing import Iterable, List, Optional

import torch

from fairseq_headprune.engine.runtime.progress import progress_bar
from fairseq_headprune.modules.masked_multihead_attention import head_mask_applied
from fairseq_headprune.study.masks.head_mask import HeadMask, full_mask


def mean_loss(model, criterion, samples: Iterable[dict], head_mask: Optional[HeadMask]) -> float:
    """Criterion loss per target token with ``head_mask`` set (None: no mask)."""
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
    start = full_mask(layout) if base_mask is None else {t: m.clone() for t, m in base_mask.items()}
    baseline = mean_loss(model, criterion, samples, start)
    increase = {t: torch.zeros(shape, dtype=torch.float64) for t, shape in layout.items()}
    heads = [(t, layer, head) for t, (layers, n) in layout.items() for layer in range(layers) for head in range(n)]
    for attention_type, layer, head in progress_bar(heads, len(heads), "single-head loss", progress):
        head_mask = {t: m.clone() for t, m in start.items()}
        head_mask[attention_type][layer, head] = 0.0
        increase[attention_type][layer, head] = mean_loss(model, criterion, samples, head_mask) - baseline
    return increase, baseline
