"""Everything after the WMT download, offline, on a locally made stand-in bundle.

raw text -> Moses tokenization -> the bundle's BPE -> binarization against the
bundle's dictionaries -> ablation sweep (--remove-bpe, tokenized BLEU and
sacreBLEU) -> significance table, with the released model's old checkpoint
format and architecture at tiny dimensions.
"""

import json
import os
import re
import subprocess

import pytest

from conftest import REPO, USER_DIR, run

SENTENCES = 60
STANDIN_ENV = {
    "SCALE": "0.2",  # 4,000 training pairs
    "MERGES": "300",
    "EPOCHS": "5",
    "MAX_TOKENS": "1024",  # small batches: enough updates for 11 BLEU in 40 s of training
    "EMBED_DIM": "64",
    "FFN_DIM": "128",
    "HEADS": "4",
    "LAYERS": "2",
    "SENTENCES": str(SENTENCES),
}
SETS = "newstest2013 mtnt"


@pytest.fixture(scope="module")
def wmt_dir(tmp_path_factory):
    """Stand-in bundle and raw sets, prepared offline (kept in HEADPRUNE_TEST_CACHE if set)."""
    cache = os.environ.get("HEADPRUNE_TEST_CACHE")
    directory = os.path.join(cache, "wmt-standin") if cache else str(tmp_path_factory.mktemp("wmt"))
    run(["bash", REPO / "scripts" / "reproductions" / "make_standin_bundle.sh", directory], env=STANDIN_ENV)
    run(["bash", REPO / "scripts" / "reproductions" / "prepare_wmt14_en_fr.sh", directory],
        env={"OFFLINE": "1", "SETS": SETS})
    return directory


def test_bundle_has_the_released_layout_and_format(wmt_dir):
    import torch

    from fairseq_headprune.engine.checkpoints.info import checkpoint_head_layout

    assert sorted(os.listdir(os.path.join(wmt_dir, "bundle"))) == ["bpecodes", "dict.en.txt", "dict.fr.txt", "model.pt"]
    state = torch.load(os.path.join(wmt_dir, "bundle", "model.pt"), map_location="cpu", weights_only=False)
    assert state["args"].arch == "transformer_vaswani_wmt_en_fr_big"
    assert any(key.endswith("in_proj_weight") for key in state["model"])  # packed q/k/v, as released
    assert checkpoint_head_layout(os.path.join(wmt_dir, "bundle", "model.pt")) == {
        "enc-enc": (2, 4), "enc-dec": (2, 4), "dec-dec": (2, 4)
    }
    bpe = open(os.path.join(wmt_dir, "bpe", "newstest2013.en")).read()
    assert "@@ " in bpe  # the codes split words, so --remove-bpe matters
    for split in SETS.split():
        assert os.path.isfile(os.path.join(wmt_dir, "bin", f"{split}.en-fr.fr.idx"))


def test_raw_text_to_significance_table(wmt_dir, tmp_path):
    out_dir = tmp_path / "ablation"
    common = ["fairseq-headprune", "ablate", os.path.join(wmt_dir, "bin"), "--path",
              os.path.join(wmt_dir, "bundle", "model.pt"), "--gen-subset", "newstest2013",
              "--out-dir", out_dir, "--beam", "5", "--lenpen", "1", "--remove-bpe", "--max-tokens", "4000",
              "--no-progress"]
    run(common + ["--mode", "cross-domain", "--cross-subset", "mtnt", "--heads", "A:*:* E:1:1"])
    with open(out_dir / "single.json") as stream:
        table = json.load(stream)
    assert len(table["rows"]) == 9
    baseline = table["settings"]["baseline_bleu"]
    # the stand-in is tiny and trained for 5 epochs of 4,000 pairs (about 11 BLEU)
    assert baseline > 5, "the stand-in model should translate its test set"

    # the sweep's BLEU is fairseq-generate's on the same binarized split, after BPE removal
    generated = run(["fairseq-generate", os.path.join(wmt_dir, "bin"), "--path",
                     os.path.join(wmt_dir, "bundle", "model.pt"), "--user-dir", USER_DIR,
                     "--task", "fairseq-headprune", "--gen-subset", "newstest2013", "--beam", "5",
                     "--lenpen", "1", "--remove-bpe", "--max-tokens", "4000", "--head-mask", "A:2:1",
                     # fairseq-generate otherwise leaves out the last (60 mod 8) sentences
                     "--required-batch-size-multiple", "1"])
    bleu = float(re.search(r"BLEU4 = ([\d.]+)", generated.stdout).group(1))
    row = next(r for r in table["rows"] if r["spec"] == "A:2:1")
    assert round(row["bleu"], 2) == bleu
    with open(out_dir / "sweeps" / "newstest2013" / "configs" / "baseline.json") as stream:
        hypotheses = json.load(stream)["hypotheses"]
    assert len(hypotheses) == SENTENCES and not any("@@" in h for h in hypotheses)

    # sacreBLEU on the raw references, and the significance command on the hypothesis files
    references = os.path.join(wmt_dir, "raw", "newstest2013.fr")
    run(common + ["--out-dir", tmp_path / "sacre", "--heads", "A:2:1", "--bleu", "sacrebleu",
                  "--references", references])
    with open(tmp_path / "sacre" / "single.json") as stream:
        sacre = json.load(stream)
    assert sacre["settings"]["bleu"] == "sacrebleu"
    system = tmp_path / "system.txt"
    with open(tmp_path / "sacre" / "sweeps" / "newstest2013" / "configs" / "single.enc-dec.L2.H1.json") as stream:
        system.write_text("\n".join(json.load(stream)["detokenized"]) + "\n")
    baseline_file = tmp_path / "baseline.txt"
    with open(tmp_path / "sacre" / "sweeps" / "newstest2013" / "configs" / "baseline.json") as stream:
        baseline_file.write_text("\n".join(json.load(stream)["detokenized"]) + "\n")
    result = run(["fairseq-headprune", "significance", references, baseline_file, system, "--bleu", "sacrebleu",
                  "--json", tmp_path / "significance.json"])
    with open(tmp_path / "significance.json") as stream:
        (significance_row,) = json.load(stream)["rows"]
    (sweep_row,) = sacre["rows"]
    assert significance_row["bleu"] == pytest.approx(sweep_row["bleu"])
    assert significance_row["p_value"] == pytest.approx(sweep_row["p_value"])
    assert "p-value" in result.stdout


