"""`fairseq-headprune dynamics` on the tiny model's epoch checkpoints."""

import json
import os

import pytest
import torch

import fairseq_headprune.compat.torch_load  # noqa: F401  (its allow-list lets torch.load read checkpoints)

from conftest import run

STUDY = ["--gen-subset", "valid", "--step-percent", "50", "--max-percent", "50", "--beam", "2",
         "--batch-size", "64", "--max-len-a", "1.2", "--max-len-b", "10", "--no-progress"]


def dynamics(tiny_model, checkpoints, out_dir, *extra, check=True):
    return run(["fairseq-headprune", "dynamics", tiny_model["data"], "--checkpoints", checkpoints,
                "--out-dir", out_dir, *STUDY, *extra], check=check)


@pytest.fixture(scope="module")
def epochs_dir(tiny_model, tmp_path_factory):
    """Two of the tiny model's epoch checkpoints, and a best/last that must be ignored."""
    directory = tmp_path_factory.mktemp("epochs")
    for name in ("checkpoint4.pt", "checkpoint8.pt", "checkpoint_best.pt", "checkpoint_last.pt"):
        os.symlink(tiny_model["checkpoint"].parent / name, directory / name)
    return directory


@pytest.fixture(scope="module")
def study(tiny_model, epochs_dir, tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("dynamics") / "out"
    result = dynamics(tiny_model, epochs_dir, out_dir)
    with open(out_dir / "dynamics.json") as stream:
        return out_dir, json.load(stream)["rows"], result.stdout


def test_every_epoch_gets_its_own_importance_and_curve(tiny_model, epochs_dir, study):
    from fairseq_headprune.study.importance.scores import read_importance_file
    from fairseq_headprune.study.output.files import file_sha256

    out_dir, rows, stdout = study
    assert sorted({r["epoch"] for r in rows}) == [4, 8]
    assert {r["level"] for r in rows} == {0, 1} and {r["pruned"] for r in rows} == {0, 24}
    for epoch in (4, 8):
        level0, level1 = sorted((r for r in rows if r["epoch"] == epoch), key=lambda r: r["level"])
        assert level0["relative"] == pytest.approx(1.0) and level0["bleu"] == level0["unpruned_bleu"]
        assert level1["relative"] == pytest.approx(level1["bleu"] / level0["unpruned_bleu"])
        # each level is tested against the epoch's unpruned model
        assert level0["p_value"] == 1.0 and level0["significant"] is False
        assert 0.0 <= level1["p_value"] <= 1.0 and isinstance(level1["significant"], bool)
        # importance was estimated on this epoch's checkpoint
        (importance,) = (out_dir / f"epoch{epoch}" / "importance").iterdir()
        identity = read_importance_file(str(importance)).settings["identity"]
        assert identity["checkpoint_sha256"] == file_sha256(str(epochs_dir / f"checkpoint{epoch}.pt"))
    # the last epoch's unpruned BLEU is the final model's (checkpoint8 = checkpoint_last)
    with open(out_dir / "epoch8" / "sweeps" / "valid" / "configs" / "baseline.json") as stream:
        assert json.load(stream)["bleu"] == pytest.approx([r for r in rows if r["epoch"] == 8][0]["unpruned_bleu"])
    assert "2 epochs (4,8)" in stdout
    for name in ("dynamics.tsv", "dynamics.md", "dynamics.png"):
        assert os.path.getsize(out_dir / name) > 0


def test_a_rerun_reuses_finished_epochs_and_redoes_an_interrupted_one(tiny_model, epochs_dir, study):
    out_dir, rows, stdout = study
    finished = (out_dir / "epoch4" / "done.json").stat().st_mtime_ns
    configs = out_dir / "epoch8" / "sweeps" / "valid" / "configs"
    stored = {p.name: p.stat().st_mtime_ns for p in configs.iterdir()}
    (out_dir / "epoch8" / "done.json").unlink()  # as if killed before epoch 8 was recorded
    again = dynamics(tiny_model, epochs_dir, out_dir)
    assert again.stdout == stdout
    assert (out_dir / "epoch4" / "done.json").stat().st_mtime_ns == finished
    assert (out_dir / "epoch8" / "done.json").exists()
    assert {p.name: p.stat().st_mtime_ns for p in configs.iterdir()} == stored  # nothing re-translated
    with open(out_dir / "dynamics.json") as stream:
        assert json.load(stream)["rows"] == rows


def test_no_epoch_checkpoints_is_one_line(tiny_model, tmp_path):
    (tmp_path / "ckpts").mkdir()
    os.symlink(tiny_model["checkpoint"], tmp_path / "ckpts" / "checkpoint_last.pt")
    result = dynamics(tiny_model, tmp_path / "ckpts", tmp_path / "out", check=False)
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"fairseq-headprune dynamics: error: no epoch checkpoints (checkpoint1.pt, checkpoint2.pt, ...) in "
        f"{tmp_path / 'ckpts'}; fairseq-train saves them unless --no-epoch-checkpoints is given"
    )
    missing = dynamics(tiny_model, tmp_path / "nowhere", tmp_path / "out", check=False)
    assert missing.stderr.strip() == (
        f"fairseq-headprune dynamics: error: checkpoint directory not found: {tmp_path / 'nowhere'}"
    )


