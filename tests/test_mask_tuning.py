"""Mask tuning by least squares, the search and latency commands, on the tiny model.

The fit is checked against the closed-form least-squares solution on
activations read independently (stock forward hooks on full passes of the
unpruned and the pruned model, the target with the residual drift), the
held-aside guard on the real loss, and the tuned, shrunk checkpoint
(heads and neurons removed) against the tuned masked model.
"""

import contextlib
import json

import numpy as np
import pytest
import torch

from fairseq_headprune.engine.runners.batches import split_batches
from fairseq_headprune.engine.search.mask_tuning import (
    forward_order,
    tune_mask,
    tuning_folded,
)
from fairseq_headprune.engine.search.tuning_guard import (
    split_held_aside,
    token_nll,
)
from fairseq_headprune.modules.masked_ffn import ffn_layout
from fairseq_headprune.modules.masked_multihead_attention import (
    head_layout,
    head_mask_applied,
    set_head_mask,
    transformer_layers,
)
from fairseq_headprune.study.masks.ffn_mask import parse_ffn_mask
from fairseq_headprune.study.masks.head_mask import parse_head_mask
from fairseq_headprune.study.search.tuning import TuningSums, read_tuning, solve_layer, write_tuning

from conftest import run, run_in_process

SENTENCES = 48
SPEC = "E:1:2,5,7 A:2:1-6 D:1:3"
FFN_SPEC = "E:1:1-20 D:2:keep=1-40"  # 20 + 88 of 4 x 128 neurons


def samples_of(task, split="valid", sentences=SENTENCES):
    dataset, batches = split_batches(task, split, max_sentences=16, limit=sentences)
    return [dataset.collater([dataset[i] for i in batch]) for batch in batches]


def always_better():
    """A held-aside loss that falls at every call: the guard keeps every fit (to test the fits themselves)."""
    calls = []

    def loss(model, sample):
        calls.append(1)
        return -float(len(calls)), 1.0
    return loss


def read_sublayer(model, sample, layer, sublayer, tuning=None, layers=(), head_mask=None):
    """Read independently, through stock forward hooks on a full pass: a post-LN sub-layer's input to its
    output projection (``out_proj`` / ``fc2``), its residual input and the sum its layer norm receives."""
    names = {"self": ("self_attn", "self_attn_layer_norm"), "ffn": ("fc2", "final_layer_norm")}
    projection_name, norm_name = names[sublayer]
    projection = layer.self_attn.out_proj if sublayer == "self" else layer.fc2
    norm = getattr(layer, norm_name)
    captured = {}
    handles = [
        projection.register_forward_pre_hook(lambda m, inputs: captured.__setitem__("units", inputs[0].detach())),
        norm.register_forward_pre_hook(lambda m, inputs: captured.__setitem__("sum", inputs[0].detach())),
    ]
    # the residual of the FFN is what the self-attention's layer norm hands on; of the self-attention, the layer input
    if sublayer == "ffn":
        handles.append(layer.self_attn_layer_norm.register_forward_hook(
            lambda m, inputs, output: captured.__setitem__("residual", output.detach())))
    else:
        handles.append(layer.register_forward_pre_hook(
            lambda m, inputs: captured.__setitem__("residual", inputs[0].detach())))
    try:
        with torch.no_grad(), head_mask_applied(model, head_mask), contextlib.ExitStack() as stack:
            if tuning is not None:
                stack.enter_context(tuning_folded(model, tuning, layers))
            model(**sample["net_input"])
    finally:
        for handle in handles:
            handle.remove()
    return captured


def least_squares_reference(columns, target):
    """Closed form: argmin over (s, c) of sum_t |sum_i s_i A_i(t) + c - Y(t)|^2 by numpy's lstsq on the
    explicit design matrix; ``columns`` N x d x k, ``target`` N x d. Returns (solution, fitted values)."""
    n, dim, k = columns.shape
    design = np.concatenate([columns.reshape(n * dim, k), np.tile(np.eye(dim), (n, 1))], axis=1)
    solution, *_ = np.linalg.lstsq(design, target.reshape(-1), rcond=None)
    return solution, design @ solution, design


