"""Load a checkpoint once and run fairseq's own code over its data splits.

The study commands share this: building the task and model from a data
directory and a checkpoint (with one-line errors for the usual mistakes),
batching a split with fairseq's dataset code, and the two passes that score
heads: importance (forward + backward through ``headprune_importance``) and
the loss with a given mask (forward only).
"""

import contextlib
import logging
import os
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import torch

from .head_mask import HeadMask, HeadMaskError, parse_head_mask
from .importance import ImportanceResult

logger = logging.getLogger(__name__)


class StudyError(ValueError):
    """Input a study cannot run on: reported as one line, non-zero exit."""


def read_lines(path: str, what: str = "") -> List[str]:
    """The lines of a UTF-8 text file, without their newlines; ``what`` names it in errors."""
    try:
        with open(path, encoding="utf-8") as stream:
            return [line.rstrip("\n") for line in stream]
    except OSError as error:
        raise StudyError(f"cannot read {what}{path}: {error.strerror}")
    except UnicodeDecodeError:
        raise StudyError(f"{what}{path} is not UTF-8 text")


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def load_task_and_model(
    data: str,
    checkpoint: str,
    fairseq_args: Sequence[str] = (),
    cpu: bool = False,
):
    """(cfg, task, model) for ``checkpoint`` with the dictionaries in ``data``.

    ``fairseq_args`` are fairseq-generate options (``--source-lang``,
    ``--beam``, ``--head-mask`` …); the task is always ``fairseq-headprune``.
    The model is in eval mode, on the GPU unless ``cpu`` or none is available.
    """
    from fairseq import checkpoint_utils, options, tasks, utils
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    from .tasks.fairseq_headprune import TASK_NAME

    if not os.path.isdir(data):
        raise StudyError(f"data directory not found: {data}")
    if not os.path.isfile(checkpoint):
        raise StudyError(f"checkpoint not found: {checkpoint}")
    use_cuda = torch.cuda.is_available() and not cpu
    argv = [data, "--task", TASK_NAME, "--path", checkpoint, *fairseq_args]
    if not use_cuda:
        argv.append("--cpu")
    parser = options.get_generation_parser()

    def refuse(message):
        raise StudyError(f"fairseq option: {message}")

    parser.error = refuse  # one line instead of argparse's usage text and exit
    try:
        args = options.parse_args_and_arch(parser, argv)
    except SystemExit as error:  # --help, or a sub-parser's own error
        raise StudyError(f"bad fairseq options: {' '.join(fairseq_args)}") from error
    cfg = convert_namespace_to_omegaconf(args)
    utils.import_user_module(cfg.common)
    try:
        task = tasks.setup_task(cfg.task)
    except Exception as error:  # fairseq raises bare Exceptions here
        raise StudyError(f"cannot set up the translation task on {data}: {_first_line(error)}")
    try:
        models, _ = checkpoint_utils.load_model_ensemble(
            [checkpoint], arg_overrides={"data": data}, task=task
        )
    except RuntimeError as error:
        message = _first_line(error)
        if "size mismatch" in str(error) or "Error(s) in loading state_dict" in message:
            detail = next(
                (line.strip() for line in str(error).splitlines() if "size mismatch" in line), message
            )
            raise StudyError(
                f"checkpoint {checkpoint} does not match the dictionaries in {data} ({detail})"
            )
        raise StudyError(f"cannot load checkpoint {checkpoint}: {message}")
    except Exception as error:  # torch.load raises many types for files that are no checkpoint
        raise StudyError(f"cannot load checkpoint {checkpoint}: {_first_line(error)}")
    model = models[0]
    if use_cuda:
        model.cuda()
    model.eval()
    return cfg, task, model


def model_device(model) -> torch.device:
    return next(model.parameters()).device


def split_batches(
    task,
    split: str,
    max_tokens: Optional[int] = None,
    max_sentences: Optional[int] = None,
    limit: Optional[int] = None,
) -> Tuple[object, List[List[int]]]:
    """fairseq's batches (lists of sentence indices) for the first ``limit`` sentences of ``split``."""
    import numpy as np

    load_split(task, split)
    dataset = task.dataset(split)
    indices = dataset.ordered_indices()
    if limit is not None:
        indices = indices[indices < limit]
    if len(indices) == 0:
        raise StudyError(f"split {split!r} in {task.cfg.data} has no sentences")
    if max_tokens is None and max_sentences is None:
        max_sentences = 64
    longest = max(int(dataset.num_tokens(i)) for i in indices)
    if max_tokens is not None and longest > max_tokens:
        raise StudyError(
            f"split {split!r} has a sentence of {longest} tokens, more than --max-tokens {max_tokens}"
        )
    batches = dataset.batch_by_size(
        np.asarray(indices, dtype=np.int64), max_tokens=max_tokens, max_sentences=max_sentences
    )
    return dataset, [list(batch) for batch in batches]


