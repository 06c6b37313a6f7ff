"""Sequence-level knowledge distillation data: the teacher's beam outputs as the training targets.

Kim & Rush (2016): a student trained on the teacher's own translations (the
best beam hypothesis of every training source) learns the teacher's mode
instead of the references' spread, which a small or shallow student cannot
fit; Kasai et al. (2021) distil this way before shrinking the decoder. The
teacher decodes with fairseq's own generator (``task.inference_step``) under
the run's generation options; the outputs are written as a fairseq-preprocess
data directory: the training split's target side replaced, everything else
(dictionaries, sources, other splits) linked to the original.
"""

import os
import time
from dataclasses import dataclass
from typing import Dict, List

import torch
from fairseq import utils
from fairseq.data import indexed_dataset

from fairseq_headprune.engine.runners.batches import load_split, model_device
from fairseq_headprune.engine.runtime.progress import progress_bar
from fairseq_headprune.errors import StudyError
from fairseq_headprune.study.output.files import atomic_path


@dataclass
class DistillOutcome:
    """What ``write_distilled_data`` wrote."""

    data: str  # the new data directory
    split: str
    sentences: int
    target_tokens: int  # the teacher's, with </s>
    reference_tokens: int  # the references', with </s>
    identical: int  # sentences whose teacher output is the reference
    seconds: float


def _split_prefix(data: str, split: str, source: str, target: str) -> str:
    """fairseq-preprocess's file prefix of a split (``train.en-fr``, or ``train.fr-en``), as fairseq looks it up."""
    for pair in (f"{source}-{target}", f"{target}-{source}"):
        if indexed_dataset.dataset_exists(os.path.join(data, f"{split}.{pair}.{target}"), impl=None):
            return f"{split}.{pair}"
    raise StudyError(f"the distill: no binarized {split!r} split of {source}-{target} in {data}", setting="distill")


def teacher_outputs(cfg, task, model, split: str, progress: bool = True) -> Dict[int, List[int]]:
    """Sentence id -> the teacher's best hypothesis (token ids, </s> last) on every sentence of ``split``."""
    load_split(task, split)
    dataset = task.dataset(split)
    model.eval()
    generator = task.build_generator([model], cfg.generation)
    max_tokens, batch_size = cfg.dataset.max_tokens, cfg.dataset.batch_size
    if max_tokens is None and batch_size is None:
        max_tokens = 12000  # fairseq-generate's default
    iterator = task.get_batch_iterator(
        dataset=dataset, max_tokens=max_tokens, max_sentences=batch_size,
        max_positions=utils.resolve_max_positions(task.max_positions(), model.max_positions()),
        ignore_invalid_inputs=False, required_batch_size_multiple=1, seed=cfg.common.seed,
        num_workers=0, data_buffer_size=cfg.dataset.data_buffer_size,
    ).next_epoch_itr(shuffle=False)
    device = model_device(model)
    outputs: Dict[int, List[int]] = {}
    with torch.no_grad():
        for sample in progress_bar(iterator, len(iterator), "teacher translations", progress):
            if "net_input" not in sample:
                continue
            sample = utils.move_to_cuda(sample, device=device) if device.type == "cuda" else sample
            for row, hypotheses in enumerate(task.inference_step(generator, [model], sample)):
                outputs[int(sample["id"][row])] = hypotheses[0]["tokens"].int().cpu().tolist()
    if len(outputs) != len(dataset):
        raise StudyError(f"the distill: the teacher translated {len(outputs)} of {len(dataset)} sentences of "
                         f"{split!r}", setting="distill")
    return outputs


def write_distilled_data(cfg, task, model, out_dir: str, split: str = "train",
                         progress: bool = True) -> DistillOutcome:
    """``out_dir``: the task's data directory with ``split``'s targets replaced by the teacher's outputs."""
    data = os.path.abspath(cfg.task.data)
    source, target = task.cfg.source_lang, task.cfg.target_lang
    prefix = _split_prefix(data, split, source, target)
    start = time.perf_counter()
    outputs = teacher_outputs(cfg, task, model, split, progress)
    os.makedirs(out_dir, exist_ok=True)
    replaced = {f"{prefix}.{target}.bin", f"{prefix}.{target}.idx"}
    for name in sorted(os.listdir(data)):
        if name not in replaced and os.path.isfile(os.path.join(data, name)):
            link = os.path.join(out_dir, name)
            if not os.path.lexists(link):
                os.symlink(os.path.join(data, name), link)
    references = task.dataset(split).tgt
    target_path = os.path.join(out_dir, f"{prefix}.{target}")
    with atomic_path(target_path + ".bin") as binary, atomic_path(target_path + ".idx") as index:
        builder = indexed_dataset.make_builder(binary, impl="mmap", vocab_size=len(task.target_dictionary))
        for sentence in range(len(outputs)):
            builder.add_item(torch.IntTensor(outputs[sentence]))
        builder.finalize(index)
    identical = sum(references[i].tolist() == outputs[i] for i in range(len(outputs)))
    return DistillOutcome(
        data=out_dir, split=split, sentences=len(outputs),
        target_tokens=sum(len(tokens) for tokens in outputs.values()),
        reference_tokens=int(sum(len(references[i]) for i in range(len(outputs)))),
        identical=int(identical), seconds=time.perf_counter() - start,
    )

