"""Fine-tuning with heads held pruned: `fairseq-train --task fairseq-headprune --head-mask`."""

import pytest
import torch

import fairseq_headprune.compat.torch_load  # noqa: F401  (its allow-list lets torch.load read checkpoints)

from conftest import REPO, TINY_MODEL_ENV, run

SPEC = "E:1:1-2 A:2:keep=3"
HEAD_DIM = 64 // 8  # the tiny model: width 64, 8 heads


@pytest.fixture(scope="module")
def finetuned(tiny_model, tmp_path_factory):
    """The tiny model fine-tuned for 6 updates with heads masked and weight decay on."""
    save_dir = tmp_path_factory.mktemp("finetuned")
    env = dict(
        TINY_MODEL_ENV,
        EPOCHS="1",
        EXTRA_ARGS=f"--finetune-from-model {tiny_model['checkpoint']} --head-mask {SPEC.replace(' ', ';')} "
        "--max-update 6 --weight-decay 0.1 --lr 0.01 --no-epoch-checkpoints",
    )
    result = run(["bash", REPO / "scripts" / "train" / "train_demo.sh", tiny_model["data"], save_dir], env=env)
    assert "masking 9 heads: E:1:1-2 A:2:keep=3" in result.stderr + result.stdout
    return save_dir / "checkpoint_last.pt"


def _head_slices(weights, key, heads):
    tensor = weights[key].t() if "out_proj" in key else weights[key]
    return [tensor[h * HEAD_DIM:(h + 1) * HEAD_DIM] for h in heads]


def test_masked_heads_keep_their_weights_and_the_others_train(tiny_model, finetuned):
    before = torch.load(tiny_model["checkpoint"], map_location="cpu")["model"]
    after = torch.load(finetuned, map_location="cpu")["model"]
    masked = {"encoder.layers.0.self_attn.": [0, 1], "decoder.layers.1.encoder_attn.": [0, 1, 3, 4, 5, 6, 7]}
    kept = {"encoder.layers.0.self_attn.": [2, 7], "decoder.layers.1.encoder_attn.": [2]}
    parts = ("q_proj.weight", "q_proj.bias", "k_proj.weight", "v_proj.weight", "v_proj.bias", "out_proj.weight")
    for prefix, heads in masked.items():
        for part in parts:
            for old, new in zip(_head_slices(before, prefix + part, heads), _head_slices(after, prefix + part, heads)):
                assert torch.equal(old, new), f"{prefix}{part} of a masked head changed"
    for prefix, heads in kept.items():
        for part in ("q_proj.weight", "v_proj.weight", "out_proj.weight"):
            for old, new in zip(_head_slices(before, prefix + part, heads), _head_slices(after, prefix + part, heads)):
                assert not torch.equal(old, new), f"{prefix}{part} of a kept head did not train"


def test_checkpoint_records_its_mask_and_applies_it_when_loaded(tiny_model, finetuned, tmp_path):
    from fairseq_headprune.engine.checkpoints.loading import load_generation_model
    from fairseq_headprune.engine.runners.batches import iterate_samples, split_batches
    from fairseq_headprune.modules.masked_multihead_attention import current_head_mask, install_masked_attention
    from fairseq_headprune.study.masks.head_mask import head_mask_to_spec

    state = torch.load(finetuned, map_location="cpu")
    assert vars(state["cfg"]["model"])["headprune_head_mask"] == SPEC

    _, task, model = load_generation_model(str(tiny_model["data"]), str(finetuned), cpu=True)
    head_mask = current_head_mask(model)
    assert head_mask_to_spec(head_mask) == SPEC
    # what each head passes on to the output projection, on a real batch
    outputs = {}
    for module in install_masked_attention(model).values():
        module.head_output_hook = lambda m, raw, scaled: outputs.setdefault((m.attention_type, m.layer_index), scaled)
    dataset, batches = split_batches(task, "valid", max_sentences=16, limit=16)
    with torch.no_grad():
        model(**next(iterate_samples(dataset, batches[:1], torch.device("cpu")))["net_input"])
    assert len(outputs) == 6  # every attention module of the 2 + 2 layers
    for (attention_type, layer), scaled in outputs.items():
        for head in range(8):
            is_zero = bool((scaled[:, :, head] == 0).all())
            assert is_zero == (head_mask[attention_type][layer, head] == 0), (attention_type, layer, head)

    def hypotheses(checkpoint, *extra):
        result = run(
            ["fairseq-headprune", "generate", tiny_model["data"], "--path", checkpoint, "--gen-subset", "valid",
             "--beam", "2", "--batch-size", "64", "--max-len-b", "20", *extra]
        )
        return [line for line in result.stdout.splitlines() if line.startswith("H-")], result.stderr

    recorded, log = hypotheses(finetuned)
    assert "masking 9 heads: E:1:1-2 A:2:keep=3" in log
    assert recorded == hypotheses(finetuned, "--head-mask", SPEC)[0]
    # the same weights without the record translate differently: the mask matters
    delattr(state["cfg"]["model"], "headprune_head_mask")
    unrecorded = tmp_path / "unrecorded.pt"
    torch.save(state, unrecorded)
    assert hypotheses(unrecorded)[0] != recorded


