"""What every head-masking task adds to the fairseq task it extends.

Not a registered component: ``fairseq_headprune`` (translation) and
``headprune_sentence_prediction`` (RoBERTa classification) are fairseq's own
tasks with this mixin in front, so fairseq builds, trains and validates their
models as usual and the mixin only makes the attention maskable (and lets a
resumed training see the batches of the run it continues).
"""

import logging

import torch

from fairseq_headprune.errors import CheckpointError, HeadMaskError, HeadPruneError, setting_words
from fairseq_headprune.modules.masked_ffn import ffn_layout, install_ffn_masks, masked_neuron_slices, set_ffn_mask
from fairseq_headprune.modules.masked_multihead_attention import (
    head_layout,
    install_masked_attention,
    masked_head_slices,
    set_head_mask,
)
from fairseq_headprune.modules.model_config import (
    FFN_MASK_KEY,
    HEAD_MASK_KEY,
    PRUNED_HEADS_KEY,
    PRUNED_NEURONS_KEY,
    config_value,
    record_config_value,
)
from fairseq_headprune.modules.pruned_heads import rebuild_pruned, rebuild_pruned_neurons
from fairseq_headprune.study.masks.ffn_mask import NEURONS
from fairseq_headprune.study.masks.head_mask import (
    HEADS,
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
        for kind in (HEADS, NEURONS):
            try:
                validate_spec_syntax(getattr(cfg, kind.option.replace("-", "_"), None), kind)
            except HeadPruneError as error:
                raise HeadMaskError(f"{setting_words(kind.setting)}: {error}", setting=kind.setting) from error
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
        recorded = {key: config_value(cfg, key)
                    for key in (HEAD_MASK_KEY, PRUNED_HEADS_KEY, FFN_MASK_KEY, PRUNED_NEURONS_KEY)}
        model = super().build_model(cfg, from_checkpoint)
        for key, value in recorded.items():
            if value is not None and config_value(cfg, key) is None:
                record_config_value(cfg, key, value)
        install_masked_attention(model)
        install_ffn_masks(model)
        # the heads a criterion with per-head parameters (headprune_gates) is built for
        self.model_head_layout = head_layout(model)
        for rebuild, what in ((rebuild_pruned, "heads"), (rebuild_pruned_neurons, "FFN neurons")):
            try:
                removed = rebuild(model, cfg)
            except HeadPruneError as error:
                raise CheckpointError(f"pruned checkpoint: {error}") from error
            if removed:
                logger.info("model with %s removed: %s", what, removed)
        self._apply_mask(model, cfg, HEAD_MASK_KEY, self.head_mask_spec, lambda: head_layout(model), HEADS,
                         set_head_mask, "heads")
        self._apply_mask(model, cfg, FFN_MASK_KEY, self.ffn_mask_spec, lambda: ffn_layout(model), NEURONS,
                         set_ffn_mask, "FFN neurons")
        return model

    def _apply_mask(self, model, cfg, key, given, layout_of, kind, set_mask, unit) -> None:
        """The checkpoint's recorded mask and the option's, combined, set on the model and recorded in its config."""
        mask = self._combined_mask(config_value(cfg, key), given, layout_of, kind, f"recorded {kind.unit} mask")
        if mask is not None:
            set_mask(model, mask)
            spec = head_mask_to_spec(mask, kind)
            record_config_value(cfg, key, spec)
            logger.info("masking %d %s: %s", count_masked(mask), unit, spec)

    @staticmethod
    def _combined_mask(recorded, given, layout_of, kind, recorded_name):
        """A checkpoint's recorded mask and the option's, combined (None: nothing masked).

        ``layout_of()`` gives the model's layout, asked only when there is a spec to read.
        """
        combined = None
        for name, spec, setting in ((recorded_name, recorded, None),
                                    (setting_words(kind.setting), given, kind.setting)):
            if spec is None:
                continue
            try:
                parsed = parse_head_mask(spec, layout_of(), kind)
            except HeadPruneError as error:
                raise HeadMaskError(f"{name}: {error}", setting=setting) from error
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

    def get_batch_iterator(self, dataset, *args, epoch=1, **kwargs):
        """fairseq's iterator, its batches composed as at the first epoch whatever epoch it is built at.

        fairseq composes the batches from a permutation seeded by the epoch it
        builds the iterator at, then only reshuffles that set each epoch: a run
        resumed from its last checkpoint (a killed fine-tune, or one trained in
        parts to score its recovery curve) at a later epoch would train on other
        batches than the run it continues. Built as at epoch 1 (where every
        fine-tune starts), a resumed run trains as the one it continues; the
        iterator still starts at ``epoch``.
        """
        cached = self.dataset_to_epoch_iter.get(dataset)  # fairseq's own cache: the run's iterator, reused
        iterator = super().get_batch_iterator(dataset, *args, epoch=1, **kwargs)
        if iterator is not cached and epoch > 1:
            iterator.epoch = epoch
            dataset.set_epoch(epoch)
        return iterator
