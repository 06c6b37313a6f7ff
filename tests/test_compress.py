"""``compress``: a checkpoint to a compressed, exported and evaluated model, on the tiny models.

One run on the tiny translation model (a FLOPs target, exported to
CTranslate2): its report, the compressed checkpoint against
fairseq-generate, the exported model against the compressed fairseq model,
a second run that recomputes nothing and a lost stage redone alone. Then the
other paths (fine-tuning with the structure held, a classifier, a language
model) and the bad inputs, each one line with nothing written.
"""

import json
import os
import statistics
import time

import pytest
import torch
from test_language_model import tiny_lm  # noqa: F401  (the fixture)
from test_sentence_prediction import classifier  # noqa: F401  (the fixture)

import fairseq_headprune.compat.torch_load  # noqa: F401  (its allow-list lets torch.load read checkpoints)
from fairseq_headprune.engine.pipelines.compress_stages import Stages
from fairseq_headprune.study.compression.records import StageRecord

from conftest import kill_once_written, run, run_in_process

# small estimates and few timed sentences: the tests are about the path, not the numbers
ESTIMATES = ["--importance-limit", "64", "--tune-limit", "64", "--cpu", "--no-progress"]
QUICK = [*ESTIMATES, "--speed-sentences", "8", "--speed-batch-sizes", "1", "8", "--repeats", "1"]
QUICKER = [*ESTIMATES, "--speed-sentences", "4", "--speed-batch-sizes", "4", "--repeats", "1"]  # the other paths
# QUICKER without the tuning (compress refuses --tune-limit beside --no-tune)
UNTUNED = ["--no-tune", "--importance-limit", "64", "--cpu", "--no-progress", "--speed-sentences", "4",
           "--speed-batch-sizes", "4", "--repeats", "1"]
GENERATION = ["--beam", "5", "--batch-size", "64"]
STAGES = ("fisher", "search", "shrink", "export", "evaluate", "speed")


def compress(data, checkpoint, out, *options, check=True):
    """The command; without fine-tuning unless the options ask for it (translation fine-tunes by default)."""
    untuned = [] if "--finetune-updates" in options else ["--finetune-updates", "0"]
    return run(["fairseq-headprune", "compress", data, "--path", checkpoint, "--out-dir", out, *options, *untuned],
               check=check)


def translation_run(tiny_model, out, *extra, check=True):
    """The shared run's command (also timed and evaluated at beam 1)."""
    return compress(tiny_model["data"], tiny_model["checkpoint"], out, "--target", "flops=60%", "--export",
                    "ctranslate2", *QUICK, *GENERATION, "--speed-beams", "1", *extra, check=check)


