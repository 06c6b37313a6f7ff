"""Export to CTranslate2: the exported model's own scores and beams against the fairseq model's.

On the tiny translation model, masked (heads and FFN neurons, uneven per
layer, a whole enc-dec layer included) and shrunk: CTranslate2's
``score_batch`` log-probabilities equal the masked fairseq model's (fp32,
within 1e-4) and its beam search equals fairseq's hypothesis for hypothesis.
"""

import pytest
import torch

from conftest import run, run_in_process

ctranslate2 = pytest.importorskip("ctranslate2")

HEADS = "E:1:1-5 A:2:* D:1:keep=2"  # uneven layers, a whole enc-dec layer removed
NEURONS = "E:1:1-100 D:2:keep=1-30"
# a pruning the tiny model still translates with (under the harsh one it repeats a word up to the length
# limit, where fairseq's and CTranslate2's limits differ)
MILD_HEADS, MILD_NEURONS = "E:1:1-3 A:2:1-4 D:1:keep=2-8", "E:1:1-32 D:2:keep=1-96"


def export(tiny_model, out, *options, path=None, check=True):
    return run(["fairseq-headprune", "export", tiny_model["data"], "--path", path or tiny_model["checkpoint"],
                "--out-dir", out, "--cpu", *options], check=check)


def fairseq_model(tiny_model, *options, path=None):
    from fairseq_headprune.engine.families import family_named

    return family_named("translation").load(str(tiny_model["data"]), str(path or tiny_model["checkpoint"]),
                                            list(options), cpu=True)


def batches_of(task, split="test", limit=None):
    from fairseq_headprune.engine.runners.batches import split_batches

    dataset, batches = split_batches(task, split, max_sentences=32, limit=limit)
    return dataset, batches


def tokens(dictionary, ids):
    return [dictionary[i] for i in ids if i not in (dictionary.pad(), dictionary.eos())]


def assert_scores_equal(exported, cfg, task, model):
    dataset, batches = batches_of(task, limit=64)
    translator = ctranslate2.Translator(str(exported), device="cpu")
    worst, count = 0.0, 0
    for batch in batches:
        sample = dataset.collater([dataset[i] for i in batch])
        with torch.no_grad():
            lprobs = model.get_normalized_probs(model(**sample["net_input"]), log_probs=True)
        target = sample["target"]
        reference = lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)
        sources = [tokens(task.source_dictionary, row.tolist()) for row in sample["net_input"]["src_tokens"]]
        targets = [tokens(task.target_dictionary, row.tolist()) for row in target]
        for row, result in enumerate(translator.score_batch(sources, targets)):
            expected = reference[row][target[row] != task.target_dictionary.pad()]
            assert len(result.log_probs) == len(expected)  # the tokens and </s>
            worst = max(worst, (expected - torch.tensor(result.log_probs)).abs().max().item())
            count += 1
    assert count == 64 and worst <= 1e-4, worst


def fairseq_hypotheses(cfg, task, model):
    """fairseq's best hypotheses over the test split and their sources (tokens), by sentence id."""
    dataset, batches = batches_of(task)
    generator = task.build_generator([model], cfg.generation)
    fairseq, sources = {}, {}
    with torch.no_grad():
        for batch in batches:
            sample = dataset.collater([dataset[i] for i in batch])
            for row, hypotheses in enumerate(task.inference_step(generator, [model], sample)):
                sentence = int(sample["id"][row])
                fairseq[sentence] = tokens(task.target_dictionary, hypotheses[0]["tokens"].tolist())
                sources[sentence] = tokens(task.source_dictionary, sample["net_input"]["src_tokens"][row].tolist())
    return fairseq, sources


def beams(cfg, task, model, exported):
    """fairseq's and CTranslate2's beam search (beam 5, length penalty 1) over the test split, by sentence id."""
    fairseq, sources = fairseq_hypotheses(cfg, task, model)
    ids = sorted(sources)
    translator = ctranslate2.Translator(str(exported), device="cpu")
    results = translator.translate_batch([sources[i] for i in ids], beam_size=5, length_penalty=1.0,
                                         max_batch_size=32, max_decoding_length=256)
    return [fairseq[i] for i in ids], [r.hypotheses[0] for r in results]


@pytest.mark.parametrize("options", [(), ("--head-mask", MILD_HEADS, "--ffn-mask", MILD_NEURONS)],
                         ids=["unpruned", "masked"])
def test_the_exported_model_translates_as_the_fairseq_model(tiny_model, tmp_path, options):
    export(tiny_model, tmp_path / "ct2", *options)
    cfg, task, model = fairseq_model(tiny_model, *options, "--beam", "5")
    assert_scores_equal(tmp_path / "ct2", cfg, task, model)
    ours, theirs = beams(cfg, task, model, tmp_path / "ct2")
    assert len(ours) > 100 and ours == theirs


