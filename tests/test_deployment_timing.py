"""Deployment timing: every system in a process of its own, decoding as the stock engines do.

References: stock fairseq-generate (the unpruned checkpoint; the compressed one
against the unpruned checkpoint with the removed heads' out_proj columns zeroed),
and CTranslate2's hypotheses against fairseq's for the same weights.
"""

import os

import pytest
import torch

from conftest import REPO, run, save_zeroed_checkpoint

SENTENCES = 8
HEAD_MASK = "E:1:1-3 A:2:1-4"  # heads removed by shrink; their out_proj columns zeroed in the reference


def stock_hypotheses(data, checkpoint):
    """fairseq-generate's best hypotheses (tokens) on the test split with fairseq's own translation task."""
    result = run(["fairseq-generate", str(data), "--path", str(checkpoint), "--task", "translation",
                  "--user-dir", str(REPO / "fairseq_headprune"), "--gen-subset", "test", "--beam", "5", "--lenpen", "1",
                  "--batch-size", "16", "--required-batch-size-multiple", "1"])
    return {int(line.split("\t")[0][2:]): line.split("\t")[2] for line in result.stdout.splitlines()
            if line.startswith("H-")}


@pytest.fixture(scope="module")
def timed(tiny_model, tmp_path_factory):
    from fairseq_headprune.engine.timing.isolated import SystemSpec, time_systems

    work = tmp_path_factory.mktemp("timing")
    compressed, exported = work / "compressed.pt", work / "ct2-unpruned"
    run(["fairseq-headprune", "shrink", "--path", tiny_model["checkpoint"], "--head-mask", HEAD_MASK,
         "--out", compressed])
    run(["fairseq-headprune", "export", tiny_model["data"], "--path", tiny_model["checkpoint"], "--out-dir", exported,
         "--quantization", "float32", "--cpu"])
    common = dict(data=str(tiny_model["data"]), split="test", sentences=SENTENCES, threads=1,
                  generation_args=["--beam", "5", "--lenpen", "1"])
    specs = [SystemSpec("ct2 unpruned float32", "ctranslate2", "unpruned", "float32", str(exported), **common),
             SystemSpec("fairseq unpruned", "fairseq", "unpruned", "float32", str(tiny_model["checkpoint"]), **common),
             SystemSpec("fairseq compressed", "fairseq", "compressed", "float32", str(compressed), **common)]
    return {"run": time_systems(specs, [1, 4], repeats=3), "work": work}


def test_each_system_decodes_in_its_own_process_without_the_other_engine(timed):
    processes = timed["run"].processes
    assert (len({p["pid"] for p in processes.values()}) == 3
            and os.getpid() not in {p["pid"] for p in processes.values()})
    assert processes["ct2 unpruned float32"]["torch_imported"] is False  # CTranslate2 alone in its process
    assert all(p["omp_wait_policy"] == os.environ.get("OMP_WAIT_POLICY") for p in processes.values())
    environment = timed["run"].environment
    assert environment["torch_in_ctranslate2_processes"] is False
    assert any("backend" in line for line in environment["ctranslate2_kernels"]), environment
    with open("/proc/cpuinfo") as stream:
        assert environment["cpu"] in stream.read()


def test_the_rounds_rotate_so_every_system_runs_in_every_position(timed):
    for passes in timed["run"].passes:
        # fairseq systems first: the first of them batches the sentences
        assert passes.rounds[0] == ["fairseq unpruned", "fairseq compressed", "ct2 unpruned float32"]
        assert [round_[0] for round_ in passes.rounds] == passes.rounds[0]
        assert all(sorted(r) == sorted(passes.rounds[0]) for r in passes.rounds)
        assert all(len(s) == 3 and min(s) > 0 for s in passes.seconds.values())


def test_the_timed_outputs_are_the_stock_engines(tiny_model, timed):
    """The unpruned model (attention through the fused kernel everywhere) decodes as stock fairseq-generate; the
    compressed one as stock fairseq on the unpruned weights with the removed heads' out_proj columns zeroed;
    CTranslate2 as fairseq for the same weights."""
    from fairseq_headprune.engine.checkpoints.info import checkpoint_head_layout
    from fairseq_headprune.study.masks.head_mask import parse_head_mask

    layout = checkpoint_head_layout(str(tiny_model["checkpoint"]))
    mask = parse_head_mask(HEAD_MASK, layout)
    zeroed = timed["work"] / "zeroed.pt"
    save_zeroed_checkpoint(tiny_model["checkpoint"], "encoder.layers.{}.self_attn.", layout["enc-enc"][1],
                           mask["enc-enc"], zeroed)
    save_zeroed_checkpoint(zeroed, "decoder.layers.{}.encoder_attn.", layout["enc-dec"][1], mask["enc-dec"], zeroed)
    unpruned, compressed = stock_hypotheses(tiny_model["data"], tiny_model["checkpoint"]), None
    compressed = stock_hypotheses(tiny_model["data"], zeroed)
    for passes in timed["run"].passes:
        assert sorted(passes.ids) == list(range(SENTENCES))
        outputs = passes.outputs
        assert outputs["fairseq unpruned"] == [unpruned[i] for i in passes.ids]
        assert outputs["fairseq compressed"] == [compressed[i] for i in passes.ids]
        assert outputs["ct2 unpruned float32"] == outputs["fairseq unpruned"]
        assert outputs["fairseq compressed"] != outputs["fairseq unpruned"]  # the heads removed made a difference
    assert timed["run"].options.beam == 5 and timed["run"].options.lenpen == 1.0