@pytest.mark.parametrize("key", [("enc-enc", 1), ("enc-ffn", 0)])
def test_the_fit_equals_the_closed_form_least_squares_solution_with_the_residual_drift(tiny_task_and_model, key):
    """A layer above a pruned one: the target carries the residual drift (Kwon et al.'s rescale target)."""
    task, model = tiny_task_and_model
    layout = head_layout(model)
    head_mask = parse_head_mask(SPEC, layout)
    samples = samples_of(task)
    pad = task.source_dictionary.pad()
    tuning = tune_mask(model, head_mask, samples, pad, progress=False, loss=always_better())
    order = forward_order(layout, ffn_layout(model))
    # downstream: every sub-layer that loses a unit or sees their drift (here: all, from enc-enc layer 1 on)
    assert list(tuning.layers) == order
    fit_samples, _ = split_held_aside(samples, 0.2)
    below = order[:order.index(key)]  # tuned before it: the student's inputs carry their fits
    layer = transformer_layers(model)[0][key[1]]
    sublayer = "self" if key[0] == "enc-enc" else "ffn"
    projection = layer.self_attn.out_proj if sublayer == "self" else layer.fc2
    bias = projection.bias.detach().double()
    columns, targets = [], []
    for sample in fit_samples:
        positions = sample["net_input"]["src_tokens"].ne(pad).transpose(0, 1)
        teacher = read_sublayer(model, sample, layer, sublayer)
        student = read_sublayer(model, sample, layer, sublayer, tuning, below, head_mask)
        units = student["units"][positions].double()  # N x (H d_h) or N x F
        weight = projection.weight.detach().double()
        if sublayer == "self":
            heads = layout["enc-enc"][1]
            per_head = units.view(units.size(0), heads, -1)  # A_h = W_o[:, h] o_h
            columns.append(torch.einsum("nhe,dhe->ndh", per_head, weight.view(weight.size(0), heads, -1)))
        else:
            columns.append(units.unsqueeze(1) * weight.unsqueeze(0))  # A_i = a_i W_2[:, i]: N x d x F
        targets.append(teacher["sum"][positions].double() - student["residual"][positions].double() - bias)
    columns, target = torch.cat(columns).numpy(), torch.cat(targets).numpy()
    k = columns.shape[2]
    solution, reference_fit, design = least_squares_reference(columns, target)
    fitted = tuning.layers[key]
    assert fitted.fitted
    ours = design @ np.concatenate([np.array(fitted.scales), np.array(fitted.bias)])
    # the same least-squares optimum: equal fitted values (unique even where the scales are not)
    assert np.abs(ours - reference_fit).max() <= 1e-4 * np.abs(reference_fit).max()
    if np.linalg.matrix_rank(design) == design.shape[1]:  # identifiable: the scales themselves agree
        assert np.abs(np.array(fitted.scales) - solution[:k]).max() <= 1e-4 * np.abs(solution[:k]).max()
    assert fitted.error_tuned <= fitted.error_binary + 1e-12


def test_a_fit_that_raises_the_held_aside_loss_is_not_kept(tiny_task_and_model):
    task, model = tiny_task_and_model
    layout = head_layout(model)
    head_mask = parse_head_mask(SPEC, layout)
    samples = samples_of(task)
    pad = task.source_dictionary.pad()

    def always_worse():
        calls = []

        def loss(model, sample):
            calls.append(1)
            return float(len(calls)), 1.0
        return loss

    refused = tune_mask(model, head_mask, samples, pad, progress=False, loss=always_worse())
    assert refused.layers and not any(v.fitted for v in refused.layers.values())
    assert all("held-aside loss" in v.reason for v in refused.layers.values() if v.reason.startswith("held"))
    # the real guard: the tuned model's loss on the held-aside batches is never above the binary mask's
    tuning = tune_mask(model, head_mask, samples, pad, progress=False)
    _, held = split_held_aside(samples, 0.2)
    nll = token_nll(pad)

    def held_loss(folded):
        total = count = 0.0
        with torch.no_grad(), head_mask_applied(model, head_mask), contextlib.ExitStack() as stack:
            if folded:
                stack.enter_context(tuning_folded(model, tuning))
            for sample in held:
                value, size = nll(model, sample)
                total, count = total + value, count + size
        return total / count

    assert held_loss(True) <= held_loss(False)
    assert held_loss(True) == pytest.approx(tuning.settings["held_aside_loss"], rel=1e-6)


def test_downstream_tuning_fits_the_sub_layers_whose_input_drifted():
    from fairseq_headprune.engine.search.mask_tuning import _tuned_sublayers

    layout = {t: (2, 4) for t in ("enc-enc", "enc-dec", "dec-dec")}
    order = forward_order(layout, {"enc-ffn": (2, 8), "dec-ffn": (2, 8)})
    masks = {t: torch.ones(shape) for t, shape in dict(layout, **{"enc-ffn": (2, 8), "dec-ffn": (2, 8)}).items()}
    masks["enc-ffn"][1, 3] = 0.0  # the encoder's last FFN loses a neuron
    assert _tuned_sublayers(order, masks, "pruned") == [("enc-ffn", 1)]
    # the decoder's first self-attention reads no encoder output: its input has not drifted
    assert _tuned_sublayers(order, masks, "downstream") == [
        ("enc-ffn", 1), ("enc-dec", 0), ("dec-ffn", 0), ("dec-dec", 1), ("enc-dec", 1), ("dec-ffn", 1)]
    masks["enc-ffn"][1, 3] = 1.0
    masks["dec-dec"][1, 0] = 0.0  # only the decoder's second self-attention
    assert _tuned_sublayers(order, masks, "downstream") == [("dec-dec", 1), ("enc-dec", 1), ("dec-ffn", 1)]


