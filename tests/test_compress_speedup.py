"""``compress --target speedup=Nx``: measured shapes, the least change fast enough, and what follows a BLEU loss.

The plain logic (the ladder of shapes, the choice, back-off and the next
step) against hand-made plans; then one run on the tiny translation model
with no BLEU loss allowed, so that the first attempt's loss makes the second
continue its fine-tuning: the plan's chosen shape is what the attempt
removed (layer counts of the compressed checkpoint and of the CTranslate2
model), the continued fine-tuning starts from the first attempt's weights,
and the report states every attempt's decision by the rule.
"""

import json
import os

import pytest
import torch

import fairseq_headprune.compat.torch_load  # noqa: F401  (its allow-list lets torch.load read checkpoints)
from fairseq_headprune.errors import SettingsError, StudyError
from fairseq_headprune.study.compression.settings import parse_target
from fairseq_headprune.study.compression.speedup import (
    Candidate,
    PlannedCandidate,
    back_off,
    candidate_ladder,
    choose_candidate,
    disturbed_plan_text,
    out_of_order,
    prune_more,
    reaches,
    removes_at_least,
    speed_breakdown,
)
from fairseq_headprune.study.compression.speedup_search import (
    ACCEPT,
    BACK_OFF,
    CONTINUE,
    GIVE_UP,
    PRUNE_MORE,
    AttemptResult,
    best_attempt,
    next_step,
)
from fairseq_headprune.study.finetuning import FINETUNE_LR_SHARE

from conftest import run

ESTIMATES = ["--importance-limit", "64", "--tune-limit", "64", "--cpu", "--no-progress"]


def planned(dropped, width, share, *speedups):
    return PlannedCandidate(Candidate(tuple(sorted(dropped.items())), width), share,
                            {str(b): s for b, s in zip((1, 64), speedups)})


def test_a_speedup_target_is_a_factor_above_one():
    target = parse_target("speedup=2x")
    assert (target.kind, target.factor, target.percent, target.text) == ("speedup", 2.0, 50.0, "speedup=2x")
    assert parse_target("speedup=1.5").factor == 1.5
    for bad in ("speedup=1x", "speedup=0.5x", "speedup=fast", "speedup=nanx"):
        with pytest.raises(SettingsError, match="speedup"):
            parse_target(bad)


def test_the_ladder_holds_every_shape_but_the_unpruned_one():
    ladder = candidate_ladder({"encoder": 6, "decoder": 6}, widths=(1.0, 0.5))
    # decoder keeping 6 to 1 layers, encoder all or half, two widths, less the unpruned shape
    assert len(ladder) == 6 * 2 * 2 - 1 and len(set(ladder)) == len(ladder)
    assert Candidate((("decoder", 0), ("encoder", 0)), 1.0) not in ladder
    assert max(c.drop_counts.get("decoder", 0) for c in ladder) == 5
    assert {c.drop_counts.get("encoder", 0) for c in ladder} == {0, 3}


def test_with_smaller_beams_a_shape_is_preferred_at_the_largest_beam_fast_enough():
    ladder = candidate_ladder({"encoder": 2, "decoder": 2}, widths=(1.0, 0.5), beams=(1, 2))
    assert len(ladder) == 3 * (2 * 2 * 2 - 1) and {c.beam for c in ladder} == {None, 1, 2}
    half = Candidate((("decoder", 0), ("encoder", 0)), 0.5)
    plan = [PlannedCandidate(half, 0.5, {"1": 1.4}),
            PlannedCandidate(Candidate(half.dropped, 0.5, 2), 0.5, {"1": 1.9}),
            PlannedCandidate(Candidate(half.dropped, 0.5, 1), 0.5, {"1": 2.6}),
            PlannedCandidate(Candidate((("decoder", 1), ("encoder", 0)), 0.5), 0.3, {"1": 2.2})]
    assert choose_candidate(plan, 1.8) == 1  # the same shape at beam 2 before beam 1 and before more pruning
    assert choose_candidate(plan, 2.0) == 2  # the shape keeps more at beam 1 than a shallower one at beam 5
    assert plan[2].candidate.name.endswith("beam 1")
    steps = speed_breakdown(plan, 2, {"1": 1.2})
    assert steps["beam 1"]["1"] == pytest.approx(2.6 / 1.4)


