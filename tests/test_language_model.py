"""Head masks on decoder-only fairseq language models (``transformer_lm``).

In process, on models fairseq builds from its registered ``transformer_lm``
architectures at small dimensions: the identities against stock fairseq,
zeroed output-projection columns and one sentence at a time with autograd.
Through the commands, on a tiny LM trained by ``fairseq-train --task
language_modeling``: masked ``fairseq-eval-lm`` against stock
``fairseq-eval-lm`` on a checkpoint with those columns zeroed.
"""

import argparse
import contextlib
import copy
import dataclasses
import re

import numpy as np
import pytest
import torch

from fairseq_headprune.errors import HeadMaskError
from fairseq_headprune.modules.masked_multihead_attention import (
    MaskedMultiheadAttention,
    attention_modules,
    head_layout,
    install_masked_attention,
    set_head_mask,
)
from fairseq_headprune.study.masks.head_mask import full_mask, parse_head_mask

from conftest import (
    REPO,
    USER_DIR,
    built_once,
    headprune_launcher,
    run,
    run_in_process,
    save_zeroed_checkpoint,
    shared_root,
    zeroed_copy,
)

LAYERS, HEADS = 2, 4
LM_OPTIONS = ["--arch", "transformer_lm", "--decoder-layers", str(LAYERS), "--decoder-embed-dim", "32",
              "--decoder-ffn-embed-dim", "64", "--decoder-attention-heads", str(HEADS),
              "--tokens-per-sample", "64", "--sample-break-mode", "eos"]


def build_lm(arch="transformer_lm", seed=1):
    from fairseq.data import Dictionary
    from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY
    from fairseq.models.transformer_lm import TransformerLanguageModelConfig

    dictionary = Dictionary()
    for index in range(40):
        dictionary.add_symbol(f"w{index}")
    task = argparse.Namespace(source_dictionary=dictionary, target_dictionary=dictionary)
    # the model config's defaults, with the values it takes from the task and common settings
    defaults = TransformerLanguageModelConfig()
    args = argparse.Namespace(**{f.name: getattr(defaults, f.name) for f in dataclasses.fields(defaults)})
    args.__dict__.update(arch=arch, decoder_layers=LAYERS, decoder_embed_dim=32, decoder_ffn_embed_dim=64,
                         decoder_attention_heads=HEADS, tokens_per_sample=64, max_target_positions=64,
                         add_bos_token=False, tpu=False)
    ARCH_CONFIG_REGISTRY[arch](args)
    torch.manual_seed(seed)
    return ARCH_MODEL_REGISTRY[arch].build_model(args, task).eval(), dictionary


def token_rows(dictionary, lengths=(10, 7, 10), seed=2):
    generator = torch.Generator().manual_seed(seed)
    rows = torch.full((len(lengths), max(lengths)), dictionary.pad())
    for row, length in enumerate(lengths):
        rows[row, :length] = torch.randint(dictionary.nspecial, len(dictionary), (length,), generator=generator)
    return rows


def next_token_logits(model, tokens):
    return model(tokens)[0]


@pytest.fixture(scope="module")
def lm():
    plain, dictionary = build_lm()
    masked = copy.deepcopy(plain)
    install_masked_attention(masked)
    return plain, masked, dictionary


def test_every_self_attention_layer_is_dec_dec(lm):
    _, masked, _ = lm
    assert sorted(attention_modules(masked)) == [("dec-dec", layer) for layer in range(LAYERS)]
    assert all(isinstance(m, MaskedMultiheadAttention) for m in attention_modules(masked).values())
    assert head_layout(masked) == {"dec-dec": (LAYERS, HEADS)}


def test_unmasked_all_ones_and_zeroed_columns(lm):
    plain, masked, dictionary = lm
    tokens = token_rows(dictionary)
    with torch.no_grad():
        reference = next_token_logits(plain, tokens)
        set_head_mask(masked, None)
        assert (next_token_logits(masked, tokens) - reference).abs().max() <= 1e-5
        set_head_mask(masked, full_mask(head_layout(masked)))
        assert (next_token_logits(masked, tokens) - reference).abs().max() <= 1e-5
        for spec in ("D:1:2", "D:2:*", "D:*:keep=3"):
            head_mask = parse_head_mask(spec, head_layout(masked))
            zeroed = zeroed_copy(plain, head_mask)
            set_head_mask(masked, head_mask)
            result = next_token_logits(masked, tokens)
            assert (result - next_token_logits(zeroed, tokens)).abs().max() <= 1e-5, spec
            assert (result - reference).abs().max() > 1e-4, spec
    set_head_mask(masked, None)


