"""Several head masks translated in one batch: each sentence once per mask.

``SplitTranslator.translate_many`` repeats a batch once per configuration
(``repeat_sample``), gives every row its configuration's mask
(``row_masks``), keeps those masks on the rows beam search keeps
(``rows_follow_beam_search``) and lets configurations that agree on the
encoder share its pass (``encoder_passes_shared``). Each sentence's search
is independent of the others in its batch, so each configuration gets the
hypotheses it gets alone.
"""

import contextlib
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from fairseq_headprune.modules.masked_multihead_attention import attention_modules, head_mask_applied
from fairseq_headprune.study.masks.head_mask import HeadMask


def repeat_sample(sample: dict, count: int) -> dict:
    """The batch ``count`` times over: row k * batch + i is sentence i under mask k."""
    net_input = {
        key: value.repeat(count, *([1] * (value.dim() - 1))) if torch.is_tensor(value) else value
        for key, value in sample["net_input"].items()
    }
    repeated = dict(sample, net_input=net_input, id=sample["id"].repeat(count))
    if sample.get("target") is not None:
        repeated["target"] = sample["target"].repeat(count, 1)
    batch = len(sample["id"])
    for key, value in sample.items():  # per-row lists, e.g. an LM context window's start_indices
        if isinstance(value, list) and len(value) == batch:
            repeated[key] = value * count
    return repeated


def row_masks(head_masks: Sequence[Optional[HeadMask]], batch: int) -> HeadMask:
    """Per attention type, (layers, masks * batch, heads): mask k on rows k * batch ... ."""
    reference = next(m for m in head_masks if m is not None)
    rows = {}
    for attention_type, shape_mask in reference.items():
        stacked = torch.stack(
            [torch.ones_like(shape_mask) if m is None else m[attention_type] for m in head_masks], dim=1
        )  # layers x masks x heads
        rows[attention_type] = stacked.repeat_interleave(batch, dim=1)
    return rows


@contextlib.contextmanager
def rows_follow_beam_search(model, row_masks: HeadMask):
    """Set per-row masks and keep them aligned with the rows beam search keeps.

    fairseq's SequenceGenerator expands every sentence to its beam, and drops
    finished sentences, through ``encoder.reorder_encoder_out(encoder_out,
    new_order)``; decoder rows are the encoder output's rows. Wrapping that
    call (on this model instance only) applies the same ``new_order`` to the
    decoder's masks, so each row keeps its configuration's mask.
    """

    encoder = model.encoder
    decoder_modules = [m for (t, _), m in attention_modules(model).items() if t != "enc-enc"]
    original = encoder.reorder_encoder_out

    def reorder_encoder_out(encoder_out, new_order):
        for module in decoder_modules:
            module.head_mask = module.head_mask.index_select(0, new_order.to(module.head_mask.device))
        return original(encoder_out, new_order)

    device = next(model.parameters()).device
    with head_mask_applied(model, {t: m.to(device) for t, m in row_masks.items()}):
        encoder.reorder_encoder_out = reorder_encoder_out
        try:
            yield
        finally:
            del encoder.reorder_encoder_out


def encoder_groups(head_masks: Sequence[Optional[HeadMask]]) -> Tuple[List[int], List[int]]:
    """Masks with the same encoder self-attention mask, grouped.

    Returns ``(representatives, group_of)``: the index of the first mask of
    every group, and each mask's group. A mask without ``enc-enc`` heads
    masked is in the group of the unmasked encoder.
    """
    keys: Dict[Optional[bytes], int] = {}
    representatives, group_of = [], []
    for index, head_mask in enumerate(head_masks):
        encoder_mask = None if head_mask is None else head_mask.get("enc-enc")
        key = None if encoder_mask is None or bool((encoder_mask == 1).all()) else (
            encoder_mask.detach().float().cpu().numpy().tobytes()
        )
        if key not in keys:
            keys[key] = len(representatives)
            representatives.append(index)
        group_of.append(keys[key])
    return representatives, group_of


@contextlib.contextmanager
def encoder_passes_shared(model, head_masks: Sequence[Optional[HeadMask]], batch: int):
    """One encoder pass per distinct encoder mask, not one per configuration.

    Inside ``rows_follow_beam_search`` the batch holds every configuration's
    copy of the sentences (row ``k * batch + i``). Configurations that mask
    only Enc-Dec or Dec-Dec heads have the same encoder output, so the
    encoder runs on one copy per group of equal encoder masks (with that
    group's rows of the per-row masks, the path ``fairseq-generate
    --head-mask`` takes) and its output is copied to every configuration's
    rows with fairseq's ``reorder_encoder_out``; beam search then reorders
    it as usual.
    """
    representatives, group_of = encoder_groups(head_masks)
    if len(representatives) == len(head_masks):
        yield  # nothing to share
        return

    encoder = model.encoder
    encoder_modules = [m for (t, _), m in attention_modules(model).items() if t == "enc-enc"]
    original_forward = encoder.forward_torchscript

    def forward_torchscript(net_input):
        device = net_input["src_tokens"].device
        groups = len(representatives)
        # rows 0 .. groups * batch - 1 are copies of the batch's sentences
        shared_input = {
            key: value[: groups * batch] if torch.is_tensor(value) and value.dim() > 0 else value
            for key, value in net_input.items()
        }
        rows = torch.cat([torch.arange(r * batch, (r + 1) * batch, device=device) for r in representatives])
        previous = [module.head_mask for module in encoder_modules]
        for module in encoder_modules:
            module.head_mask = module.head_mask.index_select(0, rows.to(module.head_mask.device))
        try:
            encoder_out = original_forward(shared_input)
        finally:
            for module, head_mask in zip(encoder_modules, previous):
                module.head_mask = head_mask
        copies = torch.tensor(
            [group * batch + i for group in group_of for i in range(batch)], device=device
        )
        # the class's method: the instance's wrapper would reorder the decoder's masks too
        return type(encoder).reorder_encoder_out(encoder, encoder_out, copies)

    encoder.forward_torchscript = forward_torchscript
    try:
        yield
    finally:
        del encoder.forward_torchscript
