"""Whole layers removed, and the distillation data that fine-tunes a shallower model.

References: stock fairseq-generate and fairseq-validate with fairseq's own
``--model-overrides {'decoder_layers_to_keep': ...}`` (LayerDrop pruning at
load time) for the shallower checkpoint and the layer choice's losses;
CTranslate2's scores and beams against the shallower fairseq model; stock
fairseq-generate's hypotheses for the teacher's outputs.
"""

import json
import math
import re

import pytest
import torch

from conftest import USER_DIR, run

LIMIT = 30  # fairseq's --max-len-b, CTranslate2's max_decoding_length in the comparisons
GENERATE = ["--user-dir", USER_DIR, "--task", "translation", "--beam", "5", "--batch-size", "64",
            "--required-batch-size-multiple", "1"]


def _hypotheses(output):
    """fairseq-generate's H- lines: sentence id -> hypothesis text."""
    lines = (line.split("\t") for line in output.splitlines() if line.startswith("H-"))
    return {int(fields[0][2:]): fields[2] for fields in lines}


def assert_decodes_as_fairseq(tiny_model, checkpoint, exported):
    """CTranslate2's greedy and beam search against fairseq's on the test split, at one length limit.

    Greedy decoding equals hypothesis for hypothesis. Beam search too, but for two cases where the searches
    themselves differ, not the models: at the limit fairseq forces </s> into the beam where CTranslate2 cuts its
    hypotheses (an untrained shallower model repeats a word up to it), and near-ties, where CTranslate2's
    length normalization ranks two hypotheses whose per-token scores (``score_batch``: fairseq's own, as
    ``assert_scores_equal`` checks) are within 0.002 of each other the other way round.
    """
    import ctranslate2
    from test_export import fairseq_hypotheses, fairseq_model

    translator = ctranslate2.Translator(str(exported), device="cpu")
    compared = {}
    for beam in (1, 5):
        cfg, task, model = fairseq_model(tiny_model, "--beam", str(beam), "--max-len-b", str(LIMIT), path=checkpoint)
        ours, sources = fairseq_hypotheses(cfg, task, model)
        ids = sorted(sources)
        results = translator.translate_batch([sources[i] for i in ids], beam_size=beam, length_penalty=1.0,
                                             max_batch_size=32, max_decoding_length=LIMIT)
        theirs = {i: result.hypotheses[0] for i, result in zip(ids, results)}
        assert len(ids) == 120
        kept = [i for i in ids if beam == 1 or len(ours[i]) < LIMIT]
        if beam == 1:
            assert [ours[i] for i in kept] == [theirs[i] for i in kept]
        for i in (i for i in kept if ours[i] != theirs[i]):
            scored = translator.score_batch([sources[i]] * 2, [ours[i], theirs[i]])
            per_token = [sum(result.log_probs) / len(result.log_probs) for result in scored]
            assert abs(per_token[0] - per_token[1]) < 2e-3, (i, ours[i], theirs[i], per_token)
        compared[beam] = sum(ours[i] == theirs[i] for i in kept)
    return compared


def test_layer_drop_specs_parse_check_and_print():
    from fairseq_headprune.errors import HeadMaskError
    from fairseq_headprune.study.masks.layer_drop import kept_layers, layer_drop_to_spec, parse_layer_drop

    depths = {"encoder": 6, "decoder": 6}
    dropped = parse_layer_drop("decoder:2-3,6; encoder:1 decoder:2", depths)
    assert dropped == {"decoder": [1, 2, 5], "encoder": [0]}
    assert layer_drop_to_spec(dropped) == "encoder:1 decoder:2-3,6"
    assert parse_layer_drop(layer_drop_to_spec(dropped), depths) == dropped
    assert kept_layers(dropped, depths) == {"encoder": [1, 2, 3, 4, 5], "decoder": [0, 3, 4]}
    for spec, message in (("decoder:1-6", "must keep at least one"), ("decoder:7", "layers 1-6, not 7"),
                          ("middle:1", "unknown stack"), ("decoder", "malformed term"), ("decoder:2-1", "malformed"),
                          ("encoder:1", "has no encoder")):
        with pytest.raises(HeadMaskError, match=message):
            parse_layer_drop(spec, depths if spec != "encoder:1" else {"decoder": 6})


