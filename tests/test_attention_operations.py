"""What the masked and shrunk models compute, counted operation by operation through torch's dispatcher.

A mask must cost nothing where none is set and at most one elementwise product
per attention call where one is; a shrunk model must run the same kernels as the
unpruned one on fewer heads. Counting the operations (never timing them) tests
that on the tiny model, whatever the machine's speed.
"""

import collections
import contextlib

import pytest
import torch
from fairseq.dataclass.configs import GenerationConfig
from torch.utils._python_dispatch import TorchDispatchMode

from fairseq_headprune.modules.masked_multihead_attention import (
    MaskedMultiheadAttention,
    attention_modules,
    fused_attention_everywhere,
    head_layout,
    set_head_mask,
)
from fairseq_headprune.study.masks.head_mask import parse_head_mask

from conftest import run

# what reshapes a tensor's view of its storage and computes nothing
METADATA_ONLY = {"aten.view", "aten._unsafe_view"}
FIXED_LENGTH = 6  # every model decodes this many tokens per sentence: the same steps for all
FUSED_KERNEL = "aten._scaled_dot_product_flash_attention_for_cpu"


class CountedOperations(TorchDispatchMode):
    """Every operation torch's dispatcher runs in the block, counted by name."""

    def __init__(self):
        super().__init__()
        self.counts = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


def sample_of(task, count=6):
    task.load_dataset("valid")
    dataset = task.dataset("valid")
    return dataset.collater([dataset[i] for i in range(count)])


def beam_search_operations(task, model, sample):
    """The operations of a fixed-length beam search (beam 3) and the hypotheses it found."""
    generation = GenerationConfig(beam=3, min_len=FIXED_LENGTH, max_len_a=0, max_len_b=FIXED_LENGTH)
    generator = task.build_generator([model], generation)
    with torch.no_grad(), CountedOperations() as operations:
        hypotheses = [h[0]["tokens"].tolist() for h in task.inference_step(generator, [model], sample)]
    assert all(len(tokens) == FIXED_LENGTH + 1 for tokens in hypotheses)  # the same steps for every model
    return operations.counts, hypotheses


def plain_fairseq_model(task, tiny_model):
    from fairseq import checkpoint_utils
    from fairseq.tasks.translation import TranslationTask

    plain_task = TranslationTask(task.cfg, task.src_dict, task.tgt_dict)
    models, _ = checkpoint_utils.load_model_ensemble([str(tiny_model["checkpoint"])], task=plain_task)
    plain = models[0].eval()
    assert not any(isinstance(m, MaskedMultiheadAttention) for m in plain.modules())
    return plain


def all_narrowed(model):
    """Whether every attention module of a shrunk model lost heads (one that kept all is fairseq's own)."""
    return all(m.skip_embed_dim_check for m in model.modules() if isinstance(m, MaskedMultiheadAttention))


def computing(counts):
    return collections.Counter({name: n for name, n in counts.items() if name not in METADATA_ONLY})


def test_without_a_mask_the_plugin_runs_fairseqs_own_operations(tiny_task_and_model, tiny_model):
    task, model = tiny_task_and_model
    set_head_mask(model, None)
    sample = sample_of(task)
    plain = plain_fairseq_model(task, tiny_model)
    ours, our_hypotheses = beam_search_operations(task, model, sample)
    theirs, their_hypotheses = beam_search_operations(task, plain, sample)
    assert ours == theirs  # every operation, every count: not even a view more
    assert our_hypotheses == their_hypotheses
    # fairseq's decoder builds and caches its future mask on a first forward, and slices a larger one that an
    # earlier test of the session's model cached (a slice, where one of this size is an alias): both build it anew
    model.decoder._future_mask = plain.decoder._future_mask = torch.empty(0)
    with torch.no_grad():
        model(**sample["net_input"])
        plain(**sample["net_input"])
    with torch.no_grad(), CountedOperations() as forward:
        model(**sample["net_input"])
    with torch.no_grad(), CountedOperations() as plain_forward:
        plain(**sample["net_input"])
    assert forward.counts == plain_forward.counts


