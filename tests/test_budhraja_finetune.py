"""Budhraja et al.'s protocol in `prune`: every configuration fine-tuned with its heads held at zero.

References: stock fairseq-generate (no plugin) on the fine-tuned checkpoint with the pruned heads' out_proj
input columns zeroed; an uninterrupted, unsharded run against a killed-and-resumed one dealt over two
--config-shard processes; the compensation command against a direct computation on the raw state dicts.
"""

import json
import os
import re

import numpy as np
import pytest
import torch

import fairseq_headprune.compat.torch_load  # noqa: F401  (lets torch.load read fairseq checkpoints)
from fairseq_headprune.engine.checkpoints.info import checkpoint_head_layout, training_history
from fairseq_headprune.study.masks.head_mask import parse_head_mask

from conftest import USER_DIR, kill_once_written, run, run_in_process, save_zeroed_checkpoint

UPDATES = 8  # a resume point after every update (a tenth of the fine-tune, at least one)
CURVE = (3, 6)  # the recovery curve's points on the way (0 and UPDATES are always points)
STUDY = ["--gen-subset", "test", "--no-progress", "--beam", "2", "--batch-size", "64", "--max-len-b", "20",
         "--orders", "none", "--draws", "1", "--layer-strategy", "enc-dec:top:1",
         "--finetune-updates", str(UPDATES)]
PREFIXES = {"enc-enc": "encoder.layers.{}.self_attn.", "enc-dec": "decoder.layers.{}.encoder_attn.",
            "dec-dec": "decoder.layers.{}.self_attn."}


def prune_command(tiny_model, out_dir, *extra):
    return ["fairseq-headprune", "prune", str(tiny_model["data"]), "--path", str(tiny_model["checkpoint"]),
            "--out-dir", str(out_dir), *STUDY, *extra]


def results(out_dir):
    with open(out_dir / "finetune" / "results.json") as stream:
        return {record["name"]: record for record in json.load(stream)}


@pytest.fixture(scope="module")
def sharded(tiny_model, tmp_path_factory):
    """The study dealt over two --config-shard processes into one directory, uninterrupted."""
    out_dir = tmp_path_factory.mktemp("finetune") / "sharded"
    curve = ("--finetune-curve", ",".join(map(str, CURVE)))  # trained in parts, stopping at each point
    first = run(prune_command(tiny_model, out_dir, "--config-shard", "1/2", *curve))
    second = run(prune_command(tiny_model, out_dir, "--config-shard", "2/2", *curve))
    return out_dir, first.stdout, second.stdout


def test_results_json_holds_every_configuration_before_and_after(tiny_model, sharded):
    out_dir, first, second = sharded
    assert "1 configurations are another shard's and not done yet" in first and "not done yet" not in second
    records = results(out_dir)
    assert sorted(records) == sorted(["control", next(n for n in records if n.startswith("mask."))])
    with open(out_dir / "budgets.json") as stream:
        budget_rows = {row["spec"]: row for row in json.load(stream)["rows"]}
    strategy = next(r for r in records.values() if r["name"] != "control")
    assert strategy["label"] == "enc-dec:top:1" and strategy["spec"] == "A:2:*"
    # the score without fine-tuning is the budget's own row; the test is against the fine-tuned control
    assert strategy["score_before"] == pytest.approx(budget_rows["A:2:*"]["bleu"])
    assert 0.0 <= strategy["p_value_vs_control"] <= 1.0
    assert strategy["delta_vs_control"] == pytest.approx(strategy["score_after"] - records["control"]["score_after"])
    for record in records.values():
        assert os.path.isfile(record["checkpoint"]) and record["updates"] == UPDATES
        assert abs(record["score_after"] - record["score_before"]) > 0.01  # fine-tuning changed the model
    assert records["control"]["spec"] == "none" and "p_value_vs_control" not in records["control"]
    assert "Budhraja et al.'s protocol" in second
    # against the unpruned model as the study scored it (the paper's baseline), the control included
    for record in records.values():
        assert record["delta_vs_unpruned"] == pytest.approx(record["score_after"] - records["control"]["score_before"])
        assert 0.0 <= record["p_value_vs_unpruned"] <= 1.0
    # the plan, before any fine-tuning, read off the checkpoint's own training
    assert re.search(r"fine-tuning 2 configurations, 8 updates \([\d.]+ epochs\) each, scored at 4 points of the "
                     r"recovery curve; the checkpoint trained \d+ updates \(\d+ epochs\); at its training speed", first)