def test_indistinguishable_units_keep_scale_one_and_unbounded_fits_keep_the_binary_mask():
    torch.manual_seed(0)
    contributions = torch.randn(200, 3, 8, dtype=torch.float64)
    contributions[:, 1] = contributions[:, 0]  # two identical heads: one direction cannot be fitted
    contributions[:, 2] = 0.0  # a dead unit
    target = 1.5 * contributions[:, 0] + 0.25
    sums = TuningSums.zeros(3, 8)
    sums.add(contributions, target)
    fit = solve_layer(sums, [0, 1, 3], units=4)
    assert fit.fitted and fit.directions == 1
    # the identical pair shares the scale the target needs (0.75 + 0.75 = 1.5) and the dead unit keeps 1
    assert fit.scales == pytest.approx([0.75, 0.75, 0.0, 1.0]) and fit.bias == pytest.approx([0.25] * 8)
    sums = TuningSums.zeros(1, 8)
    sums.add(contributions[:, :1], 50.0 * contributions[:, 0])  # needs a scale of 50
    assert "exceeds the bound" in solve_layer(sums, [2], units=4, scale_bound=10.0).reason
    assert solve_layer(sums, [2], units=4, scale_bound=100.0).scales[2] == pytest.approx(50.0)


def test_factored_neuron_sums_equal_the_explicit_contributions():
    torch.manual_seed(1)
    activations, weight, target = torch.randn(50, 6), torch.randn(8, 6), torch.randn(50, 8)
    factored, explicit = TuningSums.zeros(6, 8), TuningSums.zeros(6, 8)
    factored.add_factored(activations, weight, target)
    explicit.add(activations.unsqueeze(2) * weight.T.unsqueeze(0), target)  # A_i = a_i w_i: N x k x d
    for name in ("contribution_gram", "contribution_sum", "contribution_target", "target_sum"):
        assert torch.allclose(getattr(factored, name), getattr(explicit, name), rtol=1e-5, atol=1e-6), name


def test_a_tuned_shrunk_checkpoint_computes_the_tuned_masked_model(tiny_model, tiny_task_and_model, tmp_path):
    """Heads and FFN neurons tuned, then removed by shrink --tuning: the same logits and beams."""
    task, model = tiny_task_and_model
    layout = head_layout(model)
    head_mask = parse_head_mask(SPEC, layout)
    neuron_mask = parse_ffn_mask(FFN_SPEC, ffn_layout(model))
    tuning = tune_mask(model, head_mask, samples_of(task, "train", 64), task.source_dictionary.pad(), progress=False,
                       ffn_mask=neuron_mask, loss=always_better())
    assert sum(1 for (t, _), v in tuning.layers.items() if t.endswith("ffn") and v.fitted) >= 2
    write_tuning(tuning, str(tmp_path / "tuning.json"))
    assert read_tuning(str(tmp_path / "tuning.json"), layout, ffn_layout(model)).fingerprint() == tuning.fingerprint()
    result = run(["fairseq-headprune", "shrink", "--path", tiny_model["checkpoint"], "--tuning",
                  tmp_path / "tuning.json", "--out", tmp_path / "tuned.pt"])
    assert "removed\t10 of 48 heads" in result.stdout
    assert "removed\t108 of 512 FFN neurons" in result.stdout
    # a mask given beside the tuning is compared as a mask: the same heads written another way are the tuned mask
    respelled, tuned = "A:2:6,5,4,3,2,1 E:1:7,5,2 D:1:3", tmp_path / "tuning.json"
    again = run(["fairseq-headprune", "shrink", "--path", tiny_model["checkpoint"], "--tuning", tuned,
                 "--head-mask", respelled, "--out", tmp_path / "respelled.pt"])
    assert "removed\t10 of 48 heads" in again.stdout
    other = run(["fairseq-headprune", "shrink", "--path", tiny_model["checkpoint"], "--tuning", tuned,
                 "--head-mask", "E:1:2,5 A:2:1-6 D:1:3", "--out", tmp_path / "other.pt"], check=False)
    assert other.returncode != 0 and "is not the mask" in other.stderr and "Traceback" not in other.stderr
    from fairseq_headprune.engine.checkpoints.loading import load_generation_model
    from fairseq_headprune.modules.masked_ffn import ffn_mask_applied

    _, _, shrunk = load_generation_model(str(tiny_model["data"]), str(tmp_path / "tuned.pt"), cpu=True)
    sample = samples_of(task, "valid", 32)[0]
    with torch.no_grad(), head_mask_applied(model, head_mask), ffn_mask_applied(model, neuron_mask), \
            tuning_folded(model, tuning):
        tuned_logits = model(**sample["net_input"])[0]
        generator = task.build_generator([model], type("Args", (), {"beam": 5})())
        tuned_hypotheses = [h[0]["tokens"].tolist() for h in task.inference_step(generator, [model], sample)]
    with torch.no_grad():
        shrunk_logits = shrunk(**sample["net_input"])[0]
        # a generator keeps its models
        shrunk_generator = task.build_generator([shrunk], type("Args", (), {"beam": 5})())
        shrunk_hypotheses = [h[0]["tokens"].tolist() for h in task.inference_step(shrunk_generator, [shrunk], sample)]
    assert (tuned_logits - shrunk_logits).abs().max() <= 1e-4
    assert tuned_hypotheses == shrunk_hypotheses
    # the weights came back: the model is the untuned one again
    with torch.no_grad(), head_mask_applied(model, head_mask), ffn_mask_applied(model, neuron_mask):
        masked_logits = model(**sample["net_input"])[0]
    assert (masked_logits - tuned_logits).abs().max() > 1e-3
    set_head_mask(model, None)


