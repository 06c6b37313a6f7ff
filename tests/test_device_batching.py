"""The batching chosen for a GPU (issue 64): the rule on constructed memory and model sizes, what the user gives
winning through the real command parser, the engine's measurements of a real model, and a sweep that runs out of
device memory. No GPU is needed: the free memory is given to the engine as a number."""

import json
import math

import pytest
import torch

from fairseq_headprune.cli import build_parser, command_flags
from fairseq_headprune.commands.common import importance_settings, sweep_settings
from fairseq_headprune.errors import StudyError
from fairseq_headprune.study.device_batching import (
    BATCH_CEILING,
    CONFIGS_CEILING,
    GIB,
    IMPORTANCE_BATCH_CEILING,
    MEMORY_SHARE,
    MIB,
    SWEEP_ROW_CEILING,
    ModelShape,
    SplitShape,
    balanced,
    choose_importance_batch,
    choose_sweep_batching,
    importance_bytes_per_sentence,
    sweep_bytes_per_sentence,
)

# a 6+6-layer, d = 512 model in fp16 with a 32,000-word vocabulary, 300 test sentences: issue 64's H100 case
WMT_BASE = ModelShape(encoder_layers=6, decoder_layers=6, embed_dim=512, ffn_dim=2048, heads=8, vocabulary=32000,
                      value_bytes=2)
TEST_SET = SplitShape(sentences=300, longest_source=80, longest_target=80)
H100_FREE = 78 * GIB


def planned_bytes(choice):
    return choice.configs_per_batch * choice.batch_size * choice.bytes_per_sentence


def test_memory_per_sentence_follows_the_stated_estimate():
    """A constructed model small enough to count by hand (the module docstring's terms)."""
    model = ModelShape(encoder_layers=1, decoder_layers=1, embed_dim=8, ffn_dim=16, heads=2, vocabulary=10,
                       value_bytes=4)
    split = SplitShape(sentences=4, longest_source=3, longest_target=5)
    cache = 1 * 2 * 8 * (3 + 5)  # one decoder layer's keys and values, self- and cross-attention
    row = 4 * (cache + 3 * 8) + (4 + 3 * 4) * 10  # + the encoder's output; scores in float32, three copies
    assert sweep_bytes_per_sentence(model, split, beam=2) == 2 * row + 4 * 3 * (4 * 8 + 16)
    activations = 1 * 3 * (12 * 8 + 2 * 16 + 2 * 2 * 3) + 1 * 5 * (18 * 8 + 2 * 16 + 2 * 2 * (5 + 3))
    assert importance_bytes_per_sentence(model, split) == 4 * activations + 5 * 10 * (4 + 8)


@pytest.mark.parametrize("total", [1, 7, 64, 300, 3003])
@pytest.mark.parametrize("limit", [1, 5, 64, 150, 256, 5000])
def test_balanced_sizes_need_no_more_batches_and_fill_them_evenly(limit, total):
    size = balanced(limit, total)
    batches = math.ceil(total / min(limit, total))
    assert size <= max(1, min(limit, total)) and math.ceil(total / size) == batches
    assert size * (batches - 1) < total  # no batch left empty: the last holds something


def test_the_cpu_keeps_the_defaults_and_what_is_given():
    default = choose_sweep_batching(None, WMT_BASE, TEST_SET, beam=5, configurations=145)
    assert (default.configs_per_batch, default.batch_size, default.chosen) == (4, None, False)
    given = choose_sweep_batching(None, WMT_BASE, TEST_SET, 5, 145, configs_per_batch=9, batch_size=33)
    assert (given.configs_per_batch, given.batch_size, given.chosen) == (9, 33, False)
    importance = choose_importance_batch(None, WMT_BASE, TEST_SET)
    assert (importance.batch_size, importance.chosen) == (None, False)


def test_an_h100_fills_with_many_configurations_of_even_batches():
    choice = choose_sweep_batching(H100_FREE, WMT_BASE, TEST_SET, beam=5, configurations=145)
    assert choice.configs_chosen and choice.batch_chosen
    assert choice.batch_size == 150  # 300 sentences in two even batches (256 at most)
    assert planned_bytes(choice) <= MEMORY_SHARE * H100_FREE
    # one more configuration per batch would still fit, unless the batches of configurations are already even
    larger = (choice.configs_per_batch + 1) * choice.batch_size * choice.bytes_per_sentence
    assert larger > MEMORY_SHARE * H100_FREE or math.ceil(145 / (choice.configs_per_batch + 1)) == math.ceil(
        145 / choice.configs_per_batch)
    assert choice.configs_per_batch * choice.batch_size > 10 * 4 * 64  # the old defaults: 4 of 64 sentences