@contextlib.contextmanager
def attention_operations(monkeypatch):
    """Count the operations inside the attention modules' forward calls only (what beam search does around the
    model depends on its scores) and the calls, by whether the module held a mask."""
    operations, calls = CountedOperations(), collections.Counter()
    forward = MaskedMultiheadAttention.forward

    def counting_forward(module, *args, **kwargs):
        calls["masked" if module.head_mask is not None else "unmasked"] += 1
        with operations:
            return forward(module, *args, **kwargs)

    monkeypatch.setattr(MaskedMultiheadAttention, "forward", counting_forward)
    try:
        yield operations.counts, calls
    finally:
        monkeypatch.setattr(MaskedMultiheadAttention, "forward", forward)


def test_a_mask_adds_one_product_per_attention_call(tiny_task_and_model, monkeypatch):
    """On the fused path both models run, a masked attention module runs the unmasked module's operations and,
    per call, one elementwise product (and the views that feed it); a module holding no mask, nothing more."""
    task, model = tiny_task_and_model
    sample = sample_of(task)
    with fused_attention_everywhere():
        set_head_mask(model, None)
        with attention_operations(monkeypatch) as (unmasked, unmasked_calls):
            beam_search_operations(task, model, sample)
        # a head masked in every module but the decoder's first self-attention, which holds no mask
        set_head_mask(model, parse_head_mask("E:*:4 A:*:2 D:2:7", head_layout(model)))
        attention_modules(model)[("dec-dec", 0)].head_mask = None
        try:
            beam_search_operations(task, model, sample)  # a module's first masked call builds its channel scale
            with attention_operations(monkeypatch) as (masked, calls):
                beam_search_operations(task, model, sample)
        finally:
            set_head_mask(model, None)
    assert calls["masked"] + calls["unmasked"] == unmasked_calls["unmasked"] and calls["unmasked"] > 0
    added = computing(masked)
    added.subtract(computing(unmasked))
    assert {name: n for name, n in added.items() if n} == {"aten.mul": calls["masked"]}


@pytest.mark.parametrize("spec", ["E:1:1-6 A:2:keep=3 D:1:2,4,6,8 D:2:5", "*:*:1-4"])
def test_a_shrunk_model_runs_the_unpruned_models_kernels_on_fewer_heads(tiny_task_and_model, tiny_model, tmp_path,
                                                                         monkeypatch, spec):
    """The shrunk model's attention takes torch's fused kernel wherever the unpruned model on that kernel does:
    the same operations, each as often, only narrower (the views aside); and it translates as the masked model."""
    from fairseq_headprune.engine.checkpoints.loading import load_generation_model

    task, model = tiny_task_and_model
    sample = sample_of(task)
    run(["fairseq-headprune", "shrink", "--path", tiny_model["checkpoint"], "--head-mask", spec,
         "--out", tmp_path / "pruned.pt"])
    _, _, shrunk = load_generation_model(str(tiny_model["data"]), str(tmp_path / "pruned.pt"), cpu=True)
    with fused_attention_everywhere():
        set_head_mask(model, None)
        with attention_operations(monkeypatch) as (unpruned, _):
            beam_search_operations(task, model, sample)
        set_head_mask(model, parse_head_mask(spec, head_layout(model)))
        try:
            _, masked_hypotheses = beam_search_operations(task, model, sample)
        finally:
            set_head_mask(model, None)
    with fused_attention_everywhere(), attention_operations(monkeypatch) as (shrunk_operations, _):
        _, shrunk_hypotheses = beam_search_operations(task, shrunk, sample)
    difference = computing(shrunk_operations)
    difference.subtract(computing(unpruned))
    assert not {name: n for name, n in difference.items() if n}
    # as fairseq-generate runs it (no fused_attention_everywhere), a narrowed module still takes the fused kernel
    with attention_operations(monkeypatch) as (generated, _):
        beam_search_operations(task, shrunk, sample)
    assert generated[FUSED_KERNEL] > 0
    if all_narrowed(shrunk):  # every module lost heads: each runs as under fused_attention_everywhere
        assert generated == shrunk_operations
    assert shrunk_hypotheses == masked_hypotheses