def test_the_recovery_curve_starts_at_the_score_before_and_ends_at_the_score_after(tiny_model, sharded):
    out_dir, _, _ = sharded
    records = results(out_dir)
    for record in records.values():
        curve = record["curve"]
        assert [p["updates"] for p in curve] == [0, *CURVE, UPDATES], record["name"]
        # each point scored from its own saved checkpoint: the masked start, and the fine-tune's end
        assert curve[0]["score"] == pytest.approx(record["score_before"], abs=1e-9), record["name"]
        assert curve[-1]["score"] == pytest.approx(record["score_after"], abs=1e-9), record["name"]
        assert len({round(p["score"], 6) for p in curve}) > 1  # the model changed along the way
        control_at = {p["updates"]: p["score"] for p in records["control"]["curve"]}
        for point in curve:
            assert point["gap_vs_control"] == pytest.approx(point["score"] - control_at[point["updates"]])
    assert (out_dir / "finetune" / "curves.png").is_file()
    table = (out_dir / "finetune" / "results.md").read_text()
    assert "| budget (draws) | 0 | 3 | 6 | 8 |" in table and "| `enc-dec:top:1` (1) |" in table


@pytest.mark.parametrize("point", ["end", "curve"])
def test_a_finetuned_configuration_translates_as_stock_fairseq_with_its_heads_zeroed(tiny_model, sharded, tmp_path,
                                                                                     point):
    """The fine-tuned checkpoint, and a point of its recovery curve half-way (its own saved checkpoint)."""
    out_dir, _, _ = sharded
    record = next(r for r in results(out_dir).values() if r["name"] != "control")
    checkpoint = record["checkpoint"]
    scored = os.path.join(os.path.dirname(checkpoint), "eval")
    if point == "curve":
        checkpoint = os.path.join(os.path.dirname(checkpoint), "curve", f"update-{CURVE[0]}.pt")
        scored = checkpoint[:-len(".pt")]
    layout = checkpoint_head_layout(checkpoint)
    head_mask = parse_head_mask(record["spec"], layout)
    zeroed = tmp_path / "zeroed.pt"
    save_zeroed_checkpoint(checkpoint, PREFIXES["enc-dec"], layout["enc-dec"][1], head_mask["enc-dec"], zeroed)
    state = torch.load(zeroed, map_location="cpu")
    delattr(state["cfg"]["model"], "headprune_head_mask")  # nothing of the plugin left
    torch.save(state, zeroed)
    # fairseq's own translation task (the plugin's --user-dir only lets torch.load read the Namespace in the file)
    generated = run(["fairseq-generate", str(tiny_model["data"]), "--path", str(zeroed), "--task", "translation",
                     "--user-dir", USER_DIR,
                     "--gen-subset", "test", "--beam", "2", "--batch-size", "64", "--max-len-b", "20",
                     "--required-batch-size-multiple", "1"])
    stock = dict((int(line.split("\t")[0][2:]), line.split("\t")[2])
                 for line in generated.stdout.splitlines() if line.startswith("H-"))
    with open(os.path.join(scored, "sweeps", "test", "configs", "baseline.json")) as f:
        study = json.load(f)["hypotheses"]
    assert len(stock) == len(study) > 0
    assert [stock[i] for i in range(len(study))] == study


