"""A data split batched as fairseq batches it, and collated onto the model's device.

Every pass over data (translation, scoring, importance, tuning) takes its
batches from here: fairseq's own ``ordered_indices`` and ``batch_by_size``,
with the tie-breaking permutation seeded so every run and every rank of a
sharded study gets the same batches.
"""

import os
from typing import Callable, Iterable, List, Optional, Sequence, Tuple

import numpy as np
import torch
from fairseq import utils
from fairseq.data.data_utils import numpy_seed

from fairseq_headprune.errors import StudyError, first_line, library_errors_as, setting_words

BATCHING_SEED = 1  # fairseq's default --seed


def model_device(model) -> torch.device:
    return next(model.parameters()).device


def split_batches(
    task,
    split: str,
    max_tokens: Optional[int] = None,
    max_sentences: Optional[int] = None,
    limit: Optional[int] = None,
    max_tokens_setting: str = "max_tokens",
    sample: Optional[Sequence[int]] = None,
) -> Tuple[object, List[List[int]]]:
    """fairseq's batches (lists of sentence indices) for the first ``limit`` sentences of ``split``, or those of
    ``sample`` (sentence indices) among them (``max_tokens_setting``: the setting ``max_tokens`` comes from, for
    the error of a sentence longer)."""


    load_split(task, split)
    dataset = task.dataset(split)
    # fairseq breaks ties between sentences of one length with a random permutation:
    # seeded, so every run and every rank of a sharded study gets the same batches
    with numpy_seed(BATCHING_SEED):
        indices = dataset.ordered_indices()
    if limit is not None:
        indices = indices[indices < limit]
    if sample is not None:
        indices = indices[np.isin(indices, np.asarray(sample, dtype=np.int64))]
    if len(indices) == 0:
        raise StudyError(f"split {split!r} in {task.cfg.data} has no sentences")
    if max_tokens is None and max_sentences is None:
        max_sentences = 64
    longest = max(int(dataset.num_tokens(i)) for i in indices)
    if max_tokens is not None and longest > max_tokens:
        raise StudyError(f"split {split!r} has a sentence of {longest} tokens, more than "
                         f"{setting_words(max_tokens_setting)} {max_tokens}", setting=max_tokens_setting)
    batches = dataset.batch_by_size(
        np.asarray(indices, dtype=np.int64), max_tokens=max_tokens, max_sentences=max_sentences
    )
    return dataset, [list(batch) for batch in batches]


def split_mean_lengths(task, split: str) -> Tuple[int, int]:
    """The mean source and target lengths of ``split`` in tokens, </s> left out (a language model's samples
    are both), rounded: the shape a latency table decodes in."""
    load_split(task, split)
    dataset = task.dataset(split)
    sources = getattr(dataset, "src_sizes", None)
    targets = getattr(dataset, "tgt_sizes", None)
    sizes = np.asarray(dataset.sizes if sources is None else sources, dtype=np.float64)
    target_sizes = sizes if targets is None else np.asarray(targets, dtype=np.float64)
    return max(1, int(round(sizes.mean() - 1))), max(1, int(round(target_sizes.mean() - 1)))


def dictionary_tokens(dictionary, ids) -> List[str]:
    """The tokens of ``ids`` as the dictionary spells them, padding and </s> left out (what CTranslate2 reads and
    writes)."""
    return [dictionary[i] for i in ids if i not in (dictionary.pad(), dictionary.eos())]


def load_split(task, split: str) -> None:
    """Load ``split`` into ``task``, with one-line errors for missing or empty splits."""
    _check_split_not_empty(task, split)
    def unreadable(error: BaseException) -> StudyError:
        if isinstance(error, FileNotFoundError):
            return StudyError(f"split {split!r} not found in {task.cfg.data} ({first_line(error)})")
        return StudyError(f"cannot read split {split!r} in {task.cfg.data}: {first_line(error)}")

    with library_errors_as(unreadable):
        task.load_dataset(split, combine=False, epoch=1)


def _check_split_not_empty(task, split: str) -> None:
    """fairseq cannot even open an empty binarized split (it cannot mmap 0 bytes)."""
    source, target = getattr(task.cfg, "source_lang", None), getattr(task.cfg, "target_lang", None)
    if source is None or target is None:
        return  # not a translation task: fairseq's own reader reports its files
    for pair in (f"{source}-{target}", f"{target}-{source}"):
        for lang in (source, target):
            path = os.path.join(task.cfg.data, f"{split}.{pair}.{lang}.bin")
            if os.path.isfile(path) and os.path.getsize(path) == 0:
                raise StudyError(f"split {split!r} in {task.cfg.data} has no sentences ({path} is empty)")


def iterate_samples(dataset, batches: Iterable[List[int]], device: torch.device):
    """Collated samples (fairseq's dict with net_input, target, ntokens …) on ``device``."""

    for batch in batches:
        sample = dataset.collater([dataset[i] for i in batch])
        if device.type == "cuda":
            sample = utils.move_to_cuda(sample, device=device)
        yield sample


def collated_samples(task, model, subsets: Sequence[str], max_tokens: Optional[int],
                     max_sentences: Optional[int], limit: Optional[int],
                     max_tokens_setting: str = "importance_max_tokens",
                     sample: Optional[Callable[[int], Optional[Sequence[int]]]] = None) -> List[dict]:
    """Every batch of the first ``limit`` sentences of each of ``subsets`` (``sample``: of those it picks among a
    split's sentences, given their count; None: all), collated once on the model's device."""
    samples = []
    for subset in subsets:
        picked = None
        if sample is not None:
            load_split(task, subset)
            picked = sample(len(task.dataset(subset)))
        dataset, batches = split_batches(task, subset, max_tokens, max_sentences, limit, max_tokens_setting,
                                         picked)
        samples += list(iterate_samples(dataset, batches, model_device(model)))
    return samples