@pytest.fixture(scope="module")
def compressed(tiny_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("compress") / "run"
    result = translation_run(tiny_model, out)
    return {"out": out, "stdout": result.stdout, "report": json.loads((out / "report.json").read_text())}


def test_a_run_writes_its_report(tiny_model, compressed):
    out, report = compressed["out"], compressed["report"]
    for stage in STAGES:
        assert f"{stage}\tdone in" in compressed["stdout"]
        assert (out / stage / "stage.json").is_file() and not (out / f"{stage}.partial").exists()
    search = report["search"]
    assert search["structure"] == "joint" and search["heads_pruned"] > 0 and search["neurons_pruned"] > 0
    assert search["flops"]["kept"] <= 0.6 * search["flops"]["full"] and search["tuned"]
    assert report["finetune"] is None and report["export"]["quantization"] == "float32"
    # exported to CTranslate2: one head count per stack by default, the decoder's self- and cross-attention
    # alike, so nothing is padded; and a vocabulary map of the training pairs
    exported = json.loads((out / "export" / "stage.json").read_text())["models"]["compressed"]
    assert exported["padded"] == {"encoder": 0, "decoder": 0}
    assert len(set(exported["kept"]["dec-dec"] + exported["kept"]["enc-dec"])) == 1
    assert len(set(exported["kept"]["enc-enc"])) == 1
    assert exported["vocabulary_map"]["valid_coverage"] > 0.9 and (out / "export" / "compressed" / "vmap.txt").is_file()
    parameters = report["shrink"]["parameters"]
    assert parameters["compressed"] < parameters["unpruned"]
    evaluation = report["evaluation"]
    assert evaluation["label"] == "BLEU" and evaluation["split"] == "test" and evaluation["sentences"] == 120
    assert evaluation["test"]["test"] == "bootstrap"
    assert_p_value_agrees_with_sacrebleu(out, evaluation, tiny_model["raw"] / "test.fr")
    assert evaluation["delta"] == pytest.approx(evaluation["compressed"] - evaluation["unpruned"])
    rows = report["speed"]["rows"]
    systems = ["fairseq unpruned", "fairseq compressed", "ct2 unpruned float32", "ct2 compressed float32",
               "ct2 unpruned float32 vmap", "ct2 compressed float32 vmap"]
    assert [(r["batch_size"], r["system"]) for r in rows] == [(b, s) for b in (1, 8) for s in systems]
    assert all(r["sentences"] == 8 and r["sentences_per_second"] > 0 and len(r["seconds"]) == 1 for r in rows)
    for batch_size in (1, 8):  # each compressed model like for like; against the stock conversion apart
        by_system = {r["system"]: r for r in rows if r["batch_size"] == batch_size}
        for system, unpruned in (("fairseq compressed", "fairseq unpruned"),
                                 ("ct2 compressed float32", "ct2 unpruned float32"),
                                 ("ct2 compressed float32 vmap", "ct2 unpruned float32 vmap")):
            row = by_system[system]
            assert row["speedup_like_for_like"] == pytest.approx(by_system[unpruned]["seconds"][0] / row["seconds"][0])
        for system in ("ct2 compressed float32", "ct2 compressed float32 vmap"):
            row = by_system[system]
            assert row["speedup_vs_stock_conversion"] == pytest.approx(
                by_system["ct2 unpruned float32"]["seconds"][0] / row["seconds"][0])
        assert by_system["ct2 unpruned float32 vmap"]["speedup_like_for_like"] is None
        assert by_system["fairseq compressed"]["speedup_vs_stock_conversion"] is None
    environment = report["speed"]["environment"]
    assert environment["device"].startswith("cpu") and environment["ctranslate2"] and environment["torch"]
    markdown = (out / "report.md").read_text()
    for text in ("# Compressed model: flops=60%", "## BLEU on test", "## Size", "## Decoding speed",
                 "ct2 compressed float32", str(out / "shrink" / "checkpoint.pt")):
        assert text in markdown, text
    assert (f"BLEU\tunpruned {evaluation['unpruned']:.2f}, compressed {evaluation['compressed']:.2f}"
            in compressed["stdout"])
    # where the speed-up comes from: engine x map x compressing, each a ratio of two systems' timed seconds, whose
    # product is the compressed model with its map against fairseq's unpruned model
    for batch_size in (1, 8):
        seconds = {r["system"]: statistics.median(r["seconds"]) for r in rows if r["batch_size"] == batch_size}
        engine = seconds["fairseq unpruned"] / seconds["ct2 unpruned float32"]
        vocabulary_map = seconds["ct2 unpruned float32"] / seconds["ct2 unpruned float32 vmap"]
        compressing = seconds["ct2 unpruned float32 vmap"] / seconds["ct2 compressed float32 vmap"]
        total = seconds["fairseq unpruned"] / seconds["ct2 compressed float32 vmap"]
        assert (f"- batch {batch_size}, `ct2 compressed float32 vmap`: CTranslate2 {engine:.2f}× (the unpruned model "
                f"converted as it is) × its vocabulary map {vocabulary_map:.2f}× (the unpruned model with and without) "
                f"× compressing {compressing:.2f}× (like for like) = {total:.2f}× fairseq's unpruned model."
                ) in markdown


def assert_p_value_agrees_with_sacrebleu(out, evaluation, tokenized_references):
    """The reported p-value against sacreBLEU's own paired bootstrap on the stored hypotheses (tokenized text
    against the corpus's tokenized references, as fairseq's scorer sees them; the same resamples and seed):
    Koehn's p and sacreBLEU's are close estimates of one evidence."""
    import sacrebleu
    from sacrebleu.significance import PairedTest

    references = tokenized_references.read_text(encoding="utf-8").splitlines()
    outputs = {}
    for weights in ("unpruned", "compressed"):
        sweep = out / "evaluate" / weights / "sweeps" / "test"
        outputs[weights] = json.loads((sweep / "configs" / "baseline.json").read_text())["hypotheses"]
    assert len(references) == evaluation["sentences"] == len(outputs["compressed"])
    metric = sacrebleu.metrics.BLEU(tokenize="none", force=True)
    assert metric.corpus_score(outputs["compressed"], [references]).score == pytest.approx(
        evaluation["compressed"], abs=0.01)
    os.environ["SACREBLEU_SEED"] = str(evaluation["test"]["seed"])
    try:
        _, results = PairedTest([("baseline", outputs["unpruned"]), ("compressed", outputs["compressed"])],
                                {"BLEU": metric}, [references], test_type="bs",
                                n_samples=evaluation["test"]["samples"])()
    finally:
        del os.environ["SACREBLEU_SEED"]
    theirs = results["BLEU"][1].p_value
    assert abs(evaluation["p_value"] - theirs) < 0.1, (evaluation["p_value"], theirs)
    assert evaluation["significant"] == (theirs < evaluation["test"]["alpha"]) or abs(theirs - 0.01) < 0.02


def test_the_compressed_checkpoint_reloads_with_the_reported_bleu(tiny_model, compressed):
    out, report = compressed["out"], compressed["report"]
    shrunk = out / "shrink" / "checkpoint.pt"
    model_cfg = vars(torch.load(shrunk, map_location="cpu")["cfg"]["model"])
    assert model_cfg["headprune_pruned_heads"] == report["search"]["spec"]
    assert model_cfg["headprune_pruned_neurons"] == report["search"]["ffn_spec"]
    at_beam_1 = report["evaluation"]["beams"][0]  # --speed-beams 1
    for checkpoint, key in ((shrunk, "compressed"), (tiny_model["checkpoint"], "unpruned")):
        for beam, scores in (("5", report["evaluation"]), ("1", at_beam_1)):
            result = run(["fairseq-headprune", "generate", tiny_model["data"], "--path", checkpoint, "--gen-subset",
                          "test", *GENERATION, "--beam", beam, "--required-batch-size-multiple", "1", "--cpu"])
            line = next(line for line in result.stdout.splitlines() if "BLEU4 = " in line)
            assert f"BLEU4 = {scores[key]:.2f}," in line, (key, beam, line)
    assert at_beam_1["beam"] == 1
    assert at_beam_1["delta"] == pytest.approx(at_beam_1["compressed"] - at_beam_1["unpruned"])
    assert at_beam_1["delta_vs_run_beam"] == pytest.approx(at_beam_1["compressed"] - report["evaluation"]["unpruned"])
    # the same systems timed at beam 1: like for like at that beam, and against the unpruned model at beam 5
    run_rows = {(r["batch_size"], r["system"]): r for r in report["speed"]["rows"]}
    beam_rows = {(r["batch_size"], r["system"]): r for r in report["speed"]["beam_rows"]}
    assert sorted(beam_rows) == sorted(run_rows) and {r["beam"] for r in beam_rows.values()} == {1}
    for (batch_size, system), row in beam_rows.items():
        if row["weights"] == "compressed":
            unpruned = system.replace("compressed", "unpruned")
            assert row["speedup_like_for_like"] == pytest.approx(
                beam_rows[(batch_size, unpruned)]["seconds"][0] / row["seconds"][0])
            # against the unpruned counterpart at beam 5 timed in the same rotation, not the run's rows (another
            # timing run, minutes apart: the machine drifts between runs)
            assert len(row["run_beam_seconds"]) == len(row["seconds"])
            assert row["run_beam_seconds"] != run_rows[(batch_size, unpruned)]["seconds"]
            assert row["speedup_vs_run_beam"] == pytest.approx(
                statistics.median(row["run_beam_seconds"]) / statistics.median(row["seconds"]))
    assert "## Beam sizes" in (out / "report.md").read_text()
    assert f"beam 1\tBLEU unpruned {at_beam_1['unpruned']:.2f}" in compressed["stdout"]


def test_the_exported_model_translates_as_the_compressed_fairseq_model(tiny_model, compressed):
    ctranslate2 = pytest.importorskip("ctranslate2")
    from test_export import beams, fairseq_model

    out = compressed["out"]
    cfg, task, model = fairseq_model(tiny_model, "--beam", "5", path=out / "shrink" / "checkpoint.pt")
    ours, theirs = beams(cfg, task, model, out / "export" / "compressed")
    assert len(ours) == 120 and ours == theirs
    assert ctranslate2.Translator(str(out / "export" / "compressed"), device="cpu")  # loads as it is
    for row in compressed["report"]["speed"]["rows"]:
        if row["engine"] == "ctranslate2" and not row["system"].endswith("vmap"):
            assert row["same_hypotheses"] == row["sentences"], row  # the fairseq model's of the same weights


def _stage_files(out):
    return {path: path.stat().st_mtime_ns for stage in STAGES for path in (out / stage).rglob("*") if path.is_file()}


def test_a_second_run_recomputes_nothing_and_a_lost_stage_is_redone_alone(tiny_model, compressed):
    out = compressed["out"]
    before = _stage_files(out)
    again = translation_run(tiny_model, out)
    assert [line for line in again.stdout.splitlines() if line.split("\t")[0] in STAGES and "batch" not in line] == [
        f"{stage}\tkept from an earlier run" for stage in STAGES]
    assert _stage_files(out) == before
    report = json.loads((out / "report.json").read_text())
    assert {s["status"] for s in report["stages"].values()} == {"kept"}
    assert report["evaluation"] == compressed["report"]["evaluation"]
    # a run stopped during the speed stage: its partial directory is dropped and the stage alone runs again
    speed = out / "speed"
    speed.rename(out / "speed.partial")
    resumed = translation_run(tiny_model, out)
    assert "speed\tdone in" in resumed.stdout and resumed.stdout.count("kept from an earlier run") == len(STAGES) - 1
    assert not (out / "speed.partial").exists() and (speed / "stage.json").is_file()
    assert {p: t for p, t in _stage_files(out).items() if "speed" not in p.parts} == {
        p: t for p, t in before.items() if "speed" not in p.parts}


FINETUNED = ["--target", "heads=50%", "--finetune-updates", "3", "--finetune-lr", "0.001", "--distill",
             "word", "--distill-weight", "0.4", *UNTUNED, "--beam", "2", "--batch-size", "64"]


@pytest.fixture(scope="module")
def finetuned(tiny_model, tmp_path_factory):
    """A run that fine-tunes (3 updates of word-level distillation), uninterrupted."""
    out = tmp_path_factory.mktemp("finetuned") / "run"
    return out, compress(tiny_model["data"], tiny_model["checkpoint"], out, *FINETUNED)


def test_fine_tuning_holds_the_pruned_heads(tiny_model, finetuned):
    out, result = finetuned
    assert "finetune\tdone in" in result.stdout
    report = json.loads((out / "report.json").read_text())
    finetune = report["finetune"]
    assert finetune["updates"] == 3 and finetune["start"] == "masked" and finetune["lr"] == 0.001
    # towards the unpruned model's word distributions (the criterion's own test checks its loss)
    assert finetune["word_distillation"] == {"teacher": str(tiny_model["checkpoint"]), "weight": 0.4}
    assert finetune["targets"] == "references" and report["distill"] is None
    # where and in what it trained, stated (this machine's CPU; a GPU trains in the checkpoint's own precision)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    assert (finetune["device"], finetune["precision"]) == (device, "float32")
    assert f"s on the {device.upper()} in float32, learning rate 0.001" in (out / "report.md").read_text()
    assert report["search"]["tuning"] is None and report["shrink"]["spec"] == report["search"]["spec"]
    # the fine-tuned checkpoint records its mask; the masked heads' weights are the original ones, the others trained
    spec = report["search"]["spec"]
    state = torch.load(out / "finetune" / "checkpoint.pt", map_location="cpu")
    assert vars(state["cfg"]["model"])["headprune_head_mask"] == spec
    assert state["cfg"]["task"]["head_mask"] is None
    from fairseq_headprune.study.masks.head_mask import parse_head_mask

    mask = parse_head_mask(spec, {"enc-enc": (2, 8), "enc-dec": (2, 8), "dec-dec": (2, 8)})
    original = torch.load(tiny_model["checkpoint"], map_location="cpu")["model"]
    prefixes = {"enc-enc": "encoder.layers.{}.self_attn.", "enc-dec": "decoder.layers.{}.encoder_attn.",
                "dec-dec": "decoder.layers.{}.self_attn."}
    changed = {True: 0, False: 0}
    for attention_type, layers in mask.items():
        for layer, heads in enumerate(layers.tolist()):
            key = prefixes[attention_type].format(layer) + "q_proj.weight"
            for head, kept in enumerate(heads):
                rows = slice(head * 8, (head + 1) * 8)
                same = torch.equal(original[key][rows], state["model"][key][rows])
                assert same or kept, f"{key} head {head + 1} is pruned but changed"
                changed[bool(kept)] += not same
    assert changed[True] > 0  # kept heads trained
    assert "Fine-tuning" in (out / "report.md").read_text()
    # the score before fine-tuning is the masked original's (no tuning): fairseq's own BLEU of the unpruned
    # checkpoint with the searched heads masked
    result = run(["fairseq-headprune", "generate", tiny_model["data"], "--path", tiny_model["checkpoint"],
                  "--head-mask", spec, "--gen-subset", "test", "--beam", "2", "--batch-size", "64",
                  "--required-batch-size-multiple", "1", "--cpu"])
    line = next(line for line in result.stdout.splitlines() if "BLEU4 = " in line)
    assert f"BLEU4 = {report['evaluation']['before_finetune']:.2f}," in line, line
    assert "| pruned, before fine-tuning |" in (out / "report.md").read_text()


def test_a_killed_finetune_resumes_from_its_last_save_and_ends_with_the_same_weights(tiny_model, finetuned, tmp_path):
    """Killed once the fine-tune has saved a resume point, then run again: it continues from that point (the
    stages before it kept) and ends with the uninterrupted run's weights, bit for bit."""
    out = tmp_path / "run"
    command = ["fairseq-headprune", "compress", str(tiny_model["data"]), "--path", str(tiny_model["checkpoint"]),
               "--out-dir", str(out), *FINETUNED]
    kill_once_written(command, out / "finetune.partial" / "train" / "checkpoint_last.pt")
    assert not (out / "finetune" / "stage.json").exists() and (out / "search" / "stage.json").exists()
    resumed = run(command)
    assert "search\tkept from an earlier run" in resumed.stdout and "finetune\tdone in" in resumed.stdout
    reference, weights = (torch.load(path / "finetune" / "checkpoint.pt", map_location="cpu")["model"]
                          for path in (finetuned[0], out))
    assert sorted(reference) == sorted(weights) and all(torch.equal(reference[k], weights[k]) for k in reference)


def test_a_resumed_stage_counts_the_seconds_its_interrupted_processes_spent_until_their_last_saves(tmp_path):
    """A resumable stage (a sweep, a fine-tune) interrupted twice records, once finished, the seconds of every
    process that worked on it: each earlier one up to its last write (what came after was lost and is done again),
    even where a later process overwrote what it saved."""
    stages = Stages(str(tmp_path), None)

    def interrupted_after(seconds):
        def build(work):
            time.sleep(seconds)
            with open(os.path.join(work, "saved"), "w") as stream:  # each process saves over the last one's
                stream.write(f"{seconds} seconds of work")
            time.sleep(0.3)  # lost with the interruption
            raise KeyboardInterrupt
        return build

    def finished(work):
        assert os.path.isfile(os.path.join(work, "saved"))
        time.sleep(0.1)
        return StageRecord()

    walls = []
    for build in (interrupted_after(0.4), interrupted_after(0.2), finished):
        began = time.perf_counter()
        try:
            stages.run("evaluate", build, resumable=True)
        except KeyboardInterrupt:
            pass
        walls.append(time.perf_counter() - began)
    recorded = stages.record("evaluate", StageRecord).seconds
    assert 0.4 + 0.2 + 0.1 <= recorded <= walls[0] - 0.3 + walls[1] - 0.3 + walls[2], (recorded, walls)
    assert sorted(os.listdir(tmp_path / "evaluate")) == ["saved", "stage.json"]  # the clock is not an output


def test_a_latency_target_measures_its_table_and_reports_the_predicted_speedup(tiny_model, tmp_path):
    """Without --latency-table, the search prices heads and neurons by CTranslate2's beam search measured first (at
    the largest timed batch size); the report sets the table's prediction beside the speed measured after export."""
    out = tmp_path / "run"
    result = compress(tiny_model["data"], tiny_model["checkpoint"], out, "--target", "latency=60%", "--export",
                      "ctranslate2", "--quantization", "auto", "--no-vocabulary-map", *UNTUNED,
                      "--beam", "2", "--batch-size", "64", check=False)
    if result.returncode != 0:  # a busy machine: no narrower variant of the tiny model timed faster than the whole
        table = json.loads((out / "search.partial" / "latency.json").read_text())
        prices = [*table["per_layer_ms"].values(), *table.get("ffn_layer_ms", {}).values()]
        assert not any(any(layer) for layer in prices), result.stderr
        assert result.returncode == 2 and "prices every layer at 0 ms" in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
        return
    report = json.loads((out / "report.json").read_text())
    assert_the_fastest_accurate_compute_type_is_exported(out, report, result.stdout)
    chosen = report["export"]["quantization"]
    search = report["search"]
    table = json.loads((out / "search" / "latency.json").read_text())
    assert search["latency_table"] == "latency.json" and table["engine"] == "ctranslate2"
    assert table["precision"] == "float32"  # the compute type is chosen after the search
    assert (table["settings"]["batch_size"], table["settings"]["beam"]) == (4, 2)  # --speed-batch-sizes 4, --beam 2
    assert search["cost"] == "latency" and search["mask_cost"] <= 0.6 * search["full_cost"] + 1e-9
    whole, saved = table["settings"]["whole_model_ms"], search["full_cost"] - search["mask_cost"]
    if whole <= saved:  # timings too noisy to predict: said so, not a speed-up above the whole model's time
        assert search["predicted_speedup"] is None and "no prediction" in search["prediction_note"]
        return
    assert search["predicted_speedup"] == pytest.approx(whole / (whole - saved))
    prediction = report["speedup_prediction"]
    measured = next(r["speedup_like_for_like"] for r in report["speed"]["rows"]
                    if r["system"] == f"ct2 compressed {chosen}")
    assert prediction["predicted"] == search["predicted_speedup"] and prediction["measured"] == measured
    assert f"predicted\tbatch 4\t{prediction['predicted']:.2f}x by the latency table" in result.stdout
    assert "The search's latency table predicted" in (out / "report.md").read_text()


def assert_the_fastest_accurate_compute_type_is_exported(out, report, stdout):
    """--quantization auto: every compute type CTranslate2 computes on this CPU among float32, int8 and int8_float32
    was timed; the one exported is the fastest (summed median seconds) whose BLEU is within 0.3 of float32's; the
    exported directories hold that type (CTranslate2's own compute_type of the loaded model), and the speed stage
    timed both models in it."""
    import ctranslate2

    choice = report["export"]["quantization_choice"]
    expected = [t for t in ("float32", "int8", "int8_float32") if t in ctranslate2.get_supported_compute_types("cpu")]
    candidates = {c["compute_type"]: c for c in choice["candidates"]}
    assert list(candidates) == expected and choice["tolerance"] == 0.3
    float32_bleu = candidates["float32"]["bleu"]
    accurate = [t for t, c in candidates.items() if c["bleu"] >= float32_bleu - 0.3 - 1e-9]
    fastest = min(accurate, key=lambda t: sum(candidates[t]["seconds"].values()))
    assert choice["chosen"] == fastest == report["export"]["quantization"]
    assert sorted(choice["too_inaccurate"]) == sorted(set(candidates) - set(accurate))
    for name in ("compressed", "unpruned"):  # as saved (CTranslate2 names int8 on a CPU int8_float32)
        saved = ctranslate2.Translator(str(out / "export" / name), device="cpu").compute_type
        assert saved == ctranslate2.Translator(str(out / "export" / name), device="cpu",
                                               compute_type=fastest).compute_type, (name, saved, fastest)
    assert not (out / "export" / "float32-timed").exists()
    systems = {r["system"] for r in report["speed"]["rows"]}
    assert {f"ct2 compressed {fastest}", f"ct2 unpruned {fastest}"} <= systems
    assert f"quantization\tauto: {fastest}: " in stdout and "timed at batch 4: float32 " in stdout
    markdown = (out / "report.md").read_text()
    assert "## Compute type (`--quantization auto`)" in markdown and "**chosen**" in markdown


def test_a_classifier_is_compressed_and_scored_by_accuracy(classifier, tmp_path):  # noqa: F811
    out = tmp_path / "run"
    compress(classifier["data"], classifier["checkpoint"], out, "--target", "flops=60%", *QUICKER,
             "--batch-size", "16")
    report = json.loads((out / "report.json").read_text())
    assert report["family"] == "classifier" and report["evaluation"]["label"] == "accuracy"
    assert report["export"] is None and {r["engine"] for r in report["speed"]["rows"]} == {"fairseq"}
    assert "## Accuracy on test" in (out / "report.md").read_text()


def test_a_language_model_is_compressed_and_scored_by_perplexity(tiny_lm, tmp_path):  # noqa: F811
    out = tmp_path / "run"
    result = compress(tiny_lm["data"], tiny_lm["checkpoint"], out, "--target", "heads=50%", "--export", "ctranslate2",
                      *QUICKER, "--sample-break-mode", "eos", "--max-tokens", "2048")
    report = json.loads((out / "report.json").read_text())
    assert report["evaluation"]["label"] == "perplexity" and report["search"]["tuned"]
    assert (out / "export" / "compressed" / "model.bin").is_file() and "exported\t" in result.stdout
    eval_lm = run(["fairseq-headprune", "eval-lm", tiny_lm["data"], "--path", out / "shrink" / "checkpoint.pt",
                   "--gen-subset", "test", "--sample-break-mode", "eos", "--max-tokens", "2048", "--cpu"])
    assert f"Perplexity: {report['evaluation']['compressed']:.2f}" in eval_lm.stdout + eval_lm.stderr
    assert_exported_lm_scores_as_fairseq(tiny_lm, out / "shrink" / "checkpoint.pt", out / "export" / "compressed")


def assert_exported_lm_scores_as_fairseq(tiny_lm, checkpoint, exported):  # noqa: F811
    """CTranslate2's Generator scores every test sentence's tokens as the fairseq model (within 1e-4)."""
    from fairseq_headprune import family_named
    from fairseq_headprune.engine.runners.batches import split_batches

    ctranslate2 = pytest.importorskip("ctranslate2")
    _, task, model = family_named("language_model").load(
        str(tiny_lm["data"]), str(checkpoint), ["--sample-break-mode", "eos", "--max-tokens", "2048"], cpu=True)
    dictionary, generator = task.target_dictionary, ctranslate2.Generator(str(exported), device="cpu")
    dataset, batches = split_batches(task, "test", max_sentences=16)
    worst, count = 0.0, 0
    for batch in batches:
        sample = dataset.collater([dataset[i] for i in batch])
        with torch.no_grad():
            lprobs = model.get_normalized_probs(model(**sample["net_input"]), log_probs=True)
        for row, (inputs, target) in enumerate(zip(sample["net_input"]["src_tokens"], sample["target"])):
            kept = target.ne(dictionary.pad())
            expected = lprobs[row].gather(-1, target.unsqueeze(-1)).squeeze(-1)[kept]
            # the model's input (</s> first) and the last target token: CTranslate2 scores all but the first
            tokens = ([dictionary[i] for i in inputs[inputs.ne(dictionary.pad())].tolist()]
                      + [dictionary[int(target[kept][-1])]])
            found = torch.tensor(generator.score_batch([tokens])[0].log_probs)
            assert len(found) == len(expected)
            worst, count = max(worst, (found - expected).abs().max().item()), count + 1
    assert count == len(dataset) and worst <= 1e-4, worst


def test_bad_inputs_are_one_line_and_write_nothing(tiny_model, classifier, compressed, tmp_path, capsys):  # noqa: F811
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "keep.txt").write_text("mine")
    fresh = tmp_path / "fresh"
    run_record = (compressed["out"] / "compress.json").read_text()
    data, checkpoint = tiny_model["data"], tiny_model["checkpoint"]
    cases = [
        (data, checkpoint, ["--target", "heads=120%", "--out-dir", fresh],
         "--target heads=120% keeps as much as the unpruned model has or more"),
        (data, checkpoint, ["--target", "params=50%", "--out-dir", fresh], "unknown target kind 'params'"),
        *([(data, checkpoint, ["--target", "heads=50%", "--deploy-device", "cuda", "--out-dir", fresh],
            "--deploy-device cuda: torch sees no CUDA device here")]
          if not torch.cuda.is_available() else []),
        (data, checkpoint, ["--target", "flops=half", "--out-dir", fresh], "the share kept is a percentage"),
        (data, checkpoint, ["--target", "flops=60%", "--latency-table", taken / "keep.txt", "--out-dir", fresh],
         "--latency-table goes with a latency target"),
        (data, checkpoint, ["--target", "latency=60%", "--export", "ctranslate2", "--no-uniform", "--out-dir", fresh],
         "--uniform off: a latency target for --export ctranslate2 is priced by a table of whole stacks"),
        (tmp_path / "no-data", checkpoint, ["--target", "heads=50%", "--out-dir", fresh], "data directory not found"),
        (data, checkpoint, ["--target", "heads=50%", "--out-dir", taken],
         f"--out-dir {taken} exists, is not empty and holds no compress run; nothing was written"),
        (data, checkpoint, ["--target", "flops=50%", "--out-dir", compressed["out"], "--export", "ctranslate2",
                            "--finetune-updates", "0", *QUICK, *GENERATION],
         "holds a compress run of other settings (search.target: 'flops=60%' there, 'flops=50%' now)"),
        (data, checkpoint, ["--target", "heads=50%", "--export", "ctranslate2", "--quantization", "float16",
                            "--cpu", "--out-dir", fresh], "--quantization float16: CTranslate2"),
        (data, checkpoint, ["--target", "heads=50%", "--quantization", "int8", "--out-dir", fresh],
         "--quantization is the exported model's weight type: it goes with --export"),
        (data, checkpoint, ["--target", "heads=50%", "--export", "ctranslate2", "--quantization", "auto",
                            "--quantization-tolerance", "-1", "--out-dir", fresh],
         "--quantization-tolerance must be 0 or more BLEU points, got -1"),
        (classifier["data"], classifier["checkpoint"], ["--target", "decoding-flops=50%", "--out-dir", fresh],
         "--target decoding-flops=50% prices a translation model's beam search; this is a classifier: use flops="),
        (classifier["data"], classifier["checkpoint"], ["--target", "heads=50%", "--export", "ctranslate2",
                                                        "--out-dir", fresh],
         "--export ctranslate2: a classifier cannot be exported to CTranslate2"),
        (data, checkpoint, ["--target", "heads=50%", "--speed-beams", "2", "0", "--out-dir", fresh],
         "--speed-beams must be positive beam sizes, got [2, 0]"),
        (classifier["data"], classifier["checkpoint"], ["--target", "heads=50%", "--speed-beams", "1",
                                                        "--out-dir", fresh],
         "--speed-beams: beam sizes are a translation model's; this checkpoint is a classifier"),
    ]
    for case_data, case_checkpoint, options, message in cases:
        result = run_in_process(["compress", case_data, "--path", case_checkpoint, *options], capsys)
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2 and len(lines) == 1, (options, lines[-20:])
        assert lines[0].startswith("fairseq-headprune compress: error: ") and message in lines[0], (message, lines)
    assert not fresh.exists()
    assert sorted(p.name for p in taken.iterdir()) == ["keep.txt"] and (taken / "keep.txt").read_text() == "mine"
    assert (compressed["out"] / "compress.json").read_text() == run_record


