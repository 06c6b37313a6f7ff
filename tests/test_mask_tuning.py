"""Mask tuning by least squares, the search and latency commands, on the tiny model.

The fit is checked against the closed-form least-squares solution on
activations read independently (one head kept at a time through the mask,
the unpruned target from fairseq's own fused path), and the tuned, shrunk
checkpoint against the tuned masked model.
"""

import json

import numpy as np
import pytest
import torch

from conftest import run
from fairseq_headprune.engine.runners.batches import split_batches
from fairseq_headprune.engine.methods.mask_tuning import forward_order, tune_mask, tuning_folded
from fairseq_headprune.modules.masked_multihead_attention import (
    attention_modules, head_layout, head_mask_applied, set_head_mask,
)
from fairseq_headprune.study.masks.head_mask import full_mask, parse_head_mask
from fairseq_headprune.study.methods.mask_tuning import TuningSums, read_tuning, solve_layer, write_tuning

SENTENCES = 48
SPEC = "E:1:2,5,7 A:2:1-6 D:1:3"


def samples_of(task, split="valid", sentences=SENTENCES):
    dataset, batches = split_batches(task, split, max_sentences=16, limit=sentences)
    return [dataset.collater([dataset[i] for i in batch]) for batch in batches]


def layer_outputs(model, module, sample, head_mask):
    """The attention module's output (T x B x d) in a forward pass with ``head_mask`` (None: fairseq's fused path)."""
    captured = {}

    def capture(module, inputs, output):  # returns None: the output stays as it is
        captured["out"] = output[0].detach()

    handle = module.register_forward_hook(capture)
    try:
        with torch.no_grad(), head_mask_applied(model, head_mask):
            model(**sample["net_input"])
    finally:
        handle.remove()
    return captured["out"]


def test_the_fit_equals_the_closed_form_least_squares_solution(tiny_task_and_model):
    task, model = tiny_task_and_model
    layout = head_layout(model)
    head_mask = parse_head_mask(SPEC, layout)
    samples = samples_of(task)
    pad = task.source_dictionary.pad()
    tuning = tune_mask(model, head_mask, samples, pad, progress=False)
    assert list(tuning.layers) == [key for key in forward_order(layout) if (head_mask[key[0]][key[1]] == 0).any()]
    # enc-enc layer 1 comes first: its inputs are the unpruned model's
    key = ("enc-enc", 0)
    module = attention_modules(model)[key]
    heads = layout["enc-enc"][1]
    kept = [h for h in range(heads) if head_mask["enc-enc"][0, h] != 0]
    bias = module.out_proj.bias.detach()
    rows, targets = [], []
    for sample in samples:
        positions = sample["net_input"]["src_tokens"].ne(pad).transpose(0, 1)
        target = layer_outputs(model, module, sample, None) - bias  # fairseq's fused path, every head
        contributions = []
        for head in kept:  # A_h: the layer's output with head h alone kept, minus the bias
            one_hot = full_mask(layout)
            one_hot["enc-enc"][0] = 0.0
            one_hot["enc-enc"][0, head] = 1.0
            contributions.append(layer_outputs(model, module, sample, one_hot) - bias)
        rows.append(torch.stack(contributions, dim=-1)[positions].double())  # N x d x k
        targets.append(target[positions].double())  # N x d
    contributions, target = torch.cat(rows), torch.cat(targets)
    n, dim, k = contributions.shape
    design = np.concatenate([contributions.reshape(n * dim, k).numpy(), np.tile(np.eye(dim), (n, 1))], axis=1)
    solution, *_ = np.linalg.lstsq(design, target.reshape(-1).numpy(), rcond=None)
    fitted = tuning.layers[key]
    assert fitted.fitted
    scales = np.array([fitted.scales[h] for h in kept])
    assert np.abs(scales - solution[:k]).max() <= 1e-4 * np.abs(solution[:k]).max()
    assert np.abs(np.array(fitted.bias) - solution[k:]).max() <= 1e-4 * max(np.abs(solution[k:]).max(), 1e-3)
    assert all(fitted.scales[h] == 0.0 for h in range(heads) if h not in kept)
    # the fit reconstructs the layer better than the binary mask, in every tuned layer
    for values in tuning.layers.values():
        assert values.error_tuned <= values.error_binary + 1e-12


