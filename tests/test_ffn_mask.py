"""FFN neuron masks: zeta_i on the input of fc2, against stock fairseq with fc2's columns zeroed.

On every model family the plugin takes: a RoBERTa classifier and a
transformer_lm built by fairseq itself (random weights: the identities hold
for any), and the tiny trained translation model. References: the same
model without the plugin's hooks and with the masked neurons' fc2 input
columns zeroed; each sentence alone with its own mask (per-sentence masks
and gradients).
"""

import copy

import pytest
import torch
from test_encoder_only import batch as classifier_batch
from test_encoder_only import build_roberta, classify
from test_language_model import build_lm, next_token_logits, token_rows

from fairseq_headprune.errors import HeadMaskError
from fairseq_headprune.modules.masked_ffn import (
    current_ffn_mask,
    ffn_layers,
    ffn_layout,
    ffn_mask_applied,
    install_ffn_masks,
    set_ffn_mask,
)
from fairseq_headprune.study.masks.ffn_mask import ffn_mask_to_spec, parse_ffn_mask

WIDTH = 64  # encoder_ffn_embed_dim / decoder_ffn_embed_dim of the built models


def zeroed_fc2_copy(model, ffn_mask):
    """``model`` with the masked neurons' fc2 input columns zeroed: stock fairseq, no hook."""
    zeroed = copy.deepcopy(model)
    for (ffn_type, layer), module in ffn_layers(zeroed).items():
        if ffn_type in ffn_mask:
            kept = ffn_mask[ffn_type][layer]
            module.fc2.weight.data[:, kept == 0] = 0.0
    return zeroed


def families():
    roberta, dictionary = build_roberta()
    lm, lm_dictionary = build_lm()
    return {
        "classifier": (roberta, lambda m: classify(m, classifier_batch(dictionary)), "E"),
        "language_model": (lm, lambda m: next_token_logits(m, token_rows(lm_dictionary)), "D"),
    }


@pytest.fixture(scope="module", params=["classifier", "language_model"])
def family(request):
    plain, run_model, letter = families()[request.param]
    masked = copy.deepcopy(plain)
    install_ffn_masks(masked)
    return plain, masked, run_model, letter


def test_the_layout_names_each_stack(family):
    _, masked, _, letter = family
    assert ffn_layout(masked) == {"enc-ffn" if letter == "E" else "dec-ffn": (3 if letter == "E" else 2, WIDTH)}


@pytest.mark.parametrize("terms", ["{L}:1:1-20", "{L}:*:keep=1-8", "{L}:2:*", "{L}:1:3,5,60-64 {L}:2:keep=2"])
def test_a_masked_neuron_equals_a_zeroed_fc2_column(family, terms):
    plain, masked, run_model, letter = family
    ffn_mask = parse_ffn_mask(terms.format(L=letter), ffn_layout(masked))
    with torch.no_grad():
        reference = run_model(zeroed_fc2_copy(plain, ffn_mask))
        with ffn_mask_applied(masked, ffn_mask):
            result = run_model(masked)
        assert (result - reference).abs().max() <= 1e-5
        assert (result - run_model(plain)).abs().max() > 1e-3  # the mask changed something


def test_no_mask_is_stock_fairseq_exactly(family):
    plain, masked, run_model, _ = family
    with torch.no_grad():
        set_ffn_mask(masked, None)
        assert torch.equal(run_model(masked), run_model(plain))
        ones = {t: torch.ones(layers, width) for t, (layers, width) in ffn_layout(masked).items()}
        with ffn_mask_applied(masked, ones):
            assert torch.equal(run_model(masked), run_model(plain))
    assert current_ffn_mask(masked) is None


def test_a_fully_masked_ffn_outputs_its_bias(family):
    _, masked, run_model, letter = family
    ffn_type = "enc-ffn" if letter == "E" else "dec-ffn"
    layer = ffn_layers(masked)[(ffn_type, 0)]
    outputs = []
    handle = layer.fc2.register_forward_hook(lambda module, inputs, output: outputs.append(output))
    try:
        with torch.no_grad(), ffn_mask_applied(masked, parse_ffn_mask(f"{letter}:1:*", ffn_layout(masked))):
            run_model(masked)
    finally:
        handle.remove()
    assert torch.equal(outputs[0], layer.fc2.bias.expand_as(outputs[0]))


