"""``--head-mask`` on an encoder-only classifier through fairseq's own commands.

A tiny RoBERTa-architecture classifier is trained by stock ``fairseq-train
--task sentence_prediction`` on the acceptability corpus
(``scripts/data/prepare_acceptability_data.sh``, ``scripts/train/train_classifier.sh``).
The reference for a masked validation is stock ``fairseq-validate`` on a
copy of the checkpoint with those heads' output-projection columns zeroed.
"""

import re

import pytest
import torch

from conftest import (
    REPO,
    USER_DIR,
    built_once,
    headprune_launcher,
    run,
    run_in_process,
    save_zeroed_checkpoint,
    shared_root,
)

CLASSIFIER_ENV = {"SCALE": "0.25", "LAYERS": "2", "EMBED_DIM": "64", "FFN_DIM": "128", "HEADS": "4",
                  "EPOCHS": "2", "LR": "0.001"}
# every example scored: fairseq otherwise leaves out the last (examples mod 8)
BATCHING = ["--batch-size", "16", "--required-batch-size-multiple", "1"]
SPEC = "E:1:2-4 E:2:1,3"  # 5 of the 8 heads


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    root = shared_root(tmp_path_factory, "classifier")
    checkpoint = root / "checkpoints" / "checkpoint_best.pt"
    with built_once(root):
        if not checkpoint.exists():
            run(["bash", REPO / "scripts" / "data" / "prepare_acceptability_data.sh", root], env=CLASSIFIER_ENV)
            run(["bash", REPO / "scripts" / "train" / "train_classifier.sh", root / "bin", root / "checkpoints"],
                env=CLASSIFIER_ENV)
    return {"data": root / "bin", "checkpoint": checkpoint, "root": root}


def validation(command, checkpoint, data, *extra):
    """(loss, accuracy, examples) that a fairseq-validate run prints for the test split."""
    result = run([*command, str(data), "--path", str(checkpoint), "--valid-subset", "test", *BATCHING, *extra])
    log = result.stdout + result.stderr
    found = re.search(r"valid on 'test' subset \| loss ([\d.]+) .*\| accuracy ([\d.]+) .*\| bsz (\d+)", log)
    assert found, log[-2000:]
    return float(found.group(1)), float(found.group(2)), int(found.group(3))


def stock_validate(checkpoint, data):
    # --user-dir only for the torch.load allow-list; the task and criterion are fairseq's own
    return validation(["fairseq-validate", "--user-dir", USER_DIR, "--task", "sentence_prediction",
                       "--criterion", "sentence_prediction"], checkpoint, data)


def zeroed_checkpoint(checkpoint, spec, path):
    """The checkpoint with the heads of ``spec`` zeroed in every layer's out_proj."""
    import fairseq_headprune.compat.torch_load  # noqa: F401  (allow-list)
    from fairseq_headprune.study.masks.head_mask import parse_head_mask

    state = torch.load(checkpoint, map_location="cpu")
    heads = state["cfg"]["model"].encoder_attention_heads  # RoBERTa's model config is an argparse Namespace
    layers = 1 + max(int(k.split(".")[3]) for k in state["model"] if k.startswith("encoder.sentence_encoder.layers."))
    mask = parse_head_mask(spec, {"enc-enc": (layers, heads)})["enc-enc"]
    return save_zeroed_checkpoint(checkpoint, "encoder.sentence_encoder.layers.{}.self_attn.", heads, mask, path)


def test_masked_validation_equals_stock_fairseq_with_zeroed_columns(classifier, tmp_path):
    data, checkpoint = classifier["data"], classifier["checkpoint"]
    unmasked = stock_validate(checkpoint, data)
    reference = stock_validate(zeroed_checkpoint(checkpoint, SPEC, tmp_path / "zeroed.pt"), data)
    assert unmasked[2] == reference[2] == len((classifier["root"] / "raw" / "test.label").read_text().splitlines())
    assert reference[0] != unmasked[0]  # the zeroed heads matter to the loss
    ours = ["fairseq-validate", "--user-dir", USER_DIR, "--task", "headprune_sentence_prediction",
            "--criterion", "sentence_prediction"]
    assert validation(ours, checkpoint, data, "--head-mask", SPEC) == reference
    # the wrapper picks the task (and the criterion) from the checkpoint
    assert validation(["fairseq-headprune", "validate"], checkpoint, data, "--head-mask", SPEC) == reference
    # the heads removed for real: a smaller checkpoint that validates as the masked model
    shrunk = tmp_path / "shrunk.pt"
    run(["fairseq-headprune", "shrink", "--path", str(checkpoint), "--head-mask", SPEC, "--out", str(shrunk)])
    state = torch.load(shrunk, map_location="cpu")["model"]
    assert state["encoder.sentence_encoder.layers.0.self_attn.q_proj.weight"].size(0) == 16  # 1 of 4 heads kept
    assert validation(["fairseq-headprune", "validate"], shrunk, data) == reference