def test_a_killed_finetune_resumes_and_equals_the_uninterrupted_sharded_run(tiny_model, sharded, tmp_path):
    """Killed once a resume point exists mid-training, then run again in one process (not sharded, and in one part:
    no curve): every record equals the sharded, uninterrupted run's, trained in parts, and so do the weights."""
    out_dir = tmp_path / "resumed"
    no_curve = ("--finetune-curve", "none")
    resume_point = out_dir / "finetune" / "control" / "train" / "checkpoint_last.pt"
    kill_once_written(prune_command(tiny_model, out_dir, *no_curve), resume_point, timeout=600)
    # killed mid-fine-tune: a resume point (possibly cut while being written), no finished record
    assert resume_point.exists() and not (out_dir / "finetune" / "control" / "record.json").exists()
    run(prune_command(tiny_model, out_dir, *no_curve))
    reference, resumed = results(sharded[0]), results(out_dir)
    assert all(not record["curve"] for record in resumed.values())
    assert sorted(reference) == sorted(resumed)
    for name, record in reference.items():
        assert resumed[name]["score_after"] == pytest.approx(record["score_after"], abs=1e-9), name
        assert resumed[name]["score_before"] == pytest.approx(record["score_before"], abs=1e-9), name
        old, new = (torch.load(r["checkpoint"], map_location="cpu")["model"] for r in (record, resumed[name]))
        assert all(torch.equal(old[key], new[key]) for key in old), name


def test_compensation_of_a_finetuned_configuration_equals_a_direct_computation(tiny_model, sharded, tmp_path):
    record = next(r for r in results(sharded[0]).values() if r["name"] != "control")
    out = tmp_path / "compensation.json"
    printed = run(["fairseq-headprune", "compensation", "--before", str(tiny_model["checkpoint"]),
                   "--after", record["checkpoint"], "--out", str(out)]).stdout
    assert "(paper: < 10%)" in printed and (tmp_path / "compensation.png").is_file()
    with open(out) as stream:
        measured = json.load(stream)
    # the pruned heads are the ones the fine-tuned checkpoint records
    assert measured["pruned"] == [f"A:2:{h}" for h in range(1, 9)]
    before, after = (torch.load(p, map_location="cpu")["model"]
                     for p in (tiny_model["checkpoint"], record["checkpoint"]))
    letters = {"enc-enc": "E", "enc-dec": "A", "dec-dec": "D"}
    for attention_type, prefix in PREFIXES.items():
        for layer in range(2):
            for head in range(8):
                width = before[prefix.format(layer) + "q_proj.weight"].size(0) // 8
                rows = slice(head * width, (head + 1) * width)
                old = np.concatenate([before[prefix.format(layer) + f"{p}_proj.weight"][rows].numpy() for p in "qkv"])
                new = np.concatenate([after[prefix.format(layer) + f"{p}_proj.weight"][rows].numpy() for p in "qkv"])
                value = measured["heads"][f"{letters[attention_type]}:{layer + 1}:{head + 1}"]
                assert value["mean_abs_change"] == pytest.approx(float(np.abs(new - old).mean()), rel=1e-5)
                assert value["relative_change"] == pytest.approx(
                    float(np.linalg.norm(new - old) / np.linalg.norm(old)), rel=1e-5)
    # the pruned heads' weights are held: they did not move
    assert all(measured["heads"][name]["mean_abs_change"] == 0.0 for name in measured["pruned"])


