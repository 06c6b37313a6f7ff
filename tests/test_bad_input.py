"""Bad or idle input, tried through the real command line on the tiny model: each case ends in one line on
stderr naming the option, exit status 2, no traceback, and leaves every file that existed before as it was.

The cases are the classes a user in a hurry runs into: an option that does nothing in the combination given
(``commands/option_rules.py``), a value outside its meaning, an output that exists or is also an input, and a
directory that holds another run's results. The commands run in this process (``cli.main``), so the cases
cost no interpreter start; scripts/dev/fuzz_cli.py generates many more.
"""

import json
import os

import pytest
import torch

import fairseq_headprune.compat.torch_load  # noqa: F401  (lets torch.load read fairseq checkpoints)
from fairseq_headprune.cli import main


@pytest.fixture(scope="module")
def inputs(tiny_model, tmp_path_factory):
    """The tiny model's data and checkpoint, a finished importance run, a text file and an earlier result."""
    root = tmp_path_factory.mktemp("bad-input")
    text = root / "sentences.txt"
    text.write_text("le chat est noir\nil pleut\n")
    earlier = root / "earlier.json"
    earlier.write_text('{"earlier": "results"}\n')
    importance = root / "importance"
    assert main(["importance", str(tiny_model["data"]), "--path", str(tiny_model["checkpoint"]), "--out-dir",
                 str(importance), "--importance-limit", "8", "--no-progress"]) == 0
    # the checkpoint as fairseq saves one trained with -s en -t fr: it records its direction
    state = torch.load(tiny_model["checkpoint"], map_location="cpu", weights_only=False)
    state["cfg"]["task"]["source_lang"], state["cfg"]["task"]["target_lang"] = "en", "fr"
    directed = root / "directed.pt"
    torch.save(state, directed)
    cut = root / "cut.pt"
    cut.write_bytes(open(tiny_model["checkpoint"], "rb").read()[:100000])
    return {"cut": str(cut), "data": str(tiny_model["data"]), "checkpoint": str(tiny_model["checkpoint"]), "root": root,
            "text": str(text), "earlier": str(earlier), "importance": str(importance), "directed": str(directed)}


def cases(i):
    data, checkpoint, text, earlier = i["data"], i["checkpoint"], i["text"], i["earlier"]
    out = str(i["root"] / "new")
    study = [data, "--path", checkpoint, "--out-dir", out]
    return [
        # an option that does nothing in this combination
        (["importance", *study, "--importance-label-smoothing", "0.2"], "--importance-label-smoothing"),
        (["ablate", *study, "--mode", "all-but-one", "--heads", "E:1:1"], "--heads"),
        (["ablate", *study, "--mode", "single", "--cross-subset", "test1"], "--cross-subset"),
        (["ablate", *study, "--mode", "single", "--select-subset", "valid"], "--select-subset"),
        (["prune", *study, "--fisher", earlier, "--orders", "importance"], "--fisher"),
        (["prune", *study, "--ablation", earlier, "--orders", "importance"], "--ablation"),
        (["prune", *study, "--importance", earlier, "--importance-limit", "5"], "--importance-limit"),
        (["prune", *study, "--tune-limit", "5"], "--tune-limit"),
        (["compress", *study, "--target", "flops=50%", "--quantization-tolerance", "0.3"],
         "--quantization-tolerance"),
        (["compress", *study, "--target", "flops=50%", "--no-tune", "--tune-limit", "3"], "--tune-limit"),
        (["export", *study, "--vocabulary-map-common", "5"], "--vocabulary-map-common"),
        (["compress", *study, "--target", "heads=50%", "--finetune-updates", "0", "--finetune-processes", "2"],
         "--finetune-processes goes with"),
        (["compress", *study, "--target", "heads=50%", "--finetune-updates", "0", "--finetune-memory", "4"],
         "--finetune-memory goes with"),
        # a value outside its meaning
        (["compress", *study, "--target", "heads=50%", "--finetune-updates", "2", "--finetune-memory", "-1"],
         "--finetune-memory must be a positive number of GB"),
        (["prune", *study, "--finetune-updates", "2", "--finetune-processes", "0"],
         "--finetune-processes must be at least 1"),
        (["ablate", *study, "--types", ""], "--types"),
        (["prune", *study, "--step-percent", "50", "--max-percent", "10"], "--step-percent"),
        (["prune", *study, "--pruning-seed", "-1"], "--pruning-seed"),
        (["significance", text, text, text, "--samples", "1"], "--samples"),
        (["significance", text, text, text, "--alpha", "nan"], "--alpha is not a number"),
        (["significance", text, text, text, "--test-seed", "-1"], "--test-seed must be 0 or more, got -1"),
        (["corpus", str(i["root"] / "corpus"), "--scale", "inf"], "--scale must be a positive (finite) number"),
        (["prune", *study, "--gate-masks", str(i["root"])], "--gate-masks: file not found"),
        (["importance", data, "--path", i["directed"], "--out-dir", out, "-s", "fr", "-t", "en"], "--source-lang"),
        (["dynamics", data, "--checkpoints", os.path.dirname(checkpoint), "--out-dir", out, "--gen-subset", "nosuch"],
         "split 'nosuch' not found"),  # before the epochs' progress bar, with nothing written
        (["dynamics", data, "--checkpoints", os.path.dirname(checkpoint), "--out-dir", out, "--importance-subset",
          "nosuch"], "split 'nosuch' not found"),
        # a checkpoint cut short, a file that is none
        (["mask", "E:1:1", "--path", i["cut"]], "the file is cut short or damaged"),
        (["mask", "E:1:1", "--path", text], "it is not a PyTorch checkpoint"),
        # an output that exists, or is also an input
        (["mask", "E:1:1", "--path", checkpoint, "--out", earlier], "--out"),
        (["shrink", "--path", checkpoint, "--head-mask", "E:1:1", "--out", earlier], "--out"),
        (["shrink", "--path", checkpoint, "--head-mask", "E:1:1", "--out", checkpoint, "--overwrite"], "--out"),
        (["compensation", "--before", checkpoint, "--after", checkpoint, "--out", earlier], "--out"),
        (["significance", text, text, text, "--json", earlier], "--json"),
        (["significance", text, text, earlier, "--json", earlier, "--overwrite"], "--json"),
        # a directory that holds another run's results
        (["importance", data, "--path", checkpoint, "--out-dir", i["importance"], "--importance-limit", "4"],
         "--importance-limit 8 there, 4 now"),
        (["importance", data, "--path", checkpoint, "--out-dir", i["importance"], "--importance-limit", "8",
          "--importance-loss", "label_smoothed"], "--importance-loss"),
        (["ablate", data, "--path", checkpoint, "--out-dir", i["importance"]], "holds a run of fairseq-headprune "
                                                                               "importance"),
    ]


