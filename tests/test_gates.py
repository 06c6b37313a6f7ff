"""Learned hard-concrete head gates with an exact budget (--criterion headprune_gates)."""

import json

import pytest
import torch

from fairseq_headprune.errors import SettingsError
from fairseq_headprune.study.search.gates import (
    log_alpha_for_open_probability,
    open_probability,
    parse_target_heads,
    sample_gates,
    top_k_mask,
)

from conftest import REPO, TINY_MODEL_ENV, run


def test_the_open_probability_is_the_frequency_of_open_gates_in_samples():
    log_alpha = torch.tensor([-3.0, -1.0, 0.0, 1.5, 4.0], dtype=torch.float64)
    generator = torch.Generator().manual_seed(0)
    draws = torch.stack([sample_gates(log_alpha, generator=generator) for _ in range(40000)])
    assert ((draws == 0) | (draws == 1)).float().mean() > 0.3  # exact zeros and ones occur
    frequency = (draws > 0).double().mean(dim=0)
    assert torch.allclose(frequency, open_probability(log_alpha), atol=0.01)
    for probability in (0.1, 0.5, 0.9):
        value = open_probability(torch.tensor(log_alpha_for_open_probability(probability)))
        assert float(value) == pytest.approx(probability)


def test_the_exported_mask_keeps_exactly_the_target_heads_of_largest_log_alpha():
    log_alpha = {"enc-enc": torch.tensor([[0.5, -1.0], [2.0, 0.5]]), "dec-dec": torch.tensor([[3.0, -2.0]])}
    mask = top_k_mask(log_alpha, 3)
    assert mask["enc-enc"].tolist() == [[1.0, 0.0], [1.0, 0.0]] and mask["dec-dec"].tolist() == [[1.0, 0.0]]
    assert parse_target_heads("50%", 72) == 36 and parse_target_heads("20", 48) == 20
    for text in ("49", "0", "half", "2.5"):
        with pytest.raises(SettingsError):
            parse_target_heads(text, 48)


def test_learned_masks_make_a_curve_from_the_unpruned_model_by_heads_pruned():
    from fairseq_headprune.study.masks.head_mask import parse_head_mask
    from fairseq_headprune.study.pruning.curves import given_mask_steps

    layout = {"enc-enc": (2, 4), "dec-dec": (2, 4)}
    masks = [parse_head_mask(spec, layout) for spec in ("E:1:* D:2:1-3", "E:2:1")]
    steps = given_mask_steps(layout, "gates", masks)
    assert [(s.step, s.pruned, s.total, s.order, s.scope) for s in steps] == [
        (0, 0, 16, "gates", "all"), (1, 1, 16, "gates", "all"), (2, 7, 16, "gates", "all")]
    assert steps[2].head_mask is masks[0]


def train_gates(tiny_model, save_dir, kept, check=True):
    env = dict(TINY_MODEL_ENV, UPDATES="12", GATE_LR="0.05")
    return run(["bash", REPO / "scripts" / "train" / "train_gates.sh", tiny_model["data"], tiny_model["checkpoint"],
                save_dir, kept], env=env, check=check)


