"""`fairseq-headprune prune` on the tiny trained model."""

import json
import os
import re

import pytest

from fairseq_headprune.engine.checkpoints.info import checkpoint_head_layout
from fairseq_headprune.study.masks.head_mask import count_masked, head_mask_to_spec, parse_head_mask
from fairseq_headprune.study.pruning.curves import (
    ascending,
    curve_steps,
    heads_in_scope,
    importance_scores,
    mask_name,
    pruning_mask,
    random_order,
    step_counts,
)

from conftest import USER_DIR, run

GENERATION = ["--beam", "2", "--batch-size", "64"]
STUDY = [
    "--orders", "importance,iterative,random", "--scopes", "all,enc-dec", "--step-percent", "25",
    "--max-percent", "50", "--draws", "2", "--pruning-seed", "5",
    "--layer-budget", "84 48 84", "--type-budget", "(8,12,10)",
]


def prune(tiny_model, out_dir, *extra, check=True):
    return run(
        ["fairseq-headprune", "prune", tiny_model["data"], "--path", tiny_model["checkpoint"],
         "--gen-subset", "valid", "--out-dir", out_dir, "--no-progress", *GENERATION, *extra],
        check=check,
    )


@pytest.fixture(scope="module")
def study(tiny_model, tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("prune") / "out"
    result = prune(tiny_model, out_dir, *STUDY)
    steps = {"rows": []}
    for scope in ("all", "enc-dec"):
        with open(out_dir / f"prune_steps.{scope}.json") as stream:
            content = json.load(stream)
        steps["rows"] += content["rows"]
        steps["settings"] = content["settings"]
    return out_dir, steps, result.stdout


def rows_of(steps, scope, order, draw=None):
    return sorted(
        (r for r in steps["rows"] if r["scope"] == scope and r["order"] == order and r["draw"] == draw),
        key=lambda r: r["step"],
    )


def test_step_zero_is_the_unpruned_model(study):
    out_dir, steps, stdout = study
    with open(out_dir / "sweeps" / "valid" / "configs" / "baseline.json") as stream:
        baseline = json.load(stream)  # translated through fairseq's unmasked (fused) path
    zero = [r for r in steps["rows"] if r["step"] == 0]
    assert len(zero) == 2 * (2 + 2)  # 2 scopes x (importance, iterative, 2 random draws)
    for row in zero:
        assert row["spec"] == "none" and row["pruned"] == 0
        # step 0 runs with every xi = 1 (the masked path): the same translations
        assert row["bleu"] == pytest.approx(baseline["bleu"], abs=1e-9)
        assert row["p_value"] == 1.0 and not row["significant"]
    assert steps["settings"]["baseline_bleu"] == pytest.approx(baseline["bleu"])
    assert f"unpruned BLEU {baseline['bleu']:.2f} on valid" in stdout


def test_a_type_scope_prunes_only_that_type(tiny_model, study):
    _, steps, _ = study
    layout = checkpoint_head_layout(str(tiny_model["checkpoint"]))
    scoped = [r for r in steps["rows"] if r["scope"] == "enc-dec"]
    assert {r["pruned"] for r in scoped} == {0, 4, 8}
    for row in scoped:
        head_mask = parse_head_mask(row["spec"], layout)
        assert count_masked(head_mask) == row["pruned"]
        assert head_mask["enc-enc"].all() and head_mask["dec-dec"].all()
    assert {r["pruned"] for r in steps["rows"] if r["scope"] == "all"} == {0, 12, 24}


def test_importance_orders_follow_the_estimated_importance(tiny_model, study):
    from fairseq_headprune.study.importance.scores import read_importance_file
    from fairseq_headprune.study.masks.head_mask import full_mask

    out_dir, steps, _ = study
    layout = checkpoint_head_layout(str(tiny_model["checkpoint"]))
    once = read_importance_file(str(out_dir / "importance" / f"{mask_name(full_mask(layout))}.json"), layout)
    assert once.settings["sentences"] == 200  # the valid split
    ranking = ascending(importance_scores(once.importance), heads_in_scope(layout, "all"))
    expected = curve_steps(layout, "all", "importance", ranking, step_counts(48, 25, 50))
    assert ([r["spec"] for r in rows_of(steps, "all", "importance")]
            == [head_mask_to_spec(s.head_mask) for s in expected])
    iterative = rows_of(steps, "all", "iterative")
    assert iterative[1]["spec"] == rows_of(steps, "all", "importance")[1]["spec"]
    # step 2 re-ranked the remaining heads on the model with step 1's heads masked
    step1 = parse_head_mask(iterative[1]["spec"], layout)
    again = read_importance_file(str(out_dir / "importance" / f"{mask_name(step1)}.json"), layout)
    pruned = [h for h in heads_in_scope(layout, "all") if step1[h[0]][h[1], h[2]] == 0]
    remaining = [h for h in heads_in_scope(layout, "all") if h not in pruned]
    chosen = ascending(importance_scores(again.importance), remaining)[:12]
    assert iterative[2]["spec"] == head_mask_to_spec(pruning_mask(layout, pruned + chosen))


def test_random_curves_are_reproducible_from_the_seed(tiny_model, study):
    _, steps, _ = study
    layout = checkpoint_head_layout(str(tiny_model["checkpoint"]))
    for scope in ("all", "enc-dec"):
        candidates = heads_in_scope(layout, scope)
        counts = step_counts(len(candidates), 25, 50)
        specs = []
        for draw in (1, 2):
            expected = curve_steps(layout, scope, "random", random_order(candidates, 5, draw, scope), counts)
            got = [r["spec"] for r in rows_of(steps, scope, "random", draw)]
            assert got == [head_mask_to_spec(s.head_mask) for s in expected]
            specs.append(got)
        assert specs[0] != specs[1]


def test_a_pruning_step_scores_as_fairseq_generate(tiny_model, study):
    _, steps, _ = study
    row = rows_of(steps, "all", "importance")[2]
    result = run(
        ["fairseq-generate", tiny_model["data"], "--path", tiny_model["checkpoint"], "--user-dir", USER_DIR,
         "--task", "fairseq-headprune", "--gen-subset", "valid", "--head-mask", row["spec"],
         "--required-batch-size-multiple", "1", *GENERATION]
    )
    assert float(re.search(r"BLEU4 = ([\d.]+)", result.stdout).group(1)) == pytest.approx(row["bleu"], abs=0.006)


def test_tables_figures_and_budgets(study):
    out_dir, _, stdout = study
    for name in ("prune_curves.all.tsv", "prune_curves.md", "prune_curves.all.png", "prune_curves.enc-dec.png",
                 "prune_types.png", "budgets_summary.md", "budgets.tsv"):
        assert os.path.getsize(out_dir / name) > 0, name
    with open(out_dir / "prune_curves.enc-dec.json") as stream:
        curves = json.load(stream)["rows"]
    random_points = [r for r in curves if r["order"] == "random"]
    assert random_points and all(r["draws"] == 2 for r in random_points)
    with open(out_dir / "budgets_summary.json") as stream:
        budgets = {r["budget"]: r for r in json.load(stream)["rows"]}
    assert budgets["84 48 84"]["percent"] == pytest.approx(25.0)
    assert budgets["(8,12,10)"]["percent"] == pytest.approx(37.5)
    with open(out_dir / "budgets.json") as stream:
        layout_rows = [r for r in json.load(stream)["rows"] if r["budget"] == "84 48 84"]
    layout = {"enc-enc": (2, 8), "enc-dec": (2, 8), "dec-dec": (2, 8)}
    for row in layout_rows:
        head_mask = parse_head_mask(row["spec"], layout)
        kept = [int(head_mask[t][layer].sum()) for t in ("enc-enc", "enc-dec", "dec-dec") for layer in range(2)]
        assert kept == [8, 4, 4, 8, 8, 4]
    assert "(8,12,10)" in stdout and "84 48 84" in stdout


def test_a_rerun_reuses_every_result(tiny_model, study):
    out_dir, _, stdout = study
    configs = out_dir / "sweeps" / "valid" / "configs"
    before = {p.name: p.stat().st_mtime_ns for p in configs.iterdir()}
    table = (out_dir / "prune_curves.md").read_text()
    again = prune(tiny_model, out_dir, *STUDY)
    assert {p.name: p.stat().st_mtime_ns for p in configs.iterdir()} == before
    assert (out_dir / "prune_curves.md").read_text() == table
    assert again.stdout == stdout


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--layer-budget", "844 48 84"],
         "layer budget '844 48 84': enc-enc group '844' gives 3 layers, the model has 2"),
        (["--layer-budget", "94 48 84"],
         "layer budget '94 48 84': enc-enc layer 1 keeps 9 heads, the model has 8 per layer"),
        (["--type-budget", "(8,12)"],
         "type budget '(8,12)': expected 3 head counts (enc-enc, enc-dec, dec-dec), e.g. '(14,31,30)'"),
        (["--orders", "ablation"], "--orders ablation needs --ablation FILE (single.json of ablate --mode single)"),
        (["--orders", "importance,magnitude"], "--orders: unknown value 'magnitude' (expected importance, iterative, "
                                               "ablation, random, fisher, fisher-rearranged, gates)"),
        (["--tune-masks"], "--tune-subset valid is the split the study is evaluated on (--gen-subset); "
                           "tune on training or validation data"),
        (["--tune-masks", "--tune-orders", "random", "--tune-subset", "train"],
         "--tune-orders random: not one of --orders (importance)"),
        (["--scopes", "encoder"], "--scopes: unknown value 'encoder' (expected all, enc-enc, enc-dec, dec-dec)"),
        (["--draws", "0"], "--draws must be positive, got 0"),
        (["--pruning-seed", "-1"], "--pruning-seed must be from 0 to 4294967295, got -1"),
        (["--step-percent", "0"], "--step-percent must be in (0, 100], got 0"),
    ],
)
def test_bad_input_is_one_line(tiny_model, tmp_path, extra, message):
    result = prune(tiny_model, tmp_path / "out", *extra, check=False)
    assert result.returncode == 2
    assert result.stderr.strip() == f"fairseq-headprune prune: error: {message}"


