"""The held-aside guard of mask tuning: which batches are held aside, and the loss it compares.

A layer's least-squares fit is kept only if it lowers this loss on batches
the fit never saw (``engine.search.mask_tuning``), so that tuning cannot make
the model worse on data it was not fitted on.
"""

from typing import Callable, List, Sequence, Tuple

import torch

from fairseq_headprune.errors import StudyError

# loss(model, sample) -> (summed loss, what it is summed over); the held-aside guard's measure
LossFunction = Callable[[torch.nn.Module, dict], Tuple[float, float]]


def token_nll(pad: int) -> LossFunction:
    """Teacher-forced cross-entropy of the target tokens (translation, language models)."""
    def loss(model, sample):
        net_output = model(**sample["net_input"])
        lprobs = model.get_normalized_probs(net_output, log_probs=True)
        target = sample["target"]
        nll = -lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)
        tokens = target.ne(pad)
        return float(nll[tokens].sum()), float(tokens.sum())
    return loss


def criterion_loss(criterion) -> LossFunction:
    """A fairseq criterion's summed loss over its sample size (classifiers: per sentence)."""
    def loss(model, sample):
        value, sample_size, _ = criterion(model, sample)
        return float(value), float(sample_size)
    return loss


def split_held_aside(samples: Sequence[dict], fraction: float) -> Tuple[List[dict], List[dict]]:
    """(fit, held aside): every round(1/fraction)-th batch is held aside (at least one; the rest is fitted)."""
    if len(samples) < 2:
        raise StudyError(f"mask tuning needs at least 2 batches (one held aside to check each fit); got "
                         f"{len(samples)}: raise the tune limit or lower the tune max tokens",
                         setting=("tune_limit", "tune_max_tokens"))
    period = max(2, int(round(1 / fraction)))
    held = [i for i in range(len(samples)) if i % period == period // 2] or [len(samples) - 1]
    return [s for i, s in enumerate(samples) if i not in held], [samples[i] for i in held]


def batch_losses(model, loss: LossFunction, samples: Sequence[dict]) -> List[Tuple[float, float]]:
    """Each sample's summed loss and the tokens it sums over (a paired damage's batches)."""
    with torch.no_grad():
        return [tuple(float(x) for x in loss(model, sample)) for sample in samples]


def pooled_loss(pairs: Sequence[Tuple[float, float]]) -> float:
    """The loss per token of batches' summed losses and token counts (``batch_losses``)."""
    size = sum(count for _, count in pairs)
    return sum(value for value, _ in pairs) / size if size else float("nan")


def mean_loss(model, loss: LossFunction, samples: Sequence[dict]) -> float:
    return pooled_loss(batch_losses(model, loss, samples))
