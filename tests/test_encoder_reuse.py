"""Encoder reuse: configurations translated together that agree on the encoder share one encoder pass.

The reference is the same translator with sharing off (one encoder pass per
configuration, each on its own copy of the batch) and each configuration
translated alone, as ``fairseq-generate --head-mask`` does.
"""

import os

import pytest


@pytest.fixture(scope="module")
def translators(tiny_model):
    from fairseq_headprune.engine.checkpoints.loading import load_generation_model
    from fairseq_headprune.engine.runners.translator import SplitTranslator

    options = ["--beam", "5", "--batch-size", "64", "--required-batch-size-multiple", "1"]
    cpu = not os.environ.get("HEADPRUNE_TEST_GPU")  # scripts/dev/gpu_check.sh runs it on the GPU
    cfg, task, model = load_generation_model(str(tiny_model["data"]), str(tiny_model["checkpoint"]), options, cpu=cpu)
    shared = SplitTranslator(cfg, task, model, "test", share_encoder=True)
    unshared = SplitTranslator(cfg, task, model, "test", share_encoder=False)
    return model, shared, unshared


def encoder_rows(model, translate):
    """Rows the encoder ran on during ``translate()``, and its result."""
    rows = []
    encoder = model.encoder
    forward = encoder.forward  # fairseq calls encoder.forward directly (no module hooks)

    def counting_forward(src_tokens, *args, **kwargs):
        rows.append(src_tokens.size(0))
        return forward(src_tokens, *args, **kwargs)

    encoder.forward = counting_forward
    try:
        result = translate()
    finally:
        del encoder.forward
    return sum(rows), result


def test_shared_encoder_gives_the_same_translations(translators):
    from fairseq_headprune.modules.masked_multihead_attention import head_layout
    from fairseq_headprune.study.masks.head_mask import parse_head_mask

    model, shared, unshared = translators
    layout = head_layout(model)
    # a decoder-only mask and no mask (the unmasked encoder's group), one encoder mask twice (a second group)
    specs = ["A:2:1-4 D:1:2", None, "E:1:2", "E:1:2 D:1:1"]
    masks = [None if s is None else parse_head_mask(s, layout) for s in specs]
    sentences = shared.size
    shared_rows, with_sharing = encoder_rows(model, lambda: shared.translate_many(masks))
    # two encoder masks (none, E:1:2): two copies of the batch instead of four
    assert shared_rows == 2 * sentences
    # the decoder-only configurations against the unshared path (E:1:2's two share nothing with it)
    unshared_rows, without_sharing = encoder_rows(model, lambda: unshared.translate_many(masks[:2]))
    assert unshared_rows == 2 * sentences
    for spec, mask, a, b in zip(specs[:2], masks[:2], with_sharing, without_sharing):
        assert a.hypotheses == b.hypotheses, spec
    for spec, mask, a in zip(specs, masks, with_sharing):
        alone = shared.translate(mask)  # as fairseq-generate --head-mask translates it
        assert a.hypotheses == alone.hypotheses, spec
        assert (a.fairseq_stats == alone.fairseq_stats).all(), spec


def test_encoder_groups():
    from fairseq_headprune.engine.runners.config_batching import encoder_groups
    from fairseq_headprune.study.masks.head_mask import parse_head_mask

    layout = {"enc-enc": (2, 4), "enc-dec": (2, 4), "dec-dec": (2, 4)}
    masks = [parse_head_mask(s, layout) for s in ("E:1:1", "E:1:2", "E:2:1")]
    assert encoder_groups(masks) == ([0, 1, 2], [0, 1, 2])
    # masks that mask no encoder head share the unmasked encoder's group; equal encoder masks share theirs
    others = [None, parse_head_mask("A:1:1", layout), masks[0], parse_head_mask("E:1:1 D:2:1-4", layout)]
    assert encoder_groups(others) == ([0, 2], [0, 0, 1, 1])