def test_an_importance_file_of_another_model_is_refused(tiny_model, study, tmp_path):
    out_dir, _, _ = study
    source = next((out_dir / "importance").iterdir())
    payload = json.loads(source.read_text())
    for scores in payload["importance"].values():
        scores.append(list(scores[0]))  # a third layer
    other = tmp_path / "other_model.json"
    other.write_text(json.dumps(payload))
    result = prune(tiny_model, tmp_path / "out", "--importance", other, check=False)
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"fairseq-headprune prune: error: --importance: importance file {other} is for a model with "
        "dec-dec=3x8 enc-dec=3x8 enc-enc=3x8, not dec-dec=2x8 enc-dec=2x8 enc-enc=2x8"
    )


def test_fisher_scores_order_the_heads_and_are_not_mixed_with_importance(tiny_model, study, tmp_path):
    """--importance-method fisher: the iterative order re-estimates F_h; a file of the other kind is refused."""
    out_dir, _, _ = study
    source = next(p for p in (out_dir / "importance").iterdir() if p.name.endswith(".json"))
    payload = json.loads(source.read_text())
    payload["method"] = "fisher"
    fisher_file = tmp_path / "fisher.json"
    fisher_file.write_text(json.dumps(payload))
    result = prune(tiny_model, tmp_path / "out", "--importance", fisher_file, check=False)
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"fairseq-headprune prune: error: --importance {fisher_file} holds fisher scores, "
        "but --importance-method is gradient"
    )
    fisher = tmp_path / "fisher"
    prune(tiny_model, fisher, "--orders", "iterative", "--step-percent", "25", "--max-percent", "25",
          "--importance-method", "fisher", "--importance-limit", "16")
    from fairseq_headprune.study.importance.scores import read_importance_file
    from fairseq_headprune.study.masks.head_mask import full_mask

    layout = checkpoint_head_layout(str(tiny_model["checkpoint"]))
    first = read_importance_file(str(fisher / "importance" / f"{mask_name(full_mask(layout))}.json"), layout)
    assert first.method == "fisher" and first.settings["sentences"] == 16
    curves = json.loads((fisher / "prune_curves.all.json").read_text())
    assert curves["settings"]["importance_method"] == "fisher"
    # the first step removes the heads of lowest per-layer-normalised F_h
    ranking = ascending(importance_scores(first.importance), heads_in_scope(layout, "all"))
    expected = curve_steps(layout, "all", "iterative", ranking, step_counts(48, 25, 25))
    rows = json.loads((fisher / "prune_steps.all.json").read_text())["rows"]
    assert [r["spec"] for r in sorted(rows, key=lambda r: r["step"])] == [
        head_mask_to_spec(s.head_mask) for s in expected]