def test_per_sentence_masks_and_gradients(lm):
    _, masked, dictionary = lm
    lengths = (10, 7, 10)
    tokens = token_rows(dictionary, lengths)
    xi = (torch.rand(LAYERS, len(lengths), HEADS, generator=torch.Generator().manual_seed(3)) > 0.3).float()
    xi[1, 0] = 0.0  # a whole layer masked for one sentence

    def loss_of(logits, rows, length):
        # next-token loss on the sentence's own positions
        return torch.nn.functional.cross_entropy(
            logits[:, : length - 1].reshape(-1, logits.size(-1)), rows[:, 1:length].reshape(-1), reduction="sum"
        )

    batched_xi = xi.clone().requires_grad_()
    set_head_mask(masked, {"dec-dec": batched_xi})
    try:
        logits = next_token_logits(masked, tokens)
        sum(loss_of(logits[r:r + 1], tokens[r:r + 1], n) for r, n in enumerate(lengths)).backward()
        for row, length in enumerate(lengths):
            alone_xi = xi[:, row].clone().requires_grad_()
            set_head_mask(masked, {"dec-dec": alone_xi})
            alone = next_token_logits(masked, tokens[row:row + 1, :length])
            loss_of(alone, tokens[row:row + 1], length).backward()
            assert (logits[row, :length] - alone[0]).abs().max() <= 1e-5
            torch.testing.assert_close(batched_xi.grad[:, row], alone_xi.grad, rtol=1e-4, atol=1e-6)
    finally:
        set_head_mask(masked, None)


@pytest.mark.parametrize("spec, message", [("E:1:1", "no enc-enc attention"), ("A:*:*", "no enc-dec attention")])
def test_encoder_specs_on_a_decoder_only_model_are_refused(lm, spec, message):
    with pytest.raises(HeadMaskError, match=message):
        parse_head_mask(spec, head_layout(lm[1]))


LM_ENV = {"SCALE": "0.25", "LAYERS": str(LAYERS), "EMBED_DIM": "32", "FFN_DIM": "64", "HEADS": str(HEADS),
          "EPOCHS": "2", "LR": "0.003", "WARMUP": "100"}


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory):
    """A 2-layer transformer_lm trained by fairseq-train --task language_modeling on the demo corpus's French side,
    with the project's scripts (prepare_lm_data.sh, train_lm.sh)."""
    # one model for the session: test_compress imports this module-scoped fixture too
    root = shared_root(tmp_path_factory, "lm")
    data = {"data": root / "bin", "checkpoint": root / "checkpoints" / "checkpoint_best.pt", "root": root}
    with built_once(root):
        if not data["checkpoint"].exists():
            run(["bash", REPO / "scripts" / "data" / "prepare_lm_data.sh", root], env=LM_ENV)
            run(["bash", REPO / "scripts" / "train" / "train_lm.sh", root / "bin", root / "checkpoints"], env=LM_ENV)
    return data


def eval_lm(command, tiny_lm, checkpoint, *extra):
    result = run([*command, tiny_lm["data"], "--path", checkpoint, "--gen-subset", "test",
                  "--sample-break-mode", "eos", "--max-tokens", "2048", *extra])
    found = re.search(r"Loss \(base 2\): ([\d.]+), Perplexity: ([\d.]+)", result.stdout + result.stderr)
    assert found, (result.stdout + result.stderr)[-2000:]
    return float(found.group(1)), float(found.group(2))