def test_a_checkpoint_without_layers_translates_as_stock_fairseq_leaving_them_out(tiny_model, tmp_path):
    from fairseq_headprune.engine.checkpoints.info import load_checkpoint_state

    shallower = tmp_path / "shallower.pt"
    result = run(["fairseq-headprune", "shrink", "--path", tiny_model["checkpoint"], "--drop-layers",
                  "encoder:1 decoder:2", "--out", shallower])
    assert "removed\tlayers encoder:1 decoder:2 (encoder 2 -> 1, decoder 2 -> 1 layers)" in result.stdout
    assert "heads:" not in result.stdout  # no head was asked to go
    ours = run(["fairseq-generate", tiny_model["data"], "--path", shallower, "--gen-subset", "test", *GENERATE])
    overrides = {"encoder_layers_to_keep": "1", "decoder_layers_to_keep": "0"}  # fairseq's LayerDrop pruning
    stock = run(["fairseq-generate", tiny_model["data"], "--path", tiny_model["checkpoint"], "--gen-subset", "test",
                 "--model-overrides", repr(overrides), *GENERATE])
    assert len(_hypotheses(ours.stdout)) == 120 and _hypotheses(ours.stdout) == _hypotheses(stock.stdout)
    # exactly the removed layers' parameters are gone, and the config says how deep the model is
    original, smaller = (load_checkpoint_state(str(p)) for p in (tiny_model["checkpoint"], shallower))
    removed = ("encoder.layers.0.", "decoder.layers.1.")
    assert sum(t.numel() for k, t in original["model"].items() if k.startswith(removed)) == (
        sum(t.numel() for t in original["model"].values()) - sum(t.numel() for t in smaller["model"].values()))
    assert smaller["cfg"]["model"].encoder_layers == smaller["cfg"]["model"].decoder_layers == 1


def test_the_shallower_checkpoint_exports_and_translates_as_its_fairseq_model(tiny_model, tmp_path):
    pytest.importorskip("ctranslate2")
    from test_export import assert_scores_equal, export, fairseq_model

    shallower = tmp_path / "shallower.pt"
    run(["fairseq-headprune", "shrink", "--path", tiny_model["checkpoint"], "--drop-layers", "decoder:1",
         "--head-mask", "E:1:1-2", "--out", shallower])
    export(tiny_model, tmp_path / "ct2", path=shallower)
    cfg, task, model = fairseq_model(tiny_model, path=shallower)
    assert len(model.decoder.layers) == 1 and model.encoder.layers[0].self_attn.num_heads == 6
    assert_scores_equal(tmp_path / "ct2", cfg, task, model)
    compared = assert_decodes_as_fairseq(tiny_model, shallower, tmp_path / "ct2")
    assert compared[1] == 120, compared


def test_the_layer_choice_over_both_stacks_measures_as_many_losses_as_its_progress_counts(tiny_task_and_model):
    from fairseq_headprune.engine.checkpoints.layers import model_depths
    from fairseq_headprune.engine.compression.layer_choice import choose_layers, passes_left
    from fairseq_headprune.engine.runners.batches import collated_samples
    from fairseq_headprune.engine.search.tuning_guard import token_nll

    task, model = tiny_task_and_model
    samples = collated_samples(task, model, ["valid"], None, 64, None)
    counts = {"encoder": 1, "decoder": 1}
    choice = choose_layers(model, token_nll(task.target_dictionary.pad()), samples, counts, progress=False)
    assert {stack: len(layers) for stack, layers in choice.dropped.items()} == counts
    measured = [len(step.candidates) for step in choice.steps]
    # the first step tries all four layers, the second the two of the stack that still loses one
    assert measured == [4, 2]
    assert passes_left(model_depths(model), counts, {"encoder": [], "decoder": []}) == sum(measured)