def test_fisher_search_curves_and_tuned_masks_translate_as_the_tuned_shrunk_model(tiny_model, tmp_path):
    """Kwon et al.: the search's masks at each level, rearranged, and tuned; a tuned step is what the
    tuned, shrunk checkpoint translates."""
    from fairseq_headprune.study.importance.scores import read_importance_file
    from fairseq_headprune.study.masks.head_mask import full_mask
    from fairseq_headprune.study.search.mask_search import pruned_count_search

    out = tmp_path / "kwon"
    result = prune(tiny_model, out, "--orders", "fisher,fisher-rearranged", "--tune-masks",
                   "--tune-orders", "fisher-rearranged", "--step-percent", "50", "--max-percent", "50",
                   "--importance-limit", "64", "--tune-subset", "train", "--tune-limit", "64")
    assert "fisher-rearranged+tuned" in result.stdout and "tuned on 64" in result.stdout
    layout = checkpoint_head_layout(str(tiny_model["checkpoint"]))
    fisher = read_importance_file(str(out / "importance-fisher" / f"{mask_name(full_mask(layout))}.json"), layout)
    assert fisher.method == "fisher" and fisher.fisher_blocks is not None
    steps = json.loads((out / "prune_steps.all.json").read_text())
    rows = {r["order"]: r for r in steps["rows"] if r["step"] == 1}
    for order, rearranged in (("fisher", False), ("fisher-rearranged", True)):
        expected = pruned_count_search(fisher.importance, fisher.fisher_blocks, 24, rearranged)
        assert rows[order]["spec"] == head_mask_to_spec(expected)
    tuned = rows["fisher-rearranged+tuned"]
    assert tuned["spec"] == rows["fisher-rearranged"]["spec"] and tuned["config"] != rows["fisher-rearranged"]["config"]
    costs = steps["settings"]["method_costs"]
    assert costs["fisher-rearranged+tuned"]["tuning_sentences"] == 64
    assert costs["fisher-rearranged+tuned"]["seconds"] > costs["fisher-rearranged"]["seconds"] > 0
    # the tuned step's BLEU is the tuned, shrunk checkpoint's, translated by fairseq-generate
    tuning_file = out / "tuning" / f"{mask_name(parse_head_mask(tuned['spec'], layout))}.json"
    run(["fairseq-headprune", "shrink", "--path", tiny_model["checkpoint"], "--tuning", tuning_file,
         "--out", tmp_path / "tuned.pt"])
    generated = run(
        ["fairseq-generate", tiny_model["data"], "--path", tmp_path / "tuned.pt", "--user-dir", USER_DIR,
         "--task", "fairseq-headprune", "--gen-subset", "valid", "--required-batch-size-multiple", "1", *GENERATION]
    )
    assert float(re.search(r"BLEU4 = ([\d.]+)", generated.stdout).group(1)) == pytest.approx(tuned["bleu"], abs=0.006)