def test_a_system_that_cannot_load_is_one_error_naming_it(tiny_model, tmp_path):
    from fairseq_headprune.engine.timing.isolated import SystemSpec, time_systems
    from fairseq_headprune.errors import StudyError

    common = dict(data=str(tiny_model["data"]), split="test", sentences=2, threads=1)
    specs = [SystemSpec("fairseq unpruned", "fairseq", "unpruned", "float32", str(tiny_model["checkpoint"]), **common),
             SystemSpec("ct2 missing", "ctranslate2", "unpruned", "float32", str(tmp_path / "nothing"), **common)]
    with pytest.raises(StudyError) as raised:
        time_systems(specs, [2], repeats=1)
    message = str(raised.value)
    assert message.startswith("timing ct2 missing: ") and "\n" not in message


def test_fused_attention_everywhere_takes_the_fused_kernel_and_changes_no_hypothesis(tiny_task_and_model, monkeypatch):
    from fairseq_headprune.engine.runners.batches import iterate_samples, split_batches
    from fairseq_headprune.engine.runners.translator import translate_batches
    from fairseq_headprune.modules import masked_multihead_attention as attention

    task, model = tiny_task_and_model
    dataset, batches = split_batches(task, "test", max_sentences=16, limit=32)
    samples = list(iterate_samples(dataset, batches, torch.device("cpu")))
    calls = []
    fused = attention.MaskedMultiheadAttention._sdpa_forward
    monkeypatch.setattr(attention.MaskedMultiheadAttention, "_sdpa_forward",
                        lambda self, *a, **k: calls.append(self.attention_type) or fused(self, *a, **k))
    _, theirs = translate_batches(task, model, samples, beam=5)
    assert not calls  # an unmasked model runs fairseq's own attention
    with attention.fused_attention_everywhere():
        _, ours = translate_batches(task, model, samples, beam=5)
    assert {"enc-enc", "dec-dec"} <= set(calls) and ours == theirs  # (beamed enc-dec attention stays fairseq's)


def test_the_decoding_work_of_a_pass_is_counted(tiny_model, timed):
    """Each fairseq system reports its beam search's steps and the hypotheses they extended: at a fixed length
    every sentence of a batch stays alive to the last step, so both are known in closed form."""
    from fairseq_headprune.engine.timing.isolated import SystemSpec, time_systems
    from fairseq_headprune.study.compression.decoding import DecodingOptions

    length, beam = 4, 5
    spec = SystemSpec("fairseq unpruned", "fairseq", "unpruned", "float32", str(tiny_model["checkpoint"]),
                      data=str(tiny_model["data"]), split="test", sentences=SENTENCES, threads=1,
                      options=DecodingOptions.fixed_length(beam, length).to_dict())
    fixed = time_systems([spec], [1, 4], repeats=1)
    for passes in fixed.passes:
        batches = -(-SENTENCES // passes.batch_size)
        steps = batches * (length + 1)  # the tokens and </s>
        assert passes.decoder_work["fairseq unpruned"] == {"steps": steps, "rows": steps * passes.batch_size * beam}
        assert all(len(h.split()) == length for h in passes.outputs["fairseq unpruned"])
    for passes in timed["run"].passes:  # as the models predict: at least a step per output token and </s>
        for name in ("fairseq unpruned", "fairseq compressed"):
            work = passes.decoder_work[name]
            longest = sum(len(h.split()) + 1 for h in passes.outputs[name]) if passes.batch_size == 1 else 0
            assert work["steps"] >= longest and work["rows"] >= work["steps"]
        assert "ct2 unpruned float32" not in passes.decoder_work
        assert passes.paired_ratios("fairseq compressed", "fairseq unpruned") == [
            a / b for a, b in zip(passes.seconds["fairseq compressed"], passes.seconds["fairseq unpruned"])]