def test_fine_tuning_keeps_masked_heads_pruned(classifier, tmp_path):
    import fairseq_headprune.compat.torch_load  # noqa: F401  (allow-list)

    data, checkpoint = classifier["data"], classifier["checkpoint"]
    result = run(
        ["fairseq-headprune", "train", str(data), "--task", "headprune_sentence_prediction",
         "--criterion", "sentence_prediction", "--restore-file", str(checkpoint), "--reset-optimizer",
         "--reset-dataloader", "--reset-meters", "--arch", "roberta_base", "--num-classes", "2",
         "--init-token", "0", "--separator-token", "2", "--max-positions", "128",
         "--encoder-layers", "2", "--encoder-embed-dim", CLASSIFIER_ENV["EMBED_DIM"],
         "--encoder-ffn-embed-dim", CLASSIFIER_ENV["FFN_DIM"], "--encoder-attention-heads", CLASSIFIER_ENV["HEADS"],
         "--head-mask", "E:1:2", "--optimizer", "adam", "--lr", "0.01",
         "--weight-decay", "0.1", "--batch-size", "16", "--max-update", "4", "--save-dir", str(tmp_path),
         "--num-workers", "0", "--no-epoch-checkpoints", "--log-format", "simple"]
    )
    assert "masking 1 heads: E:1:2" in result.stdout + result.stderr
    before = torch.load(checkpoint, map_location="cpu")["model"]
    after = torch.load(tmp_path / "checkpoint_last.pt", map_location="cpu")["model"]
    prefix = "encoder.sentence_encoder.layers.0.self_attn."
    head_dim = int(CLASSIFIER_ENV["EMBED_DIM"]) // int(CLASSIFIER_ENV["HEADS"])
    head, other = slice(head_dim, 2 * head_dim), slice(0, head_dim)  # heads 2 and 1
    for name in ("q_proj.weight", "k_proj.weight", "v_proj.weight"):
        assert torch.equal(before[prefix + name][head], after[prefix + name][head]), name
        assert not torch.equal(before[prefix + name][other], after[prefix + name][other]), name
    assert torch.equal(before[prefix + "out_proj.weight"][:, head], after[prefix + "out_proj.weight"][:, head])


@pytest.mark.parametrize("spec, message", [
    ("A:1:1", "the model has no enc-dec attention (term 'A:1:1')"),
    ("E:3:1", "layer 3 out of range 1-2"),
])
def test_specs_an_encoder_only_model_lacks_are_one_line(classifier, spec, message, capsys):
    result = run_in_process(["validate", str(classifier["data"]), "--path", str(classifier["checkpoint"]),
                  "--valid-subset", "test", *BATCHING, "--head-mask", spec], capsys)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]  # after fairseq's own log lines
    assert last.startswith("fairseq-headprune: error: --head-mask:") and message in last, last


def test_a_path_that_is_no_checkpoint_is_one_line(classifier, tmp_path, capsys):
    bogus = tmp_path / "bogus.pt"
    bogus.write_text("not a checkpoint")
    result = run_in_process(["validate", str(classifier["data"]), "--path", str(bogus)], capsys)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"fairseq-headprune validate: error: "
                                                   f"cannot read checkpoint {bogus}: ")