def test_shrink_removes_the_recorded_heads(tiny_model, finetuned, tmp_path):
    out = tmp_path / "shrunk.pt"
    result = run(["fairseq-headprune", "shrink", "--path", finetuned, "--head-mask", "D:1:1", "--out", out])
    assert "removed\t10 of 48 heads: E:1:1-2 A:2:keep=3 D:1:1" in result.stdout
    model_cfg = vars(torch.load(out, map_location="cpu")["cfg"]["model"])
    assert model_cfg["headprune_head_mask"] is None
    assert model_cfg["headprune_pruned_heads"] == "E:1:1-2 A:2:keep=3 D:1:1"


def test_validating_until_enough_and_resuming_leave_the_training_as_it_was(tiny_model, tmp_path):
    """A fine-tune that validates with fairseq's BLEU after every update (compress --target speedup) trains the same
    weights as one that never validates: validation runs without gradients on its own data, and fairseq reseeds
    every update from its count. Stopped after 3 updates and continued in another call (a killed run run again),
    it still does, and it reports the seconds its first part trained too: fairseq's training clock travels from
    save to save (less the start checkpoint's, which carries the unpruned model's training)."""
    import time

    from fairseq_headprune.engine.finetune.held import CURVE_FILE, finetune_held, write_masked_start
    from fairseq_headprune.engine.finetune.resume import with_resume_points
    from fairseq_headprune.study.finetune.settings import FinetuneSettings, FinetuneStop
    from fairseq_headprune.study.masks.head_mask import parse_head_mask

    start = tmp_path / "start.pt"
    layout = {t: (2, 8) for t in ("enc-enc", "enc-dec", "dec-dec")}  # the tiny model
    write_masked_start(str(tiny_model["checkpoint"]), str(start), parse_head_mask("E:1:1-2", layout), None)
    assert torch.load(start, map_location="cpu")["extra_state"]["previous_training_time"] > 0  # its own training
    stop = FinetuneStop(interval=1, patience=100, generation={"beam": 2, "max_len_b": 20})
    trained = {}
    for name, until in (("plain", None), ("validated", stop)):
        settings = with_resume_points(FinetuneSettings(updates=4, lr=0.001, until=until))
        walls = []
        for part in ((("update", 3), None) if until is not None else (None,)):
            began = time.perf_counter()
            outcome = finetune_held(str(start), str(tiny_model["data"]), str(tmp_path / name), "translation",
                                    settings, cpu=True, progress=False, stop=part)
            walls.append(time.perf_counter() - began)
        trained[name] = torch.load(tmp_path / name / "checkpoint_last.pt", map_location="cpu")["model"]
        if until is not None:
            assert [p.updates for p in outcome.curve] == [1, 2, 3, 4] and (tmp_path / name / CURVE_FILE).exists()
            # more than the second call took in all (3 of the 4 updates were trained before it), less than both
            assert outcome.updates == 4 and walls[1] < outcome.seconds <= sum(walls)
    assert all(torch.equal(trained["plain"][key], trained["validated"][key]) for key in trained["plain"])


def test_a_finetune_trained_in_parts_across_epochs_trains_the_weights_of_one_run(tiny_model, tmp_path):
    """Stopped at the end of the first epoch and again inside the second (what a killed run resumed, or the recovery
    curve's parts, do), a fine-tune trains the same weights as in one call. fairseq composes the batches from the
    epoch its iterator is built at; the task builds them as at the first epoch, where the uninterrupted run built
    them."""
    from fairseq_headprune.engine.finetune.held import finetune_held, write_masked_start
    from fairseq_headprune.engine.finetune.resume import with_resume_points
    from fairseq_headprune.study.finetune.settings import FinetuneSettings
    from fairseq_headprune.study.masks.head_mask import parse_head_mask

    start = tmp_path / "start.pt"
    layout = {t: (2, 8) for t in ("enc-enc", "enc-dec", "dec-dec")}  # the tiny model
    write_masked_start(str(tiny_model["checkpoint"]), str(start), parse_head_mask("E:1:1-2", layout), None)
    trained_model = torch.load(tiny_model["checkpoint"], map_location="cpu")
    epochs_trained = trained_model["extra_state"]["train_iterator"]["epoch"] - 1
    per_epoch = trained_model["optimizer_history"][-1]["num_updates"] // epochs_trained  # updates per epoch
    settings = with_resume_points(FinetuneSettings(updates=per_epoch + 3, lr=0.001))
    trained = {}
    for name, parts in (("one call", [None]), ("in parts", [("update", per_epoch), ("update", per_epoch + 2), None])):
        for part in parts:
            finetune_held(str(start), str(tiny_model["data"]), str(tmp_path / name), "translation", settings,
                          cpu=True, progress=False, stop=part)
        state = torch.load(tmp_path / name / "checkpoint_last.pt", map_location="cpu")
        assert state["extra_state"]["train_iterator"]["epoch"] == 2  # the second epoch was reached
        trained[name] = state["model"]
    assert all(torch.equal(trained["one call"][key], trained["in parts"][key]) for key in trained["one call"])