def test_bad_budhraja_input_is_one_line_and_writes_nothing(tiny_model, tmp_path, capsys):
    no_train = tmp_path / "no-train"
    no_train.mkdir()
    for name in os.listdir(tiny_model["data"]):
        if not name.startswith("train"):
            os.symlink(os.path.join(tiny_model["data"], name), no_train / name)
    cases = [
        (tiny_model["data"], ["--random-level", "95"], "cannot keep 1 head(s) in every one of the model's 6 layers"),
        (tiny_model["data"], ["--layer-strategy", "top:3"], "prunes 3 layers; enc-enc has 2"),
        (no_train, ["--layer-strategy", "odd"], "has no training split"),
        (tiny_model["data"], ["--layer-strategy", "odd", "--finetune-curve", "1,9"],
         "--finetune-curve 9: a point is an update count above 0 and below --finetune-updates 2"),
        (tiny_model["data"], ["--layer-strategy", "odd", "--finetune-curve", "ten"], "expected update counts"),
        (tiny_model["data"], ["--orders", "importance", "--finetune-levels", "55"],
         "--finetune-levels 55: no step of the all curves prunes 27 of 48 heads"),
        (tiny_model["data"], ["--orders", "none", "--layer-strategy", "odd", "--finetune-levels", "50"],
         "--finetune-levels fine-tunes the curves' steps: give --orders"),
    ]
    for data_dir, options, message in cases:
        out_dir = tmp_path / "out"
        result = run_in_process(["prune", str(data_dir), "--path", str(tiny_model["checkpoint"]), "--out-dir",
                                 str(out_dir), "--gen-subset", "valid", "--finetune-updates", "2", *options], capsys)
        assert result.returncode == 2, result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and message in lines[0], result.stderr
        assert not out_dir.exists()
    # compensation between checkpoints of different architectures
    state = torch.load(tiny_model["checkpoint"], map_location="cpu")
    for key in [k for k in state["model"] if k.startswith("encoder.layers.1.")]:
        del state["model"][key]
    torch.save(state, tmp_path / "shallower.pt")
    out = tmp_path / "c.json"
    result = run_in_process(["compensation", "--before", str(tiny_model["checkpoint"]),
                             "--after", str(tmp_path / "shallower.pt"), "--out", str(out)], capsys)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "of different architectures" in result.stderr and not out.exists()


def test_recording_the_recovery_curve_does_not_change_the_fine_tune(tiny_model, sharded, tmp_path):
    """The curve trains in parts, stopping at each point to save it and resuming in a new process; every record and
    the weights after the last update are those of the same fine-tune run in one part without a curve, bit for bit
    (fairseq reseeds every update from its count and restores the data iterator's place; the points are scored
    after the training, on copies)."""
    out_dir = tmp_path / "straight"
    run(prune_command(tiny_model, out_dir, "--finetune-curve", "none"))
    curved, straight = results(sharded[0]), results(out_dir)
    assert all(record["curve"] for record in curved.values()) and not any(r["curve"] for r in straight.values())
    for name, record in curved.items():
        assert straight[name]["score_after"] == record["score_after"], name
        old, new = (torch.load(r["checkpoint"], map_location="cpu")["model"] for r in (record, straight[name]))
        assert sorted(old) == sorted(new) and all(torch.equal(old[key], new[key]) for key in old), name


