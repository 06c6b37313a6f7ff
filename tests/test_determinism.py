"""Training is a function of the seed: the same script twice gives the same weights, bit for bit.

The demo's numbers can only be pasted into the README if a rerun prints them
again; this trains the tiny test model's first epoch twice with the project's
own script (same seed, same thread count) and compares every parameter.
"""

import torch

from conftest import REPO, TINY_MODEL_ENV, run


def test_training_twice_gives_identical_parameters(tiny_model, tmp_path):
    env = dict(TINY_MODEL_ENV, EPOCHS="1")  # one epoch: every update has dropout and shuffled batches
    states = []
    for attempt in ("first", "second"):
        save_dir = tmp_path / attempt
        run(["bash", REPO / "scripts" / "train_demo.sh", tiny_model["data"], save_dir], env=env)
        states.append(torch.load(save_dir / "checkpoint_last.pt", map_location="cpu", weights_only=False)["model"])
    first, second = states
    assert first.keys() == second.keys() and len(first) > 20
    different = [name for name in first if not torch.equal(first[name], second[name])]
    assert different == []
    # and the run is not trivially constant: another seed trains other weights
    run(["bash", REPO / "scripts" / "train_demo.sh", tiny_model["data"], tmp_path / "other"],
        env=dict(env, SEED="2"))
    other = torch.load(tmp_path / "other" / "checkpoint_last.pt", map_location="cpu", weights_only=False)["model"]
    assert any(not torch.equal(first[name], other[name]) for name in first)
