"""Head importance of an encoder-only classifier or a decoder-only language model.

I_h = E_x |dL(x)/dxi_h| (Michel et al. 2019, section 4.1, as they estimate it
for BERT on MNLI). For a classifier (fairseq ``sentence_prediction``) L is
the checkpoint's own ``sentence_prediction`` criterion: cross-entropy over
the classes, or the squared error of a regression target. For a language
model (``language_modeling``) L(x) is the summed next-token cross-entropy of
sample x (fairseq's ``cross_entropy`` criterion; a sentence with
``--sample-break-mode eos``). Each example gets its own mask variables (one
(layers, examples, heads) tensor of ones that requires grad), so one backward
pass of the summed loss gives every example's dL(x)/dxi at once: examples do
not interact in these models.
"""

import contextlib
import os
from typing import Optional

import torch

from ..constants import CLASSIFIER_FAMILY, DEFAULT_IMPORTANCE_METHOD
from ..errors import StudyError
from ..study.importance import ImportanceResult, gradient_magnitude
from ..study.settings import ImportanceSettings


def load_classifier(data: str, checkpoint: str, head_mask: Optional[str] = None, cpu: bool = False):
    """(task, model, criterion) of a sentence_prediction checkpoint, through the head-masking task."""
    from ..tasks.headprune_sentence_prediction import TASK_NAME

    task, model, saved_cfg = _load_with_saved_task(data, checkpoint, TASK_NAME, head_mask, cpu, "classifier")
    return task, model, task.build_criterion(saved_cfg.criterion)


def _load_with_saved_task(data: str, checkpoint: str, task_name: str, head_mask: Optional[str], cpu: bool,
                          kind: str):
    """(task, model, saved cfg): the checkpoint's own task settings, with this data, the head-masking task and mask."""
    from fairseq import checkpoint_utils

    from .. import register_components
    from .checkpoint_info import classification_head_override

    register_components()
    if not os.path.isdir(data):
        raise StudyError(f"data directory not found: {data}")
    overrides = {"data": data, "task": task_name, "head_mask": head_mask}
    if kind == "classifier":
        overrides.update(classification_head_override(checkpoint))
    try:
        models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([checkpoint], arg_overrides=overrides)
    except SystemExit as error:  # the task's one-line errors (--head-mask)
        raise StudyError(str(error).split("error: ", 1)[-1])
    except Exception as error:
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise StudyError(f"cannot load {kind} {checkpoint} with the data in {data}: {first_line}")
    model = models[0]
    if torch.cuda.is_available() and not cpu:
        model.cuda()
    model.eval()
    return task, model, cfg


def load_language_model(data: str, checkpoint: str, head_mask: Optional[str] = None, cpu: bool = False):
    """(task, model, criterion) of a language_modeling checkpoint: fairseq's cross_entropy criterion (summed).

    The data is read with the checkpoint's own task settings (sample break
    mode, tokens per sample), so an example is a sample as the model was
    trained on it.
    """
    from ..constants import LANGUAGE_MODEL_FAMILY
    from ..tasks.headprune_language_modeling import TASK_NAME

    task, model, cfg = _load_with_saved_task(data, checkpoint, TASK_NAME, head_mask, cpu, "language model")
    return task, model, study_criterion(LANGUAGE_MODEL_FAMILY, cfg, task)


def example_importance(model, criterion, samples, layout, method: str = DEFAULT_IMPORTANCE_METHOD,
                       progress: bool = False, description: str = "importance"):
    """Sum over examples of |dL(x)/dxi_h| (``fisher``: its square), a (layers, heads) float64 tensor, the count,
    and the sum of g g^T over each layer's heads ((layers, heads, heads): the Fisher blocks, whatever the method).

    The model has one attention type (Enc-Enc for a classifier, Dec-Dec for an LM).
    Under several ranks each takes every world_size-th batch and the sums
    are added over the ranks in rank order (as ``scoring.estimate_importance``
    does for translation), so every rank returns the whole sums.
    """
    from ..modules.masked_multihead_attention import current_head_mask, head_mask_applied
    from .ranks import current_ranks
    from .scoring import progress_bar

    (attention_type,) = layout
    layers, heads = layout[attention_type]
    base = current_head_mask(model)
    base_mask = torch.ones(layers, heads) if base is None else base[attention_type]
    total = torch.zeros(layers, heads, dtype=torch.float64)
    blocks = torch.zeros(layers, heads, heads, dtype=torch.float64)
    count = 0
    ranks = current_ranks()
    samples = ranks.share(list(samples))
    for sample in progress_bar(samples, len(samples), description, progress):
        examples = sample["nsentences"]
        device = next(model.parameters()).device
        xi = base_mask.to(device).unsqueeze(1).repeat(1, examples, 1).requires_grad_()
        with head_mask_applied(model, {attention_type: xi}):
            loss, _, _ = criterion(model, sample)
            model.zero_grad()
            loss.backward()
        gradients = xi.grad.detach().double().cpu()  # layers x examples x heads
        total += gradient_magnitude(gradients, method).sum(dim=1)
        blocks += gradients.transpose(1, 2) @ gradients
        count += examples
    if ranks.sharded:
        shares = ranks.gather((total, count, blocks))
        total, count, blocks = (sum(share[i] for share in shares) for i in range(3))
    if count == 0:
        raise StudyError("no examples to estimate importance on")
    return total, count, blocks


