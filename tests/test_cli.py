"""The fairseq-headprune command: help, the corpus and mask sub-commands."""

import json

import pytest

from conftest import run, run_in_process


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


def test_mask_command_errors_are_one_line(tiny_model, tmp_path, capsys):
    for args, message in (
        (["E:9:1", "--path", tiny_model["checkpoint"]], "layer 9 out of range 1-2"),
        (["E:1:1", "--path", tmp_path / "nope.pt"], "checkpoint not found"),
        (["E:1:1", "--path", tiny_model["checkpoint"], "--out", tmp_path / "m.txt"], ".json or .tsv"),
    ):
        result = run_in_process(["mask", *args], capsys)
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
    assert bad.returncode == 2 and "--scale must be a positive (finite) number" in bad.stderr


def test_an_error_names_the_flag_the_user_gave_and_plain_words_otherwise(tmp_path, monkeypatch, capsys):
    """Below the commands an error names its setting in plain words; the command prints it with the flag its user
    gave the setting by (``search --budget``, ``shrink --head-mask``), and compress, which sets the head mask
    itself, keeps the plain words: it never tells its user about a --head-mask they could not have passed."""
    from fairseq_headprune import cli
    from fairseq_headprune.commands import compress
    from fairseq_headprune.errors import HeadMaskError
    from fairseq_headprune.study.masks.head_mask import check_mask_layout, full_mask

    status = cli.main(["search", str(tmp_path), "--path", str(tmp_path / "model.pt"), "--budget", "-1",
                       "--out-dir", str(tmp_path / "out")])
    assert status == 2
    assert capsys.readouterr().err.strip() == "fairseq-headprune search: error: --budget must be non-negative, got -1"

    layout = {"enc-enc": (2, 8), "enc-dec": (2, 8), "dec-dec": (2, 8)}
    with pytest.raises(HeadMaskError) as raised:  # what shrink and the export raise for a mask of another model
        check_mask_layout(full_mask({**layout, "enc-enc": (3, 8)}), layout)
    internal = raised.value
    assert internal.setting == "head_mask" and str(internal).startswith("the head mask is not one of this model")
    assert cli.command_flags("shrink")["head_mask"] == "--head-mask"
    assert cli.command_flags("compress").get("head_mask") is None  # compress sets it: no flag names it

    def compress_refused_by_shrink(args):  # the error of a stage deep inside compress
        raise internal

    monkeypatch.setattr(compress, "command_compress", compress_refused_by_shrink)
    status = cli.main(["compress", str(tmp_path), "--path", str(tmp_path / "model.pt"), "--target", "heads=50%",
                       "--out-dir", str(tmp_path / "run")])
    error = capsys.readouterr().err.strip()
    assert status == 2 and error.startswith("fairseq-headprune compress: error: the head mask is not one of this model")
    assert "--head-mask" not in error
    assert internal.worded(cli.command_flags("shrink")).startswith("--head-mask is not one of this model")
    # compress's budget is its target
    budget_error = HeadMaskError("the budget 3 heads is below the least any mask costs", setting="budget")
    assert budget_error.worded(cli.command_flags("compress")) == "--target 3 heads is below the least any mask costs"