def test_importance_of_a_classifier_equals_explicit_autograd(classifier, tmp_path):
    """I_h = mean over examples of |dL(x)/dxi_h| (and F_h, of (dL(x)/dxi_h)^2), L the classification loss;
    F_h estimated by 2 ranks, each on every other batch, summed over the ranks."""
    import json

    import torch.nn.functional as F
    from fairseq import checkpoint_utils

    from fairseq_headprune.modules.masked_multihead_attention import (
        head_layout,
        install_masked_attention,
        set_head_mask,
    )

    computed = {}
    for method, ranks in (("gradient", 1), ("fisher", 2)):  # Fisher sharded over 2 torchrun ranks (gloo)
        out_dir = tmp_path / method
        result = run([*headprune_launcher(ranks), "importance", str(classifier["data"]), "--path",
                      str(classifier["checkpoint"]), "--subset", "valid", "--batch-size", "8",
                      "--out-dir", str(out_dir), "--no-progress", "--importance-method", method],
                     env={"OMP_NUM_THREADS": "1"})
        assert "estimated on" in result.stdout
        stored = json.loads((out_dir / "importance.json").read_text())
        assert stored["method"] == method
        computed[method] = torch.tensor(stored["importance"]["enc-enc"], dtype=torch.float64)
    # the reference: stock sentence_prediction task, one example at a time, explicit xi
    models, _, task = checkpoint_utils.load_model_ensemble_and_task(
        [str(classifier["checkpoint"])], arg_overrides={"data": str(classifier["data"])})
    model = models[0].eval()
    install_masked_attention(model)
    layers, heads = head_layout(model)["enc-enc"]
    task.load_dataset("valid")
    dataset = task.dataset("valid")
    total = {method: torch.zeros(layers, heads, dtype=torch.float64) for method in computed}
    for index in range(len(dataset)):
        sample = dataset.collater([dataset[index]])
        xi = torch.ones(layers, heads, requires_grad=True)
        set_head_mask(model, {"enc-enc": xi})
        logits, _ = model(**sample["net_input"], features_only=True,
                          classification_head_name="sentence_classification_head")
        loss = F.nll_loss(F.log_softmax(logits, dim=-1, dtype=torch.float32), sample["target"].view(-1),
                          reduction="sum")
        (gradient,) = torch.autograd.grad(loss, xi)
        total["gradient"] += gradient.abs().double()
        total["fisher"] += gradient.double() ** 2
    set_head_mask(model, None)
    assert stored["count"] == len(dataset)
    for method, sums in total.items():
        reference = sums / len(dataset)
        relative = ((computed[method] - reference).abs().max() / reference.abs().max()).item()
        assert relative <= 1e-4, f"{method}: relative error {relative:.2e}"


@pytest.fixture(scope="module")
def classifier_study(classifier, tmp_path_factory):
    """The BERT-side studies of the tiny classifier in one study directory, as run_demo.sh lays them out."""
    data, checkpoint = str(classifier["data"]), str(classifier["checkpoint"])
    study = tmp_path_factory.mktemp("classifier_study")
    common = ["--gen-subset", "test", "--no-progress"]
    consoles = {
        "single": run(["fairseq-headprune", "ablate", data, "--path", checkpoint, "--out-dir", study / "ablation",
                       "--test", "t-test", *common]).stdout,
        "all-but-one": run(["fairseq-headprune", "ablate", data, "--path", checkpoint, "--out-dir",
                            study / "ablation", "--mode", "all-but-one", "--select-subset", "valid", *common]).stdout,
        "prune": run(["fairseq-headprune", "prune", data, "--path", checkpoint, "--out-dir", study / "pruning",
                      "--orders", "importance", "--type-budget", "(4)", "--draws", "2", "--importance-subset", "valid",
                      *common]).stdout,
        "dynamics": run(["fairseq-headprune", "dynamics", data, "--checkpoints", classifier["root"] / "checkpoints",
                         "--out-dir", study / "dynamics", "--importance-subset", "valid", "--max-percent", "50",
                         *common]).stdout,
    }
    return {"dir": study, "console": consoles}


