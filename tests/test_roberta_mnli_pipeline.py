"""Everything after the roberta.large.mnli and MNLI downloads, offline, on a locally made stand-in.

GLUE's MNLI columns -> a seeded 5k-style training subset -> GPT-2 BPE (fairseq's
own encoder) -> binarization against the bundle's dictionary, labels in the
released head's order -> the BERT-side studies (scripts/reproductions/study_roberta_mnli.sh),
on a model in the released checkpoint's format (args Namespace, encoder keys
under ``decoder.``, one classification head named ``mnli`` that its config
does not name) at tiny dimensions.
"""

import json
import os
import re

import pytest

from conftest import REPO, USER_DIR, run

SUBSET = "200"
STANDIN_ENV = {"SCALE": "0.05", "MERGES": "150", "EPOCHS": "2", "SUBSET": SUBSET}


@pytest.fixture(scope="module")
def mnli_dir(tmp_path_factory):
    """Stand-in bundle and MNLI, prepared offline (kept in HEADPRUNE_TEST_CACHE if set)."""
    cache = os.environ.get("HEADPRUNE_TEST_CACHE")
    directory = os.path.join(cache, "mnli-standin") if cache else str(tmp_path_factory.mktemp("mnli"))
    # the stand-in runs OFFLINE=1 TRAIN=1 prepare_roberta_mnli.sh DIRECTORY itself, then trains on its data
    run(["bash", REPO / "scripts" / "reproductions" / "make_standin_roberta_bundle.sh", directory], env=STANDIN_ENV)
    return directory


def test_bundle_has_the_released_format(mnli_dir):
    import torch

    from fairseq_headprune.engine.checkpoints.info import checkpoint_head_layout

    bundle = os.path.join(mnli_dir, "bundle")
    assert sorted(os.listdir(bundle)) == ["dict.txt", "encoder.json", "model.pt", "vocab.bpe"]
    state = torch.load(os.path.join(bundle, "model.pt"), map_location="cpu", weights_only=False)
    assert state["args"].arch == "roberta_large" and state["args"].task == "sentence_prediction"
    assert not hasattr(state["args"], "classification_head_name")
    assert any(key.startswith("decoder.sentence_encoder.layers.1.self_attn.") for key in state["model"])
    assert not any(key.startswith("encoder.") for key in state["model"])
    assert state["model"]["classification_heads.mnli.out_proj.weight"].shape[0] == 3
    assert checkpoint_head_layout(os.path.join(bundle, "model.pt")) == {"enc-enc": (2, 4)}


def test_data_is_glue_columns_in_gpt2_bpe_with_the_released_label_order(mnli_dir):
    from fairseq.data.encoders.gpt2_bpe import get_encoder

    rows = [line.split("\t") for line in open(os.path.join(mnli_dir, "raw", "MNLI", "dev_mismatched.tsv"))][1:]
    text = open(os.path.join(mnli_dir, "text", "dev_mismatched.raw.input1")).read().splitlines()
    assert text == [row[9] for row in rows]  # sentence2
    labels = open(os.path.join(mnli_dir, "text", "dev_mismatched.label")).read().splitlines()
    assert labels == [row[15].strip() for row in rows]  # gold_label
    # the BPE ids decode, with the bundle's own encoder files, to the raw text
    encoder = get_encoder(os.path.join(mnli_dir, "bundle", "encoder.json"),
                          os.path.join(mnli_dir, "bundle", "vocab.bpe"))
    ids = open(os.path.join(mnli_dir, "bpe", "dev_mismatched.input1")).read().splitlines()
    assert [encoder.decode([int(i) for i in line.split()]) for line in ids] == text
    assert sum(len(line.split()) for line in ids) < sum(len(line) for line in text)  # merges apply
    label_dict = open(os.path.join(mnli_dir, "bin", "label", "dict.txt")).read().split()[::2]
    assert label_dict == ["contradiction", "neutral", "entailment"]
    # train5k: SUBSET distinct training pairs, as they are in train.tsv
    train = {(row.split("\t")[8], row.split("\t")[9])
             for row in open(os.path.join(mnli_dir, "raw", "MNLI", "train.tsv"))}
    subset = list(zip(*(open(os.path.join(mnli_dir, "text", f"train5k.raw.{c}")).read().splitlines()
                        for c in ("input0", "input1"))))
    assert len(set(subset)) == int(SUBSET) and set(subset) <= train