class ExampleImportanceEstimator:
    """I_h of a classifier or LM under any mask, with the estimation samples batched once.

    The counterpart of ``scoring.ImportanceEstimator`` (translation) for
    ``prune``'s importance orders and the importance command.
    """

    def __init__(self, family: str, task, model, criterion, settings: ImportanceSettings):
        from ..modules.masked_multihead_attention import head_layout
        from .loading import iterate_samples, model_device, split_batches

        kind = "a classifier" if family == CLASSIFIER_FAMILY else "a language model"
        if settings.granularity != "sentence":
            raise StudyError(
                f"{settings.option('granularity')} {settings.granularity}: {kind} is scored per example here; "
                "use sentence"
            )
        if settings.loss != "nll":
            raise StudyError(f"{settings.option('loss')}: {kind} is scored with its own criterion's loss; drop it")
        self.task, self.model, self.criterion, self.settings = task, model, criterion, settings
        self.layout = head_layout(model)
        self.samples = []
        for subset in settings.subsets:
            dataset, batches = split_batches(
                task, subset, settings.max_tokens, settings.max_sentences or 32, settings.limit
            )
            self.samples += list(iterate_samples(dataset, batches, model_device(model)))

    def estimate(self, head_mask=None, progress: bool = True, description: str = "importance") -> ImportanceResult:
        """Importance with ``head_mask`` set (None: the model's own mask); sentence level."""
        from ..modules.masked_multihead_attention import head_mask_applied

        with head_mask_applied(self.model, head_mask) if head_mask is not None else contextlib.nullcontext():
            total, count, blocks = example_importance(self.model, self.criterion, self.samples, self.layout,
                                                      self.settings.method, progress, description)
        attention_type = next(iter(self.layout))
        return ImportanceResult(
            importance={attention_type: (total / count).float()}, granularity="sentence", count=count,
            method=self.settings.method,
            fisher_blocks={attention_type: blocks / count} if self.settings.method == "fisher" else None,
            settings={
                "subsets": list(self.settings.subsets), "sentences": count, "limit": self.settings.limit,
                # the criterion's cross-entropy (over classes, or next tokens), or a regression's squared error
                "loss": "mse" if getattr(self.task.cfg, "regression_target", False) else "nll", "criterion": self.criterion.__class__.__name__, "task": self.task.__class__.__name__,
                "torch": torch.__version__,
            },
        )


def run_example_importance(
    family: str,
    data: str,
    checkpoint: str,
    settings: ImportanceSettings,
    head_mask: Optional[str] = None,
    loss_ablation: bool = False,
    cpu: bool = False,
    progress: bool = True,
) -> Optional[ImportanceResult]:
    """The importance command's result for a classifier or an LM: sentence (example) level, the criterion's loss.

    Sharded over ranks, if any (every rank gets the sums); None on every rank but rank 0.
    """
    from ..modules.masked_multihead_attention import current_head_mask
    from .ranks import current_ranks
    from .scoring import single_head_loss_increase

    load = load_classifier if family == CLASSIFIER_FAMILY else load_language_model
    task, model, criterion = load(data, checkpoint, head_mask, cpu)
    estimator = ExampleImportanceEstimator(family, task, model, criterion, settings)
    result = estimator.estimate(progress=progress)
    if not current_ranks().is_main:
        return None  # rank 0 checks the proxy and writes
    result.settings.update(
        {"checkpoint": os.path.abspath(checkpoint), "data": os.path.abspath(data), "head_mask": head_mask}
    )
    if loss_ablation:
        result.loss_increase, base_loss = single_head_loss_increase(
            model, criterion, estimator.samples, current_head_mask(model), estimator.layout, progress=progress
        )
        result.settings["loss_ablation_base_loss_per_token"] = base_loss
    return result


def study_criterion(family: str, cfg, task):
    """The loss a prune study's importance differentiates: the classifier's criterion, or an LM's summed cross-entropy."""
    from fairseq.criterions.cross_entropy import CrossEntropyCriterion

    if family == CLASSIFIER_FAMILY:
        return task.build_criterion(cfg.criterion)
    return CrossEntropyCriterion(task, sentence_avg=False)