def test_ablate_accuracy_equals_stock_fairseq_with_zeroed_columns(classifier, classifier_study, tmp_path):
    """Every single-head configuration's predictions are stock fairseq's on a model with that head's columns zeroed."""
    import json

    from fairseq import checkpoint_utils

    from fairseq_headprune.modules.masked_multihead_attention import head_layout
    from fairseq_headprune.study.masks.head_mask import parse_head_mask

    from conftest import zeroed_copy

    data, checkpoint, out = classifier["data"], classifier["checkpoint"], classifier_study["dir"] / "ablation"
    console = classifier_study["console"]["single"]
    assert "baseline accuracy" in console and "largest drop" in console
    table = json.loads((out / "single.json").read_text())
    assert list(table["rows"][0])[:7] == ["config", "attention_type", "layer", "head", "spec", "accuracy", "delta"]
    assert table["settings"]["test"]["test"] == "t-test" and len(table["rows"]) == 8
    # the baseline and one configuration through stock fairseq-validate (accuracy printed to 0.1)
    assert abs(table["settings"]["baseline_accuracy"] - stock_validate(checkpoint, data)[1]) <= 0.05
    row = next(r for r in table["rows"] if r["spec"] == "E:1:2")
    zeroed = stock_validate(zeroed_checkpoint(checkpoint, "E:1:2", tmp_path / "zeroed.pt"), data)
    assert abs(row["accuracy"] - zeroed[1]) <= 0.05
    # every configuration's stored predictions against stock fairseq's model with zeroed columns, in process
    models, _, task = checkpoint_utils.load_model_ensemble_and_task(
        [str(checkpoint)], arg_overrides={"data": str(data)})
    model = models[0].eval()
    task.load_dataset("test")
    dataset = task.dataset("test")
    labels = task.label_dictionary
    sample = dataset.collater([dataset[i] for i in range(len(dataset))])
    layout = head_layout(model)
    for row in table["rows"]:
        stored = json.loads((out / "sweeps" / "test" / "configs" / f"{row['config']}.json").read_text())["outputs"]
        with torch.no_grad():
            logits, _ = zeroed_copy(model, parse_head_mask(row["spec"], layout))(
                **sample["net_input"], features_only=True, classification_head_name="sentence_classification_head")
        expected = [labels[p + labels.nspecial] for p in logits.argmax(dim=1).tolist()]
        assert stored == [expected[i] for i in sorted(sample["id"].tolist())], row["spec"]
    # appendix A: the kept head of each layer chosen on another split
    best = json.loads((out / "all_but_one_best.json").read_text())
    assert [(e["layer"], "selected_accuracy" in e) for e in best["rows"]] == [(1, True), (2, True)]


@pytest.mark.parametrize("options, message", [
    (["--bleu", "sacrebleu"], "--bleu, --references and --sacrebleu-detokenize are for translation, not a classifier"),
    (["--metric", "mcc", "--test", "t-test"], "--test t-test does not apply to mcc"),
    (["--test", "compare-mt"], "--test compare-mt does not apply to accuracy"),
])
def test_ablate_options_a_classifier_cannot_take_are_one_line(classifier, tmp_path, options, message):
    result = run(["fairseq-headprune", "ablate", str(classifier["data"]), "--path", str(classifier["checkpoint"]),
                  "--out-dir", str(tmp_path), *options], check=False)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], lines


@pytest.mark.parametrize("options, message", [
    (["--engine", "ctranslate2"], "a classifier cannot be exported to CTranslate2"),
    (["--quantization", "int8"], "--quantization times a CTranslate2 model: add --engine ctranslate2"),
])
def test_latency_tables_a_classifier_cannot_have_are_one_line(classifier, tmp_path, options, message, capsys):
    pytest.importorskip("ctranslate2")
    table = tmp_path / "latency.json"
    result = run_in_process(["latency", str(classifier["data"]), "--path", str(classifier["checkpoint"]),
                  "--out", str(table), "--no-progress", "--cpu", *options], capsys)
    assert result.returncode == 2 and "Traceback" not in result.stderr and not table.exists()
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], lines


def test_prune_a_classifier_by_importance_and_within_budgets(classifier, classifier_study):
    """Every step's and budget draw's accuracy equals stock fairseq's model with those heads' columns zeroed."""
    import json

    data, checkpoint, out = classifier["data"], classifier["checkpoint"], classifier_study["dir"] / "pruning"
    console = classifier_study["console"]["prune"]
    assert console.startswith("unpruned accuracy ") and "accuracy" in console.splitlines()[-2]
    steps = json.loads((out / "prune_steps.all.json").read_text())["rows"]
    budgets = json.loads((out / "budgets.json").read_text())["rows"]
    assert len(budgets) == 2 and all(r["percent"] == 50.0 for r in budgets)
    for row in steps + budgets:
        correct = stock_correctness(checkpoint, data, row["spec"])
        assert row["accuracy"] == pytest.approx(100 * correct.mean(), abs=1e-9), row["spec"]