def test_the_layer_choice_measures_the_loss_stock_fairseq_validate_reports(tiny_model, tiny_task_and_model):
    from fairseq_headprune.engine.checkpoints.layers import model_depths
    from fairseq_headprune.engine.compression.layer_choice import choose_layers
    from fairseq_headprune.engine.runners.batches import collated_samples
    from fairseq_headprune.engine.search.tuning_guard import token_nll

    task, model = tiny_task_and_model
    samples = collated_samples(task, model, ["valid"], None, 64, None)
    choice = choose_layers(model, token_nll(task.target_dictionary.pad()), samples, {"decoder": 1}, progress=False)
    assert model_depths(model) == {"encoder": 2, "decoder": 2}  # every layer back
    step = choice.steps[0]
    assert set(step.candidates) == {"decoder:1", "decoder:2"}
    assert step.loss == min(step.candidates.values()) and choice.dropped == {"decoder": [step.layer - 1]}
    # the candidates' losses, in bits per token, are fairseq-validate's with that layer left out at load time
    for candidate, loss in step.candidates.items():
        kept = "1" if candidate == "decoder:1" else "0"
        result = run(["fairseq-validate", tiny_model["data"], "--path", tiny_model["checkpoint"], "--user-dir",
                      USER_DIR, "--task", "translation", "--criterion", "cross_entropy", "--valid-subset", "valid",
                      "--batch-size", "64", "--model-overrides",
                      repr({"encoder_layers_to_keep": "0,1", "decoder_layers_to_keep": kept})])
        # the checkpoint's label-smoothed criterion prints the plain cross-entropy as nll_loss
        reported = float(re.search(r"\| nll_loss ([\d.]+)", result.stdout + result.stderr).group(1))
        assert loss / math.log(2) == pytest.approx(reported, abs=1e-3), candidate
    assert choice.base_loss < step.loss


def test_distilled_targets_are_the_teachers_beam_outputs(tiny_model, tmp_path):
    from fairseq_headprune.engine.compression.distillation import write_distilled_data
    from fairseq_headprune.engine.families import family_named
    from fairseq_headprune.engine.runners.batches import load_split

    translation = family_named("translation")
    cfg, task, model = translation.load(str(tiny_model["data"]), str(tiny_model["checkpoint"]),
                                        ["--beam", "5", "--batch-size", "64"], cpu=True)
    outcome = write_distilled_data(cfg, task, model, str(tmp_path / "distilled"), split="valid", progress=False)
    assert outcome.sentences == 200 and 0 <= outcome.identical < 200
    # fairseq reads the new directory: the sources and the references of other splits are the original ones
    _, distilled_task, _ = translation.load(str(tmp_path / "distilled"), str(tiny_model["checkpoint"]), [], cpu=True)
    for split in ("valid", "test"):
        load_split(distilled_task, split)
        load_split(task, split)
    original, distilled = task.dataset("valid"), distilled_task.dataset("valid")
    assert all(torch.equal(original.src[i], distilled.src[i]) for i in range(200))
    assert all(torch.equal(task.dataset("test").tgt[i], distilled_task.dataset("test").tgt[i]) for i in range(120))
    stock = _hypotheses(run(["fairseq-generate", tiny_model["data"], "--path", tiny_model["checkpoint"],
                             "--gen-subset", "valid", *GENERATE]).stdout)
    dictionary = task.target_dictionary
    assert len(stock) == 200
    for sentence, hypothesis in stock.items():
        target = distilled.tgt[sentence]
        assert int(target[-1]) == dictionary.eos() and dictionary.string(target) == hypothesis, sentence
    assert sum(len(distilled.tgt[i]) for i in range(200)) == outcome.target_tokens


@pytest.fixture(scope="module")
def small_training_data(tiny_model, tmp_path_factory):
    """The tiny model's data with its valid split as the training split too: distilled in seconds."""
    data = tmp_path_factory.mktemp("small") / "bin"
    data.mkdir()
    for path in tiny_model["data"].iterdir():
        name = path.name
        if name.startswith("train."):
            continue
        (data / name).symlink_to(path)
        if name.startswith("valid."):
            (data / name.replace("valid.", "train.", 1)).symlink_to(path)
    return data


