"""The fairseq-headprune command: help, the corpus and mask sub-commands."""

import json

from conftest import run


def test_help_lists_the_sub_commands():
    result = run(["fairseq-headprune", "--help"])
    for command in ("corpus", "mask", "train", "generate", "validate", "interactive"):
        assert command in result.stdout


def test_mask_command_prints_and_writes(tiny_model, tmp_path):
    out = tmp_path / "mask.json"
    result = run(
        ["fairseq-headprune", "mask", "E:1:6 A:2:1,3", "--path", tiny_model["checkpoint"],
         "--out", out, "--list"]
    )
    assert "masked\t3 of 48 heads" in result.stdout
    assert "spec\tE:1:6 A:2:1,3" in result.stdout
    assert json.loads(out.read_text())["spec"] == "E:1:6 A:2:1,3"
    again = run(["fairseq-headprune", "mask", out, "--path", tiny_model["checkpoint"]])
    assert "spec\tE:1:6 A:2:1,3" in again.stdout


def test_mask_command_errors_are_one_line(tiny_model, tmp_path):
    for args, message in (
        (["E:9:1", "--path", tiny_model["checkpoint"]], "layer 9 out of range 1-2"),
        (["E:1:1", "--path", tmp_path / "nope.pt"], "checkpoint not found"),
        (["E:1:1", "--path", tiny_model["checkpoint"], "--out", tmp_path / "m.txt"], ".json or .tsv"),
    ):
        result = run(["fairseq-headprune", "mask", *args], check=False)
        assert result.returncode == 2
        assert result.stderr.strip().count("\n") == 0, result.stderr
        assert message in result.stderr


def test_corpus_command_is_deterministic(tmp_path):
    for name in ("a", "b"):
        run(["fairseq-headprune", "corpus", tmp_path / name, "--scale", "0.01", "--seed", "3"])
    for split in ("train", "valid", "test", "test-shifted"):
        for lang in ("en", "fr"):
            assert (tmp_path / "a" / f"{split}.{lang}").read_text() == (
                tmp_path / "b" / f"{split}.{lang}"
            ).read_text()
    bad = run(["fairseq-headprune", "corpus", tmp_path / "c", "--scale", "0"], check=False)
    assert bad.returncode == 2 and "--scale must be positive" in bad.stderr
