"""Resume points of a fine-tune: fairseq-train's ``checkpoint_last.pt`` saved with the optimizer every tenth of
its updates, the newest whole one found after a kill, and the training time the killed processes spent up to it."""

import dataclasses
import glob
import os
import shutil

import torch

from fairseq_headprune.study.finetune.settings import FinetuneSettings

SAVES_PER_FINETUNE = 10  # checkpoint_last.pt this many times per fine-tune (resume points)


def resume_point(train_dir: str) -> None:
    """fairseq writes checkpoints in place: a process killed while saving leaves a cut checkpoint_last.pt. Resume
    from the newest whole one (fairseq keeps the last two interval saves), or start over if none is whole."""
    last = os.path.join(train_dir, "checkpoint_last.pt")
    if not os.path.isfile(last):
        return
    saves = sorted(glob.glob(os.path.join(train_dir, "checkpoint_*_*.pt")), key=os.path.getmtime, reverse=True)
    for candidate in [last] + saves:
        try:
            torch.load(candidate, map_location="cpu", weights_only=False)
        except (EOFError, RuntimeError) as error:
            if not cut_file(error):
                raise
            continue
        if candidate != last:
            shutil.copyfile(candidate, last)
        return
    shutil.rmtree(train_dir)


def cut_file(error: BaseException) -> bool:
    """Whether ``torch.load``'s error says the file was cut off while being written: empty (EOFError), or a zip
    archive without its end (what a killed save leaves); any other failure (memory, a bug) is not one."""
    return isinstance(error, EOFError) or (
        isinstance(error, RuntimeError) and "PytorchStreamReader failed reading zip archive" in str(error))


def resumed_seconds(save_dir: str, start: str) -> float:
    """The seconds earlier processes spent on the fine-tune in ``save_dir`` up to its resume point, by fairseq's
    own training clock (``extra_state['previous_training_time']``, carried from save to save); 0 when there is no
    resume point. The clock carries on from the start checkpoint's, so that checkpoint's training is taken off."""
    last = os.path.join(save_dir, "checkpoint_last.pt")
    if not os.path.isfile(last):
        return 0.0
    return max(0.0, _training_clock(last) - _training_clock(start))


def _training_clock(checkpoint: str) -> float:
    # memory-mapped: the tensors stay on disk, only the small extra state is read (a curve's every stop asks)
    state = torch.load(checkpoint, map_location="cpu", weights_only=False, mmap=True)
    return float((state.get("extra_state") or {}).get("previous_training_time") or 0.0)


def with_resume_points(finetune: FinetuneSettings) -> FinetuneSettings:
    """The fine-tune saving a resume point (``checkpoint_last.pt`` with the optimizer) every tenth of its updates
    (with epochs: each epoch's end, where fairseq saves anyway): a killed fine-tune continues from the last one
    (``resume_point``) and ends with the weights of an uninterrupted one."""
    interval = max(1, finetune.updates // SAVES_PER_FINETUNE) if finetune.updates else 0
    return dataclasses.replace(finetune, save_interval=interval)