def test_offline_preparation_stops_on_a_missing_file(wmt_dir, tmp_path):
    result = run(["bash", REPO / "scripts" / "reproductions" / "prepare_wmt14_en_fr.sh", wmt_dir],
                 env={"OFFLINE": "1", "SETS": "newstest2013 newstest2014"}, check=False)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        f"prepare_wmt14_en_fr: error: OFFLINE=1 and {wmt_dir}/raw/newstest2014.en or .fr is missing"
    )
    empty = tmp_path / "empty"
    result = run(["bash", REPO / "scripts" / "reproductions" / "prepare_wmt14_en_fr.sh", empty],
                 env={"OFFLINE": "1"}, check=False)
    assert result.returncode == 1 and "OFFLINE=1 and" in result.stderr and "is missing" in result.stderr


def test_figures_3_and_4_and_the_report_in_the_users_own_environment(wmt_dir, tmp_path):
    """wmt_pruning.sh with VENV=system (the python3 on PATH as it is, as on a GPU cluster): importance estimated
    where missing, Figure 3's and Figure 4's curves on newstest2013, report.md; a curve's BLEU is
    fairseq-generate's under the same mask."""
    study = tmp_path / "wmt14"
    result = run(["bash", REPO / "scripts" / "reproductions" / "wmt_pruning.sh", wmt_dir, study],
                 env={"VENV": "system", "IMPORTANCE_SUBSETS": "mtnt", "MAX_TOKENS": "4000",
                      "EXTRA_ARGS": "--no-progress"})
    assert "precision fp32" in result.stderr  # no GPU: fp32 by default
    with open(study / "importance" / "importance.json") as stream:
        assert json.load(stream)["settings"]["subsets"] == ["mtnt"]
    with open(study / "pruning" / "prune_steps.all.json") as stream:
        steps = json.load(stream)
    assert steps["settings"]["split"] == "newstest2013" and steps["settings"]["step_percent"] == 10.0
    rows = [row for row in steps["rows"] if row["order"] == "importance"]
    assert [row["pruned"] for row in rows][:3] == [0, 3, 5]  # 10% steps of 24 heads, rounded up
    row = rows[2]
    generated = run(["fairseq-generate", os.path.join(wmt_dir, "bin"), "--path",
                     os.path.join(wmt_dir, "bundle", "model.pt"), "--user-dir", USER_DIR,
                     "--task", "fairseq-headprune", "--gen-subset", "newstest2013", "--beam", "5",
                     "--lenpen", "1", "--remove-bpe", "--max-tokens", "4000", "--head-mask", row["spec"],
                     "--required-batch-size-multiple", "1"])
    assert round(row["bleu"], 2) == float(re.search(r"BLEU4 = ([\d.]+)", generated.stdout).group(1))
    for scope in ("enc-enc", "enc-dec", "dec-dec"):
        with open(study / "pruning" / f"prune_steps.{scope}.json") as stream:
            assert {row["scope"] for row in json.load(stream)["rows"]} == {scope}
    report = (study / "report.md").read_text()
    assert "prun" in report.lower() and "importance" in report.lower()


def test_wmt_scripts_name_what_is_wrong_in_one_line(wmt_dir, tmp_path):
    script = REPO / "scripts" / "reproductions" / "wmt_pruning.sh"
    result = run(["bash", script, wmt_dir, tmp_path / "s"], env={"PRECISION": "fp16"}, check=False)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        "PRECISION=fp16 needs a GPU, and torch sees none (PRECISION=fp32 on a CPU)")
    # VENV=system with a python3 that cannot import the plugin: one line, exit 1
    env = dict(os.environ, VENV="system", PATH="/usr/bin:/bin")
    result = subprocess.run(["bash", str(script), wmt_dir, str(tmp_path / "s")], env=env, capture_output=True,
                            text=True, cwd=REPO)
    assert result.returncode == 1
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("setup_env.sh: error: VENV=system, but ") and "cannot import fairseq_headprune" in line