def test_search_writes_a_mask_within_the_budget_that_every_command_reads(tiny_model, tmp_path):
    out = tmp_path / "search"
    result = run(["fairseq-headprune", "search", tiny_model["data"], "--path", tiny_model["checkpoint"],
                  "--budget", "30", "--importance-limit", "64", "--out-dir", out, "--no-progress"])
    assert "pruned 18 of 48 heads" in result.stdout
    record = json.loads((out / "search.json").read_text())
    assert record["result"]["cost"] == 30 and record["result"]["rearranged"]
    assert record["result"]["estimated_loss_increase_block"] <= record["result"]["block_loss_before_rearrangement"]
    # the mask file is what every command's --head-mask reads, with the spec the search printed
    from fairseq_headprune.study.masks.head_mask import count_masked, head_mask_to_spec, read_mask_file

    layout = {t: (2, 8) for t in ("enc-enc", "enc-dec", "dec-dec")}
    head_mask = read_mask_file(str(out / "mask.json"), layout)
    assert count_masked(head_mask) == 18 and head_mask_to_spec(head_mask) == record["spec"]


def test_latency_tables_price_a_search_and_are_refused_elsewhere(tiny_model, tmp_path):
    table = tmp_path / "latency.json"
    run(["fairseq-headprune", "latency", tiny_model["data"], "--path", tiny_model["checkpoint"], "--out", table,
         "--repeats", "2", "--sentences", "4", "--sequence-length", "8", "--no-progress"])
    payload = json.loads(table.read_text())
    assert sorted(payload["per_layer_ms"]) == sorted(f"{t}:{layer}" for t in ("enc-enc", "enc-dec", "dec-dec")
                                                     for layer in (1, 2))
    assert all(len(v) == 9 for v in payload["per_layer_ms"].values())
    result = run(["fairseq-headprune", "search", tiny_model["data"], "--path", tiny_model["checkpoint"],
                  "--budget", "50%", "--cost", "latency", "--latency-table", table, "--importance-limit", "32",
                  "--out-dir", tmp_path / "search", "--no-progress"])
    record = json.loads((tmp_path / "search" / "search.json").read_text())
    assert record["result"]["cost"] <= record["full_cost"] / 2 + 1e-9 and "ms" in result.stdout
    # the table written by the command is refused for another device (one line in the CLI: ResultFileError)
    from fairseq_headprune.errors import ResultFileError
    from fairseq_headprune.study.search.costs import read_latency_table

    with pytest.raises(ResultFileError, match="measured on another device"):
        read_latency_table(str(table), payload["architecture"], "cuda: another device")


@pytest.mark.parametrize("args, message", [
    (["--budget", "49"], "more than the unpruned model costs (48 heads)"),
    (["--budget", "24", "--tune-masks", "--tune-subset", "test"], "never on a test split"),
    (["--budget", "24", "--cost", "latency"], "--cost latency needs --latency-table"),
])
def test_bad_search_input_is_one_line(tiny_model, tmp_path, args, message, capsys):
    result = run_in_process(["search", tiny_model["data"], "--path", tiny_model["checkpoint"],
                  "--out-dir", tmp_path / "search", *args], capsys)
    assert result.returncode != 0
    assert len(result.stderr.strip().splitlines()) == 1 and message in result.stderr, result.stderr
    assert not (tmp_path / "search").exists()