def test_checkpoints_of_different_architectures_are_refused(tiny_model, tmp_path):
    directory = tmp_path / "mixed"
    directory.mkdir()
    os.symlink(tiny_model["checkpoint"].parent / "checkpoint1.pt", directory / "checkpoint1.pt")
    state = torch.load(tiny_model["checkpoint"].parent / "checkpoint2.pt", map_location="cpu")
    model_cfg = state["cfg"]["model"]
    if isinstance(model_cfg, dict):
        model_cfg["decoder_attention_heads"] = 4
    else:
        model_cfg.decoder_attention_heads = 4
    torch.save(state, directory / "checkpoint2.pt")
    result = dynamics(tiny_model, directory, tmp_path / "out", check=False)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "fairseq-headprune dynamics: error: checkpoints of different architectures: checkpoint2.pt is "
    )
    assert "enc-dec=2x4" in lines[0] and "enc-dec=2x8" in lines[0]
    wrong = dynamics(tiny_model, directory, tmp_path / "out", "--epochs", "1-3", check=False)
    assert wrong.stderr.strip() == (
        f"fairseq-headprune dynamics: error: --epochs: no checkpoint3.pt in {directory} (epochs there: 1-2)"
    )


def test_the_report_reads_its_numbers_from_the_result_files(study, tmp_path):
    import shutil

    from fairseq_headprune.study.output.report import write_report

    out_dir, rows, _ = study
    shutil.copytree(out_dir, tmp_path / "study" / "dynamics", ignore=shutil.ignore_patterns("epoch*"))
    (tmp_path / "study" / "commands").mkdir()
    (tmp_path / "study" / "commands" / "dynamics.sh").write_text("fairseq-headprune dynamics DATA --checkpoints DIR\n")
    report = (tmp_path / "study" / "report.md")
    write_report(str(tmp_path / "study"))
    text = report.read_text()
    at_50 = {r["epoch"]: r for r in rows if r["level"] == 1}
    assert f"keeps {100 * at_50[4]['relative']:.1f}% of its BLEU at epoch 4" in text
    assert "![pruning curves over training](dynamics/dynamics.png)" in text
    assert "fairseq-headprune dynamics DATA --checkpoints DIR" in text
    # change a result file: the report follows it
    path = tmp_path / "study" / "dynamics" / "dynamics.json"
    payload = json.loads(path.read_text())
    for row in payload["rows"]:
        if row["epoch"] == 4 and row["level"] == 1:
            row["relative"] = 0.123
    path.write_text(json.dumps(payload))
    write_report(str(tmp_path / "study"))
    assert "keeps 12.3% of its BLEU at epoch 4" in report.read_text()


def test_a_report_of_an_empty_directory_is_one_line(tmp_path):
    result = run(["fairseq-headprune", "report", tmp_path], check=False)
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"fairseq-headprune report: error: {tmp_path} holds no study results (importance/, ablation/, pruning/, ...)"
    )


def test_the_report_keeps_every_table_of_a_file_but_its_caption(tmp_path):
    from fairseq_headprune.study.output.report import _Study
    from fairseq_headprune.study.output.tables import markdown_single_table

    rows = [{"attention_type": t, "layer": 1, "head": h, "delta": -0.1 * h, "significant": h == 2}
            for t in ("enc-enc", "enc-dec") for h in (1, 2)]
    (tmp_path / "ablation").mkdir()
    (tmp_path / "ablation" / "single.md").write_text(markdown_single_table(rows, 30.0, "A caption."))
    table = _Study(str(tmp_path)).table("ablation/single.md")
    assert "A caption." not in table
    assert table.startswith("**Enc-Enc** (baseline 30.00)") and "**Enc-Dec** (baseline 30.00)" in table
    assert "| 1 | -0.10 | **-0.20** |" in table