def test_the_deployment_benchmark_prints_its_table(tiny_model, tmp_path):
    pytest.importorskip("ctranslate2")
    result = run(["python", "scripts/benchmarks/benchmark_deploy.py", "--data", tiny_model["data"], "--path",
                  tiny_model["checkpoint"], "--head-mask", "E:1:1-3 A:2:1-4", "--ffn-mask", "E:1:1-32",
                  "--sentences", "4", "--batch-sizes", "4", "--repeats", "1", "--work", tmp_path / "work",
                  "--json", tmp_path / "deploy.json"])
    assert "batch size 4: 4 sentences of test, 1 repeats" in result.stdout
    rows = json.loads((tmp_path / "deploy.json").read_text())["rows"]
    assert [r["system"] for r in rows] == ["fairseq unpruned", "fairseq compressed", "ct2 unpruned float32",
                                           "ct2 unpruned int8", "ct2 compressed float32", "ct2 compressed int8"]
    same = {r["system"]: r["same_hypotheses"] for r in rows}
    assert same["ct2 unpruned float32"] == same["ct2 compressed float32"] == 4  # the fairseq model's of its weights
    for row in rows:
        assert row["system"] in result.stdout and row["sentences_per_second"] > 0


def test_translation_fine_tunes_by_default_and_other_families_do_not(tiny_model, classifier):  # noqa: F811
    from fairseq_headprune.cli import build_parser
    from fairseq_headprune.commands.compress import compress_settings
    from fairseq_headprune.study.compression.settings import DEFAULT_TRANSLATION_FINETUNE_UPDATES

    def settings(data, checkpoint, *options):
        args, unknown = build_parser().parse_known_args(["compress", str(data), "--path", str(checkpoint),
                                                         "--target", "heads=50%", "--out-dir", "unused", *options])
        args.fairseq_args = unknown
        return compress_settings(args)

    translation = settings(tiny_model["data"], tiny_model["checkpoint"])
    assert DEFAULT_TRANSLATION_FINETUNE_UPDATES > 0 and "finetune" in translation.stages
    assert translation.finetune.updates == DEFAULT_TRANSLATION_FINETUNE_UPDATES
    assert "finetune" not in settings(tiny_model["data"], tiny_model["checkpoint"], "--finetune-updates", "0").stages
    assert settings(classifier["data"], classifier["checkpoint"]).finetune.updates == 0