def test_every_bad_input_is_one_line_and_changes_nothing(inputs, capsys):
    before = {p: p.read_bytes() for p in inputs["root"].rglob("*") if p.is_file()}
    checkpoint = open(inputs["checkpoint"], "rb").read()
    failures = []
    for argv, expected in cases(inputs):
        capsys.readouterr()
        try:
            status = main(argv)
        except SystemExit as stop:  # argparse's own refusals
            status = stop.code
        stderr = capsys.readouterr().err
        lines = [line for line in stderr.strip().splitlines() if line.strip()]
        if status != 2 or len(lines) != 1 or "Traceback" in stderr or expected not in lines[0]:
            failures.append(f"{' '.join(argv)}: exit {status}: {stderr.strip()[-500:]}")
        after = {p: p.read_bytes() for p in inputs["root"].rglob("*") if p.is_file()}
        if after != before:
            changed = sorted(str(p) for p in set(after) | set(before) if after.get(p) != before.get(p))
            failures.append(f"{' '.join(argv)}: changed {changed}")
            before = after
    assert open(inputs["checkpoint"], "rb").read() == checkpoint
    assert not failures, "\n".join(failures)


def test_an_other_part_joins_a_study_directory_and_the_same_part_must_match(inputs, tiny_model, capsys):
    """A prune directory gathers a curve per scope: another scope joins it with its own settings, the same scope
    only with the same (its test's seed too); the settings all parts share (here the generation) must match
    throughout."""
    out = str(inputs["root"] / "curves")
    common = [str(tiny_model["data"]), "--path", str(tiny_model["checkpoint"]), "--out-dir", out, "--gen-subset",
              "valid", "--no-progress", "--beam", "1", "--batch-size", "64", "--step-percent", "50",
              "--max-percent", "50", "--importance", os.path.join(inputs["importance"], "importance.json")]
    assert main(["prune", *common, "--scopes", "enc-enc"]) == 0
    assert main(["prune", *common, "--scopes", "dec-dec", "--step-percent", "25"]) == 0  # another part
    record = json.load(open(os.path.join(out, "headprune-run.json")))
    assert sorted(record["parts"]) == ["curve dec-dec", "curve enc-enc"]
    capsys.readouterr()
    assert main(["prune", *common, "--scopes", "enc-enc", "--step-percent", "25"]) == 2  # the same part, other
    assert "curve enc-enc: --step-percent 50.0 there, 25.0 now" in capsys.readouterr().err
    assert main(["prune", *common, "--scopes", "enc-enc", "--test-seed", "7"]) == 2  # re-tested: refused
    assert "curve enc-enc: --test-seed 12345 there, 7 now" in capsys.readouterr().err
    assert main(["prune", *common, "--scopes", "enc-dec", "--beam", "2"]) == 2  # shared: the generation
    assert "--beam '1' there, '2' now" in capsys.readouterr().err
    assert sorted(json.load(open(os.path.join(out, "headprune-run.json")))["parts"]) == sorted(record["parts"])