def test_tiny_memory_still_translates_one_configuration_of_a_few_sentences():
    choice = choose_sweep_batching(200 * MIB, WMT_BASE, TEST_SET, beam=5, configurations=145)
    assert choice.configs_per_batch == 1 and 1 <= choice.batch_size < 20
    assert planned_bytes(choice) <= MEMORY_SHARE * 200 * MIB
    nothing = choose_sweep_batching(1 * MIB, WMT_BASE, TEST_SET, beam=5, configurations=145)
    assert (nothing.configs_per_batch, nothing.batch_size) == (1, 1)  # the least there is; the device may refuse it


def test_huge_memory_stops_at_the_ceilings():
    small = ModelShape(3, 3, 128, 256, 8, 5892, 4)
    choice = choose_sweep_batching(2 ** 50, small, SplitShape(3000, 40, 40), beam=5, configurations=1000)
    assert choice.batch_size <= BATCH_CEILING and choice.configs_per_batch <= CONFIGS_CEILING
    assert choice.configs_per_batch * choice.batch_size * 5 <= SWEEP_ROW_CEILING
    assert choice.batch_size == balanced(BATCH_CEILING, 3000)
    importance = choose_importance_batch(2 ** 50, small, SplitShape(3000, 40, 40))
    assert importance.batch_size == balanced(IMPORTANCE_BATCH_CEILING, 3000)
    few = choose_sweep_batching(2 ** 50, small, SplitShape(3000, 40, 40), beam=5, configurations=3)
    assert few.configs_per_batch == 3  # no more than there are


def test_what_is_given_wins_and_the_rest_is_chosen_around_it():
    batch_given = choose_sweep_batching(H100_FREE, WMT_BASE, TEST_SET, 5, 145, batch_size=16)
    assert batch_given.batch_size == 16 and not batch_given.batch_chosen and batch_given.configs_chosen
    assert batch_given.configs_per_batch == balanced(CONFIGS_CEILING, 145)  # 16 sentences leave room for many
    configs_given = choose_sweep_batching(H100_FREE, WMT_BASE, TEST_SET, 5, 145, configs_per_batch=2)
    assert configs_given.configs_per_batch == 2 and not configs_given.configs_chosen
    assert configs_given.batch_size == 150 and configs_given.batch_chosen
    tokens_given = choose_sweep_batching(H100_FREE, WMT_BASE, TEST_SET, 5, 145, max_tokens=4000)
    assert tokens_given.batch_size is None and not tokens_given.batch_chosen  # fairseq fills batches by tokens
    sentences = 4000 // 80  # the longest sentence's length counted for each
    assert tokens_given.configs_per_batch <= MEMORY_SHARE * H100_FREE // (sentences * tokens_given.bytes_per_sentence)
    both = choose_sweep_batching(H100_FREE, WMT_BASE, TEST_SET, 5, 145, configs_per_batch=3, batch_size=7)
    assert (both.configs_per_batch, both.batch_size, both.chosen) == (3, 7, False)


def test_ranks_each_get_batches_of_their_share():
    alone = choose_sweep_batching(H100_FREE, WMT_BASE, TEST_SET, 5, configurations=20)
    shared = choose_sweep_batching(H100_FREE, WMT_BASE, TEST_SET, 5, configurations=20, ranks=4)
    assert alone.configs_per_batch == 20 and shared.configs_per_batch == 5


def test_importance_keeps_what_is_given_and_the_per_batch_unit():
    full = ModelShape(6, 6, 512, 2048, 8, 32000, 4)
    chosen = choose_importance_batch(H100_FREE, full, TEST_SET)
    assert chosen.chosen and chosen.batch_size == balanced(chosen.batch_size, 300)
    assert chosen.batch_size * chosen.bytes_per_sentence <= MEMORY_SHARE * H100_FREE
    assert choose_importance_batch(H100_FREE, full, TEST_SET, batch_size=8).batch_size == 8
    assert choose_importance_batch(H100_FREE, full, TEST_SET, max_tokens=900).batch_size is None
    per_batch = choose_importance_batch(H100_FREE, full, TEST_SET, per_batch=True)
    assert per_batch.batch_size is None and not per_batch.chosen  # the scores average over batches


def test_the_choice_is_stated_in_one_line():
    line = choose_sweep_batching(H100_FREE, WMT_BASE, TEST_SET, 5, 145, batch_size=64).describe("cuda:0 (H100)")
    assert "\n" not in line and line.startswith("device batching: ")
    assert "64 sentences per batch (given)" in line and "78.0 GiB free" in line and "cuda:0 (H100)" in line
    importance = choose_importance_batch(H100_FREE, WMT_BASE, TEST_SET)
    assert f"{importance.batch_size} sentences per importance batch" in importance.describe("cuda:0")


