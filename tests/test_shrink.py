"""Real head removal: shrunk checkpoints against masked models."""

import re

import pytest
import torch

from fairseq_headprune.engine.checkpoints.info import load_checkpoint_state, state_head_layout
from fairseq_headprune.modules.masked_multihead_attention import (
    attention_modules,
    head_layout,
    set_head_mask,
    unfused_attention,
)
from fairseq_headprune.modules.pruned_heads import shrink_model
from fairseq_headprune.study.masks.head_mask import parse_head_mask

from conftest import USER_DIR, run, run_in_process

MASKS = [
    "E:1:3",                                  # one head
    "E:2:* A:1:*",                            # whole layers removed
    "E:1:1-6 A:2:keep=3 D:1:2,4,6,8 D:2:5",   # uneven per-layer budgets
]


def shrink(tiny_model, spec, out, check=True):
    return run(["fairseq-headprune", "shrink", "--path", tiny_model["checkpoint"], "--head-mask", spec,
                "--out", out], check=check)


def load(tiny_model, path):
    from fairseq_headprune.engine.checkpoints.loading import load_generation_model

    _, task, model = load_generation_model(str(tiny_model["data"]), str(path), cpu=True)
    return task, model


@pytest.mark.parametrize("spec", MASKS)
def test_shrunk_model_equals_masked_model(tiny_model, tiny_task_and_model, tmp_path, spec):
    task, model = tiny_task_and_model
    shrink(tiny_model, spec, tmp_path / "pruned.pt")
    _, shrunk = load(tiny_model, tmp_path / "pruned.pt")
    head_mask = parse_head_mask(spec, head_layout(model))
    for (attention_type, layer), module in attention_modules(shrunk).items():
        assert module.num_heads == int(head_mask[attention_type][layer].sum())
    task.load_dataset("valid")
    dataset = task.dataset("valid")
    sample = dataset.collater([dataset[i] for i in range(32)])
    set_head_mask(model, head_mask)
    try:
        with torch.no_grad():
            masked_logits = model(**sample["net_input"])[0]
            shrunk_logits = shrunk(**sample["net_input"])[0]
        assert (masked_logits - shrunk_logits).abs().max() <= 1e-4
        # a generator decodes with the models it was built with: one per model
        generator = task.build_generator([model], type("Args", (), {"beam": 5})())
        shrunk_generator = task.build_generator([shrunk], type("Args", (), {"beam": 5})())
        with torch.no_grad():
            masked_hypotheses = [h[0]["tokens"].tolist() for h in task.inference_step(generator, [model], sample)]
            shrunk_hypotheses = [h[0]["tokens"].tolist()
                                 for h in task.inference_step(shrunk_generator, [shrunk], sample)]
        assert masked_hypotheses == shrunk_hypotheses
        # the narrowed layers' fused attention against fairseq's unfused path
        with torch.no_grad(), unfused_attention():
            unfused_logits = shrunk(**sample["net_input"])[0]
            unfused_hypotheses = [h[0]["tokens"].tolist()
                                  for h in task.inference_step(shrunk_generator, [shrunk], sample)]
        assert (unfused_logits - shrunk_logits).abs().max() <= 1e-5
        assert unfused_hypotheses == shrunk_hypotheses
    finally:
        set_head_mask(model, None)


def test_shrunk_checkpoint_is_smaller_by_the_removed_parameters_and_reports_them(tiny_model, tmp_path):
    spec = "E:1:1-6 A:2:keep=3 D:1:2,4,6,8 D:2:5"
    result = shrink(tiny_model, spec, tmp_path / "pruned.pt")
    # each removed head: 3 x (d x C + d) rows of q/k/v and C x d columns of out_proj
    width, heads = 64, 8
    head_dim = width // heads
    per_head = 3 * (head_dim * width + head_dim) + width * head_dim
    removed_heads = 6 + 7 + 4 + 1
    report = dict(re.findall(r"^total\t(\d+)\t(\d+)", result.stdout, re.M))
    before, after = next(iter(report.items()))
    assert int(before) - int(after) == removed_heads * per_head
    # on disk: the same checkpoint without optimizer state, minus 4 bytes per removed float
    reference = load_checkpoint_state(str(tiny_model["checkpoint"]))
    reference["last_optimizer_state"] = None
    torch.save(reference, tmp_path / "reference.pt")
    saved = (tmp_path / "reference.pt").stat().st_size - (tmp_path / "pruned.pt").stat().st_size
    assert abs(saved - 4 * removed_heads * per_head) < 4096, saved
    state = load_checkpoint_state(str(tmp_path / "pruned.pt"))
    layout = state_head_layout(state)
    recorded = parse_head_mask(state["cfg"]["model"].headprune_pruned_heads, layout)
    expected = parse_head_mask(spec, layout)
    assert all(torch.equal(recorded[t], expected[t]) for t in layout)