def test_masked_eval_lm_equals_stock_with_zeroed_columns(tiny_lm, tmp_path):
    spec = "D:1:2-3 D:2:1"
    mask = parse_head_mask(spec, {"dec-dec": (LAYERS, HEADS)})["dec-dec"]
    save_zeroed_checkpoint(tiny_lm["checkpoint"], "decoder.layers.{}.self_attn.", HEADS, mask, tmp_path / "zeroed.pt")
    stock = ["fairseq-eval-lm", "--user-dir", USER_DIR, "--task", "language_modeling"]
    unmasked = eval_lm(stock, tiny_lm, tiny_lm["checkpoint"])
    reference = eval_lm(stock, tiny_lm, tmp_path / "zeroed.pt")
    assert reference != unmasked
    ours = ["fairseq-eval-lm", "--user-dir", USER_DIR, "--task", "headprune_language_modeling"]
    assert eval_lm(ours, tiny_lm, tiny_lm["checkpoint"], "--head-mask", spec) == reference
    # the heads removed for real: a smaller checkpoint that evaluates as the masked model
    # (through the wrapper, which picks the task from the checkpoint)
    shrunk = tmp_path / "shrunk.pt"
    run(["fairseq-headprune", "shrink", "--path", tiny_lm["checkpoint"], "--head-mask", spec, "--out", shrunk])
    assert torch.load(shrunk, map_location="cpu")["model"]["decoder.layers.0.self_attn.q_proj.weight"].size(0) == 16
    assert eval_lm(["fairseq-headprune", "eval-lm"], tiny_lm, shrunk) == reference
    # fairseq-validate too (through the wrapper): the loss stock fairseq-validate reports with the columns zeroed
    validated = [validation(command, tiny_lm, checkpoint, *extra) for command, checkpoint, extra in (
        (["fairseq-validate", "--user-dir", USER_DIR, "--task", "language_modeling"], tmp_path / "zeroed.pt", ()),
        (["fairseq-headprune", "validate"], tiny_lm["checkpoint"], ("--head-mask", spec)),
    )]
    assert validated[0] == validated[1]


