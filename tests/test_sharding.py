"""Studies sharded over 2 CPU ranks with torchrun (gloo) equal one process, file for file.

The launch is the documented one:
``torchrun --standalone --nproc-per-node N "$(command -v fairseq-headprune)" COMMAND …``.
Both sides run on one thread per process, so only the sharding differs.
"""

import json
import os
import shutil

import numpy as np
import pytest

from fairseq_headprune.study.output.files import TEMPORARY_PREFIX

from conftest import headprune_launcher, run

ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
GENERATION = ["--beam", "2", "--batch-size", "64", "--no-progress"]
HEADS = ["--heads", "E:1:1-3 A:2:* D:1:2"]


def headprune(ranks, command, *arguments, check=True):
    return run([*headprune_launcher(ranks), command, *arguments], env=ONE_THREAD, check=check)


def ablate(tiny_model, out_dir, ranks, *extra):
    return headprune(
        ranks, "ablate", tiny_model["data"], "--path", tiny_model["checkpoint"], "--gen-subset", "test",
        "--out-dir", out_dir, *GENERATION, *HEADS, *extra,
    )


def config_files(sweep_dir):
    """Every file in the sweep's configs/, temporaries included."""
    return sorted(os.listdir(os.path.join(sweep_dir, "configs")))


def stored(sweep_dir, name, drop_seconds=True):
    with open(os.path.join(sweep_dir, "configs", name), encoding="utf-8") as stream:
        result = json.load(stream)
    if drop_seconds:
        result.pop("seconds")
    return result


def assert_same_sweep(one, other):
    assert config_files(one) == config_files(other)
    for name in config_files(one):
        assert stored(one, name) == stored(other, name), name


def read(path):
    with open(path, encoding="utf-8") as stream:
        return stream.read()


@pytest.fixture(scope="module")
def one_process(tiny_model, tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("one") / "ablate"
    result = ablate(tiny_model, out_dir, 1, "--mode", "cross-domain", "--cross-subset", "test1")
    return out_dir, result.stdout


def test_a_sweep_under_two_ranks_writes_what_one_process_writes(tiny_model, one_process, tmp_path):
    one, one_stdout = one_process
    two = tmp_path / "ablate"
    result = ablate(tiny_model, two, 2, "--mode", "cross-domain", "--cross-subset", "test1")
    for split in ("test", "test1"):
        assert len(config_files(one / "sweeps" / split)) == 1 + 3 + 8 + 1
        assert_same_sweep(one / "sweeps" / split, two / "sweeps" / split)
    for table in ("single.tsv", "single.md", "single.test1.tsv", "cross_domain.tsv", "cross_domain.md"):
        assert read(one / table) == read(two / table), table
    # rank 0 alone speaks: the same console as one process, once
    assert result.stdout == one_stdout.replace(str(one), str(two))


def test_a_sweep_killed_under_n_ranks_resumes_under_m_without_loss_or_duplication(tiny_model, one_process, tmp_path):
    one, _ = one_process
    out_dir = tmp_path / "ablate"
    sweep_dir = out_dir / "sweeps" / "test"
    ablate(tiny_model, out_dir, 2)
    names = config_files(sweep_dir)
    # killed under 2 ranks, resumed under 1; then killed under 1, resumed under 2
    for killed_share, resume_ranks in ((slice(1, None, 3), 1), (slice(0, None, 2), 2)):
        # what a kill leaves: some configurations stored, one half-written temporary
        for name in names[killed_share]:
            os.remove(sweep_dir / "configs" / name)
        stored_name = next(n for n in names if os.path.exists(sweep_dir / "configs" / n))
        temporary = sweep_dir / "configs" / f"{TEMPORARY_PREFIX}{stored_name}.x1y2.part"  # as atomic_path names it
        shutil.copy(sweep_dir / "configs" / stored_name, temporary)
        kept = {name: read(sweep_dir / "configs" / name) for name in config_files(sweep_dir) if name.endswith(".json")}
        ablate(tiny_model, out_dir, resume_ranks)
        assert config_files(sweep_dir) == names  # nothing lost, nothing twice, no temporary left
        for name, text in kept.items():
            assert read(sweep_dir / "configs" / name) == text, f"{name} was translated again"
        assert_same_sweep(one / "sweeps" / "test", sweep_dir)
        assert read(out_dir / "single.tsv") == read(one / "single.tsv")


def importance(tiny_model, out_dir, ranks):
    headprune(
        ranks, "importance", tiny_model["data"], "--path", tiny_model["checkpoint"], "--subset", "valid",
        "--batch-size", "16", "--out-dir", out_dir, "--no-progress",
    )
    with open(out_dir / "importance.json", encoding="utf-8") as stream:
        return json.load(stream)


def test_importance_shards_batches_and_sums_over_ranks(tiny_model, tmp_path):
    one = importance(tiny_model, tmp_path / "one", 1)
    two = importance(tiny_model, tmp_path / "two", 2)
    for key in ("sentences", "target_tokens", "batches"):
        assert one["settings"][key] == two["settings"][key]
    assert two["settings"]["mean_loss_per_token"] == pytest.approx(one["settings"]["mean_loss_per_token"], rel=1e-12)
    assert two["count"] == one["count"]
    for attention_type, scores in one["importance"].items():
        np.testing.assert_allclose(two["importance"][attention_type], scores, rtol=1e-10)


def test_pruning_with_re_estimated_importance_under_two_ranks_equals_one_process(tiny_model, tmp_path):
    study = ["--gen-subset", "valid", "--orders", "iterative,random", "--step-percent", "25", "--max-percent", "50",
             "--draws", "2", "--layer-budget", "84 48 84", *GENERATION]
    outputs = {}
    for ranks in (1, 2):
        out_dir = tmp_path / f"ranks{ranks}"
        headprune(ranks, "prune", tiny_model["data"], "--path", tiny_model["checkpoint"], "--out-dir", out_dir,
                  *study)
        outputs[ranks] = out_dir
    for table in ("prune_steps.all.tsv", "prune_curves.all.tsv", "budgets_summary.tsv", "prune_curves.md"):
        assert read(outputs[1] / table) == read(outputs[2] / table), table
    estimated = sorted(os.listdir(outputs[1] / "importance"))
    assert len(estimated) == 2  # the unpruned model's, and the re-estimate after the first step
    assert sorted(os.listdir(outputs[2] / "importance")) == estimated
    assert_same_sweep(outputs[1] / "sweeps" / "valid", outputs[2] / "sweeps" / "valid")


def test_a_command_that_is_not_sharded_refuses_torchrun_in_one_line(tmp_path):
    result = headprune(2, "report", tmp_path, check=False)
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if "fairseq-headprune report: error" in line]
    assert lines and "ablate, prune, dynamics, importance" in lines[0]