def test_the_choice_is_the_least_change_fast_enough_and_backing_off_keeps_more():
    plan = [planned({"decoder": 1}, 1.0, 0.83, 1.5, 1.4),  # fast enough at batch 1 only
            planned({"decoder": 0}, 0.5, 0.50, 1.6, 1.7),
            planned({"decoder": 1}, 0.5, 0.42, 2.1, 2.0),
            planned({"decoder": 2}, 0.75, 0.45, 2.4, 2.2),
            planned({"decoder": 2}, 0.25, 0.10, 3.5, 3.1)]
    assert choose_candidate(plan, 1.5) == 1  # the most FLOPs kept among those at >= 1.5x at both sizes
    assert choose_candidate(plan, 2.0) == 3  # 45% kept beats 42%
    assert back_off(plan, 3) == 1 and back_off(plan, 1) == 0 and back_off(plan, 0) is None
    assert back_off(plan, 3, tried=[1]) == 0  # a shape tried already is not tried again
    # shape 1 kept the BLEU but measured 1.5x / 1.55x where the plan said 1.6x / 1.7x: asked for 1.6x, the next
    # shape must reach 1.6 x 1.6/1.5 at batch 1 and 1.6 x 1.7/1.55 at batch 64 by the plan
    assert prune_more(plan, 1, 1.6, {"1": 1.5, "64": 1.55}) == 3  # the next in order: 2.4x and 2.2x by the plan
    assert prune_more(plan, 1, 2.1, {"1": 1.5, "64": 1.55}) == 4  # 2.24x and 2.30x needed: shapes 3 and 2 miss
    assert prune_more(plan, 4, 1.6, {"1": 3.0, "64": 3.0}) is None
    with pytest.raises(StudyError, match=r"3\.10x as fast .* at batch 64"):
        choose_candidate(plan, 4.0)
    steps = speed_breakdown(plan, 2, {"1": 1.3, "64": 1.2})
    assert steps["vocabulary map (unpruned model)"] == {"1": 1.3, "64": 1.2}
    assert steps["layers removed"] == {"1": 1.5, "64": 1.4}
    narrowed = steps["heads and neurons narrowed"]
    assert narrowed["1"] * 1.5 == pytest.approx(2.1) and narrowed["64"] * 1.4 == pytest.approx(2.0)


def test_a_plan_timed_against_the_shapes_order_is_named():
    ordered = [planned({"decoder": 0}, 0.5, 0.50, 1.6, 1.7),
               planned({"decoder": 1}, 1.0, 0.70, 1.4, 1.3),
               planned({"decoder": 1}, 0.5, 0.35, 2.1, 2.0),
               planned({"decoder": 2}, 0.5, 0.20, 2.0, 2.6)]  # 2.0 < 2.1 at batch 1: within the tolerance
    assert removes_at_least(ordered[2].candidate, ordered[0].candidate)
    assert removes_at_least(ordered[2].candidate, ordered[1].candidate)
    assert not removes_at_least(ordered[1].candidate, ordered[0].candidate)  # fewer layers, but wider
    assert not removes_at_least(ordered[0].candidate, ordered[0].candidate)
    assert out_of_order(ordered) == []
    # a disturbed timing: the shape with two layers removed timed at 1.2x, below 0.8 of the 1.6x and 2.1x of
    # shapes that remove less, at batch 1 (the 1.4x of "1 decoder layer removed, 100% width": 0.86, within)
    disturbed = [*ordered[:3], planned({"decoder": 2}, 0.5, 0.20, 1.2, 2.6)]
    pairs = out_of_order(disturbed)
    assert [(p.larger, p.batch) for p in pairs] == [("1 decoder layer removed, 50% width", "1"),
                                                    ("no layer removed, 50% width", "1")]
    assert pairs[0].ratio == pytest.approx(1.2 / 2.1) and pairs[1].ratio == pytest.approx(1.2 / 1.6)
    # another beam is another decoding: not compared
    smaller_beam = Candidate(disturbed[3].candidate.dropped, 0.5, beam=1)
    assert not removes_at_least(smaller_beam, disturbed[0].candidate)
    text = disturbed_plan_text(pairs, "OUT/plan")
    assert text.startswith("2 pairs of shapes") and "0.57 of the speed-up" in text and "OUT/plan" in text