def test_the_fine_tunes_seed_orders_the_batches_and_another_recipe_is_refused(tiny_model, sharded, tmp_path, capsys):
    """--finetune-seed: the checkpoint's own seed given explicitly is the default run, bit for bit (the sharded run,
    which trained in parts: the same weights as one part); another seed trains on other batches with other dropout
    (other weights). A directory holding fine-tunes of another length, curve, learning rate or seed is refused in
    one line and left as it was: its records would otherwise be merged as this run's."""
    own_seed = training_history(str(tiny_model["checkpoint"])).seed
    reference = results(sharded[0])
    no_curve = ("--finetune-curve", "none")
    for seed in (own_seed, own_seed + 1):
        out_dir = tmp_path / f"seed{seed}"
        run(prune_command(tiny_model, out_dir, *no_curve, "--finetune-seed", str(seed)))
        seeded = results(out_dir)
        assert sorted(seeded) == sorted(reference)
        for name, record in reference.items():
            assert seeded[name]["seed"] == seed, name
            old, new = (torch.load(r["checkpoint"], map_location="cpu")["model"] for r in (record, seeded[name]))
            same = all(torch.equal(old[key], new[key]) for key in old)
            assert same == (seed == own_seed), (name, seed)
    # refused: the sharded run's directory asked for another recipe (its records: 8 updates, curve 3, 6, seed 1)
    curve = ("--finetune-curve", ",".join(map(str, CURVE)))
    merged = (sharded[0] / "finetune" / "results.json").read_bytes()
    cases = [
        (("--finetune-updates", "6", "--finetune-curve", "3"), "fine-tuned 8 updates, not 6 updates"),
        (no_curve, "scored at update 3, 6, 8, not the end only"),
        ((*curve, "--finetune-lr", "0.5"), "at learning rate "),
        ((*curve, "--finetune-seed", str(own_seed + 1)), f"under seed {own_seed}, not {own_seed + 1}"),
    ]
    for options, message in cases:
        result = run_in_process(prune_command(tiny_model, sharded[0], *options)[1:], capsys)
        assert result.returncode == 2, result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and message in lines[0] and "holds a configuration" in lines[0], result.stderr
        assert (sharded[0] / "finetune" / "results.json").read_bytes() == merged
    # the plan refuses what the run would
    plan = run_in_process(prune_command(tiny_model, sharded[0], *curve, "--finetune-seed", str(own_seed + 1),
                                        "--finetune-plan")[1:], capsys)
    assert plan.returncode == 2 and f"under seed {own_seed}, not {own_seed + 1}" in plan.stderr, plan.stderr
    # a fine-tune begun under one seed (killed before its record) is not resumed under another
    begun = tmp_path / f"seed{own_seed + 1}"
    (begun / "finetune" / "control" / "record.json").unlink()
    result = run_in_process(prune_command(tiny_model, begun, *no_curve)[1:], capsys)
    assert result.returncode == 2 and f"under seed {own_seed + 1}, not {own_seed}" in result.stderr, result.stderr


def test_each_random_draw_is_fine_tuned_under_its_own_seed(tiny_model, tmp_path):
    """Budhraja et al. sample and fine-tune each of their draws anew, so draw d of a random level trains under the
    seed + d - 1 (its batches' order and dropout vary with its mask); draw 1 and the control share the seed.
    Reference: draw 2's mask fine-tuned directly (``finetune_held``, in this process) under that seed."""
    from fairseq_headprune.engine.finetune.held import finetune_held, write_masked_start
    from fairseq_headprune.engine.finetune.resume import with_resume_points
    from fairseq_headprune.study.finetune.settings import FinetuneSettings

    own_seed = training_history(str(tiny_model["checkpoint"])).seed
    out_dir = tmp_path / "draws"
    run(["fairseq-headprune", "prune", str(tiny_model["data"]), "--path", str(tiny_model["checkpoint"]),
         "--out-dir", str(out_dir), "--gen-subset", "test", "--no-progress", "--beam", "2", "--batch-size", "64",
         "--max-len-b", "20", "--orders", "none", "--random-level", "50", "--draws", "2",
         "--finetune-updates", str(UPDATES), "--finetune-curve", "none"])
    records = results(out_dir)
    seeds = {record["label"]: record["seed"] for record in records.values()}
    assert seeds == {"unpruned (control)": own_seed, "50% draw 1": own_seed, "50% draw 2": own_seed + 1}
    second = next(record for record in records.values() if record["label"] == "50% draw 2")
    start = tmp_path / "start.pt"
    layout = checkpoint_head_layout(str(tiny_model["checkpoint"]))
    write_masked_start(str(tiny_model["checkpoint"]), str(start), parse_head_mask(second["spec"], layout), None)
    settings = with_resume_points(FinetuneSettings(updates=UPDATES, seed=own_seed + 1))
    outcome = finetune_held(str(start), str(tiny_model["data"]), str(tmp_path / "direct"), "translation", settings,
                            cpu=True, progress=False)
    direct = torch.load(outcome.checkpoint, map_location="cpu")["model"]
    fine_tuned = torch.load(second["checkpoint"], map_location="cpu")["model"]
    assert sorted(direct) == sorted(fine_tuned) and all(torch.equal(direct[k], fine_tuned[k]) for k in direct)