def test_ffn_neurons_masked_and_removed_equal_stock_eval_lm_with_zeroed_fc2_columns(tiny_lm, tmp_path):
    """--ffn-mask through fairseq-eval-lm, and the same neurons removed by shrink (a transformer_lm's config is a
    dataclass that drops unknown keys when fairseq builds it: the record of removed neurons must survive)."""
    state = torch.load(tiny_lm["checkpoint"], map_location="cpu")
    width = state["model"]["decoder.layers.0.fc1.weight"].size(0)
    spec = f"D:1:1-{width // 2} D:2:keep=1-8"
    for layer, keep in ((0, range(width // 2, width)), (1, range(8))):
        masked = torch.ones(width, dtype=torch.bool)
        masked[list(keep)] = False
        state["model"][f"decoder.layers.{layer}.fc2.weight"][:, masked] = 0.0
    torch.save(state, tmp_path / "zeroed.pt")
    stock = ["fairseq-eval-lm", "--user-dir", USER_DIR, "--task", "language_modeling"]
    reference = eval_lm(stock, tiny_lm, tmp_path / "zeroed.pt")
    assert reference != eval_lm(stock, tiny_lm, tiny_lm["checkpoint"])
    ours = ["fairseq-eval-lm", "--user-dir", USER_DIR, "--task", "headprune_language_modeling"]
    assert eval_lm(ours, tiny_lm, tiny_lm["checkpoint"], "--ffn-mask", spec) == reference
    shrunk = tmp_path / "shrunk.pt"
    run(["fairseq-headprune", "shrink", "--path", tiny_lm["checkpoint"], "--ffn-mask", spec, "--out", shrunk])
    weights = torch.load(shrunk, map_location="cpu")["model"]
    assert [weights[f"decoder.layers.{layer}.fc1.weight"].size(0) for layer in (0, 1)] == [width - width // 2, 8]
    loss, perplexity = eval_lm(["fairseq-headprune", "eval-lm"], tiny_lm, shrunk)
    assert abs(loss - reference[0]) <= 1e-3 and abs(perplexity - reference[1]) <= 1e-2 * reference[1]


def validation(command, tiny_lm, checkpoint, *extra):
    """(loss, ppl) that fairseq-validate prints for the test split."""
    result = run([*command, tiny_lm["data"], "--path", checkpoint, "--valid-subset", "test", "--max-tokens", "2048",
                  *extra])
    found = re.search(r"valid on 'test' subset \| loss ([\d.]+) \| ppl ([\d.]+)", result.stdout + result.stderr)
    assert found, (result.stdout + result.stderr)[-2000:]
    return found.groups()


@pytest.mark.skipif(hasattr(np, "compat"), reason="numpy 1 has np.compat: fairseq needs no fix")
def test_stock_fairseq_needs_the_numpy_fix(tiny_lm, tmp_path):
    """Without the plugin, fairseq's LM data stops at np.compat.long under numpy 2 (tiny_lm trained with it)."""
    result = run(["fairseq-train", tiny_lm["data"], "--task", "language_modeling", *LM_OPTIONS, "--optimizer", "adam",
                  "--lr", "0.003", "--max-tokens", "2048", "--max-update", "1", "--save-dir", tmp_path,
                  "--num-workers", "0", "--no-save"], check=False)
    assert result.returncode != 0 and "np.compat.long" in result.stderr


def test_importance_of_a_language_model_equals_explicit_autograd(tiny_lm, tmp_path):
    """I_h = mean over sentences of |dL(x)/dxi_h|, L(x) the sentence's summed next-token loss, one at a time
    in the reference; estimated by 2 torchrun ranks (gloo), each on every other batch."""
    import json

    import torch.nn.functional as F
    from fairseq import checkpoint_utils

    result = run([*headprune_launcher(2), "importance", tiny_lm["data"], "--path", tiny_lm["checkpoint"],
                  "--subset", "valid", "--limit", "100", "--batch-size", "16", "--out-dir", tmp_path, "--no-progress"],
                 env={"OMP_NUM_THREADS": "1"})
    assert "estimated on 100 sentences" in result.stdout
    stored = json.loads((tmp_path / "importance.json").read_text())
    computed = torch.tensor(stored["importance"]["dec-dec"], dtype=torch.float64)
    # the reference: stock language_modeling task (with the numpy 2 fix), one sentence at a time, explicit xi
    import fairseq_headprune.registry

    fairseq_headprune.registry.register_components()
    models, _, task = checkpoint_utils.load_model_ensemble_and_task(
        [str(tiny_lm["checkpoint"])], arg_overrides={"data": str(tiny_lm["data"])})
    model = models[0].eval()
    install_masked_attention(model)
    task.load_dataset("valid")
    dataset = task.dataset("valid")
    total = torch.zeros(LAYERS, HEADS, dtype=torch.float64)
    for index in range(100):
        sample = dataset.collater([dataset[index]])
        xi = torch.ones(LAYERS, HEADS, requires_grad=True)
        set_head_mask(model, {"dec-dec": xi})
        logits = model(**sample["net_input"])[0]
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), sample["target"].view(-1),
                               ignore_index=task.target_dictionary.pad(), reduction="sum")
        (gradient,) = torch.autograd.grad(loss, xi)
        total += gradient.abs().double()
    set_head_mask(model, None)
    reference = total / 100
    assert stored["count"] == 100
    assert torch.allclose(computed, reference, rtol=1e-4, atol=1e-7), (computed - reference).abs().max()


@pytest.fixture(scope="module")
def lm_study(tiny_lm, tmp_path_factory):
    """Every study of the tiny LM in one study directory, as run_lm_demo.sh lays them out."""
    data, checkpoint = tiny_lm["data"], tiny_lm["checkpoint"]
    study = tmp_path_factory.mktemp("lm_study")
    common = ["--gen-subset", "test", "--samples", "200", "--sample-break-mode", "eos", "--max-tokens", "2048",
              "--no-progress"]
    consoles = {
        "single": run(["fairseq-headprune", "ablate", data, "--path", checkpoint, "--out-dir", study / "ablation",
                       "--mode", "cross-domain", "--cross-subset", "valid", *common]).stdout,
        "all-but-one": run(["fairseq-headprune", "ablate", data, "--path", checkpoint, "--out-dir",
                            study / "ablation", "--mode", "all-but-one", *common]).stdout,
        "prune": run(["fairseq-headprune", "prune", data, "--path", checkpoint, "--out-dir", study / "pruning",
                      "--orders", "importance,random", "--draws", "2", "--importance-limit", "100", *common]).stdout,
        "dynamics": run(["fairseq-headprune", "dynamics", data, "--checkpoints", tiny_lm["root"] / "checkpoints",
                         "--out-dir", study / "dynamics", "--importance-limit", "100", "--max-percent", "50",
                         *common]).stdout,
        "speed": run(["python", REPO / "scripts" / "benchmarks" / "benchmark_lm_speed.py", "--data", data,
                      "--path", checkpoint, "--batch-sizes", "3", "--sentences", "6", "--repeats", "1",
                      "--generate", "6", "--sampling-topk", "5", "--json", study / "shrink" / "lm_speed.json"]).stdout,
    }
    return {"dir": study, "console": consoles}


def test_ablate_perplexity_equals_stock_eval_lm_with_zeroed_columns(tiny_lm, lm_study, tmp_path):
    """ablate's perplexity and loss per token for a masked head against stock fairseq-eval-lm with its columns
    zeroed."""
    import json

    checkpoint, out = tiny_lm["checkpoint"], lm_study["dir"] / "ablation"
    console = lm_study["console"]["single"]
    assert "baseline perplexity" in console and "largest rise" in console
    table = json.loads((out / "single.json").read_text())
    assert list(table["rows"][0])[:8] == ["config", "attention_type", "layer", "head", "spec", "ppl", "delta", "loss"]
    assert len(table["rows"]) == LAYERS * HEADS and table["settings"]["family"] == "language_model"
    stock = ["fairseq-eval-lm", "--user-dir", USER_DIR, "--task", "language_modeling"]
    loss, ppl = eval_lm(stock, tiny_lm, checkpoint)  # printed to 4 and 2 decimals
    assert abs(table["settings"]["baseline_ppl"] - ppl) <= 0.0051
    for spec in ("D:1:2", "D:2:4"):
        row = next(r for r in table["rows"] if r["spec"] == spec)
        mask = parse_head_mask(spec, {"dec-dec": (LAYERS, HEADS)})["dec-dec"]
        zeroed = save_zeroed_checkpoint(checkpoint, "decoder.layers.{}.self_attn.", HEADS, mask, tmp_path / "z.pt")
        zeroed_loss, zeroed_ppl = eval_lm(stock, tiny_lm, zeroed)
        assert abs(row["loss"] - zeroed_loss) <= 0.00006 and abs(row["ppl"] - zeroed_ppl) <= 0.0051, (row, zeroed_loss)
        assert row["delta"] == pytest.approx(row["ppl"] - table["settings"]["baseline_ppl"])
    cross = json.loads((out / "cross_domain.json").read_text())
    assert len(cross["rows"]) == LAYERS * HEADS and "cross_baseline_ppl" in cross["settings"]
    # all-but-one: the best kept head of a layer has the lowest perplexity
    rows = json.loads((out / "all_but_one.json").read_text())["rows"]
    for entry in json.loads((out / "all_but_one_best.json").read_text())["rows"]:
        assert entry["ppl"] == min(r["ppl"] for r in rows if r["layer"] == entry["layer"])


@pytest.mark.parametrize("bad, message", [
    ("translation data", "cannot load {checkpoint} with the data in {data}: "),
    ("--heads E:1:1", "--heads: the model has no enc-enc attention (term 'E:1:1')"),
])
def test_ablate_refuses_translation_data_and_encoder_heads_for_a_language_model(tiny_lm, tiny_model, tmp_path, bad,
                                                                                 message, capsys):
    data = tiny_model["data"] if bad == "translation data" else tiny_lm["data"]
    extra = bad.split() if bad.startswith("--") else []
    result = run_in_process(["ablate", data, "--path", tiny_lm["checkpoint"], "--out-dir", tmp_path, *extra], capsys)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    expected = "fairseq-headprune ablate: error: " + message.format(checkpoint=tiny_lm["checkpoint"], data=data)
    assert len(lines) == 1 and lines[0].startswith(expected), lines


def test_prune_a_language_model_by_importance_and_at_random(tiny_lm, lm_study, tmp_path):
    """Step 0 is the baseline; the importance order prunes the least important head first; a step's
    perplexity equals stock fairseq-eval-lm with that step's heads zeroed."""
    import json

    from fairseq_headprune.study.importance.scores import normalize_per_layer, read_importance_file

    checkpoint, out = tiny_lm["checkpoint"], lm_study["dir"] / "pruning"
    assert lm_study["console"]["prune"].startswith("unpruned perplexity ")
    table = json.loads((out / "prune_steps.all.json").read_text())
    rows = table["rows"]
    assert {"spec", "ppl", "delta", "loss"} <= set(rows[0])
    first = [r for r in rows if r["step"] == 0]
    assert all(r["delta"] == 0 and r["p_value"] == 1 for r in first)  # nothing pruned: the baseline itself
    (importance_file,) = (out / "importance").glob("*.json")
    scores = normalize_per_layer(read_importance_file(str(importance_file)).importance)["dec-dec"]
    layer, head = divmod(int(scores.argmin()), HEADS)
    step = next(r for r in rows if r["order"] == "importance" and r["step"] == 1)
    assert step["spec"] == f"D:{layer + 1}:{head + 1}"
    step = next(r for r in rows if r["order"] == "importance" and r["step"] == 3)
    mask = parse_head_mask(step["spec"], {"dec-dec": (LAYERS, HEADS)})["dec-dec"]
    zeroed = save_zeroed_checkpoint(checkpoint, "decoder.layers.{}.self_attn.", HEADS, mask, tmp_path / "z.pt")
    zeroed_loss, zeroed_ppl = eval_lm(["fairseq-eval-lm", "--user-dir", USER_DIR, "--task", "language_modeling"],
                                      tiny_lm, zeroed)
    assert abs(step["loss"] - zeroed_loss) <= 0.00006 and abs(step["ppl"] - zeroed_ppl) <= 0.0051
    curves = json.loads((out / "prune_curves.all.json").read_text())["rows"]
    assert {(r["order"], r["draws"]) for r in curves} == {("importance", 1), ("random", 2)}
    assert all("ppl_std" in r for r in curves) and "unpruned perplexity" in (out / "prune_curves.md").read_text()


def test_dynamics_and_report_of_a_language_model(lm_study):
    """Each epoch's level 0 is its unpruned perplexity; the report reads perplexity everywhere, with no findings."""
    import json

    study = lm_study["dir"]
    assert "perplexity as % of each epoch's unpruned perplexity" in lm_study["console"]["dynamics"]
    rows = json.loads((study / "dynamics" / "dynamics.json").read_text())["rows"]
    assert sorted({r["epoch"] for r in rows}) == [1, 2]
    assert all(r["relative"] == 1.0 for r in rows if r["level"] == 0)
    run(["fairseq-headprune", "report", study])
    report = (study / "report.md").read_text()
    single = json.loads((study / "ablation" / "single.json").read_text())["settings"]
    assert f"Baseline {single['baseline_ppl']:.2f}; " in report and "the largest rise is" in report
    assert "## Removing heads for real" in report and "| scoring | 3 |" in report
    assert "| generating (sampling from the top 5) | 3 |" in report
    assert "BLEU" not in report and "## What reproduces" not in report


def test_speed_benchmark_scores_and_generates_the_same_with_heads_masked_or_removed(lm_study):
    """scripts/benchmarks/benchmark_lm_speed.py: the shrunk LM's summed loss and sampled continuations (same seed)
    equal the masked one's."""
    import json

    measurements = json.loads((lm_study["dir"] / "shrink" / "lm_speed.json").read_text())["measurements"]
    assert [m["mode"] for m in measurements] == ["scoring", "generating (sampling from the top 5)"]
    assert all(m["same_output_as_masked"] and m["removed_heads"] == LAYERS * HEADS // 2 for m in measurements)
    assert measurements[1]["tokens"] == 6 * (6 + 1)  # each continuation and its EOS
    assert measurements[0]["parameters"]["shrunk"] < measurements[0]["parameters"]["unpruned"]
    for measurement in measurements:  # every model timed in a process of its own
        processes = measurement["processes"]
        assert sorted(processes) == ["masked", "masked (fairseq)", "shrunk", "shrunk (fairseq)", "unpruned"]
        assert len(set(processes.values())) == 5


def test_ablate_with_a_context_window_equals_stock_eval_lm(tiny_lm, tmp_path):
    """fairseq-eval-lm's --context-window passes through: a masked head's perplexity as stock eval-lm's, zeroed."""
    import json

    window = ["--context-window", "16", "--tokens-per-sample", "64"]
    run(["fairseq-headprune", "ablate", tiny_lm["data"], "--path", tiny_lm["checkpoint"], "--gen-subset", "test",
         "--out-dir", tmp_path / "ablate", "--heads", "D:1:1-2", "--samples", "100", "--no-progress", *window])
    table = json.loads((tmp_path / "ablate" / "single.json").read_text())
    mask = parse_head_mask("D:1:1", {"dec-dec": (LAYERS, HEADS)})["dec-dec"]
    zeroed = save_zeroed_checkpoint(tiny_lm["checkpoint"], "decoder.layers.{}.self_attn.", HEADS, mask,
                                    tmp_path / "z.pt")
    stock = ["fairseq-eval-lm", "--user-dir", USER_DIR, "--task", "language_modeling"]
    result = run([*stock, tiny_lm["data"], "--path", zeroed, "--gen-subset", "test", *window])
    zeroed_ppl = float(re.search(r"Perplexity: ([\d.]+)", result.stdout + result.stderr).group(1))
    row = next(r for r in table["rows"] if r["spec"] == "D:1:1")
    assert abs(row["ppl"] - zeroed_ppl) <= 0.0051 and len(table["rows"]) == 2


def test_mask_tuning_on_a_decoder_only_model_lowers_the_held_aside_loss(tiny_lm):
    """Heads and neurons tuned on a transformer_lm (no encoder): the tuned model's held-aside loss, read with
    fairseq's own cross-entropy criterion, is what the guard recorded and no more than the binary mask's."""
    from fairseq.criterions.cross_entropy import CrossEntropyCriterion

    from fairseq_headprune.engine.families import family_named
    from fairseq_headprune.engine.search.mask_tuning import tune_mask, tuning_folded, tuning_samples
    from fairseq_headprune.engine.search.tuning_guard import split_held_aside
    from fairseq_headprune.modules.masked_ffn import ffn_layout, ffn_mask_applied
    from fairseq_headprune.modules.masked_multihead_attention import head_layout, head_mask_applied
    from fairseq_headprune.study.masks.ffn_mask import parse_ffn_mask
    from fairseq_headprune.study.masks.head_mask import parse_head_mask
    from fairseq_headprune.study.search.settings import TuningSettings

    _, task, model = family_named("language_model").load(str(tiny_lm["data"]), str(tiny_lm["checkpoint"]), cpu=True)
    samples = tuning_samples(task, model, TuningSettings(subsets=["valid"], limit=64))
    head_mask = parse_head_mask("D:1:1-2", head_layout(model))
    neuron_mask = parse_ffn_mask("D:2:1-16", ffn_layout(model))
    tuning = tune_mask(model, head_mask, samples, task.source_dictionary.pad(), progress=False, ffn_mask=neuron_mask)
    assert [key for key in tuning.layers] == [("dec-dec", 0), ("dec-ffn", 0), ("dec-dec", 1), ("dec-ffn", 1)]
    _, held = split_held_aside(samples, 0.2)
    criterion = CrossEntropyCriterion(task, sentence_avg=False)

    def held_loss(tuned):
        total = tokens = 0.0
        with torch.no_grad(), head_mask_applied(model, head_mask), ffn_mask_applied(model, neuron_mask), \
                (tuning_folded(model, tuning) if tuned else contextlib.nullcontext()):
            for sample in held:
                loss, sample_size, _ = criterion(model, sample)
                total, tokens = total + float(loss), tokens + float(sample_size)
        return total / tokens

    assert held_loss(True) == pytest.approx(tuning.settings["held_aside_loss"], rel=1e-5)
    assert held_loss(True) <= held_loss(False)