def parsed(argv):
    """A sub-command's namespace as ``fairseq-headprune`` parses it (fairseq's options kept aside)."""
    args, unknown = build_parser().parse_known_args(argv)
    args.fairseq_args = unknown
    return args


def test_the_commands_leave_open_only_what_the_user_did_not_give():
    base = ["DATA", "--path", "m.pt", "--out-dir", "o"]
    for command in ("ablate", "prune"):
        assert sweep_settings(parsed([command, *base]), "m.pt").configs_per_batch is None
        given = sweep_settings(parsed([command, *base, "--configs-per-batch", "8", "--batch-size", "32"]), "m.pt")
        assert given.configs_per_batch == 8 and given.generation_args[:2] == ["--batch-size", "32"]
    assert importance_settings(parsed(["importance", "DATA", "--path", "m.pt", "--out-dir", "o"])).max_sentences is None
    given = importance_settings(parsed(["importance", "DATA", "--path", "m.pt", "--out-dir", "o",
                                        "--importance-batch-size", "16"]))
    assert given.max_sentences == 16


# ----------------------------------------------------------------------------- the engine, on the tiny model


@pytest.fixture(scope="module")
def loaded_sweep(tiny_model):
    def load(*options, out_dir="unused"):
        from fairseq_headprune.engine.checkpoints.loading import load_generation_model

        args = parsed(["ablate", str(tiny_model["data"]), "--path", str(tiny_model["checkpoint"]),
                       "--out-dir", str(out_dir), "--cpu", "--beam", "4", *options])
        settings = sweep_settings(args, args.path)
        return (settings, *load_generation_model(settings.data, settings.checkpoint, settings.generation_args,
                                                 cpu=True))
    return load


def raw_longest(raw, split, language):
    with open(raw / f"{split}.{language}", encoding="utf-8") as stream:
        return max(len(line.split()) + 1 for line in stream)  # + </s>


def test_the_engine_measures_the_model_and_the_split(tiny_model, loaded_sweep):
    from fairseq_headprune.engine.runners.device_batching import model_shape, split_shape

    _, cfg, task, model = loaded_sweep()
    shape = model_shape(model, task, half=False)
    assert (shape.encoder_layers, shape.decoder_layers, shape.embed_dim, shape.ffn_dim, shape.heads) == (2, 2, 64,
                                                                                                         128, 8)
    assert shape.vocabulary == len(task.target_dictionary) == model.decoder.output_projection.out_features
    assert shape.parameters == sum(p.numel() for p in model.parameters())
    split = split_shape(task, ["valid"])
    assert split.sentences == 200
    assert (split.longest_source, split.longest_target) == (raw_longest(tiny_model["raw"], "valid", "en"),
                                                            raw_longest(tiny_model["raw"], "valid", "fr"))


def test_the_engine_fills_a_gpu_and_keeps_what_is_given(loaded_sweep, capsys, tmp_path):
    from fairseq_headprune.engine.runners.device_batching import sweep_batching

    gpu = lambda model: H100_FREE  # noqa: E731  (what torch.cuda.mem_get_info would say)
    settings, cfg, task, model = loaded_sweep(out_dir=tmp_path / "open")
    chosen = sweep_batching(settings, cfg, task, model, "valid", 47, free_memory=gpu)
    line = capsys.readouterr().out
    assert line.count("\n") == 1 and line.startswith("device batching: ")
    assert chosen.configs_per_batch == 47 and chosen.configs_per_batch_chosen  # all 47 configurations in a batch
    assert cfg.dataset.batch_size == 200 and chosen.generation_args[-2:] == ["--batch-size", "200"]

    settings, cfg, task, model = loaded_sweep("--configs-per-batch", "3", "--batch-size", "16",
                                              out_dir=tmp_path / "given")
    given = sweep_batching(settings, cfg, task, model, "valid", 47, free_memory=gpu)
    assert capsys.readouterr().out == ""  # nothing chosen, nothing said
    assert (given.configs_per_batch, cfg.dataset.batch_size, given.configs_per_batch_chosen) == (3, 16, False)

    settings, cfg, task, model = loaded_sweep(out_dir=tmp_path / "cpu")
    cpu = sweep_batching(settings, cfg, task, model, "valid", 47, free_memory=lambda model: None)
    assert capsys.readouterr().out == "" and cpu == settings and cpu.batch_configs == 4
    assert (cfg.dataset.batch_size, cfg.dataset.max_tokens) == (None, None)  # fairseq-generate's own batching


