"""The `importance` command and the criterion inside fairseq-train (1 and 2 processes)."""

import json
import shutil
import socket

import pytest
import torch

from fairseq_headprune.study.importance.scores import read_importance_file

from conftest import run, run_in_process

LAYOUT = {"enc-enc": (2, 8), "enc-dec": (2, 8), "dec-dec": (2, 8)}


def importance_command(tiny_model, out_dir, *extra, check=True, data=None, capsys=None):
    """The command in a process of its own, or with ``capsys`` in this one (for the refusals)."""
    command = ["importance", data or tiny_model["data"], "--path", tiny_model["checkpoint"], "--out-dir", out_dir,
               "--no-progress", *extra]
    if capsys is not None:
        return run_in_process(command, capsys)
    return run(["fairseq-headprune", *command], check=check)


@pytest.fixture(scope="module")
def data_with_empty_split(tiny_model, tmp_path_factory):
    """The tiny model's data plus a correctly binarized split with no sentences."""
    from fairseq.data import indexed_dataset

    data = tmp_path_factory.mktemp("data") / "bin"
    shutil.copytree(tiny_model["data"], data)
    for lang in ("en", "fr"):
        prefix = str(data / f"empty.en-fr.{lang}")
        builder = indexed_dataset.make_builder(prefix + ".bin", impl="mmap", vocab_size=1000)
        builder.finalize(prefix + ".idx")
    return data


def test_importance_command_writes_scores_plot_and_correlates_with_loss_increase(tiny_model, tmp_path):
    result = importance_command(tiny_model, tmp_path, "--importance-subset", "valid", "test",
                                "--importance-limit", "100", "--importance-max-tokens", "1500", "--loss-ablation")
    assert (tmp_path / "importance.png").stat().st_size > 10_000
    scores = read_importance_file(str(tmp_path / "importance.json"), LAYOUT)
    assert scores.settings["sentences"] == 200  # 100 of each split
    assert scores.settings["subsets"] == ["valid", "test"]
    # the authors' loss by default: plain cross-entropy, recorded with the scores
    assert (scores.settings["loss"], scores.settings["label_smoothing"]) == ("nll", 0.0)
    for attention_type, values in scores.normalized.items():
        assert torch.allclose(values.norm(dim=1), torch.ones(2, dtype=torch.float64))
    rows = (tmp_path / "importance.tsv").read_text().splitlines()
    assert len(rows) == 1 + 48
    # heads whose removal costs most loss rank high: positive rank correlation
    rho, p_value = scores.correlation_with_loss_increase()
    assert rho > 0.3 and p_value < 0.05, (rho, p_value)
    assert "spearman(importance, loss increase" in result.stdout
    # the console names each head by its --head-mask spec, the most important first
    for attention_type, letter in (("enc-enc", "E"), ("enc-dec", "A"), ("dec-dec", "D")):
        values = scores.importance[attention_type]
        best = sorted(((values[layer, head].item(), f"{letter}:{layer + 1}:{head + 1}")
                       for layer in range(values.shape[0]) for head in range(values.shape[1])), reverse=True)
        line = next(line for line in result.stdout.splitlines() if line.startswith(attention_type + "\t"))
        assert f"top {', '.join(spec for _, spec in best[:3])}\t" in line, line


def test_importance_of_a_masked_model_and_token_granularity(tiny_model, tmp_path):
    importance_command(tiny_model, tmp_path, "--granularity", "token", "--head-mask", "D:*:keep=1",
                       "--limit", "40", "--batch-size", "16", "--loss", "label_smoothed", "--label-smoothing", "0.2")
    payload = json.loads((tmp_path / "importance.json").read_text())
    assert (payload["settings"]["loss"], payload["settings"]["label_smoothing"]) == ("label_smoothed", 0.2)
    assert payload["granularity"] == "token"
    assert payload["settings"]["head_mask"] == "D:*:keep=1"
    assert payload["count"] == payload["settings"]["target_tokens"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--subset", "nosuch"], "split 'nosuch' not found"),
        (["--subset", "empty"], "split 'empty'"),
        (["--head-mask", "E:3:1"], "layer 3 out of range 1-2"),
        (["--limit", "0"], "--importance-limit must be positive"),
    ],
)
def test_bad_input_is_one_line_and_non_zero(tiny_model, data_with_empty_split, tmp_path, args, message, capsys):
    result = importance_command(tiny_model, tmp_path / "out", *args, data=data_with_empty_split, capsys=capsys)
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert not (tmp_path / "out" / "importance.json").exists()


