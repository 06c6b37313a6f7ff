"""What every head-masking task adds to the fairseq task it extends.

Not a registered component: ``fairseq_headprune`` (translation) and
``headprune_sentence_prediction`` (RoBERTa classification) are fairseq's own
tasks with this mixin in front, so fairseq builds, trains and validates their
models as usual and the mixin only makes the attention maskable.
"""

import logging

import torch

from ..modules.masked_ffn import ffn_layout, install_ffn_masks, masked_neuron_slices, set_ffn_mask
from ..modules.model_config import FFN_MASK_KEY, HEAD_MASK_KEY, PRUNED_HEADS_KEY, config_value, record_config_value
from ..study.masks.ffn_mask import NEURONS
from ..modules.pruned_heads import rebuild_pruned, rebuild_pruned_neurons
from ..errors import CheckpointError, HeadMaskError, HeadPruneError
from ..modules.masked_multihead_attention import (
    head_layout,
    install_masked_attention,
    masked_head_slices,
    set_head_mask,
)
from ..study.masks.head_mask import (
    combine_masks,
    count_masked,
    head_mask_to_spec,
    parse_head_mask,
    validate_spec_syntax,
)

logger = logging.getLogger(__name__)

HEAD_MASK_HELP = (
    "heads to mask: space-separated TYPE:LAYERS:HEADS terms, TYPE one of E/enc-enc, "
    "A/enc-dec, D/dec-dec (encoder-only models have E only), 1-based layers and heads as lists, "
    "ranges or '*', 'keep=LIST' to mask all other heads (e.g. \"E:1:6 A:2:1,3 D:*:keep=1\"), "
    "'none', or a .json/.tsv mask file"
)
FFN_MASK_HELP = (
    "FFN neurons (hidden units) to mask, on the input of fc2: space-separated TYPE:LAYERS:NEURONS terms, "
    "TYPE one of E/enc-ffn, D/dec-ffn, with --head-mask's syntax (e.g. \"E:2:1-200 D:6:keep=1-128\"), "
    "'none', or a .json/.tsv mask file"
)


class HeadMaskingMixin:
    """``--head-mask`` for the fairseq task it precedes in the bases.

    ``build_model`` lets fairseq build the model named by ``--arch`` (or the
    checkpoint), then makes every attention module maskable, rebuilds heads a
    pruned checkpoint removed, and applies the checkpoint's recorded mask
    combined with ``--head-mask``; ``optimizer_step`` keeps masked heads'
    weights where they were while fine-tuning.
    """

    def __init__(self, cfg, *args, **kwargs):
        for option, kind in (("head_mask", None), ("ffn_mask", NEURONS)):
            try:
                validate_spec_syntax(getattr(cfg, option, None), *([kind] if kind else []))
            except HeadPruneError as error:
                raise HeadMaskError(f"--{option.replace('_', '-')}: {error}") from error
        super().__init__(cfg, *args, **kwargs)
        self.criterion = None
        self._frozen_weights = None  # (parameter, dim, index, values) of masked heads and neurons

    def _setting(self, name: str):
        """A task option: legacy tasks (language_modeling) keep their settings in ``args``."""
        settings = getattr(self, "cfg", None)
        if settings is None or not hasattr(settings, name):
            settings = getattr(self, "args", None)
        return getattr(settings, name, None)

    @property
    def head_mask_spec(self):
        return self._setting("head_mask")

    @property
    def ffn_mask_spec(self):
        return self._setting("ffn_mask")

    def build_model(self, cfg, from_checkpoint=False):
        # fairseq drops the config keys a dataclass model (transformer_lm) does not declare when it
        # builds one from a checkpoint (merge_with_parent(remove_missing=True)): keep ours
        recorded = {key: config_value(cfg, key) for key in (HEAD_MASK_KEY, PRUNED_HEADS_KEY, FFN_MASK_KEY)}
        model = super().build_model(cfg, from_checkpoint)
        for key, value in recorded.items():
            if value is not None and config_value(cfg, key) is None:
                record_config_value(cfg, key, value)
        install_masked_attention(model)
        # the heads a criterion with per-head parameters (headprune_gates) is built for
        self.model_head_layout = head_layout(model)
        try:
            removed = rebuild_pruned(model, cfg)
        except HeadPruneError as error:
            raise CheckpointError(f"pruned checkpoint: {error}") from error
        if removed:
            logger.info("model with heads removed: %s", removed)
        head_mask = self._head_mask(model, cfg)
        if head_mask is not None:
            set_head_mask(model, head_mask)
            spec = head_mask_to_spec(head_mask)
            record_config_value(cfg, HEAD_MASK_KEY, spec)
            logger.info("masking %d heads: %s", count_masked(head_mask), spec)
        install_ffn_masks(model)
        try:
            removed = rebuild_pruned_neurons(model, cfg)
        except HeadPruneError as error:
            raise CheckpointError(f"pruned checkpoint: {error}") from error
        if removed:
            logger.info("model with FFN neurons removed: %s", removed)
        ffn_mask = self._combined_mask(config_value(cfg, FFN_MASK_KEY), self.ffn_mask_spec, lambda: ffn_layout(model),
                                       NEURONS, "recorded neuron mask", "--ffn-mask")
        if ffn_mask is not None:
            set_ffn_mask(model, ffn_mask)
            spec = head_mask_to_spec(ffn_mask, NEURONS)
            record_config_value(cfg, FFN_MASK_KEY, spec)
            logger.info("masking %d FFN neurons: %s", count_masked(ffn_mask), spec)
        return model

    def _head_mask(self, model, model_cfg):
        """The checkpoint's recorded mask and ``--head-mask``, combined (None: no head masked)."""
        return self._combined_mask(config_value(model_cfg, HEAD_MASK_KEY), self.head_mask_spec,
                                   lambda: head_layout(model))

    @staticmethod
    def _combined_mask(recorded, given, layout_of, kind=None, recorded_name="recorded head mask",
                       option="--head-mask"):
        """A checkpoint's recorded mask and the option's, combined (None: nothing masked).

        ``layout_of()`` gives the model's layout, asked only when there is a spec to read.
        """
        combined = None
        for name, spec in ((recorded_name, recorded), (option, given)):
            if spec is None:
                continue
            try:
                parsed = parse_head_mask(spec, layout_of(), *([kind] if kind else []))
            except HeadPruneError as error:
                raise HeadMaskError(f"{name}: {error}") from error
            combined = combine_masks(combined, parsed)
        if combined is None or count_masked(combined) == 0:
            return None
        return combined

    def optimizer_step(self, optimizer, model, update_num):
        """The optimizer's step, after which masked heads and neurons get their weights back.

        Their gradients are exactly zero (the mask multiplies their output by
        0), but decoupled weight decay and stale optimizer moments would still
        move them; restoring keeps a pruned head pruned if the mask is ever lifted.
        """
        if self._frozen_weights is None:
            unwrapped = model
            while hasattr(unwrapped, "module"):  # distributed / legacy wrappers
                unwrapped = unwrapped.module
            self._frozen_weights = [
                (parameter, dim, index, parameter.detach().index_select(dim, index).clone())
                for parameter, dim, index in masked_head_slices(unwrapped) + masked_neuron_slices(unwrapped)
            ]
        super().optimizer_step(optimizer, model, update_num)
        with torch.no_grad():
            for parameter, dim, index, values in self._frozen_weights:
                parameter.index_copy_(dim, index, values.to(parameter.dtype))