def test_the_per_type_scripts_add_up_to_figure_4(tiny_model, study, tmp_path):
    import sys

    from conftest import REPO

    out_dir, _, _ = study
    importance = next((out_dir / "importance").iterdir())  # any importance file of this model
    env = {"VENV": os.path.dirname(os.path.dirname(sys.executable)), "STEP": "50", "MAX": "50",
           "ORDERS": "importance", "IMPORTANCE": str(importance), "GEN_ARGS": "--beam 1 --batch-size 64"}
    for script in ("prune_enc_enc.sh", "prune_dec_dec.sh"):
        run(["bash", REPO / "scripts" / "studies" / script, tiny_model["data"], tiny_model["checkpoint"], "valid",
             tmp_path / "types"], env=dict(env, EXTRA_ARGS="--no-progress"))
    table = (tmp_path / "types" / "prune_curves.md").read_text()
    assert "**Enc-Enc** (16 heads" in table and "**Dec-Dec** (16 heads" in table
    assert os.path.getsize(tmp_path / "types" / "prune_types.png") > 0
    wrong = run(["bash", REPO / "scripts" / "studies" / "prune.sh", "decoder", tiny_model["data"],
                 tiny_model["checkpoint"], "valid", tmp_path / "x"], env=env, check=False)
    assert wrong.returncode == 2 and wrong.stderr.startswith("unknown scope: decoder")