def test_the_mask_in_force_reads_back_as_its_spec(family):
    _, masked, _, letter = family
    spec = f"{letter}:1:1-10,33 {letter}:2:keep=1-4"
    with ffn_mask_applied(masked, parse_ffn_mask(spec, ffn_layout(masked))):
        assert ffn_mask_to_spec(current_ffn_mask(masked)) == spec
    assert current_ffn_mask(masked) is None


def test_per_sentence_masks_and_gradients_are_each_sentences_own():
    """A (layers, batch, neurons) mask that requires grad: row b scores and differentiates sentence b alone."""
    model, dictionary = build_lm()
    install_ffn_masks(model)
    tokens = token_rows(dictionary, lengths=(10, 10, 10))
    layout = ffn_layout(model)
    generator = torch.Generator().manual_seed(0)
    values = {t: torch.rand(layers, tokens.size(0), width, generator=generator)
              for t, (layers, width) in layout.items()}
    batch_mask = {t: v.clone().requires_grad_(True) for t, v in values.items()}
    with ffn_mask_applied(model, batch_mask):
        per_sentence = next_token_logits(model, tokens).sum(dim=(1, 2))
        per_sentence.sum().backward()
    for row in range(tokens.size(0)):
        own = {t: v[:, row].clone().requires_grad_(True) for t, v in values.items()}
        with ffn_mask_applied(model, own):
            alone = next_token_logits(model, tokens[row:row + 1]).sum()
            alone.backward()
        assert torch.allclose(alone, per_sentence[row].detach(), rtol=1e-5, atol=1e-4)
        for ffn_type in layout:
            assert torch.allclose(own[ffn_type].grad, batch_mask[ffn_type].grad[:, row], rtol=1e-4, atol=1e-5)


def test_a_mask_of_another_width_is_one_clear_error():
    model, dictionary = build_lm()
    install_ffn_masks(model)
    with pytest.raises(HeadMaskError, match="a mask of 32 neurons for an FFN of 64"):
        with ffn_mask_applied(model, {"dec-ffn": torch.ones(2, 32)}):
            next_token_logits(model, token_rows(dictionary))


@pytest.mark.parametrize("spec, message", [
    ("E:1:65", "neuron 65 out of range 1-64"),
    ("E:4:1", "layer 4 out of range 1-3"),
    ("D:1:1", "the model has no dec-ffn block"),
    ("A:1:1", "unknown FFN type 'A' (expected E/enc-ffn or D/dec-ffn)"),
    ("E:1", "malformed term 'E:1' (expected TYPE:LAYERS:NEURONS"),
    ("", "empty ffn-mask spec"),
])
def test_bad_specs_say_what_is_wrong(spec, message):
    with pytest.raises(HeadMaskError) as error:
        parse_ffn_mask(spec, {"enc-ffn": (3, WIDTH)})
    assert message in str(error.value)


def test_fairseq_generate_with_an_ffn_mask_equals_stock_fairseq_on_zeroed_columns(tiny_model, tmp_path):
    """The tiny translation model: --ffn-mask through fairseq's own fairseq-generate, hypothesis for hypothesis."""
    from test_fairseq_cli import generate, hypotheses

    import fairseq_headprune.compat.torch_load  # noqa: F401  (allow-list)

    spec = "E:1:1-64 D:2:keep=1-32,100"  # the tiny model's FFNs have 128 neurons
    state = torch.load(tiny_model["checkpoint"], map_location="cpu")
    ffn_mask = parse_ffn_mask(spec, {"enc-ffn": (2, 128), "dec-ffn": (2, 128)})
    for ffn_type, stack in (("enc-ffn", "encoder"), ("dec-ffn", "decoder")):
        for layer in range(2):
            weight = state["model"][f"{stack}.layers.{layer}.fc2.weight"]
            weight[:, ffn_mask[ffn_type][layer] == 0] = 0.0
    zeroed = tmp_path / "zeroed.pt"
    torch.save(state, zeroed)
    stock = generate(dict(tiny_model, checkpoint=zeroed), "--task", "translation").stdout
    masked = generate(tiny_model, "--task", "fairseq-headprune", "--ffn-mask", spec)
    assert hypotheses(masked.stdout) == hypotheses(stock) and len(hypotheses(stock)) > 0
    assert hypotheses(masked.stdout) != hypotheses(generate(tiny_model, "--task", "translation").stdout)
    assert f"masking 159 FFN neurons: {spec}" in masked.stderr


