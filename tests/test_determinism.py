"""Training is a function of the seed: the same script twice gives the same weights, bit for bit.

The demo's numbers can only be pasted into the README if a rerun prints them
again; this trains the tiny test model's first epoch again with the project's
own script (same seed, same thread count) and compares every parameter with
the first epoch of the session's tiny model, trained by the same script.
"""

import torch

from conftest import REPO, TINY_MODEL_ENV, run


def test_training_twice_gives_identical_parameters(tiny_model, tmp_path):
    """The session's tiny model (trained by the fixture, same seed) is the first run."""
    env = dict(TINY_MODEL_ENV, EPOCHS="1")  # one epoch: every update has dropout and shuffled batches
    run(["bash", REPO / "scripts" / "train" / "train_demo.sh", tiny_model["data"], tmp_path / "again"], env=env)

    def parameters(path):
        return torch.load(path, map_location="cpu", weights_only=False)["model"]

    first = parameters(tiny_model["root"] / "checkpoints" / "checkpoint1.pt")
    second = parameters(tmp_path / "again" / "checkpoint_last.pt")
    assert first.keys() == second.keys() and len(first) > 20
    different = [name for name in first if not torch.equal(first[name], second[name])]
    assert different == []
    # and the run is not trivially constant: another seed trains other weights
    run(["bash", REPO / "scripts" / "train" / "train_demo.sh", tiny_model["data"], tmp_path / "other"],
        env=dict(env, SEED="2", EXTRA_ARGS="--max-update 2"))  # two updates differ already
    other = parameters(tmp_path / "other" / "checkpoint_last.pt")
    assert any(not torch.equal(first[name], other[name]) for name in first)