def test_shrunk_checkpoint_translates_in_a_fresh_fairseq_generate(tiny_model, tmp_path):
    spec = "E:2:* A:1:keep=1,2 D:*:7,8"
    shrink(tiny_model, spec, tmp_path / "pruned.pt")

    def bleu(*extra):
        result = run(["fairseq-generate", tiny_model["data"], "--user-dir", USER_DIR, "--task",
                      "fairseq-headprune", "--gen-subset", "valid", "--batch-size", "64", "--beam", "5",
                      *extra])
        return re.search(r"BLEU4 = ([\d.]+)", result.stdout).group(1)

    assert bleu("--path", tmp_path / "pruned.pt") == bleu("--path", tiny_model["checkpoint"], "--head-mask", spec)


def test_legacy_checkpoint_shrinks_like_the_new_format(tiny_model, tiny_task_and_model, tmp_path):
    from support import write_legacy_checkpoint

    spec = "A:1:keep=4 D:2:1-3"
    write_legacy_checkpoint(str(tiny_model["checkpoint"]), str(tmp_path / "legacy.pt"))
    run(["fairseq-headprune", "shrink", "--path", tmp_path / "legacy.pt", "--head-mask", spec,
         "--out", tmp_path / "legacy-pruned.pt"])
    shrink(tiny_model, spec, tmp_path / "pruned.pt")
    _, from_legacy = load(tiny_model, tmp_path / "legacy-pruned.pt")
    _, from_new = load(tiny_model, tmp_path / "pruned.pt")
    task, _ = tiny_task_and_model
    task.load_dataset("valid")
    dataset = task.dataset("valid")
    sample = dataset.collater([dataset[i] for i in range(16)])
    with torch.no_grad():
        assert (from_legacy(**sample["net_input"])[0] - from_new(**sample["net_input"])[0]).abs().max() <= 1e-5


def test_shrink_model_in_memory_keeps_output_bias_for_an_empty_layer(tiny_model, tmp_path):
    _, model = load(tiny_model, tiny_model["checkpoint"])
    module = attention_modules(model)[("enc-dec", 1)]
    bias = module.out_proj.bias.detach().clone()
    shrink_model(model, parse_head_mask("A:2:*", head_layout(model)))
    assert module.num_heads == 0 and module.q_proj.weight.shape[0] == 0
    query = torch.randn(5, 3, 64)
    output, weights = module(query, query, query)
    assert weights is None and torch.equal(output, bias.expand(5, 3, 64))


@pytest.mark.parametrize(
    "args, message",
    [
        (["--head-mask", "E:3:1"], "layer 3 out of range 1-2"),
        (["--head-mask", "none"], "removes no head"),
    ],
)
def test_bad_shrink_input_is_one_line(tiny_model, tmp_path, args, message, capsys):
    result = run_in_process(["shrink", "--path", tiny_model["checkpoint"], "--out",
                  tmp_path / "pruned.pt", *args], capsys)
    assert result.returncode != 0
    assert len(result.stderr.strip().splitlines()) == 1 and message in result.stderr
    assert not (tmp_path / "pruned.pt").exists()


def test_shrink_refuses_to_overwrite_its_input_or_prune_twice(tiny_model, tmp_path, capsys):
    import shutil

    checkpoint = tmp_path / "model.pt"
    shutil.copy(tiny_model["checkpoint"], checkpoint)
    before = checkpoint.read_bytes()
    result = run_in_process(["shrink", "--path", checkpoint, "--head-mask", "E:1:1",
                  "--out", checkpoint], capsys)
    assert result.returncode != 0 and "is also what --path reads" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert checkpoint.read_bytes() == before
    shrink(tiny_model, "E:1:1", tmp_path / "pruned.pt")
    again = run_in_process(["shrink", "--path", tmp_path / "pruned.pt", "--head-mask", "E:1:2",
                 "--out", tmp_path / "twice.pt"], capsys)
    assert again.returncode != 0 and "already has heads removed" in again.stderr
