"""Old-format (WMT14 En-Fr release style) checkpoints under torch >= 2.6."""

import argparse
import fractions
import pickle

import numpy
import pytest
import torch

from fairseq_headprune.compat.torch_load import NUMPY_ARRAY_GLOBALS
from fairseq_headprune.engine.checkpoints.info import checkpoint_head_layout
from fairseq_headprune.errors import CheckpointError

from conftest import USER_DIR, run, validate_loss
from support import write_legacy_checkpoint


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


def test_the_plugin_allows_exactly_its_list(tmp_path):
    """In a fresh interpreter: importing the plugin adds argparse.Namespace and numpy's rebuilding of arrays of
    numbers to torch's safe globals and nothing else; a Namespace checkpoint and one whose meters hold numpy arrays
    (fairseq-train with --eval-bleu) then load with weights_only, and one that pickles another object, also inside
    a numpy array of objects, is still refused."""
    namespace_path, evil_path = tmp_path / "namespace.pt", tmp_path / "evil.pt"
    meters_path, evil_array_path = tmp_path / "meters.pt", tmp_path / "evil_array.pt"
    torch.save({"model": {}, "args": argparse.Namespace(arch="transformer")}, namespace_path)
    torch.save({"model": {}, "payload": fractions.Fraction(1, 3)}, evil_path)
    torch.save({"model": {}, "extra_state": {"metrics": {"_bleu_counts": numpy.array([3, 2, 1, 0]),
                                                         "_bleu_len": numpy.array([4.5])}}}, meters_path)
    torch.save({"model": {}, "payload": numpy.array([fractions.Fraction(1, 3)], dtype=object)}, evil_array_path)
    script = f"""
import pickle, torch
before = set(torch.serialization.get_safe_globals())
try:
    torch.load({str(namespace_path)!r})
    print("namespace loaded before the plugin")
except pickle.UnpicklingError:
    print("namespace refused before the plugin")
import fairseq_headprune
from fairseq_headprune.compat.torch_load import FAIRSEQ_CHECKPOINT_GLOBALS
added = set(torch.serialization.get_safe_globals()) - before
print("added", sorted(g.__module__ + "." + g.__qualname__ for g in added))
print("list", sorted(g.__module__ + "." + g.__qualname__ for g in FAIRSEQ_CHECKPOINT_GLOBALS))
print("arch", torch.load({str(namespace_path)!r})["args"].arch)
print("counts", torch.load({str(meters_path)!r})["extra_state"]["metrics"]["_bleu_counts"].tolist())
for path in ({str(evil_path)!r}, {str(evil_array_path)!r}):
    try:
        torch.load(path)
        print("evil loaded")
    except pickle.UnpicklingError:
        print("evil refused")
"""
    lines = run(["python", "-c", script]).stdout.splitlines()
    numpy_globals = sorted(g.__module__ + "." + g.__qualname__ for g in NUMPY_ARRAY_GLOBALS)
    assert numpy_globals[:1] == ["numpy._core.multiarray._reconstruct"] or "numpy.core.multiarray._reconstruct" in (
        numpy_globals)
    assert {"numpy.ndarray", "numpy.dtype", "numpy.dtypes.Int64DType"} <= set(numpy_globals)
    listed = str(sorted(["argparse.Namespace", *numpy_globals]))
    assert lines == [
        "namespace refused before the plugin",
        f"added {listed}",
        f"list {listed}",
        "arch transformer",
        "counts [3, 2, 1, 0]",
        "evil refused",
        "evil refused",
    ]


def generate(data, checkpoint, *extra):
    result = run(
        ["fairseq-generate", data, "--path", checkpoint, "--user-dir", USER_DIR,
         "--task", "fairseq-headprune", "--gen-subset", "valid", "--beam", "4",
         "--batch-size", "64", *extra]
    )
    return sorted(line for line in result.stdout.splitlines() if line.startswith("H-"))


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
    with pytest.raises(CheckpointError, match="checkpoint not found"):
        checkpoint_head_layout(str(tmp_path / "missing.pt"))
    junk = tmp_path / "junk.pt"
    junk.write_text("not a checkpoint")
    with pytest.raises(CheckpointError, match="cannot read checkpoint"):
        checkpoint_head_layout(str(junk))
