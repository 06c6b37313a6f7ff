"""The fine-tune's memory counted before it trains (``study.finetune.memory``), and the batch that fits."""

import json

import pytest

from fairseq_headprune.errors import StudyError
from fairseq_headprune.study.finetune.memory import HEADROOM, TrainingShape, needed_bytes, plan_memory

from conftest import run

# the paper's WMT En-Fr big model with its teacher beside it: 6 + 6 layers, d 1024, FFN 4096, 16 heads
BIG = TrainingShape(parameters=221_937_664, teacher_parameters=221_937_664, model_dim=1024, ffn_dim=4096,
                    heads=16, encoder_layers=6, decoder_layers=6, vocabulary=44_512)


def _budget(tokens, longest=100, shape=BIG):
    """The free bytes at which a batch of ``tokens`` tokens just fits."""
    return sum(needed_bytes(shape, tokens, longest).values()) / HEADROOM


def test_the_checkpoints_batch_is_kept_where_it_fits_and_halved_with_more_accumulation_where_not():
    fits = plan_memory(BIG, "GPU", _budget(4096) * 1.001, "tokens", 4096, longest=100)
    assert (fits.chosen, fits.accumulation) == (4096, 1) and "does not fit" not in fits.text()
    halved = plan_memory(BIG, "GPU", _budget(4096) * 0.999, "tokens", 4096, longest=100)
    assert (halved.chosen, halved.accumulation) == (2048, 2)
    assert "the checkpoint's batch of 4096 tokens does not fit, so batches of 2048 are trained, 2 accumulated" \
        in halved.text()
    quarter = plan_memory(BIG, "GPU", _budget(2048) * 0.999, "tokens", 4096, longest=100)
    assert (quarter.chosen, quarter.accumulation) == (1024, 4)
    # what it counts: the student's weights, gradients and Adam's moments; the teacher's weights; the batch
    assert fits.needed["student"] == 16 * BIG.parameters and fits.needed["teacher"] == 4 * BIG.parameters
    assert fits.needed["batch"] > halved.needed["batch"] * 1.9


def test_a_batch_is_never_halved_below_the_longest_pair_and_none_fitting_stops_with_one_line():
    with pytest.raises(StudyError) as refused:
        plan_memory(BIG, "GPU", _budget(200) * 0.999, "tokens", 4096, longest=200)
    message = str(refused.value)
    assert "\n" not in message and "a batch of 256 tokens" in message and "--distill sequence" in message
    alone = TrainingShape(**{**BIG.__dict__, "teacher_parameters": 0})
    with pytest.raises(StudyError) as refused:
        plan_memory(alone, "CPU", 1e9, "sentences", 8, longest=50)
    assert "a batch of 1 sentences" in str(refused.value) and "--distill" not in str(refused.value)


def test_a_fine_tune_over_its_memory_trains_smaller_batches_and_states_it(tiny_model, tmp_path):
    """``compress --finetune-memory 2`` on the tiny model batching 65,536 tokens (about 5 GB of activations by the
    estimate): it trains the largest halved batch that fits, as many more accumulated per update, and report.md
    and report.json say so; at 0.001 GB, one line before any stage runs."""
    import torch

    from fairseq_headprune.engine.checkpoints.info import load_checkpoint_state

    state = load_checkpoint_state(str(tiny_model["checkpoint"]))
    state["cfg"]["dataset"]["max_tokens"] = batch = 65536
    frequency = int(state["cfg"]["optimization"]["update_freq"][0])
    checkpoint = tmp_path / "large-batches.pt"
    torch.save(state, checkpoint)
    out = tmp_path / "run"
    common = ["fairseq-headprune", "compress", tiny_model["data"], "--path", checkpoint,
              "--target", "heads=50%", "--no-tune", "--finetune-updates", "2", "--beam", "2", "--batch-size", "64",
              "--required-batch-size-multiple", "1", "--speed-batch-sizes", "64", "--repeats", "1",
              "--speed-sentences", "8", "--no-progress"]
    run([*common, "--out-dir", out, "--finetune-memory", "2"])
    finetune = json.loads((out / "report.json").read_text())["finetune"]
    memory, budget = finetune["memory"], HEADROOM * 2e9
    total = sum(memory["needed"].values())
    assert memory["batch"] == batch and memory["accumulation"] >= 2
    assert memory["chosen"] * memory["accumulation"] == batch and finetune["update_freq"] == (
        memory["accumulation"] * frequency)
    # the largest that fits: the batch's activations grow with its tokens, so twice the batch would not
    assert memory["free"] == pytest.approx(2e9) and total <= budget < total + memory["needed"]["batch"]
    assert (f"batches of {memory['chosen']} are trained, {memory['accumulation']} accumulated"
            in (out / "report.md").read_text())
    refused = run([*common, "--out-dir", tmp_path / "small", "--finetune-memory", "0.001"], check=False)
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    assert "the fine-tune needs an estimated" in refused.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "small" / "search").exists()