def test_ill_conditioned_or_unbounded_fits_keep_the_binary_mask():
    torch.manual_seed(0)
    contributions = torch.randn(200, 2, 8, dtype=torch.float64)
    contributions[:, 1] = contributions[:, 0]  # two identical heads: singular normal equations
    sums = TuningSums.zeros(2, 8)
    sums.add(contributions, contributions.sum(dim=1))
    singular = solve_layer(sums, [0, 3], heads=4)
    assert not singular.fitted and "condition number" in singular.reason
    assert singular.scales == [1.0, 0.0, 0.0, 1.0] and singular.bias == [0.0] * 8
    sums = TuningSums.zeros(1, 8)
    sums.add(contributions[:, :1], 50.0 * contributions[:, 0])  # needs a scale of 50
    assert "exceeds the bound" in solve_layer(sums, [2], heads=4, scale_bound=10.0).reason
    assert solve_layer(sums, [2], heads=4, scale_bound=100.0).scales[2] == pytest.approx(50.0)


def test_a_tuned_shrunk_checkpoint_computes_the_tuned_masked_model(tiny_model, tiny_task_and_model, tmp_path):
    task, model = tiny_task_and_model
    layout = head_layout(model)
    head_mask = parse_head_mask(SPEC, layout)
    tuning = tune_mask(model, head_mask, samples_of(task, "train", 32), task.source_dictionary.pad(), progress=False)
    write_tuning(tuning, str(tmp_path / "tuning.json"))
    assert read_tuning(str(tmp_path / "tuning.json"), layout).fingerprint() == tuning.fingerprint()
    result = run(["fairseq-headprune", "shrink", "--path", tiny_model["checkpoint"], "--tuning",
                  tmp_path / "tuning.json", "--out", tmp_path / "tuned.pt"])
    assert "removed\t10 of 48 heads" in result.stdout
    from fairseq_headprune.engine.checkpoints.loading import load_generation_model

    _, _, shrunk = load_generation_model(str(tiny_model["data"]), str(tmp_path / "tuned.pt"), cpu=True)
    sample = samples_of(task, "valid", 32)[0]
    with torch.no_grad(), head_mask_applied(model, head_mask), tuning_folded(model, tuning):
        tuned_logits = model(**sample["net_input"])[0]
        generator = task.build_generator([model], type("Args", (), {"beam": 5})())
        tuned_hypotheses = [h[0]["tokens"].tolist() for h in task.inference_step(generator, [model], sample)]
    with torch.no_grad():
        shrunk_logits = shrunk(**sample["net_input"])[0]
        shrunk_generator = task.build_generator([shrunk], type("Args", (), {"beam": 5})())  # a generator keeps its models
        shrunk_hypotheses = [h[0]["tokens"].tolist() for h in task.inference_step(shrunk_generator, [shrunk], sample)]
    assert (tuned_logits - shrunk_logits).abs().max() <= 1e-4
    assert tuned_hypotheses == shrunk_hypotheses
    # the weights came back: the model is the untuned one again
    with torch.no_grad(), head_mask_applied(model, head_mask):
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
    assert sorted(payload["per_layer_ms"]) == sorted(f"{t}:{l}" for t in ("enc-enc", "enc-dec", "dec-dec") for l in (1, 2))
    assert all(len(v) == 9 for v in payload["per_layer_ms"].values())
    result = run(["fairseq-headprune", "search", tiny_model["data"], "--path", tiny_model["checkpoint"],
                  "--budget", "50%", "--cost", "latency", "--latency-table", table, "--importance-limit", "32",
                  "--out-dir", tmp_path / "search", "--no-progress"])
    record = json.loads((tmp_path / "search" / "search.json").read_text())
    assert record["result"]["cost"] <= record["full_cost"] / 2 + 1e-9 and "ms" in result.stdout
    # the table written by the command is refused for another device (one line in the CLI: ResultFileError)
    from fairseq_headprune.errors import ResultFileError
    from fairseq_headprune.study.methods.mask_search import read_latency_table

    with pytest.raises(ResultFileError, match="measured on another device"):
        read_latency_table(str(table), payload["architecture"], "cuda: another device")


@pytest.mark.parametrize("args, message", [
    (["--budget", "49"], "more than the unpruned model costs (48 heads)"),
    (["--budget", "24", "--tune-masks", "--tune-subset", "test"], "never on a test split"),
    (["--budget", "24", "--cost", "latency"], "--cost latency needs --latency-table"),
])
def test_bad_search_input_is_one_line(tiny_model, tmp_path, args, message):
    result = run(["fairseq-headprune", "search", tiny_model["data"], "--path", tiny_model["checkpoint"],
                  "--out-dir", tmp_path / "search", *args], check=False)
    assert result.returncode != 0
    assert len(result.stderr.strip().splitlines()) == 1 and message in result.stderr, result.stderr
    assert not (tmp_path / "search").exists()