def test_uneven_heads_are_padded_per_stack_and_score_as_the_masked_model(tiny_model, tmp_path):
    result = export(tiny_model, tmp_path / "ct2", "--head-mask", HEADS, "--ffn-mask", NEURONS)
    assert "heads kept\tenc-dec\t8 0" in result.stdout and "heads kept\tenc-enc\t3 8" in result.stdout
    assert "encoder\t8 heads per layer; 5 zero heads pad" in result.stdout
    cfg, task, model = fairseq_model(tiny_model, "--head-mask", HEADS, "--ffn-mask", NEURONS)
    assert_scores_equal(tmp_path / "ct2", cfg, task, model)


def test_a_shrunk_checkpoint_exports_as_its_masked_model(tiny_model, tmp_path):
    run(["fairseq-headprune", "shrink", "--path", tiny_model["checkpoint"], "--head-mask", HEADS,
         "--ffn-mask", NEURONS, "--out", tmp_path / "shrunk.pt"])
    export(tiny_model, tmp_path / "ct2", path=tmp_path / "shrunk.pt")
    cfg, task, model = fairseq_model(tiny_model, "--head-mask", HEADS, "--ffn-mask", NEURONS, "--beam", "5")
    assert_scores_equal(tmp_path / "ct2", cfg, task, model)
    int8 = export(tiny_model, tmp_path / "ct2-int8", "--quantization", "int8", path=tmp_path / "shrunk.pt")
    assert "(ctranslate2, int8)" in int8.stdout
    assert_int8_close_to_float32(task, tmp_path / "ct2", tmp_path / "ct2-int8")


def assert_int8_close_to_float32(task, float32_dir, int8_dir):
    """int8 weights change the scores by quantization noise only: CTranslate2's per-token log-probabilities of the
    references under int8 and float32 correlate at r >= 0.98 and differ by at most 0.3 on average.

    Measured on the tiny shrunk model: r = 0.993 and mean |Δ| 0.23 on an AVX2 CPU without VNNI (oneDNN's u8s8
    path), mean |Δ| 0.01 on an AVX-512 one; between two different models (this one and the unpruned one, both
    float32) r = 0.64 and mean |Δ| 2.7, so an export of the wrong weights fails."""
    dataset, batches = batches_of(task)
    sources, targets = [], []
    for batch in batches:
        sample = dataset.collater([dataset[i] for i in batch])
        sources += [tokens(task.source_dictionary, row.tolist()) for row in sample["net_input"]["src_tokens"]]
        targets += [tokens(task.target_dictionary, row.tolist()) for row in sample["target"]]
    scores = {}
    for name, directory in (("float32", float32_dir), ("int8", int8_dir)):
        translator = ctranslate2.Translator(str(directory), device="cpu")
        assert translator.compute_type.startswith("int8") == (name == "int8"), translator.compute_type
        scores[name] = torch.cat([torch.tensor(r.log_probs) for r in translator.score_batch(sources, targets)])
        del translator  # one translator alive at a time
    correlation = float(torch.corrcoef(torch.stack([scores["float32"], scores["int8"]]))[0, 1])
    difference = float((scores["float32"] - scores["int8"]).abs().mean())
    assert correlation >= 0.98 and difference <= 0.3, (correlation, difference)


def test_bad_exports_are_one_line_and_write_nothing(tiny_model, tmp_path, capsys):
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "keep.txt").write_text("mine")
    for options, message in [
        (["--out-dir", taken], f"--out-dir {taken} exists and is not empty; nothing was written"),
        (["--out-dir", tmp_path / "f16", "--quantization", "float16"], "--quantization float16: CTranslate2"),
    ]:
        result = run_in_process(["export", tiny_model["data"], "--path", tiny_model["checkpoint"], "--cpu",
                      *options], capsys)
        assert result.returncode == 2, result.stderr
        assert result.stderr.strip().splitlines() == [f"fairseq-headprune export: error: {message}"] or (
            len(result.stderr.strip().splitlines()) == 1 and message in result.stderr), result.stderr
    assert (taken / "keep.txt").read_text() == "mine" and sorted(p.name for p in taken.iterdir()) == ["keep.txt"]
    assert not (tmp_path / "f16").exists()


def test_layers_without_neurons_or_heads_export_masked_and_shrunk_as_the_masked_model(tiny_model, tmp_path):
    """CTranslate2 holds no empty weight: a layer keeping no neuron gets one zero neuron, a stack keeping no
    head one zero head per layer, adding nothing; that is not padding for unevenness."""
    empty, headless = "E:1:* D:2:*", "E:1:* E:2:*"
    masks = ["--ffn-mask", empty, "--head-mask", headless]
    cfg, task, model = fairseq_model(tiny_model, *masks)
    masked = export(tiny_model, tmp_path / "masked", *masks)
    assert "heads kept\tenc-enc\t0 0" in masked.stdout and "zero heads pad" not in masked.stdout
    assert "encoder\t1 heads per layer; no head kept: each layer holds one zero head" in masked.stdout
    assert_scores_equal(tmp_path / "masked", cfg, task, model)
    run(["fairseq-headprune", "shrink", "--path", tiny_model["checkpoint"], *masks, "--out", tmp_path / "shrunk.pt"])
    export(tiny_model, tmp_path / "shrunk", path=tmp_path / "shrunk.pt")
    assert_scores_equal(tmp_path / "shrunk", cfg, task, model)
