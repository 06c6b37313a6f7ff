"""A fine-tune on several processes (``--finetune-processes``): fairseq's data-parallel training started by the
plugin, against the same fine-tune in one process accumulating as many batches per update."""

import sys

import pytest
import torch

import fairseq_headprune.compat.torch_load  # noqa: F401  (its allow-list lets torch.load read checkpoints)

from conftest import REPO, kill_once_written

MASK = "E:1:1-2 A:2:keep=3"


def _start(tiny_model, path, update_freq):
    """The tiny model without dropout (so that a batch trains alike whichever process draws it) accumulating
    ``update_freq`` batches per update, its heads ``MASK`` masked: a fine-tune's start."""
    from fairseq_headprune.engine.finetune.held import write_masked_start
    from fairseq_headprune.study.masks.head_mask import parse_head_mask

    state = torch.load(tiny_model["checkpoint"], map_location="cpu")
    model = state["cfg"]["model"]
    for key in ("dropout", "attention_dropout", "activation_dropout"):
        setattr(model, key, 0.0)
    state["cfg"]["optimization"]["update_freq"] = [update_freq]
    plain = path.with_suffix(".plain.pt")
    torch.save(state, plain)
    write_masked_start(str(plain), str(path), parse_head_mask(MASK, {t: (2, 8) for t in ("enc-enc", "enc-dec",
                                                                                         "dec-dec")}), None)
    return path


def _finetune(tiny_model, start, save_dir, processes):
    """8 updates validated on valid after 4 and 8 (as ``compress --target speedup`` fine-tunes: the best kept)."""
    from fairseq_headprune.engine.finetune.held import finetune_held
    from fairseq_headprune.engine.finetune.resume import with_resume_points
    from fairseq_headprune.study.finetune.settings import FinetuneSettings, FinetuneStop

    until = FinetuneStop(subset="valid", interval=4, generation={"beam": 2})
    settings = with_resume_points(FinetuneSettings(updates=8, lr=0.001, until=until, processes=processes))
    return finetune_held(str(start), str(tiny_model["data"]), str(save_dir), "translation", settings, cpu=True,
                         progress=False)


def _weights(outcome):
    return torch.load(outcome.checkpoint, map_location="cpu")["model"]


@pytest.fixture(scope="module")
def starts(tiny_model, tmp_path_factory):
    directory = tmp_path_factory.mktemp("starts")
    return {freq: _start(tiny_model, directory / f"start-{freq}.pt", freq) for freq in (1, 2)}


@pytest.fixture(scope="module")
def two_processes(tiny_model, starts, tmp_path_factory):
    """The start accumulating 2 batches per update, fine-tuned 8 updates on 2 processes (1 batch each)."""
    return _finetune(tiny_model, starts[2], tmp_path_factory.mktemp("two") / "train", processes=2)


def test_two_processes_train_the_weights_one_process_accumulating_their_batches_trains(tiny_model, starts,
                                                                                       two_processes, tmp_path):
    """Two processes each taking one batch per update end where one process taking both does (fairseq sums the
    gradients over the processes as over the accumulated batches), within float tolerance, and validate alike
    (each translates a share of the split, the BLEU statistics summed); one process taking one batch per update
    ends elsewhere, so the tolerance tells the two apart."""
    one = _finetune(tiny_model, starts[2], tmp_path / "one", processes=1)
    single = _finetune(tiny_model, starts[1], tmp_path / "single", processes=1)
    assert (two_processes.processes, two_processes.update_freq, one.processes, one.update_freq) == (2, 1, 1, 2)
    assert two_processes.updates == one.updates == 8
    assert [p.updates for p in two_processes.curve] == [4, 8]
    assert two_processes.curve == one.curve and two_processes.kept_updates == one.kept_updates
    start = torch.load(starts[2], map_location="cpu")["model"]
    reference, weights, fewer = _weights(one), _weights(two_processes), _weights(single)
    trained = max((reference[k] - start[k]).abs().max().item() for k in reference)
    apart = max((reference[k] - weights[k]).abs().max().item() for k in reference)
    other = max((reference[k] - fewer[k]).abs().max().item() for k in reference)
    assert trained > 1e-4 and apart < 0.02 * trained < other, (trained, apart, other)
    # the masked heads held on both processes: their query weights as they started
    rows = slice(0, 2 * 8)  # heads 1-2 of encoder layer 1, 8 dimensions each
    key = "encoder.layers.0.self_attn.q_proj.weight"
    assert torch.equal(weights[key][rows], start[key][rows]) and not torch.equal(weights[key], start[key])


RESUMABLE = """
import sys
from test_finetune_processes import _finetune
from pathlib import Path

if __name__ == "__main__":
    _finetune({{"data": Path({data!r})}}, Path({start!r}), Path({save_dir!r}), processes=2)
"""


def test_a_killed_two_process_finetune_resumes_to_the_uninterrupted_weights(tiny_model, starts, two_processes,
                                                                           tmp_path):
    """Killed (both processes) once it has saved its resume point after 4 of 8 updates, then run again: it
    continues from there and ends with the validations and the weights of the uninterrupted 2-process run, bit
    for bit."""
    from fairseq_headprune.engine.finetune.resume import resume_point

    save_dir = tmp_path / "killed"
    script = tmp_path / "resumable.py"
    script.write_text(RESUMABLE.format(data=str(tiny_model["data"]), start=str(starts[2]), save_dir=str(save_dir)))
    command = ["env", f"PYTHONPATH={REPO / 'tests'}", sys.executable, script]
    kill_once_written(command, save_dir / "checkpoint_1_4.pt")
    assert not (save_dir / "checkpoint_1_8.pt").exists()
    resume_point(str(save_dir))
    resumed = _finetune(tiny_model, starts[2], save_dir, processes=2)
    assert resumed.updates == two_processes.updates == 8 and resumed.curve == two_processes.curve
    reference, weights = _weights(two_processes), _weights(resumed)
    assert sorted(reference) == sorted(weights) and all(torch.equal(reference[k], weights[k]) for k in reference)