def test_a_loss_beyond_the_tolerance_continues_the_fine_tuning_once_then_backs_off():
    assert next_step(0.4, 1.0, False, True, 2) == ACCEPT
    assert next_step(0.4, 1.0, False, True, 2, fast_enough=False) == PRUNE_MORE
    assert next_step(0.4, 1.0, False, True, 0, fast_enough=False) == GIVE_UP
    assert next_step(1.4, 1.0, False, True, 2) == CONTINUE
    assert next_step(1.4, 1.0, True, True, 1) == BACK_OFF
    assert next_step(1.4, 1.0, False, False, 1) == BACK_OFF  # nothing to continue without fine-tuning
    assert next_step(1.4, 1.0, False, True, 0) == GIVE_UP
    decisions = [PRUNE_MORE, BACK_OFF, GIVE_UP]
    results = [AttemptResult(-0.2, {"1": 1.9}), AttemptResult(-1.5, {"1": 2.4}), AttemptResult(-0.9, {"1": 1.95})]
    assert best_attempt(decisions, results, 1.0) == 2  # the fastest within the tolerance
    assert best_attempt(decisions, results, 0.1) == 0  # none within: the one that lost least
    assert best_attempt([*decisions, ACCEPT], [*results, AttemptResult(-0.5, {"1": 2.1})], 1.0) == 3


