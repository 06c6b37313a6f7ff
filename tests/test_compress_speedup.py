"""``compress --target speedup=Nx`` on the tiny translation model: the plan, the attempts and the result.

One run with no BLEU loss allowed and a fine-tuning that cannot stop gaining
within its ceiling, so that the first attempt's loss makes the second continue
its fine-tuning: the plan's chosen shape is the least damaged fast enough and
what the attempt removed (the plan's layers; layer counts of the compressed
checkpoint and of the CTranslate2 model), every decision reads the validation
split by the rule, the continued fine-tuning starts from the first attempt's
weights, and the test split is translated once, for the result. A second run
decides on a split where validation and test disagree (constructed), and a
third is killed in its fine-tuning and resumed to the same weights. A fourth deals validation into halves
(``--decision-half``): what is fitted reads one, what is decided the other.
(The plain logic: tests/test_speedup_search.py.)
"""

import json
import os
import shutil

import pytest
import torch

import fairseq_headprune.compat.torch_load  # noqa: F401  (its allow-list lets torch.load read checkpoints)
from fairseq_headprune.study.compression.speed import Speedups
from fairseq_headprune.study.compression.speedup.rules import (
    ACCEPT,
    CONTINUE,
    GIVE_UP,
    PRUNE_MORE,
    AttemptResult,
    best_attempt,
    damage_order,
    next_step,
    prune_more,
)
from fairseq_headprune.study.compression.speedup.runs import attempt_run
from fairseq_headprune.study.compression.speedup.settings import SPEEDUP_LR_SHARE, STOP_SHARE_OF_TOLERANCE
from fairseq_headprune.study.compression.speedup.shapes import (
    PLAN_MARGIN,
    PlannedCandidate,
    candidate_ladder,
    out_of_order,
)
from fairseq_headprune.study.finetune.settings import UPDATE_CEILING

from conftest import kill_once_written, run, run_in_process

ESTIMATES = ["--importance-limit", "64", "--tune-limit", "64", "--cpu", "--no-progress"]
# no BLEU loss allowed, and a fine-tuning of 4 updates validated after each, never stopping before its ceiling
SPEEDUP = ["--target", "speedup=1.05x", "--max-bleu-loss", "0", "--max-attempts", "2", "--finetune-updates", "4",
           "--finetune-patience", "10", *ESTIMATES, "--speed-sentences", "8", "--speed-batch-sizes", "1", "8",
           "--repeats", "1", "--beam", "5", "--batch-size", "64"]


def speedup_command(tiny_model, out, *options):
    return ["fairseq-headprune", "compress", str(tiny_model["data"]), "--path", str(tiny_model["checkpoint"]),
            "--out-dir", str(out), *SPEEDUP, *options]


