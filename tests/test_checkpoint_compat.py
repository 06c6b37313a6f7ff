"""Old-format (WMT14 En-Fr release style) checkpoints under torch >= 2.6."""

import fractions
import pickle

import pytest
import torch

from conftest import USER_DIR, run, validate_loss
from fairseq_headprune.checkpoint_info import checkpoint_head_layout
from fairseq_headprune.head_mask import HeadMaskError
from fairseq_headprune.legacy_checkpoint import write_legacy_checkpoint


@pytest.fixture(scope="module")
def legacy_checkpoint(tiny_model, tmp_path_factory):
    path = tmp_path_factory.mktemp("legacy") / "model.pt"
    write_legacy_checkpoint(str(tiny_model["checkpoint"]), str(path))
    return path


def test_legacy_checkpoint_has_the_release_format(legacy_checkpoint):
    state = torch.load(legacy_checkpoint, map_location="cpu")  # plugin imported: allowed
    assert "cfg" not in state and state["args"].arch == "transformer_vaswani_wmt_en_fr_big"
    assert state["args"].share_all_embeddings
    keys = state["model"]
    assert "encoder.layers.0.self_attn.in_proj_weight" in keys
    assert "encoder.layers.0.layer_norms.0.weight" in keys
    assert not any(k.endswith("q_proj.weight") for k in keys)


def test_plain_torch_load_refuses_it_without_the_plugin(legacy_checkpoint):
    result = run(
        ["python", "-c", f"import torch; torch.load({str(legacy_checkpoint)!r})"], check=False
    )
    assert result.returncode != 0 and "argparse.Namespace" in result.stderr


def test_the_allow_list_stays_narrow(tmp_path):
    path = tmp_path / "evil.pt"
    torch.save({"model": {}, "payload": fractions.Fraction(1, 3)}, path)
    with pytest.raises(pickle.UnpicklingError):
        torch.load(path)


def generate(data, checkpoint, *extra):
    result = run(
        ["fairseq-generate", data, "--path", checkpoint, "--user-dir", USER_DIR,
         "--task", "fairseq-headprune", "--gen-subset", "valid", "--beam", "4",
         "--batch-size", "64", *extra]
    )
    return sorted(l for l in result.stdout.splitlines() if l.startswith("H-"))


def test_legacy_checkpoint_loads_with_the_task_and_translates(tiny_model, legacy_checkpoint):
    original = generate(tiny_model["data"], tiny_model["checkpoint"])
    legacy = generate(tiny_model["data"], legacy_checkpoint)
    assert legacy == original and len(legacy) > 0
    masked_original = generate(tiny_model["data"], tiny_model["checkpoint"], "--head-mask", "A:1:1-4")
    masked_legacy = generate(tiny_model["data"], legacy_checkpoint, "--head-mask", "A:1:1-4")
    assert masked_legacy == masked_original != original


def test_validate_applies_the_mask_to_a_legacy_checkpoint(tiny_model, legacy_checkpoint):
    legacy_model = dict(tiny_model, checkpoint=legacy_checkpoint)
    assert validate_loss(legacy_model, "--head-mask", "A:*:*") > validate_loss(legacy_model) + 0.1


def test_layout_is_read_from_either_format(tiny_model, legacy_checkpoint):
    expected = {"enc-enc": (2, 8), "enc-dec": (2, 8), "dec-dec": (2, 8)}
    assert checkpoint_head_layout(str(tiny_model["checkpoint"])) == expected
    assert checkpoint_head_layout(str(legacy_checkpoint)) == expected


def test_unreadable_checkpoints(tmp_path):
    with pytest.raises(HeadMaskError, match="checkpoint not found"):
        checkpoint_head_layout(str(tmp_path / "missing.pt"))
    junk = tmp_path / "junk.pt"
    junk.write_text("not a checkpoint")
    with pytest.raises(HeadMaskError, match="cannot read checkpoint"):
        checkpoint_head_layout(str(junk))