def test_a_started_sweep_keeps_its_batches(loaded_sweep, tmp_path):
    from fairseq_headprune.engine.runners.device_batching import sweep_batching

    manifest = tmp_path / "sweeps" / "valid" / "sweep.json"
    manifest.parent.mkdir(parents=True)
    manifest.write_text(json.dumps({"identity": {"max_tokens": None, "batch_size": 37}, "references": []}))
    settings, cfg, task, model = loaded_sweep(out_dir=tmp_path)
    resumed = sweep_batching(settings, cfg, task, model, "valid", 47, free_memory=lambda model: H100_FREE)
    assert cfg.dataset.batch_size == 37 and resumed.generation_args[-2:] == ["--batch-size", "37"]
    assert resumed.configs_per_batch_chosen  # still chosen around the recorded batch
    on_cpu = sweep_batching(settings, *loaded_sweep(out_dir=tmp_path)[1:], "valid", 47,
                            free_memory=lambda model: None)
    assert on_cpu.generation_args[-2:] == ["--batch-size", "37"]


def test_importance_on_a_gpu_takes_a_batch_that_fills_it(loaded_sweep, capsys):
    from fairseq_headprune.engine.runners.device_batching import importance_batching
    from fairseq_headprune.study.settings import ImportanceSettings

    _, _, task, model = loaded_sweep()
    gpu = lambda model: H100_FREE  # noqa: E731
    chosen = importance_batching(ImportanceSettings(subsets=["valid"], limit=150), task, model, free_memory=gpu)
    assert chosen.max_sentences == 150  # the 150 sentences asked for, in one batch
    assert capsys.readouterr().out.startswith("device batching: 150 sentences per importance batch; chosen for cpu")
    for kept in (ImportanceSettings(subsets=["valid"], max_sentences=8), ImportanceSettings(subsets=["valid"],
                 max_tokens=500), ImportanceSettings(subsets=["valid"], granularity="batch")):
        assert importance_batching(kept, task, model, free_memory=gpu) == kept
    cpu = ImportanceSettings(subsets=["valid"])
    assert importance_batching(cpu, task, model, free_memory=lambda model: None) == cpu
    assert capsys.readouterr().out == ""


# ----------------------------------------------------------------------------- running out of device memory


class RunnerShortOfMemory:
    """Runs at most ``fits`` masks together; more raise what torch raises when the GPU is full."""

    split, manifest_references, model = "test", [], None

    def __init__(self, fits):
        self.fits, self.calls = fits, []

    class result_type:  # noqa: N801  (what run_sweep stores per configuration)
        def __init__(self, name, spec, labels, value):
            self.name, self.value = name, value

        def to_dict(self):
            return {"name": self.name, "value": self.value}

    def run_many(self, masks):
        self.calls.append(len(masks))
        if len(masks) > self.fits:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return [Kept(float(sum(t.sum() for t in mask.values()))) for mask in masks]


class Kept:
    """A configuration's output: the heads its mask kept."""

    def __init__(self, value):
        self.value = value


def masked_configs(count):
    from fairseq_headprune.study.importance.ablation import HeadConfig
    from fairseq_headprune.study.masks.head_mask import parse_head_mask

    layout = {"enc-enc": (1, 16)}
    return [HeadConfig(f"E-1-{h}", parse_head_mask(f"E:1:{h}", layout)) for h in range(1, count + 1)]


def test_a_chosen_batch_that_runs_out_of_memory_is_split(tmp_path):
    from fairseq_headprune.engine.sweeps.resumable_sweep import run_sweep

    runner = RunnerShortOfMemory(fits=3)
    configs = masked_configs(13)
    results = run_sweep(runner, configs, str(tmp_path), {"sweep": 1}, progress=False, configs_per_batch=8,
                        split_on_memory_error=True)
    assert [results[c.name].value for c in configs] == [15.0] * 13  # every configuration, one head masked
    assert runner.calls[:3] == [8, 4, 2] and max(runner.calls[3:]) <= 2  # halved until it fits, and kept there
    assert sum(n for n in runner.calls if n <= 3) == 13


def test_a_given_batch_that_runs_out_of_memory_is_a_one_line_error(tmp_path):
    from fairseq_headprune.engine.sweeps.resumable_sweep import run_sweep

    with pytest.raises(StudyError, match=r"^out of GPU memory running 8 configuration\(s\) together: make the "
                                         r"configs per batch, the batch size or the max tokens smaller$") as error:
        run_sweep(RunnerShortOfMemory(fits=3), masked_configs(13), str(tmp_path), {"sweep": 1}, progress=False,
                  configs_per_batch=8)
    assert error.value.worded(command_flags("ablate")) == (
        "out of GPU memory running 8 configuration(s) together: make --configs-per-batch, --batch-size or "
        "--max-tokens smaller")  # as the ablate command prints it