def test_compress_removes_decoder_layers_and_fine_tunes_on_distilled_targets(tiny_model, small_training_data,
                                                                              tmp_path):
    from test_compress import GENERATION, QUICKER, compress

    out = tmp_path / "run"
    result = compress(small_training_data, tiny_model["checkpoint"], out, "--target", "decoding-flops=45%",
                      "--drop-decoder-layers", "1", "--finetune-updates", "4", "--distill", "sequence",
                      "--export", "ctranslate2", *QUICKER, *GENERATION)
    for stage in ("layers", "fisher", "search", "distill", "finetune", "shrink", "export", "evaluate", "speed"):
        assert f"{stage}\tdone in" in result.stdout, stage
    report = json.loads((out / "report.json").read_text())
    layers, search = report["layers"], report["search"]
    step = layers["steps"][0]
    assert layers["spec"] == f"decoder:{step['layer']}" and step["loss"] == min(step["candidates"].values())
    assert f"layers\tremoved {layers['spec']}" in result.stdout
    # the budget is a share of the unpruned model's cost: the search prunes the shallower model down to it
    assert layers["kept_cost"] > 0.45 * layers["full_cost"] >= search["mask_cost"] > 0
    assert search["full_cost"] == pytest.approx(layers["kept_cost"])
    distill = report["distill"]
    assert distill["sentences"] == 200 and report["finetune"]["targets"] == "distilled"
    assert report["finetune"]["updates"] == 4 and report["evaluation"]["before_finetune"] is not None
    assert "before fine-tuning" in result.stdout
    # the compressed model is one decoder layer deep in fairseq and in CTranslate2, and translates alike
    from test_export import fairseq_model

    _, _, model = fairseq_model(tiny_model, path=out / "shrink" / "checkpoint.pt")
    assert len(model.decoder.layers) == 1 and len(model.encoder.layers) == 2
    compared = assert_decodes_as_fairseq(tiny_model, out / "shrink" / "checkpoint.pt", out / "export" / "compressed")
    assert compared[1] == 120 and compared[5] >= 100, compared
    markdown = (out / "report.md").read_text()
    assert "**Whole layers removed** first" in markdown and "sequence-level distillation" in markdown
    # the size table starts from the shallower model, and the report says so with its count
    kept = layers["parameters"]["kept"]
    table_total = next(row for row in report["shrink"]["report"] if row.startswith("total")).split("\t")
    assert int(table_total[1]) == kept < report["shrink"]["parameters"]["unpruned"] == layers["parameters"]["unpruned"]
    assert f"took the model to {kept:,} parameters" in markdown


@pytest.mark.parametrize("options, message", [
    (["--target", "decoding-flops=50%", "--drop-decoder-layers", "2"], "keeps at least one"),
    (["--target", "latency=50%", "--drop-decoder-layers", "1"], "a latency table is timed on the full model"),
    (["--target", "flops=50%", "--distill", "sequence"], "--distill goes with fine-tuning"),
    (["--target", "flops=50%", "--finetune-updates", "2", "--distill-weight", "0.3"], "--distill word"),
    (["--target", "flops=50%", "--finetune-updates", "2", "--distill", "word", "--distill-weight", "2"],
     "between 0 and 1"),
    (["--target", "decoding-flops=60%", "--drop-decoder-layers", "1"], "already keeps"),
], ids=["all-layers", "latency", "distill-alone", "weight-alone", "weight-range", "target-met"])
def test_bad_layer_and_distillation_options_are_one_line(tiny_model, tmp_path, options, message, capsys):
    from test_compress import QUICKER

    from fairseq_headprune import cli

    untuned = [] if "--finetune-updates" in options else ["--finetune-updates", "0"]
    status = cli.main(["compress", str(tiny_model["data"]), "--path", str(tiny_model["checkpoint"]), "--out-dir",
                       str(tmp_path / "run"), *options, *untuned, *QUICKER])
    error = capsys.readouterr().err.strip().splitlines()
    assert status != 0 and len(error) == 1 and message in error[0], error
    assert not any((tmp_path / "run").glob("*/stage.json"))


def test_bad_drop_layers_specs_are_one_line(tiny_model, tmp_path, capsys):
    from fairseq_headprune import cli

    for spec, message in (("decoder:1-2", "must keep at least one"), ("decoder:3", "layers 1-2, not 3")):
        status = cli.main(["shrink", "--path", str(tiny_model["checkpoint"]), "--drop-layers", spec, "--out",
                           str(tmp_path / "x.pt")])
        error = capsys.readouterr().err.strip().splitlines()
        assert status != 0 and len(error) == 1 and message in error[0], error
        assert not (tmp_path / "x.pt").exists()