def load_split(task, split: str) -> None:
    """Load ``split`` into ``task``, with one-line errors for missing or empty splits."""
    _check_split_not_empty(task, split)
    try:
        task.load_dataset(split, combine=False, epoch=1)
    except FileNotFoundError as error:
        raise StudyError(f"split {split!r} not found in {task.cfg.data} ({_first_line(error)})")
    except Exception as error:  # fairseq's dataset readers raise assorted types
        raise StudyError(f"cannot read split {split!r} in {task.cfg.data}: {_first_line(error)}")


def _check_split_not_empty(task, split: str) -> None:
    """fairseq cannot even open an empty binarized split (it cannot mmap 0 bytes)."""
    source, target = task.cfg.source_lang, task.cfg.target_lang
    for pair in (f"{source}-{target}", f"{target}-{source}"):
        for lang in (source, target):
            path = os.path.join(task.cfg.data, f"{split}.{pair}.{lang}.bin")
            if os.path.isfile(path) and os.path.getsize(path) == 0:
                raise StudyError(f"split {split!r} in {task.cfg.data} has no sentences ({path} is empty)")


def iterate_samples(dataset, batches: Iterable[List[int]], device: torch.device):
    """Collated samples (fairseq's dict with net_input, target, ntokens …) on ``device``."""
    from fairseq import utils

    for batch in batches:
        sample = dataset.collater([dataset[i] for i in batch])
        if device.type == "cuda":
            sample = utils.move_to_cuda(sample, device=device)
        yield sample


def _progress(iterable, total: int, description: str, enabled: bool):
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
    frozen and unchanged; dropout is off (eval mode).
    """
    from fairseq.logging import metrics

    from .criterions.headprune_importance import importance_from_meters

    total: Dict[str, object] = {}
    model.eval()
    with frozen_parameters(model), torch.enable_grad():
        for sample in _progress(samples, total_batches, description, progress):
            loss, _, logging_output = criterion(model, sample)
            loss.backward()  # fills the importance sums in logging_output
            _sum_logging_outputs(total, logging_output)
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
        count=count,
        settings={
            "loss": criterion.importance_loss,
            "label_smoothing": criterion.eps,
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

    def __init__(
        self,
        task,
        model,
        subsets: Sequence[str],
        limit: Optional[int] = None,
        max_tokens: Optional[int] = None,
        max_sentences: Optional[int] = None,
        loss: str = "label_smoothed",
        granularity: str = "sentence",
        label_smoothing: float = 0.1,
    ):
        from .criterions.headprune_importance import HeadPruneImportanceCriterion

        self.model = model
        self.criterion = HeadPruneImportanceCriterion(
            task,
            sentence_avg=False,
            label_smoothing=label_smoothing,
            importance_loss=loss,
            importance_granularity=granularity,
        )
        device = model_device(model)
        self.samples = []
        for split in subsets:
            dataset, batches = split_batches(task, split, max_tokens, max_sentences, limit)
            self.samples.extend(iterate_samples(dataset, batches, device))
        self.settings = {
            "subsets": list(subsets),
            "limit_per_subset": limit,
            "max_tokens": max_tokens,
            "max_sentences": max_sentences,
            "device": str(device),
        }

    def estimate(self, head_mask: Optional[HeadMask], progress: bool = True, description: str = "importance"):
        """Importance of every head with ``head_mask`` set (None: the model's own mask)."""
        from .masked_multihead_attention import head_mask_applied

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
    from .masked_multihead_attention import head_mask_applied

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
    from .head_mask import full_mask

    start = full_mask(layout) if base_mask is None else {t: m.clone() for t, m in base_mask.items()}
    baseline = mean_loss(model, criterion, samples, start)
    increase = {t: torch.zeros(shape, dtype=torch.float64) for t, shape in layout.items()}
    heads = [(t, layer, head) for t, (layers, n) in layout.items() for layer in range(layers) for head in range(n)]
    for attention_type, layer, head in _progress(heads, len(heads), "single-head loss", progress):
        head_mask = {t: m.clone() for t, m in start.items()}
        head_mask[attention_type][layer, head] = 0.0
        increase[attention_type][layer, head] = mean_loss(model, criterion, samples, head_mask) - baseline
    return increase, baseline


def translate_batches(task, model, batches, beam: int = 5):
    """Seconds and best hypotheses (token ids) of fairseq's beam search over ``batches``."""
    import time
    from argparse import Namespace

    generator = task.build_generator([model], Namespace(beam=beam))
    hypotheses = []
    start = time.perf_counter()
    with torch.no_grad():
        for batch in batches:
            for sentence in task.inference_step(generator, [model], batch):
                hypotheses.append(sentence[0]["tokens"].tolist())
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - start, hypotheses


def parse_mask_for_model(spec: Optional[str], layout) -> Optional[HeadMask]:
    if spec is None:
        return None
    try:
        return parse_head_mask(spec, layout)
    except HeadMaskError as error:
        raise StudyError(f"--head-mask: {error}")