@pytest.fixture(scope="module")
def speedup_run(tiny_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("speedup") / "run"
    result = run(speedup_command(tiny_model, out))
    return {"out": out, "stdout": result.stdout, "report": json.loads((out / "report.json").read_text()),
            "checkpoint": tiny_model["checkpoint"]}


def _layer_counts(state):
    counts = {}
    for key in state:
        parts = key.split(".")
        if len(parts) > 3 and parts[0] in ("encoder", "decoder") and parts[1] == "layers":
            counts.setdefault(parts[0], set()).add(int(parts[2]))
    return {stack: len(layers) for stack, layers in counts.items()}


def _stage(out, stage):
    return json.loads((out / stage / "stage.json").read_text())


class _Shrunk(Exception):
    """Raised once an attempt's shrink stage is done: its tests read no later stage."""


def shrunk_attempt(settings):
    """Run the attempt ``settings`` through its shrink stage and stop there: the records of its stages so far."""
    from fairseq_headprune.engine.pipelines.compress import run_compress
    from fairseq_headprune.engine.pipelines.compress_stages import Stages
    from fairseq_headprune.study.compression.records import STAGE_RECORDS

    def stop_after_shrink(stage, status, _seconds):
        if stage == "shrink" and status == "ran":
            raise _Shrunk()

    with pytest.raises(_Shrunk):
        run_compress(settings, on_stage=stop_after_shrink)
    stages = Stages(settings.out_dir, None)
    return {stage: stages.record(stage, STAGE_RECORDS[stage]) for stage in ("layers", "search")}


def test_the_plan_times_and_damages_every_shape_and_the_attempt_has_the_least_damaged_fast_enough(tiny_model,
                                                                                                speedup_run):
    out, report = speedup_run["out"], speedup_run["report"]
    plan = report["plan"]
    ladder = candidate_ladder({"encoder": 2, "decoder": 2})
    assert len(plan["candidates"]) == len(ladder)
    assert all(set(c["speedups"]) == {"1", "8"} and min(c["speedups"].values()) > 0 for c in plan["candidates"])
    candidates = [PlannedCandidate.from_dict(c) for c in plan["candidates"]]
    assert all(c.damage is not None for c in candidates)
    # a shape of whole layers alone is damaged by exactly the loss its layer choice measured
    for candidate in candidates:
        if candidate.candidate.width == 1.0:
            choice = plan["layer_choices"][candidate.candidate.layers_name]
            loss = choice["steps"][-1]["loss"] if choice["steps"] else choice["base_loss"]
            assert candidate.damage == pytest.approx(loss - plan["base_loss"])
    # the damage on the first 64 sentences (--importance-limit 64): one batch, so no standard error over batches
    # (test_plan_damage checks it over many), and no sample drawn
    assert plan["damage_sentences"] == 64 and all(c.damage_se is None for c in candidates)
    assert plan["damage_sampled_from"] == 0
    # the choice by its stated rule: the least damaged at 1.05x plus the margin at both sizes, else at 1.05x
    chosen = candidates[plan["chosen"]]
    need = 1.05 * (1 + PLAN_MARGIN) if any(c.reaches(1.05 * (1 + PLAN_MARGIN)) for c in candidates) else 1.05
    assert chosen.reaches(need)
    assert next(i for i in damage_order(candidates) if candidates[i].reaches(need)) == plan["chosen"]
    first = report["attempts"][0]
    assert first["shape"]["name"] == chosen.candidate.name
    # the attempt removed the plan's layers, and nothing was chosen again
    layers = _stage(out / "attempt-1", "layers") if chosen.candidate.drop_counts else None
    if layers is not None:
        assert layers["spec"] == plan["layer_choices"][chosen.candidate.layers_name]["spec"]
        assert layers["chosen_by"] == "plan"
    state = torch.load(out / "attempt-1" / "shrink" / "checkpoint.pt", map_location="cpu")["model"]
    full = _layer_counts(torch.load(tiny_model["checkpoint"], map_location="cpu")["model"])
    expected = {stack: full[stack] - chosen.candidate.drop_counts.get(stack, 0) for stack in full}
    assert _layer_counts(state) == expected
    model_bin = (out / "attempt-1" / "export" / "compressed" / "model.bin").read_bytes()
    for stack, count in expected.items():  # CTranslate2's model holds exactly the layers kept
        assert f"{stack}/layer_{count - 1}/".encode() in model_bin
        assert f"{stack}/layer_{count}/".encode() not in model_bin
    assert "plan\t" in speedup_run["stdout"] and "attempt 1\t" in speedup_run["stdout"]
    # a plan timed against the shapes' order says so, before any attempt, and only then
    assert plan["out_of_order"] == [pair.to_dict() for pair in out_of_order(candidates)]
    assert ("warning\t" in speedup_run["stdout"]) == bool(plan["out_of_order"])
    markdown = (out / "report.md").read_text()
    assert "## The shapes timed" in markdown and "**(chosen)**" in markdown and "| damage |" in markdown


def test_every_decision_reads_validation_and_a_loss_continues_from_the_first_attempts_weights(speedup_run):
    out, report = speedup_run["out"], speedup_run["report"]
    first = report["attempts"][0]
    assert first["score"]["split"] == "valid"
    assert first["score"]["delta"] < 0, "the tiny model loses BLEU at this shape; the test needs it to"
    for attempt in report["attempts"]:  # every decision by the rule, on validation, with no loss allowed
        left = 2 - attempt["attempt"]
        can_continue = attempt["continued_from"] is None and attempt["finetune"]["stopped"] == UPDATE_CEILING
        fast_enough = Speedups.of(attempt["speedups"]).reaches(report["factor"])
        assert attempt["decision"] == next_step(-attempt["score"]["delta"], 0.0, can_continue, left, fast_enough)
        evaluation = _stage(out / attempt["dir"], "evaluate")
        assert (evaluation["split"], evaluation["delta"]) == ("valid", attempt["score"]["delta"])
        assert _stage(out / attempt["dir"], "speed")["split"] == "valid"
    # the fine-tuning validated after every update, stopped at its ceiling, and kept its best checkpoint
    finetune = _stage(out / "attempt-1", "finetune")
    assert [p["updates"] for p in finetune["curve"]] == [1, 2, 3, 4] and finetune["stopped"] == UPDATE_CEILING
    scores = [p["bleu"] for p in finetune["curve"]]
    assert finetune["kept_updates"] == finetune["curve"][len(scores) - 1 - scores[::-1].index(max(scores))]["updates"]
    assert finetune["until"]["target"] == pytest.approx(report["plan"]["reference"]
                                                       - STOP_SHARE_OF_TOLERANCE * 0.0)
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
    second_finetune = _stage(out / "attempt-2", "finetune")
    assert second_finetune["start"] == "continued"
    # at the learning rate of the fine-tuning it continues (the default share of the start checkpoint's rate
    # would be a share of that fine-tuning's rate): half of the unpruned model's peak rate
    trained = torch.load(speedup_run["checkpoint"], map_location="cpu", weights_only=False)["cfg"]
    assert second_finetune["lr"] == finetune["lr"] == pytest.approx(
        SPEEDUP_LR_SHARE * trained["optimization"]["lr"][0])


def test_the_result_is_the_best_attempt_on_validation_translated_once_on_test(speedup_run):
    out, report = speedup_run["out"], speedup_run["report"]
    attempts, result = report["attempts"], report["result"]
    chosen = attempts[best_attempt([a["decision"] for a in attempts],  # none within: the one that lost least
                                   [AttemptResult(a["score"]["delta"], a["speedups"]) for a in attempts], 0.0)]
    assert result["attempt"] == chosen["attempt"] and result["decided"] == chosen["score"]
    assert result["within_tolerance"] == (chosen["score"]["delta"] >= 0.0)
    # the result's evaluation and timing: on test, in result/, the attempt's other stages linked, not recomputed
    evaluation = _stage(out / "result", "evaluate")
    assert evaluation["split"] == result["reported"]["split"] == "test"
    assert (evaluation["unpruned"], evaluation["compressed"], evaluation["delta"]) == (
        result["reported"]["unpruned"], result["reported"]["compressed"], result["reported"]["delta"])
    for stage in ("search", "finetune", "shrink", "export"):
        assert os.stat(out / "result" / stage / "stage.json").st_ino == os.stat(
            out / chosen["dir"] / stage / "stage.json").st_ino
    # test is translated in result/ alone: once per model (unpruned, compressed, before fine-tuning)
    test_sweeps = sorted(str(path.relative_to(out)) for path in out.rglob("*") if path.is_dir()
                         and (path / "sweep.json").exists()
                         and json.loads((path / "sweep.json").read_text())["identity"]["split"] == "test")
    assert test_sweeps and all(path.startswith("result/") for path in test_sweeps), test_sweeps
    assert f"result\tattempt {result['attempt']} on test" in speedup_run["stdout"]
    markdown = (out / "report.md").read_text()
    # the score before fine-tuning says where a continued fine-tuning began: the earlier attempt's weights
    before = result["reported"]["before_finetune"]
    started = (f"{before:.2f} where its fine-tuning continued from {chosen['continued_from']}"
               if chosen["continued_from"] else f"{before:.2f} before fine-tuning")
    assert started in speedup_run["stdout"] and started in markdown
    assert "Every decision read valid; test was translated once" in markdown and "## Recovery" in markdown


def test_the_cost_is_measured_before_the_plan_and_counts_what_the_run_then_does(speedup_run):
    """The estimate's lines before the plan starts and again once it has chosen; the probe's units against what the
    run then wrote: one export of the unpruned model is the attempt's (to the byte), the sentences each stage
    translates and the fine-tune's validations are those the attempt's records count."""
    out, lines = speedup_run["out"], speedup_run["stdout"].splitlines()
    plan_starts = lines.index("plan\t...")
    before = [line.split("\t")[1] for line in lines[:plan_starts] if line.startswith("cost\t")]
    assert {"plan", "finetune", "attempt evaluate", "result speed", "in all", "memory"} <= set(before), before
    assert any(line.startswith("cost\tin all\tfrom here ") for line in lines[plan_starts:])
    probe, attempt = _stage(out, "cost"), out / "attempt-1"
    exported = attempt / "export" / "unpruned"
    assert probe["export_bytes"] == sum(path.stat().st_size for path in exported.iterdir())
    assert probe["decision_sentences"] == _stage(attempt, "evaluate")["sentences"]
    assert probe["report_sentences"] == _stage(out / "result", "evaluate")["sentences"]
    assert probe["validations"] == len(_stage(attempt, "finetune")["curve"]) == 4
    plan_shapes = {(json.dumps(c["dropped"], sort_keys=True), c["width"]) for c in _stage(out, "plan")["candidates"]}
    assert len(probe["shape_shares"]) == len(plan_shapes)
    assert probe["update_seconds"] > 0 and probe["distilled"]


def test_every_record_the_run_wrote_reads_back_typed_and_writes_back_the_same_json(speedup_run):
    """One serialisation (``study.output.serialisation``) for every record: each stage.json and report.json of the
    run, read by its record class, holds typed records (int batch sizes, validations, candidates) and writes the
    same JSON again, key for key and in the same order."""
    from fairseq_headprune.study.compression.records import STAGE_RECORDS, CompressReport
    from fairseq_headprune.study.compression.speedup.cost import CostProbe
    from fairseq_headprune.study.compression.speedup.records import PlanRecord, SpeedupReport
    from fairseq_headprune.study.finetune.settings import Validation

    out, read = speedup_run["out"], {}
    for path in sorted(out.rglob("*.json")):
        if path.name == "stage.json":
            record_type = {"plan": PlanRecord, "cost": CostProbe}.get(path.parent.name) or STAGE_RECORDS.get(
                path.parent.name)
        elif path.name == "report.json":
            record_type = SpeedupReport if path.parent == out else CompressReport
        else:
            continue
        text = json.loads(path.read_text())
        record = record_type.from_dict(text)
        assert json.dumps(record.to_dict()) == json.dumps(text), path
        read[str(path.relative_to(out))] = record
    assert {"report.json", "plan/stage.json", "cost/stage.json", "attempt-1/report.json",
            "attempt-1/finetune/stage.json", "result/speed/stage.json"} <= set(read)
    report = read["report.json"]
    assert all(isinstance(batch, int) for batch in report.result.speedups) and report.attempts
    assert all(isinstance(point, Validation) for point in read["attempt-1/finetune/stage.json"].curve)
    assert isinstance(read["plan/stage.json"].candidates[0], PlannedCandidate)
    assert read["attempt-1/report.json"].speed.settings.batch_sizes == [1, 8]


def test_a_dry_run_prints_the_estimate_and_stops_before_the_plan(tiny_model, tmp_path):
    out = tmp_path / "run"
    result = run(speedup_command(tiny_model, out, "--dry-run"))
    costs = [line.split("\t")[1:] for line in result.stdout.splitlines() if line.startswith("cost\t")]
    stages = [cost[0] for cost in costs]
    assert stages[-2:] == ["in all", "memory"] and "plan" in stages and "finetune" in stages, result.stdout
    # the fine-tune's memory as its probe planned it: the checkpoint's batch, which fits on this machine
    assert costs[-1][1].startswith("the fine-tune needs an estimated ") and "does not fit" not in costs[-1][1]
    assert "stopped before the plan" in result.stdout.splitlines()[-1]
    assert (out / "cost" / "stage.json").is_file() and not (out / "plan").exists()


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

    speedup = settings("--target", "speedup=2x")
    assert speedup.distill == "word"
    # fine-tuned until enough on the decision split, at most as many updates as the checkpoint trained, at half
    # its peak learning rate; the other targets a fixed length at a tenth of it
    trained = torch.load(tiny_model["checkpoint"], map_location="cpu", weights_only=False)
    assert speedup.finetune.updates == trained["optimizer_history"][-1]["num_updates"]
    assert speedup.finetune.until.subset == "valid" and speedup.finetune.until.patience == 3
    assert speedup.finetune.learning_rate(0.002) == pytest.approx(0.001)
    flops = settings("--target", "decoding-flops=50%")
    assert flops.finetune.until is None and flops.finetune.learning_rate(0.002) == pytest.approx(0.0002)
    shifted = settings("--target", "speedup=2x", "--gen-subset", "test1", "--finetune-minutes", "5")
    assert (shifted.speedup.decision_subset, shifted.evaluation.gen_subset, shifted.finetune.until.minutes) == (
        "valid", "test1", 5)
    assert settings("--target", "speedup=2x", "--distill", "sequence").distill == "sequence"
    assert settings("--target", "speedup=2x", "--distill", "none").distill is None
    assert settings("--target", "speedup=2x", "--finetune-updates", "0").distill is None  # nothing to distil into


def test_the_fine_tunes_data_is_counted_as_fairseq_train_batches_it(tiny_model, tmp_path):
    """The fine-tuning's data (``engine.finetune.data``) against fairseq-train's own count: the tiny checkpoint's
    updates over the epochs it trained are one epoch's updates, and the target tokens are the sum of the target
    side's lengths as fairseq's indexed dataset stores them. ``--finetune-epochs E`` is a ceiling of E epochs of
    them; validations come every tenth of the ceiling, or sooner where ``VALIDATION_SPLITS`` times the validation
    split's tokens are trained on first."""
    import numpy as np
    from fairseq.data import data_utils

    from fairseq_headprune.cli import build_parser
    from fairseq_headprune.commands.compress import compress_settings
    from fairseq_headprune.engine.finetune.data import finetune_data
    from fairseq_headprune.engine.pipelines.speedup.run import with_finetune_data
    from fairseq_headprune.study.finetune.settings import VALIDATION_SPLITS, FinetuneSettings

    trained = torch.load(tiny_model["checkpoint"], map_location="cpu", weights_only=False)
    epochs = trained["extra_state"]["train_iterator"]["epoch"] - 1
    per_epoch = trained["optimizer_history"][-1]["num_updates"] // epochs
    data = finetune_data(str(tiny_model["checkpoint"]), str(tiny_model["data"]), "translation",
                         FinetuneSettings(updates=1), "valid")
    assert data.updates_per_epoch == per_epoch

    def stored_tokens(split):
        source, target = trained["cfg"]["task"]["source_lang"], trained["cfg"]["task"]["target_lang"]
        dataset = data_utils.load_indexed_dataset(str(tiny_model["data"] / f"{split}.{source}-{target}.{target}"),
                                                  None)
        return int(np.sum(dataset.sizes))

    assert (data.target_tokens, data.validation_tokens) == (stored_tokens("train"), stored_tokens("valid"))

    def settings(*options):
        args, extra = build_parser().parse_known_args(["compress", str(tiny_model["data"]), "--path",
                                                       str(tiny_model["checkpoint"]), "--out-dir",
                                                       str(tmp_path / "out"), "--target", "speedup=2x", *options])
        args.fairseq_args = extra
        return compress_settings(args)

    assert settings("--finetune-epochs", "2.5").finetune.updates == int(np.ceil(2.5 * per_epoch))
    counted = with_finetune_data(settings("--finetune-updates", "1000"))
    by_tokens = int(np.ceil(VALIDATION_SPLITS * data.validation_tokens / (data.target_tokens / per_epoch)))
    assert counted.finetune.until.data == data
    assert counted.finetune.until.validation_interval(1000) == min(100, by_tokens)
    given = with_finetune_data(settings("--finetune-updates", "1000", "--finetune-valid-interval", "7"))
    assert given.finetune.until.validation_interval(1000) == 7 and given.finetune.until.data is None
    assert settings("--target", "decoding-flops=50%").distill is None
    assert settings("--target", "decoding-flops=50%", "--distill", "word").distill == "word"
    assert not (tmp_path / "out").exists()


def test_bad_speedup_inputs_are_one_line(tiny_model, tmp_path, capsys):
    common = ["compress", str(tiny_model["data"]), "--path", str(tiny_model["checkpoint"]), "--cpu"]
    cases = [(["--target", "speedup=1x"], "a speed-up is a factor above 1"),
             (["--target", "speedup=2x", "--drop-decoder-layers", "1"], "leave out --drop-*-layers"),
             (["--target", "flops=50%", "--max-bleu-loss", "1"], "--max-bleu-loss goes with --target speedup"),
             (["--target", "flops=50%", "--allow-beam", "--narrowing", "plan"],
              "--allow-beam and --narrowing go with --target speedup"),
             (["--target", "speedup=2x", "--quantization", "auto"], "name it"),
             (["--target", "speedup=2x", "--decision-subset", "test"], "the split the result is reported on"),
             (["--target", "speedup=2x", "--decision-subset", "test1"], "never on a test split"),
             (["--target", "flops=50%", "--decision-subset", "valid1"], "--decision-subset goes with --target speedup"),
             (["--target", "flops=50%", "--finetune-patience", "3"], "goes with --target speedup"),
             (["--target", "speedup=2x", "--finetune-patience", "0"], "--finetune-patience must be at least 1"),
             (["--target", "flops=50%", "--plan-margin", "5"], "error: --plan-margin goes with --target speedup"),
             (["--target", "flops=50%", "--max-attempts", "2"], "error: --max-attempts goes with --target speedup"),
             (["--target", "flops=50%", "--decision-half"], "error: --decision-half goes with --target speedup"),
             (["--target", "flops=50%", "--dry-run"], "error: --dry-run goes with --target speedup"),
             (["--target", "speedup=2x", "--plan-margin", "-5"], "--plan-margin must be 0% or more"),
             (["--target", "speedup=2x", "--finetune-precision", "float16"],
              "--finetune-precision: fine-tuning in float16 needs a GPU")]
    if not torch.cuda.is_available():  # refused before the plan measures or writes anything
        cases.append((["--target", "speedup=2x", "--deploy-device", "cuda"],
                      "--deploy-device cuda: torch or the installed CTranslate2 sees no CUDA device here"))
    for index, (options, message) in enumerate(cases):
        out = tmp_path / f"out{index}"
        result = run_in_process([*common, "--out-dir", out, *options], capsys)
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2 and len(lines) == 1, (options, lines[-20:])
        assert lines[0].startswith("fairseq-headprune compress: error: ") and message in lines[0], (message, lines)
        assert not out.exists()


def test_a_plan_with_no_shape_fast_enough_is_kept_and_says_how_near_it_came(tiny_model, speedup_run, tmp_path):
    """A plan that timed no shape at the target (``choose_candidate`` gives None: tests/test_speedup_search.py),
    here the run's own plan recorded so: one line naming the fastest shape and its speed-up, report.md with every
    shape timed, no attempt; the plan is kept, so the same command answers again at once."""
    out = tmp_path / "run"
    out.mkdir()
    shutil.copytree(speedup_run["out"] / "plan", out / "plan")
    shutil.copy(speedup_run["out"] / "compress.json", out / "compress.json")
    plan = _stage(out, "plan")
    (out / "plan" / "stage.json").write_text(json.dumps({**plan, "chosen": None}))
    result = run(speedup_command(tiny_model, out), check=False)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "plan\tkept from an earlier run" in result.stdout and not (out / "attempt-1").exists()
    candidates = [PlannedCandidate.from_dict(c) for c in plan["candidates"]]
    fastest = max(candidates, key=lambda c: min(c.speedups.values()))
    slowest = min(fastest.speedups, key=fastest.speedups.get)
    assert (f"--target speedup=1.05x: the fastest shape tried ({fastest.candidate.name}) decodes "
            f"{fastest.speedups[slowest]:.2f}x as fast as the unpruned model with its vocabulary map at batch "
            f"{slowest}; ask for less (every shape timed: {out / 'report.md'})") in result.stderr
    markdown = (out / "report.md").read_text()
    assert "no attempt was made" in markdown and "**(chosen)**" not in markdown
    assert all(f"| {c.candidate.name} | {100 * c.flops_share:.1f}% |" in markdown for c in candidates)


def test_a_shape_of_whole_layers_alone_searches_nothing_and_keeps_the_other_weights(tiny_model, tmp_path):
    """An attempt whose shape removes one encoder layer and narrows nothing: the search prunes no unit and the
    compressed checkpoint is the original's other layers, renumbered, tensor for tensor."""
    from fairseq_headprune.cli import build_parser
    from fairseq_headprune.commands.compress import compress_settings

    argv = ["compress", str(tiny_model["data"]), "--path", str(tiny_model["checkpoint"]), "--out-dir",
            str(tmp_path / "top"), "--target", "speedup=1.05x", "--finetune-updates", "0", *ESTIMATES,
            "--speed-sentences", "4", "--speed-batch-sizes", "4", "--repeats", "1", "--beam", "5",
            "--batch-size", "64"]
    args, extra = build_parser().parse_known_args(argv)
    args.fairseq_args = extra
    settings = compress_settings(args)
    # the share of the decoding FLOPs the encoder's other layer keeps at full width: what the plan would price
    from fairseq_headprune.study.masks.layer_drop import LayerChoice

    second_encoder_layer = LayerChoice({"encoder": [1]}, 0.0)
    layers_only = attempt_run(settings, 0.99, second_encoder_layer, str(tmp_path / "probe"))
    from fairseq_headprune.engine.checkpoints.layers import layers_removed
    from fairseq_headprune.engine.families import family_named
    from fairseq_headprune.engine.pipelines.search import layer_costs, search_costs

    family = family_named(settings.family)
    cfg, task, model = family.load(settings.data, settings.checkpoint, settings.evaluation.generation_args, cpu=True)
    search_settings, costs = search_costs(layers_only.search_settings(settings.checkpoint, str(tmp_path)), cfg, task,
                                          model)
    with layers_removed(model, {"encoder": [1]}):
        share = layer_costs(search_settings, model).full_cost() / costs.full_cost()
    records = shrunk_attempt(attempt_run(settings, share, second_encoder_layer, str(tmp_path / "attempt")))
    search, layers = records["search"], records["layers"]
    assert search.heads_pruned == 0 and search.neurons_pruned == 0 and search.spec is None
    assert (layers.spec, layers.chosen_by) == ("encoder:2", "plan")
    dropped = 1  # the encoder layer removed, 0-based
    original = torch.load(tiny_model["checkpoint"], map_location="cpu")["model"]
    compressed = torch.load(tmp_path / "attempt" / "shrink" / "checkpoint.pt", map_location="cpu")["model"]
    kept = [layer for layer in range(2) if layer != dropped]
    for key, value in compressed.items():
        parts = key.split(".")
        if parts[:2] == ["encoder", "layers"]:
            parts[2] = str(kept[int(parts[2])])
        assert torch.equal(value, original[".".join(parts)]), key
    assert _layer_counts(compressed) == {"encoder": 1, "decoder": 2}


@pytest.fixture(scope="module")
def disagreeing_data(tiny_model, tmp_path_factory):
    """The tiny model's data with one more split, valid1: the test sources, each reference replaced by a word no
    model here writes, so that every model scores 0 BLEU on it: a decision split on which no shape loses."""
    root = tmp_path_factory.mktemp("disagreeing")
    raw = root / "raw"
    raw.mkdir()
    shutil.copy(tiny_model["raw"] / "test.en", raw / "noise.en")
    lines = (tiny_model["raw"] / "test.fr").read_text().splitlines()
    (raw / "noise.fr").write_text("".join("nonword\n" for _ in lines))
    made = root / "made"
    run(["fairseq-preprocess", "--source-lang", "en", "--target-lang", "fr", "--validpref",
         f"{tiny_model['raw'] / 'test'},{raw / 'noise'}", "--srcdict", tiny_model["data"] / "dict.en.txt",
         "--tgtdict", tiny_model["data"] / "dict.fr.txt", "--destdir", made, "--workers", "1"])
    data = root / "bin"
    data.mkdir()
    for path in tiny_model["data"].iterdir():
        os.symlink(path, data / path.name)
    for path in made.glob("valid1.*"):
        shutil.copy(path, data / path.name)
    return data


def test_decisions_follow_validation_where_it_disagrees_with_test(tiny_model, disagreeing_data, tmp_path):
    """On valid1 every model scores 0 BLEU, so no attempt loses anything there; on test the first attempt loses
    (the run above shows it): the decision is the one within the tolerance (accept or prune more), never the
    continued fine-tuning a loss on test would bring, and the test split is translated only for the result."""
    out = tmp_path / "run"
    command = ["fairseq-headprune", "compress", str(disagreeing_data), "--path", str(tiny_model["checkpoint"]),
               "--out-dir", str(out), *SPEEDUP, "--decision-subset", "valid1"]
    run(command)
    report = json.loads((out / "report.json").read_text())
    attempt = report["attempts"][0]
    assert attempt["score"]["split"] == "valid1" and attempt["score"]["delta"] == 0.0
    # decided on valid1: within the tolerance (no loss allowed there, none made): accepted, or, measured too slow, a
    # faster shape tried if the plan has one; a loss on test would have continued its fine-tuning
    candidates = [PlannedCandidate.from_dict(c) for c in report["plan"]["candidates"]]
    chosen = report["plan"]["chosen"]
    faster = prune_more(candidates, chosen, 1.05, Speedups.of(attempt["speedups"]), [chosen])
    assert attempt["decision"] == (ACCEPT if Speedups.of(attempt["speedups"]).reaches(1.05) else
                                   PRUNE_MORE if faster is not None else GIVE_UP)
    result = report["result"]
    assert result["decided"]["split"] == "valid1" and result["reported"]["split"] == "test"
    if result["attempt"] == 1:  # the disagreement itself: within on valid1, a loss on test
        assert result["reported"]["delta"] < 0
        assert result["within_tolerance"] and not result["within_tolerance_reported"]
    # the fine-tuning's target was the unpruned model's 0 BLEU: reached at the first validation
    assert attempt["finetune"]["stopped"] == "reached" and attempt["finetune"]["updates"] == 1
    for directory in ("attempt-1", "result"):
        assert _stage(out / directory, "evaluate")["split"] == ("test" if directory == "result" else "valid1")


def test_a_killed_speedup_run_resumes_its_fine_tuning_to_the_same_weights(tiny_model, speedup_run, tmp_path):
    """Killed once the first attempt's fine-tuning has validated and saved, then run again with the same plan: the
    fine-tuning resumes from its last save and ends with the uninterrupted run's weights and curve."""
    out = tmp_path / "run"
    out.mkdir()
    # the same plan (its timing is the machine's): the uninterrupted run's, and its record of the run
    shutil.copytree(speedup_run["out"] / "plan", out / "plan")
    shutil.copy(speedup_run["out"] / "compress.json", out / "compress.json")
    command = speedup_command(tiny_model, out, "--max-attempts", "1")
    kill_once_written(command, out / "attempt-1" / "finetune.partial" / "train" / "validations.json")
    assert not (out / "attempt-1" / "finetune" / "stage.json").exists()
    # resumed, and stopped again once its fine-tuning stage is complete (a stage directory appears whole, renamed
    # from its .partial): what follows the fine-tuning is the uninterrupted run's test
    kill_once_written(command, out / "attempt-1" / "finetune" / "stage.json")
    reference = torch.load(speedup_run["out"] / "attempt-1" / "finetune" / "checkpoint.pt", map_location="cpu")
    resumed = torch.load(out / "attempt-1" / "finetune" / "checkpoint.pt", map_location="cpu")
    assert sorted(reference["model"]) == sorted(resumed["model"])
    assert all(torch.equal(reference["model"][k], resumed["model"][k]) for k in reference["model"])
    assert _stage(out / "attempt-1", "finetune")["curve"] == _stage(speedup_run["out"] / "attempt-1",
                                                                    "finetune")["curve"]


def test_a_planned_narrowing_builds_the_shape_the_plan_timed(tiny_model, tmp_path):
    """``--narrowing plan``: an attempt at width 0.5 keeps half of every kept layer's heads and FFN neurons (those
    of highest Fisher information), whatever the search would have spent the FLOPs on; read off the compressed
    checkpoint's tensors."""
    from fairseq_headprune.cli import build_parser
    from fairseq_headprune.commands.compress import compress_settings
    from fairseq_headprune.study.masks.layer_drop import LayerChoice

    argv = ["compress", str(tiny_model["data"]), "--path", str(tiny_model["checkpoint"]), "--out-dir",
            str(tmp_path / "top"), "--target", "speedup=1.05x", "--narrowing", "plan", "--finetune-updates", "0",
            *ESTIMATES, "--speed-sentences", "4", "--speed-batch-sizes", "4", "--repeats", "1", "--beam", "5",
            "--batch-size", "64"]

    def settings_of(arguments):
        args, extra = build_parser().parse_known_args(arguments)
        args.fairseq_args = extra
        return compress_settings(args)

    settings = settings_of(argv)
    first_decoder_layer = LayerChoice({"decoder": [0]}, 0.0)
    attempt = attempt_run(settings, 0.3, first_decoder_layer, str(tmp_path / "attempt"), width=0.5)
    assert attempt.attempt.width == 0.5 and attempt.identity()["search"]["width"] == 0.5
    assert settings.identity()["speedup"]["narrowing"] == "plan"
    # the default narrowing leaves the width to the search, and the identities as they were before the option
    default = settings_of(argv[:8] + argv[10:])
    other = attempt_run(default, 0.3, first_decoder_layer, str(tmp_path / "other"), width=0.5)
    assert other.attempt.width is None and "width" not in other.identity()["search"]
    assert "narrowing" not in default.identity()["speedup"]
    # the fine-tune's seed is part of the run's identity where it is given, and absent (as before it) where not
    tuned = settings_of([*argv, "--finetune-updates", "5"])
    seeded = settings_of([*argv, "--finetune-updates", "5", "--finetune-seed", "3"])
    assert "seed" not in tuned.identity()["finetune"] and seeded.identity()["finetune"]["seed"] == 3
    search = shrunk_attempt(attempt)["search"]
    assert search.heads_pruned == search.heads_total // 2
    original = torch.load(tiny_model["checkpoint"], map_location="cpu", weights_only=False)
    heads = {"encoder": original["cfg"]["model"].encoder_attention_heads,
             "decoder": original["cfg"]["model"].decoder_attention_heads}
    state = original["model"]
    compressed = torch.load(tmp_path / "attempt" / "shrink" / "checkpoint.pt", map_location="cpu")["model"]
    assert _layer_counts(compressed) == {"encoder": 2, "decoder": 1}
    for key, value in compressed.items():
        parts = key.split(".")
        if len(parts) < 5 or parts[1] != "layers" or parts[-1] != "weight":
            continue
        stack, module = parts[0], parts[3]
        full = state[key] if stack == "encoder" else state[".".join([stack, "layers", "1", *parts[3:]])]
        if parts[4] == "q_proj":  # heads x head_dim rows
            head_dim = full.shape[0] // heads[stack]
            assert value.shape[0] == max(1, round(0.5 * heads[stack])) * head_dim, key
        elif module == "fc1":  # one row per FFN neuron
            assert value.shape[0] == max(1, round(0.5 * full.shape[0])), key


def test_a_decision_half_keeps_what_is_fitted_apart_from_what_decides(tiny_model, tmp_path, capsys):
    """``--decision-half``: OUT/halves holds valid's even-numbered sentences as valid-fit and its odd-numbered
    ones as valid-decide (read back with fairseq's own dataset against the original's rows); the Fisher scores,
    the plan's damage and the fine-tuning's validations read valid-fit, every decision and the unpruned reference
    valid-decide, with as many sentences as that half holds; test is translated once, for the result."""
    from fairseq.data import data_utils

    out = tmp_path / "run"
    stdout = run(speedup_command(tiny_model, out, "--decision-half", "--max-attempts", "1")).stdout
    halves = _stage(out, "halves")
    data = out / "halves" / "data"
    assert (halves["fit"], halves["decide"], halves["split"]) == ("valid-fit", "valid-decide", "valid")
    for side in ("en", "fr"):
        whole = data_utils.load_indexed_dataset(str(tiny_model["data"] / f"valid.en-fr.{side}"), None)
        fit = data_utils.load_indexed_dataset(str(data / f"valid-fit.en-fr.{side}"), None)
        decide = data_utils.load_indexed_dataset(str(data / f"valid-decide.en-fr.{side}"), None)
        assert len(fit) + len(decide) == len(whole) == halves["sentences"] and len(fit) - len(decide) in (0, 1)
        assert all(torch.equal(fit[i], whole[2 * i]) for i in range(len(fit)))
        assert all(torch.equal(decide[i], whole[2 * i + 1]) for i in range(len(decide)))
    assert os.path.realpath(data / "test.en-fr.fr.bin") == os.path.realpath(tiny_model["data"] / "test.en-fr.fr.bin")
    plan = _stage(out, "plan")
    assert plan["split"] == "valid-fit" and plan["decision_subset"] == "valid-decide"
    assert plan["stop_subset"] == "valid-fit" and plan["stop_reference"] is not None
    attempt = out / "attempt-1"
    assert _stage(attempt, "fisher")["subsets"] == ["valid-fit"]
    until = _stage(attempt, "finetune")["until"]
    # the stop target: the unpruned model's score on the half the fine-tuning validates on (no loss allowed here)
    assert until["subset"] == "valid-fit" and until["target"] == plan["stop_reference"]
    evaluated = _stage(attempt, "evaluate")
    assert (evaluated["split"], evaluated["sentences"]) == ("valid-decide", halves["decide_sentences"])
    assert _stage(out / "result", "evaluate")["split"] == "test"
    report = json.loads((out / "report.json").read_text())
    assert report["attempts"][0]["score"]["split"] == "valid-decide"
    assert report["result"]["decided"]["split"] == "valid-decide" and report["result"]["reported"]["split"] == "test"
    assert report["halves"]["decide_sentences"] == halves["decide_sentences"]
    assert "on valid-decide" in stdout
    markdown = (out / "report.md").read_text()
    assert "odd- and even-numbered sentences of valid" in markdown
    assert "fairseq's validation BLEU on valid-fit" in markdown  # the recovery curve names the half it read
    # a decision split fairseq-preprocess did not write cannot be halved: one line, before anything is timed
    result = run_in_process(speedup_command(tiny_model, tmp_path / "other", "--decision-half", "--decision-subset",
                                            "valid7")[1:], capsys)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].endswith("leave out --decision-half")
    assert not (tmp_path / "other" / "plan").exists()