@pytest.fixture(scope="module")
def speedup_run(tiny_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("speedup") / "run"
    result = run(["fairseq-headprune", "compress", tiny_model["data"], "--path", tiny_model["checkpoint"],
                  "--out-dir", out, "--target", "speedup=1.05x", "--max-bleu-loss", "0", "--max-attempts", "2",
                  "--finetune-updates", "4", *ESTIMATES, "--speed-sentences", "8", "--speed-batch-sizes", "1", "8",
                  "--repeats", "1", "--beam", "5", "--batch-size", "64"])
    return {"out": out, "stdout": result.stdout, "report": json.loads((out / "report.json").read_text()),
            "checkpoint": tiny_model["checkpoint"]}


def _layer_counts(state):
    counts = {}
    for key in state:
        parts = key.split(".")
        if len(parts) > 3 and parts[0] in ("encoder", "decoder") and parts[1] == "layers":
            counts.setdefault(parts[0], set()).add(int(parts[2]))
    return {stack: len(layers) for stack, layers in counts.items()}


def test_the_plan_times_every_shape_and_the_attempt_has_the_chosen_one(tiny_model, speedup_run):
    out, report = speedup_run["out"], speedup_run["report"]
    plan = report["plan"]
    ladder = candidate_ladder({"encoder": 2, "decoder": 2})
    assert len(plan["candidates"]) == len(ladder)
    assert all(set(c["speedups"]) == {"1", "8"} and min(c["speedups"].values()) > 0 for c in plan["candidates"])
    chosen = plan["candidates"][plan["chosen"]]
    assert min(chosen["speedups"].values()) >= 1.05
    # no shape that keeps more decoding FLOPs reached the target at both batch sizes
    assert not [c for c in plan["candidates"]
                if c["flops_share"] > chosen["flops_share"] and min(c["speedups"].values()) >= 1.05]
    first = report["attempts"][0]
    assert first["shape"]["name"] == chosen["name"]
    state = torch.load(out / "attempt-1" / "shrink" / "checkpoint.pt", map_location="cpu")["model"]
    full = _layer_counts(torch.load(tiny_model["checkpoint"], map_location="cpu")["model"])
    expected = {stack: full[stack] - chosen["dropped"].get(stack, 0) for stack in full}
    assert _layer_counts(state) == expected
    config = json.loads((out / "attempt-1" / "export" / "compressed" / "config.json").read_text())
    model_bin = (out / "attempt-1" / "export" / "compressed" / "model.bin").read_bytes()
    for stack, layers in expected.items():  # CTranslate2's model holds exactly the layers kept
        assert f"{stack}/layer_{layers - 1}/".encode() in model_bin
        assert f"{stack}/layer_{layers}/".encode() not in model_bin
    assert config is not None
    assert "plan\t" in speedup_run["stdout"] and "attempt 1\t" in speedup_run["stdout"]
    # a plan timed against the shapes' order says so, before any attempt, and only then
    candidates = [PlannedCandidate.from_dict(c) for c in plan["candidates"]]
    assert plan["out_of_order"] == [pair.to_dict() for pair in out_of_order(candidates)]
    assert ("warning\t" in speedup_run["stdout"]) == bool(plan["out_of_order"])


def test_a_loss_makes_the_next_attempt_continue_from_the_first_ones_weights(speedup_run):
    out, report = speedup_run["out"], speedup_run["report"]
    first = report["attempts"][0]
    assert first["delta"] < 0, "the tiny model loses BLEU at this shape; the test needs it to"
    for attempt in report["attempts"]:  # every decision by the rule, with no loss allowed
        left = 2 - attempt["attempt"]
        continued = attempt["continued_from"] is not None
        fast_enough = reaches(attempt["speedups"], report["factor"])
        assert attempt["decision"] == next_step(-attempt["delta"], 0.0, continued, True, left, fast_enough)
    assert first["decision"] == CONTINUE
    second = report["attempts"][1]
    assert second["continued_from"] == "attempt-1" and second["shape"] == first["shape"]
    # the second attempt's layers, Fisher scores and search are the first one's files, not recomputed
    for stage in ("fisher", "search"):
        a = out / "attempt-1" / stage / "stage.json"
        b = out / "attempt-2" / stage / "stage.json"
        assert os.stat(a).st_ino == os.stat(b).st_ino
    # its fine-tuning started from the first attempt's fine-tuned weights: before it, the model removed for real
    # is the first attempt's compressed checkpoint, tensor for tensor
    before = torch.load(out / "attempt-2" / "finetune" / "before.pt", map_location="cpu")["model"]
    compressed = torch.load(out / "attempt-1" / "shrink" / "checkpoint.pt", map_location="cpu")["model"]
    assert before.keys() == compressed.keys()
    assert all(torch.equal(before[k], compressed[k]) for k in before)
    finetune = json.loads((out / "attempt-2" / "finetune" / "stage.json").read_text())
    assert finetune["start"] == "continued"
    # at the learning rate of the fine-tuning it continues (the default share of the start checkpoint's rate
    # would be a share of that fine-tuning's rate), which is the default share of the unpruned model's
    first_finetune = json.loads((out / "attempt-1" / "finetune" / "stage.json").read_text())
    trained = torch.load(speedup_run["checkpoint"], map_location="cpu", weights_only=False)["cfg"]
    assert finetune["lr"] == first_finetune["lr"] == pytest.approx(FINETUNE_LR_SHARE * trained["optimization"]["lr"][0])
    result = report["result"]
    attempts = report["attempts"]
    chosen = attempts[best_attempt([a["decision"] for a in attempts],  # none within: the one that lost least
                                   [AttemptResult(a["delta"], a["speedups"]) for a in attempts], 0.0)]
    assert result["attempt"] == chosen["attempt"] and result["delta"] == chosen["delta"]
    assert result["within_tolerance"] == (chosen["delta"] >= 0.0)
    markdown = (out / "report.md").read_text()
    assert "## The shapes timed" in markdown and "**(chosen)**" in markdown


def test_the_plan_benchmark_times_every_attempt_against_its_plan(speedup_run, tmp_path):
    pytest.importorskip("ctranslate2")
    out, report = speedup_run["out"], speedup_run["report"]
    result = run(["python", "scripts/benchmarks/benchmark_speedup_plan.py", "--run", out, "--sentences", "4",
                  "--repeats", "1", "--json", tmp_path / "plan.json"])
    rows = json.loads((tmp_path / "plan.json").read_text())["results"]
    expected = [(a["attempt"], size) for a in report["attempts"] for size in report["plan"]["batch_sizes"]]
    assert [(r["attempt"], r["batch_size"]) for r in rows] == expected
    for row in rows:  # the plan's figure for the attempt's shape, beside a measurement of the attempt's models
        attempt = report["attempts"][row["attempt"] - 1]
        assert row["predicted"] == attempt["shape"]["speedups"][str(row["batch_size"])]
        assert row["measured_by_compress"] == attempt["speedups"][str(row["batch_size"])]
        assert row["measured"] == pytest.approx(
            sorted(row["seconds"]["ct2 unpruned vmap"])[0] / sorted(row["seconds"]["ct2 compressed vmap"])[0])
        assert row["relative_error"] == pytest.approx((row["predicted"] - row["measured"]) / row["measured"])
    assert "largest error of the plan" in result.stdout
    failed = run(["python", "scripts/benchmarks/benchmark_speedup_plan.py", "--run", tmp_path], check=False)
    lines = failed.stderr.strip().splitlines()
    assert failed.returncode != 0 and len(lines) == 1 and "report.json does not exist" in lines[0], lines


def test_a_speedup_target_distills_word_level_unless_told_otherwise(tiny_model, tmp_path):
    from fairseq_headprune.cli import build_parser
    from fairseq_headprune.commands.compress import compress_settings

    def settings(*options):
        args, extra = build_parser().parse_known_args(["compress", str(tiny_model["data"]), "--path",
                                                       str(tiny_model["checkpoint"]), "--out-dir",
                                                       str(tmp_path / "out"), *options])
        args.fairseq_args = extra
        return compress_settings(args)

    assert settings("--target", "speedup=2x").distill == "word"
    assert settings("--target", "speedup=2x", "--distill", "sequence").distill == "sequence"
    assert settings("--target", "speedup=2x", "--distill", "none").distill is None
    assert settings("--target", "speedup=2x", "--finetune-updates", "0").distill is None  # nothing to distil into
    assert settings("--target", "decoding-flops=50%").distill is None
    assert settings("--target", "decoding-flops=50%", "--distill", "word").distill == "word"
    assert not (tmp_path / "out").exists()


def test_bad_speedup_inputs_are_one_line(tiny_model, tmp_path):
    common = ["fairseq-headprune", "compress", tiny_model["data"], "--path", tiny_model["checkpoint"], "--cpu"]
    cases = [(["--target", "speedup=1x"], "a speed-up is a factor above 1"),
             (["--target", "speedup=2x", "--drop-decoder-layers", "1"], "leave out --drop-*-layers"),
             (["--target", "flops=50%", "--max-bleu-loss", "1"], "go with --target speedup"),
             (["--target", "flops=50%", "--allow-beam"], "go with --target speedup"),
             (["--target", "speedup=2x", "--quantization", "auto"], "name it")]
    for index, (options, message) in enumerate(cases):
        out = tmp_path / f"out{index}"
        result = run([*common, "--out-dir", out, *options], check=False)
        assert result.returncode == 2, (options, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
        assert message in result.stderr
        assert not out.exists()


def test_a_shape_of_whole_layers_alone_searches_nothing_and_keeps_the_other_weights(tiny_model, tmp_path):
    """An attempt whose shape removes one encoder layer and narrows nothing: the search prunes no unit and the
    compressed checkpoint is the original's other layers, renumbered, tensor for tensor."""
    from fairseq_headprune.cli import build_parser
    from fairseq_headprune.commands.compress import compress_settings
    from fairseq_headprune.engine.pipelines.compress import run_compress

    argv = ["compress", str(tiny_model["data"]), "--path", str(tiny_model["checkpoint"]), "--out-dir",
            str(tmp_path / "top"), "--target", "speedup=1.05x", "--finetune-updates", "0", *ESTIMATES,
            "--speed-sentences", "4", "--speed-batch-sizes", "4", "--repeats", "1", "--beam", "5",
            "--batch-size", "64"]
    args, extra = build_parser().parse_known_args(argv)
    args.fairseq_args = extra
    settings = compress_settings(args)
    # the share of the decoding FLOPs the encoder's other layer keeps at full width: what the plan would price
    layers_only = settings.attempt(0.99, {"encoder": 1}, str(tmp_path / "probe"))
    from fairseq_headprune.engine.checkpoints.layers import layers_removed
    from fairseq_headprune.engine.families import family_named
    from fairseq_headprune.engine.pipelines.search import layer_costs, search_costs

    family = family_named(settings.family)
    cfg, task, model = family.load(settings.data, settings.checkpoint, settings.evaluation.generation_args, cpu=True)
    search_settings, costs = search_costs(layers_only.search_settings(settings.checkpoint, str(tmp_path)), cfg, task,
                                          model)
    with layers_removed(model, {"encoder": [1]}):
        share = layer_costs(search_settings, model).full_cost() / costs.full_cost()
    outcome = run_compress(settings.attempt(share, {"encoder": 1}, str(tmp_path / "attempt")))
    report = outcome.report
    assert report.search.heads_pruned == 0 and report.search.neurons_pruned == 0 and report.search.spec is None
    dropped = int(report.layers.spec.split(":")[1]) - 1  # the encoder layer removed, 0-based
    original = torch.load(tiny_model["checkpoint"], map_location="cpu")["model"]
    compressed = torch.load(tmp_path / "attempt" / "shrink" / "checkpoint.pt", map_location="cpu")["model"]
    kept = [layer for layer in range(2) if layer != dropped]
    for key, value in compressed.items():
        parts = key.split(".")
        if parts[:2] == ["encoder", "layers"]:
            parts[2] = str(kept[int(parts[2])])
        assert torch.equal(value, original[".".join(parts)]), key
    assert _layer_counts(compressed) == {"encoder": 1, "decoder": 2}