def test_study_script_runs_every_bert_study_and_accuracy_is_stock_fairseq_validate(mnli_dir, tmp_path):
    import torch

    study = tmp_path / "study"
    run(["bash", REPO / "scripts" / "reproductions" / "study_roberta_mnli.sh", mnli_dir, study],
        env={"SPEED_EXAMPLES": "32", "SPEED_REPEATS": "1", "BATCH_SIZE": "64", "ORDERS": "importance,random"})
    single = json.loads((study / "ablation" / "single.json").read_text())
    assert len(single["rows"]) == 8 and single["settings"]["test"]["test"] == "t-test"
    best = json.loads((study / "ablation" / "all_but_one_best.json").read_text())
    assert best["settings"]["select_subset"] == "valid2"  # appendix A: chosen on the training subset
    importance = json.loads((study / "importance" / "importance.json").read_text())
    assert importance["settings"]["subsets"] == ["valid2"]
    report = (study / "report.md").read_text()
    assert "Table 4" in report and "finding of the papers" in report

    # a row of the sweep: stock fairseq-validate (fairseq's own task and criterion; the plugin loaded only
    # for torch.load's allow-list) on the released-format checkpoint with that head's out_proj columns zeroed
    row = next(r for r in single["rows"] if r["spec"] == "E:2:3")
    state = torch.load(os.path.join(mnli_dir, "bundle", "model.pt"), map_location="cpu", weights_only=False)
    weight = state["model"]["decoder.sentence_encoder.layers.1.self_attn.out_proj.weight"]
    head_dim = weight.shape[1] // 4
    weight[:, 2 * head_dim:3 * head_dim] = 0
    zeroed = tmp_path / "zeroed.pt"
    torch.save(state, zeroed)
    result = run(["fairseq-validate", os.path.join(mnli_dir, "bin"), "--path", zeroed, "--user-dir", USER_DIR,
                  "--task", "sentence_prediction", "--criterion", "sentence_prediction", "--valid-subset", "valid",
                  "--model-overrides", "{'classification_head_name': 'mnli'}", "--batch-size", "64",
                  "--required-batch-size-multiple", "1"])
    accuracy = float(re.search(r"\| accuracy ([\d.]+)", result.stdout + result.stderr).group(1))
    assert row["accuracy"] == pytest.approx(accuracy, abs=1e-6)
    # the wrapper finds the task, the criterion and the head named mnli by itself
    wrapped = run(["fairseq-headprune", "validate", os.path.join(mnli_dir, "bin"), "--path",
                   os.path.join(mnli_dir, "bundle", "model.pt"), "--valid-subset", "valid", "--batch-size", "64",
                   "--required-batch-size-multiple", "1", "--head-mask", "E:2:3"])
    assert float(re.search(r"\| accuracy ([\d.]+)", wrapped.stdout + wrapped.stderr).group(1)) == accuracy


def test_bad_input_is_one_line(mnli_dir, tmp_path):
    missing = tmp_path / "missing.pt"
    result = run(["fairseq-headprune", "validate", os.path.join(mnli_dir, "bin"), "--path", missing], check=False)
    assert result.returncode == 2 and result.stderr.strip() == (
        f"fairseq-headprune validate: error: --path: checkpoint not found: {missing}")
    empty = tmp_path / "empty"
    empty.mkdir()
    result = run(["bash", REPO / "scripts" / "reproductions" / "study_roberta_mnli.sh", empty], check=False)
    assert result.returncode == 2 and result.stderr.strip().count("\n") == 0
    assert "prepare_roberta_mnli.sh" in result.stderr
    copy = tmp_path / "copy"
    (copy / "bundle").mkdir(parents=True)
    for name in ("dict.txt", "encoder.json", "vocab.bpe"):
        (copy / "bundle" / name).write_bytes(open(os.path.join(mnli_dir, "bundle", name), "rb").read())
    (copy / "raw").symlink_to(os.path.join(mnli_dir, "raw"))
    result = run(["bash", REPO / "scripts" / "reproductions" / "prepare_roberta_mnli.sh", copy],
                 env={"OFFLINE": "1", "SUBSET": "100000"}, check=False)
    assert result.returncode != 0 and "more than the" in result.stderr
    assert not (copy / "bin").exists()
