"""A validation split dealt into two halves, so that what is fitted on validation data and what is decided on it
read different sentences.

A speed-up run fits several things on its validation split: the Fisher scores and the search's loss estimates,
mask tuning, the plan's damage ranking, and the fine-tuning's stop and best checkpoint (fairseq's
``--best-checkpoint-metric bleu``, the best of every validation). A score that chose among many candidates is
optimistic on the sentences it chose on, so the decisions (accept, continue, back off, which attempt is the
result) read the other half. Sentences are dealt alternately (0, 2, 4 ... fit; 1, 3, 5 ... decide), so a split
ordered by document or length gives both halves alike. The halves are written as fairseq-preprocess splits
(``SPLIT-fit``, ``SPLIT-decide``) in a data directory whose other files link to the original.
"""

import os
import re
from dataclasses import dataclass
from typing import Dict, List, Tuple

import torch
from fairseq.data import indexed_dataset

from fairseq_headprune.errors import StudyError
from fairseq_headprune.study.output.files import atomic_path

FIT_SUFFIX, DECIDE_SUFFIX = "-fit", "-decide"


@dataclass
class HalvesOutcome:
    """What ``write_validation_halves`` wrote: ``data`` holds ``fit`` (even-numbered sentences of ``split``) and
    ``decide`` (odd-numbered) beside links to everything else."""

    data: str
    split: str
    fit: str
    decide: str
    sentences: int  # in the whole split
    fit_sentences: int
    decide_sentences: int


def half_names(split: str) -> Tuple[str, str]:
    """The fit and decide halves' split names."""
    return split + FIT_SUFFIX, split + DECIDE_SUFFIX


def _split_files(data: str, split: str) -> Dict[str, str]:
    """A binarized split's files, as prefix -> impl: ``valid.en-de.en`` for every language pair and side."""
    pattern = re.compile(re.escape(split) + r"\.([^.]+-[^.]+)\.([^.]+)\.idx$")
    prefixes = {}
    for name in sorted(os.listdir(data)):
        if pattern.match(name):
            prefix = os.path.join(data, name[: -len(".idx")])
            impl = indexed_dataset.infer_dataset_impl(prefix)
            if impl is not None:
                prefixes[prefix] = impl
    return prefixes


def write_validation_halves(data: str, split: str, out_dir: str) -> HalvesOutcome:
    """``out_dir``: ``data`` with ``split`` dealt into its two halves (every side of every language pair)."""
    data = os.path.abspath(data)
    fit, decide = half_names(split)
    files = _split_files(data, split)
    if not files:
        raise StudyError(f"no binarized {split!r} split in {data} to deal into halves for the decision half "
                         "(it needs fairseq-preprocess output); leave out the decision half", setting="decision_half")
    datasets = {prefix: indexed_dataset.make_dataset(prefix, impl=impl) for prefix, impl in files.items()}
    sizes = {len(dataset) for dataset in datasets.values()}
    if len(sizes) != 1:
        raise StudyError(f"the decision half: the {split!r} split's files in {data} hold different numbers of "
                         f"sentences ({', '.join(str(s) for s in sorted(sizes))})", setting="decision_half")
    sentences = sizes.pop()
    if sentences < 2:
        raise StudyError(f"the {split!r} split in {data} holds {sentences} sentence(s): too few to halve; leave "
                         "out the decision half", setting="decision_half")
    os.makedirs(out_dir, exist_ok=True)
    for name in sorted(os.listdir(data)):
        link = os.path.join(out_dir, name)
        if os.path.isfile(os.path.join(data, name)) and not os.path.lexists(link):
            os.symlink(os.path.join(data, name), link)
    halves: List[Tuple[str, range]] = [(fit, range(0, sentences, 2)), (decide, range(1, sentences, 2))]
    for prefix, dataset in datasets.items():
        rest = os.path.basename(prefix)[len(split):]  # .en-de.en
        sentences_of = [torch.as_tensor(dataset[row]) for row in range(sentences)]
        # the builder sizes its integers by the largest id it may hold: the split's own, as fairseq-preprocess's
        id_bound = 1 + max(int(tokens.max()) for tokens in sentences_of if tokens.numel())
        for name, rows in halves:
            out = os.path.join(out_dir, name + rest)
            with atomic_path(out + ".bin") as binary, atomic_path(out + ".idx") as index:
                builder = indexed_dataset.make_builder(binary, impl="mmap", vocab_size=id_bound)
                for row in rows:
                    builder.add_item(sentences_of[row])
                builder.finalize(index)
    return HalvesOutcome(data=out_dir, split=split, fit=fit, decide=decide, sentences=sentences,
                         fit_sentences=len(halves[0][1]), decide_sentences=len(halves[1][1]))