def test_trained_gates_keep_exactly_the_target_and_leave_the_frozen_model_unchanged(tiny_model, tmp_path):
    save_dir = tmp_path / "gates"
    result = train_gates(tiny_model, save_dir, "20")
    assert "masked\t28 of 48 heads" in result.stdout
    mask = json.loads((save_dir / "mask.json").read_text())
    state = torch.load(save_dir / "checkpoint_best.pt", map_location="cpu", weights_only=False)
    original = torch.load(tiny_model["checkpoint"], map_location="cpu", weights_only=False)["model"]
    assert all(torch.equal(original[name], state["model"][name]) for name in original)  # frozen
    gates = state["criterion"]
    assert float(gates["target_heads"]) == 20
    # the 20 heads kept are those with the largest log_alpha, read here from the saved parameters
    scores = sorted(((float(v), name, layer, head) for name, tensor in gates.items() if name.startswith("log_alpha_")
                     for layer, row in enumerate(tensor.tolist()) for head, v in enumerate(row)), reverse=True)
    kept = {(name.replace("log_alpha_", "").replace("_", "-"), layer + 1, head + 1)
            for _, name, layer, head in scores[:20]}
    masked = {(t, int(layer), head) for t, layers in mask["masked"].items() for layer, heads in layers.items()
              for head in heads}
    everything = {(t, layer, head) for t in ("enc-enc", "enc-dec", "dec-dec") for layer in (1, 2)
                  for head in range(1, 9)}
    assert masked == everything - kept
    cost = json.loads((save_dir / "cost.json").read_text())
    assert cost["updates"] == 12 and cost["sentences"] > 24 and cost["seconds"] > 0
    # the gates moved: training changed them from their common initial value
    assert len({round(score, 6) for score, *_ in scores}) > 40
    # the exported mask is a mask file every command's --head-mask reads
    from fairseq_headprune.study.masks.head_mask import count_masked, read_mask_file

    layout = {t: (2, 8) for t in ("enc-enc", "enc-dec", "dec-dec")}
    assert count_masked(read_mask_file(str(save_dir / "mask.json"), layout)) == 28
    # and the curve of prune --gate-masks, with what training cost
    out = tmp_path / "prune"
    run(["fairseq-headprune", "prune", tiny_model["data"], "--path", tiny_model["checkpoint"], "--gen-subset", "valid",
         "--out-dir", out, "--orders", "gates", "--gate-masks", save_dir / "mask.json", "--beam", "2",
         "--no-progress"])
    curves = json.loads((out / "prune_steps.all.json").read_text())
    assert [(r["order"], r["pruned"]) for r in curves["rows"]] == [("gates", 0), ("gates", 28)]
    assert curves["rows"][1]["spec"] == mask["spec"]
    assert curves["settings"]["method_costs"]["gates"]["seconds"] == cost["seconds"]


def test_a_target_larger_than_the_model_is_one_line(tiny_model, tmp_path):
    result = train_gates(tiny_model, tmp_path / "gates", "49", check=False)
    assert result.returncode != 0
    log = (tmp_path / "gates" / "train.log").read_text().strip().splitlines()
    assert "--gate-target-heads 49 must keep between 1 and the model's 48 heads" in log[-1]
    assert not any("Traceback" in line for line in log)


def test_gates_start_from_an_old_format_checkpoint_without_a_criterion_entry(tiny_model, tmp_path):
    """The released WMT14 En-Fr model's format (args, packed in_proj, no 'criterion'): fairseq's trainer used
    to stop with "Cannot load model parameters"; the gates now start from their initial values."""
    from support import write_legacy_checkpoint

    legacy = tmp_path / "legacy.pt"
    write_legacy_checkpoint(str(tiny_model["checkpoint"]), str(legacy))
    assert "criterion" not in torch.load(legacy, map_location="cpu", weights_only=False)
    save_dir = tmp_path / "gates"
    env = dict(TINY_MODEL_ENV, UPDATES="2", GATE_LR="0.05")
    result = run(["bash", REPO / "scripts" / "train" / "train_gates.sh", tiny_model["data"], legacy, save_dir, "20"],
                 env=env, check=False)
    log = (save_dir / "train.log").read_text()
    assert result.returncode == 0, log[-3000:]
    assert "Cannot load model parameters" not in log
    from fairseq_headprune.study.masks.head_mask import count_masked, read_mask_file

    layout = {t: (2, 8) for t in ("enc-enc", "enc-dec", "dec-dec")}
    assert count_masked(read_mask_file(str(save_dir / "mask.json"), layout)) == 28
    state = torch.load(save_dir / "checkpoint_last.pt", map_location="cpu", weights_only=False)
    assert sorted(k for k in state["criterion"] if k.startswith("log_alpha_")) == [
        "log_alpha_dec_dec", "log_alpha_enc_dec", "log_alpha_enc_enc"]
