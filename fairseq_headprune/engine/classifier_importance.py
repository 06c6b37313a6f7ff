"""Head importance of an encoder-only classifier (fairseq ``sentence_prediction``).

I_h = E_x |dL(x)/dxi_h| (Michel et al. 2019, section 4.1, as they estimate it
for BERT on MNLI), L being the checkpoint's own ``sentence_prediction``
criterion: cross-entropy over the classes, or the squared error of a
regression target. Each example gets its own mask variables (one
(layers, examples, heads) tensor of ones that requires grad), so one backward
pass of the summed loss gives every example's dL(x)/dxi at once: examples do
not interact in an encoder.
"""

import os
from typing import Optional

import torch

from ..errors import StudyError
from ..study.importance import ImportanceResult
from ..study.settings import ImportanceSettings

SENTENCE_PREDICTION_TASKS = ("sentence_prediction", "headprune_sentence_prediction")


def load_classifier(data: str, checkpoint: str, head_mask: Optional[str] = None, cpu: bool = False):
    """(task, model, criterion) of a sentence_prediction checkpoint, through the head-masking task."""
    from fairseq import checkpoint_utils

    from .. import register_components
    from ..tasks.headprune_sentence_prediction import TASK_NAME

    register_components()
    if not os.path.isdir(data):
        raise StudyError(f"data directory not found: {data}")
    overrides = {"data": data, "task": TASK_NAME, "head_mask": head_mask}
    try:
        models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([checkpoint], arg_overrides=overrides)
    except SystemExit as error:  # the task's one-line errors (--head-mask)
        raise StudyError(str(error).split("error: ", 1)[-1])
    except Exception as error:
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise StudyError(f"cannot load classifier {checkpoint} with the data in {data}: {first_line}")
    model = models[0]
    if torch.cuda.is_available() and not cpu:
        model.cuda()
    model.eval()
    criterion = task.build_criterion(cfg.criterion)
    return task, model, criterion


def classifier_importance(model, criterion, samples, layout) -> torch.Tensor:
    """Sum over examples of |dL(x)/dxi_h|, a (layers, heads) float64 tensor, and the example count."""
    from ..modules.masked_multihead_attention import current_head_mask, head_mask_applied

    layers, heads = layout["enc-enc"]
    base = current_head_mask(model)
    base_mask = torch.ones(layers, heads) if base is None else base["enc-enc"]
    total = torch.zeros(layers, heads, dtype=torch.float64)
    count = 0
    for sample in samples:
        examples = sample["nsentences"]
        device = next(model.parameters()).device
        xi = base_mask.to(device).unsqueeze(1).repeat(1, examples, 1).requires_grad_()
        with head_mask_applied(model, {"enc-enc": xi}):
            loss, _, _ = criterion(model, sample)
            model.zero_grad()
            loss.backward()
        total += xi.grad.detach().abs().sum(dim=1).double().cpu()
        count += examples
    return total, count


def run_classifier_importance(
    data: str,
    checkpoint: str,
    settings: ImportanceSettings,
    head_mask: Optional[str] = None,
    loss_ablation: bool = False,
    cpu: bool = False,
    progress: bool = True,
) -> ImportanceResult:
    """The importance command's result for a classifier: sentence level, the criterion's loss."""
    from ..modules.masked_multihead_attention import current_head_mask, head_layout
    from .loading import iterate_samples, model_device, split_batches
    from .scoring import single_head_loss_increase

    if settings.granularity != "sentence":
        raise StudyError(f"--granularity {settings.granularity}: a classifier's loss is per example; use sentence")
    if settings.loss != "nll":
        raise StudyError("--loss: a classifier is scored with its own sentence_prediction criterion; drop --loss")
    task, model, criterion = load_classifier(data, checkpoint, head_mask, cpu)
    layout = head_layout(model)
    samples = []
    for subset in settings.subsets:
        dataset, batches = split_batches(
            task, subset, settings.max_tokens, settings.max_sentences or 32, settings.limit
        )
        samples += list(iterate_samples(dataset, batches, model_device(model)))
    total, count = classifier_importance(model, criterion, samples, layout)
    result = ImportanceResult(
        importance={"enc-enc": (total / count).float()}, granularity="sentence", count=count,
        settings={
            "subsets": list(settings.subsets), "sentences": count, "limit": settings.limit,
            "loss": criterion.__class__.__name__, "task": task.__class__.__name__,
            "checkpoint": os.path.abspath(checkpoint), "data": os.path.abspath(data), "head_mask": head_mask,
            "torch": torch.__version__,
        },
    )
    if loss_ablation:
        result.loss_increase, base_loss = single_head_loss_increase(
            model, criterion, samples, current_head_mask(model), layout, progress=progress
        )
        result.settings["loss_ablation_base_loss_per_token"] = base_loss
    return result