def test_missing_or_mismatched_checkpoint_is_one_line(tiny_model, tmp_path, capsys):
    out = ["--out-dir", tmp_path / "out"]
    missing = run_in_process(["importance", tiny_model["data"], "--path", tmp_path / "no.pt", *out], capsys)
    assert missing.returncode != 0 and missing.stderr.strip() == (
        f"fairseq-headprune importance: error: checkpoint not found: {tmp_path / 'no.pt'}"
    )
    not_a_checkpoint = run_in_process(["importance", tiny_model["data"], "--path", tiny_model["data"] / "dict.en.txt",
                                       *out], capsys)
    assert not_a_checkpoint.returncode != 0
    assert len(not_a_checkpoint.stderr.strip().splitlines()) == 1
    # read first, to learn which family of model it holds
    assert f"cannot read checkpoint {tiny_model['data'] / 'dict.en.txt'}" in not_a_checkpoint.stderr
    other_dict = tmp_path / "other-dict"
    shutil.copytree(tiny_model["data"], other_dict)
    for lang in ("en", "fr"):
        with open(other_dict / f"dict.{lang}.txt", "a") as stream:
            stream.writelines(f"extraword{i} 1\n" for i in range(9))
    mismatch = run_in_process(["importance", other_dict, "--path", tiny_model["checkpoint"], *out], capsys)
    assert mismatch.returncode != 0
    assert len(mismatch.stderr.strip().splitlines()) == 1
    assert "does not match the dictionaries" in mismatch.stderr


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def train_with_importance(tiny_model, out_dir, world_size):
    """One epoch over `valid` at learning rate 0: importance of the initial model."""
    command = [
        "fairseq-headprune", "train", tiny_model["data"],
        "--arch", "transformer_vaswani_wmt_en_fr_big", "--share-all-embeddings",
        "--encoder-layers", "2", "--decoder-layers", "2",
        "--encoder-embed-dim", "64", "--decoder-embed-dim", "64",
        "--encoder-ffn-embed-dim", "128", "--decoder-ffn-embed-dim", "128",
        "--encoder-attention-heads", "8", "--decoder-attention-heads", "8",
        "--dropout", "0", "--attention-dropout", "0", "--activation-dropout", "0", "--seed", "3",
        "--optimizer", "adam", "--lr", "0", "--lr-scheduler", "fixed",
        "--criterion", "headprune_importance", "--importance-save-dir", out_dir,
        "--train-subset", "valid", "--valid-subset", "test", "--max-tokens", "1024",
        "--max-epoch", "1", "--cpu", "--num-workers", "0", "--save-dir", out_dir / "checkpoints",
        "--no-last-checkpoints", "--log-format", "simple", "--log-interval", "1",
    ]
    if world_size == 1:
        return [run(command)]
    import os
    import subprocess
    import sys

    port = free_port()
    env = dict(os.environ, PATH=f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ['PATH']}")
    workers = [
        subprocess.Popen(
            [str(c) for c in command] + [
                "--distributed-world-size", str(world_size), "--distributed-rank", str(rank),
                "--distributed-init-method", f"tcp://127.0.0.1:{port}", "--distributed-no-spawn",
                "--distributed-backend", "gloo", "--ddp-backend", "legacy_ddp",
            ],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
        )
        for rank in range(world_size)
    ]
    outputs = [worker.communicate(timeout=300)[0] for worker in workers]
    for worker, output in zip(workers, outputs):
        assert worker.returncode == 0, output[-3000:]
    return outputs


def test_criterion_in_fairseq_train_sums_across_two_workers(tiny_model, tmp_path):
    single, double = tmp_path / "one", tmp_path / "two"
    train_with_importance(tiny_model, single, 1)
    outputs = train_with_importance(tiny_model, double, 2)
    assert "imp_enc_dec" in outputs[0]  # readable per-type mean in the training log
    one = read_importance_file(str(single / "importance_epoch1.json"), LAYOUT)
    two = read_importance_file(str(double / "importance_epoch1.json"), LAYOUT)
    assert one.count == two.count == 200  # every sentence of valid, once
    for attention_type in LAYOUT:
        assert torch.allclose(one.importance[attention_type], two.importance[attention_type],
                              rtol=1e-5, atol=0)
    # the importance command on the checkpoint fairseq-train saved gives the same scores
    run(["fairseq-headprune", "importance", tiny_model["data"], "--path",
         single / "checkpoints" / "checkpoint1.pt", "--out-dir", tmp_path / "command",
         "--max-tokens", "1024", "--no-progress"])
    command = read_importance_file(str(tmp_path / "command" / "importance.json"), LAYOUT)
    for attention_type in LAYOUT:
        assert torch.allclose(one.importance[attention_type], command.importance[attention_type],
                              rtol=1e-4, atol=0)