def test_the_plan_exports_and_times_one_group_of_shapes_at_a_time(tiny_model, tmp_path, monkeypatch):
    """The plan's disk and timing processes hold the unpruned model and one group of shapes (``PLAN_GROUP``),
    whatever the ladder's length: each group is timed with the unpruned model beside it and deleted before the
    next is exported, and every shape of the ladder is timed once."""
    from fairseq_headprune.cli import main
    from fairseq_headprune.engine.pipelines.speedup import plan as speedup_plan

    monkeypatch.setattr(speedup_plan, "PLAN_GROUP", 3)
    groups = []
    timed = speedup_plan.time_systems

    def recording(specs, *args, **kwargs):
        reference = next(spec.model for spec in specs if spec.name == speedup_plan.REFERENCE)
        on_disk = sorted(os.path.relpath(path, os.path.dirname(reference)) for path in
                         [os.path.join(root, name) for root, names, _ in os.walk(os.path.dirname(reference))
                          for name in names if name.startswith("shape-")])
        groups.append({"timed": sorted({os.path.relpath(spec.model, os.path.dirname(reference)) for spec in specs
                                        if spec.model != reference}), "on_disk": on_disk})
        return timed(specs, *args, **kwargs)

    monkeypatch.setattr(speedup_plan, "time_systems", recording)
    out = tmp_path / "run"
    command = speedup_command(tiny_model, out)[1:]
    command[command.index("speedup=1.05x")] = "speedup=50x"  # no shape gets there: the plan alone
    assert main(command) == 2
    plan = _stage(out, "plan")
    shapes = {(str(c["dropped"]), c["width"]) for c in plan["candidates"]}
    assert len(groups) == -(-len(shapes) // 3) > 1
    for group in groups:
        assert 1 <= len(group["timed"]) <= 3 and group["on_disk"] == group["timed"]  # the earlier groups gone
    assert sum(len(group["timed"]) for group in groups) == len(shapes)
    assert all(set(c["speedups"]) == {"1", "8"} for c in plan["candidates"])


def test_the_plan_times_every_shape_once_and_again_at_length_only_where_the_timing_decides(tiny_model, tmp_path,
                                                                                           monkeypatch):
    """With --repeats 2 the plan screens every shape one round, then times at 2 rounds the shapes
    ``decisive_candidates`` names on what it has timed, until the decisive shapes of the final plan all are; each
    candidate records the rounds its speed-ups are the median of, and the report's table says them."""
    from fairseq_headprune.cli import main
    from fairseq_headprune.engine.pipelines.speedup import plan as speedup_plan
    from fairseq_headprune.study.compression.speedup.rules import decisive_candidates
    from fairseq_headprune.study.compression.speedup.shapes import PlannedCandidate

    calls = []
    timed = speedup_plan.time_systems

    def recording(specs, batch_sizes, repeats, **kwargs):
        calls.append((repeats, sorted({spec.model for spec in specs if spec.name not in (
            speedup_plan.REFERENCE, speedup_plan.STOCK)})))
        return timed(specs, batch_sizes, repeats, **kwargs)

    monkeypatch.setattr(speedup_plan, "time_systems", recording)
    monkeypatch.setattr(speedup_plan, "choose_candidate", lambda *args, **kwargs: None)  # the plan alone
    out = tmp_path / "run"
    command = speedup_command(tiny_model, out)[1:]
    command[command.index("--repeats") + 1] = "2"
    assert main(command) == 2
    plan = _stage(out, "plan")
    candidates = [PlannedCandidate.from_dict(c) for c in plan["candidates"]]
    shapes = {(c.candidate.dropped, c.candidate.width) for c in candidates}
    screened = [models for repeats, models in calls if repeats == 1]
    refined = [models for repeats, models in calls if repeats == 2]
    assert sum(len(models) for models in screened) == len(shapes) and len(calls) == len(screened) + len(refined)
    assert calls[:len(screened)] == [(1, models) for models in screened]  # every shape screened before any refined
    refined_count = sum(len(models) for models in refined)
    decisive = decisive_candidates(candidates, 1.05, plan["margin"])
    assert 0 < len({(candidates[i].candidate.dropped, candidates[i].candidate.width) for i in decisive}) \
        <= refined_count < len(shapes)
    assert all(candidates[i].rounds == 2 for i in decisive)
    assert sorted(c.rounds for c in candidates).count(2) == refined_count  # no beam variant here: one a shape
    assert plan["screen_rounds"] == 1 and plan["repeats"] == 2
    markdown = (out / "report.md").read_text()
    assert f"every shape 1 round, then the {refined_count} whose timing decides the choice" in markdown
    assert "| rounds |" in markdown