# ---- FFN neurons and the joint search (prune --structure ffn | joint), the FLOPs axis -----------------------

SHORT = ["--max-len-b", "30"]  # neuron pruning by low scores can stop the model from ending its sentences




def lowest_neurons(scores, count, normalize):
    """The ``count`` neurons of lowest (per-layer l2-normalised) score, as an FFN mask; ties by position."""
    import torch

    keyed = []
    for ffn_type in ("enc-ffn", "dec-ffn"):
        values = torch.tensor(scores[ffn_type], dtype=torch.float64)
        if normalize:
            values = values / values.norm(dim=1, keepdim=True)
        keyed += [(float(values[layer, n]), ffn_type, layer, n) for layer in range(2) for n in range(128)]
    keyed.sort(key=lambda k: (k[0], ("enc-ffn", "dec-ffn").index(k[1]), k[2], k[3]))
    ffn_mask = {t: torch.ones(2, 128) for t in ("enc-ffn", "dec-ffn")}
    for _, ffn_type, layer, n in keyed[:count]:
        ffn_mask[ffn_type][layer, n] = 0.0
    return ffn_mask


def test_ffn_curves_prune_neurons_by_score_at_random_and_by_the_search(tiny_model, neuron_scores, tiny_flops,
                                                                        tmp_path):
    from fairseq_headprune.study.masks.ffn_mask import ffn_mask_to_spec

    out = tmp_path / "ffn"
    result = prune(tiny_model, out, "--structure", "ffn", "--orders", "importance,random,fisher",
                   "--importance", neuron_scores, "--importance-method", "fisher", "--fisher", neuron_scores,
                   "--step-percent", "10", "--max-percent", "10", "--draws", "1", *SHORT)
    rows = {r["order"]: r for r in json.loads((out / "prune_steps.ffn.json").read_text())["rows"] if r["step"] == 1}
    scores = json.loads(neuron_scores.read_text())["neuron_importance"]
    for order in ("importance", "random", "fisher"):
        row = rows[order]
        # 10% of the FFN layers' FLOPs: 52 of 512 neurons (rounded up), no head
        assert (row["neurons_pruned"], row["heads_pruned"], row["spec"]) == (52, 0, "none"), order
        assert row["percent"] == pytest.approx(100 * 52 / 512) and row["x_axis"] == "units"
        assert row["flops_removed_percent"] == pytest.approx(100 * 52 * tiny_flops["neuron"] / tiny_flops["total"])
    # importance: the lowest per-layer-normalised scores; the search (equal costs): the lowest raw F
    assert rows["importance"]["ffn_spec"] == ffn_mask_to_spec(lowest_neurons(scores, 52, normalize=True))
    assert rows["fisher"]["ffn_spec"] == ffn_mask_to_spec(lowest_neurons(scores, 52, normalize=False))
    assert rows["random"]["ffn_spec"] not in (rows["importance"]["ffn_spec"], rows["fisher"]["ffn_spec"])
    assert "BLEU with x% of the FFN neurons pruned:" in result.stdout and "  ffn     importance" in result.stdout
    assert "**FFN neurons**" in (out / "prune_curves.md").read_text()
    assert os.path.getsize(out / "prune_curves.ffn.png") > 0
    # a step's BLEU is what fairseq-generate translates with its neurons masked
    generated = run(
        ["fairseq-generate", tiny_model["data"], "--path", tiny_model["checkpoint"], "--user-dir", USER_DIR,
         "--task", "fairseq-headprune", "--gen-subset", "valid", "--ffn-mask", rows["random"]["ffn_spec"],
         "--required-batch-size-multiple", "1", *GENERATION, *SHORT]
    )
    assert float(re.search(r"BLEU4 = ([\d.]+)", generated.stdout).group(1)) == pytest.approx(rows["random"]["bleu"],
                                                                                             abs=0.006)


