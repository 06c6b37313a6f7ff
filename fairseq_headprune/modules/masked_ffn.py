"""One mask variable zeta_i per hidden unit (neuron) of every FFN block.

A neuron's activation is multiplied by zeta_i on the input of ``fc2`` (Kwon
et al. 2022, section 3: mask variables for FFN neurons beside the heads'),
by a forward pre-hook on fairseq's own ``fc2``: fairseq's layer code runs
untouched, and with no mask set the hook returns at once. zeta_i = 0 equals
zeroing column i of ``fc2``; an FFN with every neuron masked outputs ``fc2``'s
bias. A mask is ``(neurons,)`` for every sentence or ``(batch, neurons)``
per sentence (a batch expanded by beam search repeats each sentence's row);
one that requires grad yields per-sentence gradients dL/dzeta.
"""

import contextlib
from typing import Callable, Dict, Iterator, Optional, Tuple

import torch
from torch import Tensor

from fairseq_headprune.constants import FFN_TYPES
from fairseq_headprune.errors import HeadMaskError
from fairseq_headprune.modules.masked_multihead_attention import transformer_layers
from fairseq_headprune.modules.unit_weights import NEURON_PARAMETERS, masked_unit_slices
from fairseq_headprune.study.masks.ffn_mask import FfnLayout, FfnMask


class NeuronMask:
    """The forward pre-hook on one FFN's ``fc2`` that scales its input by the layer's neuron mask."""

    def __init__(self, ffn_type: str, layer_index: int):
        self.ffn_type, self.layer_index = ffn_type, layer_index
        self.mask: Optional[Tensor] = None
        # called as hook(neuron_mask, hidden, scaled), both T x B x F, while a mask is set:
        # lets importance estimation see each neuron's activation and its gradient
        self.output_hook: Optional[Callable[["NeuronMask", Tensor, Tensor], None]] = None

    def __call__(self, fc2, inputs):
        if self.mask is None:
            return None
        (hidden,) = inputs  # T x B x F
        mask = self.mask.to(hidden.device)
        if mask.size(-1) != hidden.size(-1):
            raise HeadMaskError(
                f"{self.ffn_type} layer {self.layer_index + 1}: a mask of {mask.size(-1)} neurons "
                f"for an FFN of {hidden.size(-1)}"
            )
        if mask.dim() == 2:  # per sentence: B x F
            bsz, mask_bsz = hidden.size(1), mask.size(0)
            if bsz != mask_bsz:
                if bsz % mask_bsz:
                    raise HeadMaskError(f"per-sentence neuron masks for {mask_bsz} sentences, "
                                        f"but the batch has {bsz} sentences")
                mask = mask.repeat_interleave(bsz // mask_bsz, dim=0)
            mask = mask.unsqueeze(0)  # 1 x B x F
        scaled = hidden * mask.to(hidden.dtype)
        if self.output_hook is not None:
            self.output_hook(self, hidden, scaled)
        return (scaled,)


def ffn_layers(model) -> Dict[Tuple[str, int], torch.nn.Module]:
    """(FFN type, 0-based layer) -> the Transformer layer holding that FFN (its ``fc1`` and ``fc2``)."""
    encoder_layers, decoder_layers = transformer_layers(model)
    layers = {}
    for ffn_type, stack in zip(FFN_TYPES, (encoder_layers, decoder_layers)):
        for index, layer in enumerate(stack):
            output = NEURON_PARAMETERS.output_projection  # the linear whose input the mask scales: fc2
            if not isinstance(getattr(layer, output, None), torch.nn.Linear):
                raise HeadMaskError(f"{ffn_type} layer {index + 1} is a {type(layer).__name__} without an {output}")
            layers[(ffn_type, index)] = layer
    return layers


def install_ffn_masks(model) -> Dict[Tuple[str, int], NeuronMask]:
    """Give every FFN's ``fc2`` its neuron-mask hook (once); returns the hooks by key."""
    hooks = {}
    for key, layer in ffn_layers(model).items():
        fc2 = NEURON_PARAMETERS.output_linear(layer)
        hook = getattr(fc2, "neuron_mask", None)
        if hook is None:
            hook = NeuronMask(*key)
            fc2.neuron_mask = hook
            fc2.register_forward_pre_hook(hook)
        hooks[key] = hook
    return hooks


def ffn_layout(model) -> FfnLayout:
    """Layers and hidden units per FFN type (every layer of a type as wide as the others)."""
    widths: Dict[str, list] = {}
    for (ffn_type, _), layer in sorted(ffn_layers(model).items()):
        widths.setdefault(ffn_type, []).append(NEURON_PARAMETERS.output_linear(layer).in_features)
    layout = {}
    for ffn_type in FFN_TYPES:
        if ffn_type in widths:
            if len(set(widths[ffn_type])) != 1:
                raise HeadMaskError(f"{ffn_type} layers have different widths {widths[ffn_type]}")
            layout[ffn_type] = (len(widths[ffn_type]), widths[ffn_type][0])
    return layout


def set_ffn_mask(model, ffn_mask: Optional[FfnMask]) -> None:
    """Set (or with None, clear) every FFN's neuron mask; a type missing from ``ffn_mask`` is left unmasked.

    Each tensor is ``(layers, neurons)`` or, per sentence, ``(layers, batch, neurons)``.
    """
    for (ffn_type, layer), hook in install_ffn_masks(model).items():
        hook.mask = None if ffn_mask is None or ffn_type not in ffn_mask else ffn_mask[ffn_type][layer]


@contextlib.contextmanager
def ffn_mask_applied(model, ffn_mask: Optional[FfnMask]) -> Iterator[None]:
    """``set_ffn_mask`` for the block; the masks set before come back after it."""
    hooks = install_ffn_masks(model)
    previous = {key: hook.mask for key, hook in hooks.items()}
    set_ffn_mask(model, ffn_mask)
    try:
        yield
    finally:
        for key, hook in hooks.items():
            hook.mask = previous[key]


def current_ffn_mask(model) -> Optional[FfnMask]:
    """The neuron mask every FFN holds now (None when no neuron is masked)."""
    hooks = install_ffn_masks(model)
    if all(hook.mask is None for hook in hooks.values()):
        return None
    ffn_mask = {t: torch.ones(layers, width) for t, (layers, width) in ffn_layout(model).items()}
    for (ffn_type, layer), hook in hooks.items():
        if hook.mask is not None:
            if hook.mask.dim() != 1:
                raise HeadMaskError("the model holds per-sentence neuron masks, not one mask")
            ffn_mask[ffn_type][layer] = hook.mask.detach().float().cpu()
    if all(bool((m != 0).all()) for m in ffn_mask.values()):
        return None
    return ffn_mask


def masked_neuron_slices(model):
    """(parameter, dimension, indices) of every masked neuron's own weights (``unit_weights.NEURON_PARAMETERS``:
    its fc1 row and bias, its fc2 column)."""
    blocks = ffn_layers(model)
    return [held for key, hook in install_ffn_masks(model).items()
            for held in masked_unit_slices(blocks[key], NEURON_PARAMETERS, hook.mask)]