def stock_correctness(checkpoint, data, spec, split="test"):
    """Per example of ``split`` (in id order), 1.0 where stock fairseq's model with ``spec``'s columns zeroed
    is right."""
    from fairseq import checkpoint_utils

    from fairseq_headprune.modules.masked_multihead_attention import head_layout
    from fairseq_headprune.study.masks.head_mask import parse_head_mask

    from conftest import zeroed_copy

    models, _, task = checkpoint_utils.load_model_ensemble_and_task(
        [str(checkpoint)], arg_overrides={"data": str(data)})
    model = models[0].eval()
    task.load_dataset(split)
    dataset = task.dataset(split)
    sample = dataset.collater([dataset[i] for i in range(len(dataset))])
    with torch.no_grad():
        model = zeroed_copy(model, parse_head_mask(spec, head_layout(model))) if spec != "none" else model
        logits, _ = model(**sample["net_input"], features_only=True,
                          classification_head_name="sentence_classification_head")
    return (logits.argmax(dim=1) == sample["target"].view(-1)).double().numpy()


def test_dynamics_of_a_classifier(classifier, classifier_study):
    """Each epoch's unpruned accuracy is its checkpoint's, by stock fairseq; levels are relative to it."""
    import json

    assert "accuracy as % of each epoch's unpruned accuracy" in classifier_study["console"]["dynamics"]
    rows = json.loads((classifier_study["dir"] / "dynamics" / "dynamics.json").read_text())["rows"]
    assert sorted({r["epoch"] for r in rows}) == [1, 2]
    for row in rows:
        checkpoint = classifier["root"] / "checkpoints" / row["checkpoint"]
        if row["level"] == 0:
            assert row["unpruned_accuracy"] == pytest.approx(100 * stock_correctness(checkpoint, classifier["data"],
                                                                                      "none").mean(), abs=1e-9)
        assert row["relative"] == pytest.approx(row["accuracy"] / row["unpruned_accuracy"])


def test_report_of_a_classifier_study(classifier_study):
    """The report reads the accuracy tables and holds them to the papers' BERT findings."""
    import json

    study = classifier_study["dir"]
    run(["fairseq-headprune", "report", study])
    report = (study / "report.md").read_text()
    single = json.loads((study / "ablation" / "single.json").read_text())["settings"]
    assert f"Baseline {single['baseline_accuracy']:.2f}; " in report and "heads change accuracy significantly" in report
    assert "every layer within −0.96% accuracy with one head kept" in report  # the BERT finding, not WMT's
    assert "40% of the heads pruned by importance" in report and "BLEU" not in report.split("## What reproduces")[0]


def test_a_classifier_searched_tuned_and_shrunk_classifies_as_the_tuned_masked_model(classifier, tmp_path):
    """Kwon et al.'s pipeline on an encoder-only model: search, tune, fold into a smaller checkpoint."""
    from fairseq_headprune.engine.checkpoints.loading import load_evaluation_model
    from fairseq_headprune.engine.search.mask_tuning import tuning_folded
    from fairseq_headprune.modules.masked_ffn import ffn_layout
    from fairseq_headprune.modules.masked_multihead_attention import head_layout, head_mask_applied
    from fairseq_headprune.study.search.tuning import read_tuning

    out = tmp_path / "search"
    run(["fairseq-headprune", "search", classifier["data"], "--path", classifier["checkpoint"], "--budget", "50%",
         "--tune-masks", "--out-dir", out, "--no-progress"])
    run(["fairseq-headprune", "shrink", "--path", classifier["checkpoint"], "--tuning", out / "tuning.json",
         "--out", tmp_path / "tuned.pt"])
    _, task, model = load_evaluation_model("classifier", str(classifier["data"]), str(classifier["checkpoint"]))
    _, _, shrunk = load_evaluation_model("classifier", str(classifier["data"]), str(tmp_path / "tuned.pt"))
    tuning = read_tuning(str(out / "tuning.json"), head_layout(model), ffn_layout(model))
    task.load_dataset("test")
    dataset = task.dataset("test")
    sample = dataset.collater([dataset[i] for i in range(32)])
    head = next(iter(model.classification_heads))
    with torch.no_grad(), head_mask_applied(model, tuning.head_mask), tuning_folded(model, tuning):
        tuned = model(**sample["net_input"], features_only=True, classification_head_name=head)[0]
    with torch.no_grad():
        smaller = shrunk(**sample["net_input"], features_only=True, classification_head_name=head)[0]
    assert (tuned - smaller).abs().max() <= 1e-4
    assert sum(int(m.sum()) for m in tuning.head_mask.values()) == 4