@pytest.mark.parametrize("spec, message", [
    ("E:3:1", "--ffn-mask: layer 3 out of range 1-2"),
    ("D:1:129", "--ffn-mask: neuron 129 out of range 1-128"),
    ("A:1:1", "--ffn-mask: unknown FFN type 'A'"),
])
def test_a_bad_ffn_mask_in_fairseqs_commands_is_one_line(tiny_model, spec, message):
    from test_fairseq_cli import generate

    result = generate(tiny_model, "--task", "fairseq-headprune", "--ffn-mask", spec, check=False)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("fairseq-headprune: error: --ffn-mask:") and message in last, last


# ---- removal: fc1 rows and fc2 columns sliced out, the model reloaded ------------------------------


@pytest.mark.parametrize("terms", ["{L}:1:1-20", "{L}:*:keep=1-8,40", "{L}:1:* {L}:2:3"])
def test_a_shrunk_ffn_computes_the_masked_model(family, terms):
    """Removing masked neurons from a built model (what a shrunk checkpoint's task rebuilds) changes no output."""
    from fairseq_headprune.modules.pruned_heads import shrink_ffn_model

    plain, masked, run_model, letter = family
    ffn_mask = parse_ffn_mask(terms.format(L=letter), ffn_layout(masked))
    shrunk = copy.deepcopy(plain)
    kept = shrink_ffn_model(shrunk, ffn_mask)
    assert kept == {t: [int(row.sum()) for row in m] for t, m in ffn_mask.items()}
    with torch.no_grad(), ffn_mask_applied(masked, ffn_mask):
        assert (run_model(shrunk) - run_model(masked)).abs().max() <= 1e-5


def test_a_shrunk_translation_checkpoint_reloads_and_decodes_as_the_masked_model(
        tiny_model, tiny_task_and_model, tmp_path):
    """Heads and neurons removed together from the tiny model: logits within 1e-4, the same beams, fewer parameters."""
    import re

    from test_shrink import load

    from fairseq_headprune.modules.masked_multihead_attention import head_layout, head_mask_applied
    from fairseq_headprune.study.masks.head_mask import parse_head_mask

    from conftest import run

    task, model = tiny_task_and_model
    head_spec, ffn_spec = "E:1:1-4 D:2:keep=2", "E:1:1-100 E:2:keep=1-64 D:1:*"
    result = run(["fairseq-headprune", "shrink", "--path", tiny_model["checkpoint"], "--head-mask", head_spec,
                  "--ffn-mask", ffn_spec, "--out", tmp_path / "pruned.pt"])
    canonical = "E:1:keep=101-128 E:2:65-128 D:1:*"  # the same neurons, as the spec writer names them
    assert f"removed\t{100 + 64 + 128} of 512 FFN neurons: {canonical}" in result.stdout
    before, after = re.search(r"^total\t(\d+)\t(\d+)", result.stdout, re.M).groups()
    removed_heads, width, head_dim = 4 + 7, 64, 8
    per_neuron = width + 1 + width  # its fc1 row and bias, its fc2 column
    assert int(before) - int(after) == ((100 + 64 + 128) * per_neuron
                                        + removed_heads * (4 * head_dim * width + 3 * head_dim))
    _, shrunk = load(tiny_model, tmp_path / "pruned.pt")
    assert [shrunk.encoder.layers[i].fc1.out_features for i in (0, 1)] == [28, 64]
    assert shrunk.decoder.layers[0].fc1.out_features == 0
    head_mask = parse_head_mask(head_spec, head_layout(model))
    ffn_mask = parse_ffn_mask(ffn_spec, ffn_layout(model))
    task.load_dataset("valid")
    dataset = task.dataset("valid")
    sample = dataset.collater([dataset[i] for i in range(32)])
    with torch.no_grad(), head_mask_applied(model, head_mask), ffn_mask_applied(model, ffn_mask):
        assert (model(**sample["net_input"])[0] - shrunk(**sample["net_input"])[0]).abs().max() <= 1e-4
        beams = [task.build_generator([m], type("Args", (), {"beam": 5})()) for m in (model, shrunk)]
        hypotheses = [[h[0]["tokens"].tolist() for h in task.inference_step(g, [m], sample)]
                      for g, m in zip(beams, (model, shrunk))]
    assert hypotheses[0] == hypotheses[1]
    again = run(["fairseq-headprune", "shrink", "--path", tmp_path / "pruned.pt", "--ffn-mask", "E:1:1",
                 "--out", tmp_path / "twice.pt"], check=False)
    assert again.returncode == 2 and "already has heads removed" in again.stderr