def test_joint_curves_and_head_curves_on_one_flops_axis(tiny_model, neuron_scores, tiny_flops, tmp_path):
    from fairseq_headprune.study.importance.scores import read_fisher_file
    from fairseq_headprune.study.masks.ffn_mask import ffn_mask_to_spec
    from fairseq_headprune.study.search.costs import ffn_flops_costs, flops_costs, merge_costs
    from fairseq_headprune.study.search.mask_search import search_mask

    out = tmp_path / "together"
    prune(tiny_model, out, "--structure", "joint", "--orders", "fisher,fisher-rearranged", "--fisher", neuron_scores,
          "--step-percent", "20", "--max-percent", "20", *SHORT)
    layout = {t: (2, 8) for t in ("enc-enc", "enc-dec", "dec-dec")}
    fisher = read_fisher_file(str(neuron_scores), layout)
    costs = merge_costs(flops_costs(layout, {t: (64, 8) for t in layout}, 32),
                        ffn_flops_costs({"enc-ffn": (2, 128), "dec-ffn": (2, 128)}, {"enc-ffn": 64, "dec-ffn": 64}))
    flops = tiny_flops["total"]
    assert costs.full_cost() == flops
    rows = [r for r in json.loads((out / "prune_steps.joint.json").read_text())["rows"] if r["step"] == 1]
    for row in rows:
        expected = search_mask(fisher.importance, fisher.fisher_blocks, costs, 0.8 * flops,
                               row["order"] == "fisher-rearranged", neurons=fisher.neuron_importance)
        assert row["spec"] == head_mask_to_spec(expected.head_mask)
        assert row["ffn_spec"] == ffn_mask_to_spec(expected.ffn_mask)
        assert row["percent"] == row["flops_removed_percent"] == pytest.approx(100 * (1 - expected.cost / flops))
        assert row["percent"] >= 20 and row["heads_pruned"] > 0 and row["neurons_pruned"] > 0
    # head curves into the same directory, on the same axis: 24 heads removed
    result = prune(tiny_model, out, "--orders", "importance", "--importance", neuron_scores, "--importance-method",
                   "fisher", "--step-percent", "50", "--max-percent", "50", "--x-axis", "flops", *SHORT)
    heads = [r for r in json.loads((out / "prune_steps.all.json").read_text())["rows"] if r["step"] == 1]
    assert heads[0]["pruned"] == 24 and heads[0]["percent"] == pytest.approx(100 * 24 * tiny_flops["head"] / flops)
    assert "x% of the attention and FFN layers' FLOPs per token removed" in result.stdout
    table = (out / "prune_curves.md").read_text()
    assert "**Heads and FFN neurons (joint search)** (x: % of the attention and FFN layers' FLOPs" in table
    assert "**All attention types** (x: % of the attention and FFN layers' FLOPs" in table
    record = json.loads((out / "prune_curves.all.json").read_text())["settings"]
    assert (record["structure"], record["x_axis"], record["sequence_length"]) == ("heads", "flops", 32)