def test_word_distillation_is_fairseqs_loss_interpolated_with_the_teachers_cross_entropy(tiny_model,
                                                                                       tiny_task_and_model):
    """Kim & Rush's word-level loss, against fairseq's own label-smoothed criterion and the cross-entropy between
    the teacher's and the student's distributions computed here from both models' outputs."""
    from fairseq import checkpoint_utils
    from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterion

    from fairseq_headprune.criterions.headprune_word_distillation import HeadPruneWordDistillationCriterion
    from fairseq_headprune.engine.runners.batches import collated_samples
    from fairseq_headprune.modules.masked_multihead_attention import head_mask_applied
    from fairseq_headprune.study.masks.head_mask import parse_head_mask

    task, student = tiny_task_and_model
    sample = collated_samples(task, student, ["valid"], None, 16, 16)[0]
    (teacher,), _ = checkpoint_utils.load_model_ensemble([str(tiny_model["checkpoint"])],
                                                         arg_overrides={"data": str(tiny_model["data"])})
    teacher.eval()
    criterion = HeadPruneWordDistillationCriterion(task, False, 0.1, distill_teacher=str(tiny_model["checkpoint"]),
                                                   distill_weight=0.3)
    stock = LabelSmoothedCrossEntropyCriterion(task, False, 0.1)
    mask = parse_head_mask("E:1:1-6 D:2:keep=1", {"enc-enc": (2, 8), "enc-dec": (2, 8), "dec-dec": (2, 8)})
    with head_mask_applied(student, mask), torch.no_grad():  # the student: the model with heads masked
        loss, sample_size, logged = criterion(student, sample)
        reference, _, _ = stock(student, sample)
        student_lprobs = student.get_normalized_probs(student(**sample["net_input"]), log_probs=True)
        teacher_probs = teacher.get_normalized_probs(teacher(**sample["net_input"]), log_probs=False)
    tokens = sample["target"].ne(task.target_dictionary.pad())
    distilled = -(teacher_probs * student_lprobs).sum(-1)[tokens].sum()
    assert float(logged["distill_loss"]) == pytest.approx(float(distilled), rel=1e-5)
    assert float(loss) == pytest.approx(0.7 * float(reference) + 0.3 * float(distilled), rel=1e-5)
    assert sample_size == sample["ntokens"] and float(distilled) > float(logged["nll_loss"]) * 0.1
    assert not any(name.startswith("_teacher") for name, _ in criterion.named_parameters())


def test_a_heads_target_after_whole_layers_searches_the_whole_heads_within_its_share(tiny_model, tmp_path):
    """``--target heads=P% --drop-decoder-layers 1`` through the real parser: the share is of the unpruned model's
    heads, the shallower model keeps the whole heads within it (a budget resolved once, not re-parsed)."""
    from test_compress import GENERATION, UNTUNED, compress

    out = tmp_path / "run"
    compress(tiny_model["data"], tiny_model["checkpoint"], out, "--target", "heads=40%", "--drop-decoder-layers",
             "1", *UNTUNED, *GENERATION)
    report = json.loads((out / "report.json").read_text())
    layers, search = report["layers"], report["search"]
    assert layers["full_cost"] == 48 and layers["kept_cost"] == 32  # 2 + 2 layers of 8 heads; one decoder layer
    assert search["budget"] == 19  # 40% of 48 heads: 19.2, the whole heads within it
    assert search["mask_cost"] <= 19 and search["heads_total"] - search["heads_pruned"] == search["mask_cost"]


def test_the_cost_estimate_counts_the_loss_passes_the_plans_layer_choices_make(tiny_task_and_model):
    """``layer_choice_passes`` (the cost probe's count, no model) against the losses ``choose_layers`` measures for
    every shape of the plan's ladder with one cache, as the plan calls it."""
    from fairseq_headprune.engine.checkpoints.layers import model_depths
    from fairseq_headprune.engine.compression.layer_choice import choose_layers
    from fairseq_headprune.engine.runners.batches import collated_samples
    from fairseq_headprune.engine.search.tuning_guard import token_nll
    from fairseq_headprune.study.compression.speedup.cost import layer_choice_passes
    from fairseq_headprune.study.compression.speedup.shapes import candidate_ladder

    task, model = tiny_task_and_model
    samples = collated_samples(task, model, ["valid"], None, 64, 16)
    depths = model_depths(model)
    counts = [candidate.drop_counts for candidate in candidate_ladder(depths)]
    cache: dict = {}
    for layer_counts in {tuple(sorted(c.items())): c for c in counts}.values():
        choose_layers(model, token_nll(task.target_dictionary.pad()), samples, layer_counts, progress=False,
                      cache=cache)
    assert len(cache) == layer_choice_passes(depths, counts) > 1