def test_training_dynamics_under_two_ranks_equals_one_process(tiny_model, tmp_path):
    checkpoints = tmp_path / "epochs"
    checkpoints.mkdir()
    for name in ("checkpoint4.pt", "checkpoint8.pt"):
        os.symlink(tiny_model["checkpoint"].parent / name, checkpoints / name)
    outputs = {}
    for ranks in (1, 2):
        outputs[ranks] = tmp_path / f"ranks{ranks}"
        headprune(ranks, "dynamics", tiny_model["data"], "--checkpoints", checkpoints, "--out-dir", outputs[ranks],
                  "--gen-subset", "valid", "--step-percent", "50", "--max-percent", "50", "--max-len-a", "1.2",
                  "--max-len-b", "10", *GENERATION)
    assert read(outputs[1] / "dynamics.tsv") == read(outputs[2] / "dynamics.tsv")
    for epoch in (4, 8):
        assert_same_sweep(outputs[1] / f"epoch{epoch}" / "sweeps" / "valid",
                          outputs[2] / f"epoch{epoch}" / "sweeps" / "valid")


def test_more_ranks_than_configurations_is_refused_in_one_line_before_anything_is_written(
        tiny_model, tmp_path, monkeypatch, capsys):
    """As rank 0 of 3 would see it (in process: torchrun's error plumbing is tested above)."""
    from fairseq_headprune import cli
    from fairseq_headprune.engine.runtime import ranks

    monkeypatch.setattr(ranks, "_current", ranks.Ranks(0, 3))
    out_dir = tmp_path / "ablate"
    status = cli.main(["ablate", str(tiny_model["data"]), "--path", str(tiny_model["checkpoint"]),
                       "--gen-subset", "test", "--out-dir", str(out_dir), *GENERATION, "--heads", "E:1:1"])
    assert status != 0
    error = capsys.readouterr().err.strip().splitlines()
    assert error == ["fairseq-headprune ablate: error: 3 ranks (torchrun --nproc-per-node) for 2 configurations: "
                     "some ranks would have nothing to do; launch at most 2"]
    assert not out_dir.exists()