def test_tuned_joint_steps_translate_as_the_tuned_shrunk_model(tiny_model, neuron_scores, tmp_path):
    """Heads and neurons tuned together at a joint level: the step's BLEU is what the checkpoint with the
    tuning folded in and the heads and neurons removed translates with fairseq-generate."""
    out = tmp_path / "joint-tuned"
    result = prune(tiny_model, out, "--structure", "joint", "--orders", "fisher", "--fisher", neuron_scores,
                   "--tune-masks", "--tune-subset", "train", "--tune-limit", "64",
                   "--step-percent", "20", "--max-percent", "20", *SHORT)
    assert "fisher+tuned" in result.stdout
    rows = {r["order"]: r for r in json.loads((out / "prune_steps.joint.json").read_text())["rows"] if r["step"] == 1}
    tuned = rows["fisher+tuned"]
    assert (tuned["spec"], tuned["ffn_spec"]) == (rows["fisher"]["spec"], rows["fisher"]["ffn_spec"])
    assert tuned["config"] != rows["fisher"]["config"]
    (tuning_file,) = (out / "tuning").glob("*.ffn-*.json")  # the one tuned mask, named by both masks
    assert json.loads(tuning_file.read_text())["ffn_spec"] == tuned["ffn_spec"]
    shrunk = run(["fairseq-headprune", "shrink", "--path", tiny_model["checkpoint"], "--tuning", tuning_file,
                  "--out", tmp_path / "tuned.pt"])
    assert f"removed\t{tuned['neurons_pruned']} of 512 FFN neurons" in shrunk.stdout
    generated = run(
        ["fairseq-generate", tiny_model["data"], "--path", tmp_path / "tuned.pt", "--user-dir", USER_DIR,
         "--task", "fairseq-headprune", "--gen-subset", "valid", "--required-batch-size-multiple", "1",
         *GENERATION, *SHORT]
    )
    assert float(re.search(r"BLEU4 = ([\d.]+)", generated.stdout).group(1)) == pytest.approx(tuned["bleu"], abs=0.006)
    # the report's structures section (scripts/studies/compare_structures.sh's layout) shows both curves
    study = tmp_path / "study"
    (study / "structures").mkdir(parents=True)
    (study / "structures" / "joint").symlink_to(out)
    (study / "structures" / "finetune-60").mkdir()  # a compress run's report is nested under the section
    (study / "structures" / "finetune-60" / "report.md").write_text("# Compressed model: flops=60%\n\n"
                                                                    "## BLEU on test\n\n| model | BLEU |\n")
    run(["fairseq-headprune", "report", study])
    report = (study / "report.md").read_text()
    assert "## Heads, FFN neurons, or both" in report
    assert "\n#### BLEU on test\n" in report and "\n## BLEU on test" not in report
    assert "The joint search at 60% of the FLOPs removed" in report
    assert f"| {tuned['bleu']:.2f} |" in report and "Fisher search (Kwon et al.) + mask tuning" in report


def test_bad_structure_input_is_one_line(tiny_model, heads_only_scores, tmp_path):
    heads_only = heads_only_scores
    cases = [
        (["--structure", "ffn", "--importance", heads_only, "--importance-method", "fisher"],
         f"--importance {heads_only} has no FFN neuron scores; estimate them with importance "
         "--importance-structures heads,ffn"),
        (["--structure", "ffn", "--orders", "fisher", "--fisher", heads_only],
         f"--fisher {heads_only} has no FFN neuron scores; estimate them with importance --importance-method fisher "
         "--importance-structures heads,ffn"),
        (["--structure", "ffn", "--orders", "iterative"],
         "--orders iterative: not an order of --structure ffn (importance, random, fisher)"),
        (["--structure", "joint", "--orders", "fisher", "--x-axis", "units"],
         "--structure joint prunes heads and neurons together: its x-axis is --x-axis flops"),
        (["--structure", "ffn", "--scopes", "enc-enc"], "--scopes: for head curves only; --structure ffn prunes "
                                                         "every FFN layer"),
        (["--structure", "ffn", "--type-budget", "(8,12,10)"], "--type-budget: for head curves only; --structure "
                                                               "ffn prunes every FFN layer"),
    ]
    for extra, message in cases:
        result = prune(tiny_model, tmp_path / "out", *extra, check=False)
        assert result.returncode == 2, result.stderr
        assert result.stderr.strip() == f"fairseq-headprune prune: error: {message}"
        assert not (tmp_path / "out").exists()
