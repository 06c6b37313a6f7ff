"""fairseq's MultiheadAttention with one mask variable xi_h per head.

Each head's output is multiplied by xi_h before the output projection
(Michel et al. 2019, eq. 3).  We do not copy fairseq's forward: the scaling is
a forward pre-hook on ``out_proj``.  fairseq's fused path calls
``F.multi_head_attention_forward`` with ``out_proj``'s weights and never calls
the module, so while a mask is set the unfused path is taken; with no mask
the module runs fairseq's code untouched (fused path included), so
installing the plugin costs nothing at inference.

fairseq's unfused path is slow (separate bmm, softmax and bmm kernels, and
during beam search it is the only path).  Masked and narrowed (shrunk) modules
therefore compute attention with ``torch.nn.functional.scaled_dot_product_attention``
when nothing needs fairseq's extras (attention weights, dropout, bias_k/v,
zero attention, beamable enc-dec attention): the same projections, the
incremental state in fairseq's own layout and keys, and the head mask still
applied by the hook on ``out_proj``.
"""

import contextlib
from typing import Callable, Dict, Iterator, List, Optional, Tuple

import torch
import torch.nn.functional as F
from fairseq.modules.multihead_attention import MultiheadAttention
from torch import Tensor

from fairseq_headprune.constants import ATTENTION_TYPES
from fairseq_headprune.errors import HeadMaskError
from fairseq_headprune.modules.unit_weights import HEAD_PARAMETERS, masked_unit_slices
from fairseq_headprune.study.masks.head_mask import HeadLayout, HeadMask


class MaskedMultiheadAttention(MultiheadAttention):
    """A fairseq ``MultiheadAttention`` whose heads are scaled by ``head_mask``.

    ``head_mask`` is None (no masking), a ``(heads,)`` tensor applied to every
    sentence, or a ``(batch, heads)`` tensor with one mask per sentence (for
    scoring and gradients; a batch expanded by beam search repeats each
    sentence's row).  A tensor that requires grad yields per-sentence
    gradients dL/dxi.
    """

    # compute masked and narrowed modules' attention with torch's fused
    # scaled_dot_product_attention (False: fairseq's unfused path, as before)
    use_sdpa: bool = True
    # also unmasked, whole modules (``fused_attention_everywhere``): an unpruned
    # model timed with the kernel its pruned counterpart runs
    sdpa_everywhere: bool = False

    attention_type: str
    layer_index: int
    head_mask: Optional[Tensor]
    # called as hook(module, head_outputs, scaled_outputs), both T x B x H x d,
    # while a mask is set: lets importance estimation see each head's output
    head_output_hook: Optional[Callable[["MaskedMultiheadAttention", Tensor, Tensor], None]]

    @classmethod
    def from_module(
        cls, module: MultiheadAttention, attention_type: str, layer_index: int
    ) -> "MaskedMultiheadAttention":
        """Turn a built (possibly loaded) module into a masked one, in place.

        Changing the class keeps every parameter, buffer and state-dict key,
        so checkpoints load unchanged.
        """
        if not isinstance(module, MaskedMultiheadAttention):
            module.__class__ = cls
            module.head_mask = None
            module.head_output_hook = None
            module._scale_hook = HEAD_PARAMETERS.output_linear(module).register_forward_pre_hook(
                module._scale_heads
            )
        module.attention_type = attention_type
        module.layer_index = layer_index
        return module

    def forward(self, query: Tensor, *args, **kwargs) -> Tuple[Tensor, Optional[Tensor]]:
        if self.num_heads == 0:
            # every head removed (shrink.py): only the output bias is left
            tgt_len, bsz, _ = query.shape
            bias = self.out_proj.bias
            if bias is None:
                return query.new_zeros(tgt_len, bsz, self.out_proj.out_features), None
            return bias.to(query.dtype).expand(tgt_len, bsz, -1), None
        narrowed = self.skip_embed_dim_check
        if self.head_mask is None and not narrowed and not self.sdpa_everywhere:
            return super().forward(query, *args, **kwargs)
        arguments = self._sdpa_arguments(query, *args, **kwargs)
        if arguments is not None:
            return self._sdpa_forward(query, *arguments), None
        if narrowed or self.head_mask is None:
            return super().forward(query, *args, **kwargs)
        # skip_embed_dim_check is one of the conditions that routes fairseq's
        # forward to the unfused path, which calls self.out_proj (and the hook).
        previous = self.skip_embed_dim_check
        self.skip_embed_dim_check = True
        try:
            return super().forward(query, *args, **kwargs)
        finally:
            self.skip_embed_dim_check = previous

    _FORWARD_ARGUMENTS = (
        "key", "value", "key_padding_mask", "incremental_state", "need_weights",
        "static_kv", "attn_mask", "before_softmax", "need_head_weights",
    )

    def _sdpa_arguments(self, query: Tensor, *args, **kwargs):
        """(key, value, key_padding_mask, incremental_state, static_kv, attn_mask)
        when the fused path computes exactly what fairseq's would, else None."""
        if not self.use_sdpa:
            return None
        bound = dict(zip(self._FORWARD_ARGUMENTS, args))
        bound.update(kwargs)
        dropout = self.dropout_module.p if (
            self.training or self.dropout_module.apply_during_inference) else 0.0
        if (
            bound.get("need_weights", True) or bound.get("need_head_weights", False)
            or bound.get("before_softmax", False) or dropout > 0
            or self.onnx_trace or query.device.type == "xla"
            or self.bias_k is not None or self.add_zero_attn
            or getattr(self, "use_xformers", False)
            or (self.encoder_decoder_attention and self.beam_size > 1)
            or not (self.self_attention or self.encoder_decoder_attention)
        ):
            return None
        return (
            bound.get("key"), bound.get("value"), bound.get("key_padding_mask"),
            bound.get("incremental_state"), bool(bound.get("static_kv", False)),
            bound.get("attn_mask"),
        )

    def _sdpa_forward(self, query, key, value, key_padding_mask, incremental_state,
                      static_kv, attn_mask) -> Tensor:
        """fairseq's attention (self or encoder-decoder, incremental or not)
        through ``F.scaled_dot_product_attention``; returns T x B x C."""
        tgt_len, bsz, _ = query.shape
        heads, head_dim = self.num_heads, self.head_dim
        saved_state = self._get_input_buffer(incremental_state) if incremental_state is not None else None
        if saved_state is not None and static_kv and "prev_key" in saved_state:
            key = None  # the encoder's keys and values are cached

        def split_heads(x: Tensor) -> Tensor:  # T x B x (H*d) -> B x H x T x d
            return x.view(x.size(0), x.size(1), heads, head_dim).permute(1, 2, 0, 3)

        q = split_heads(self.q_proj(query))
        source = query if self.self_attention else key
        k = v = None
        if source is not None:
            k, v = split_heads(self.k_proj(source)), split_heads(self.v_proj(source))
        if saved_state is not None:
            if "prev_key" in saved_state:
                prev_key, prev_value = saved_state["prev_key"], saved_state["prev_value"]
                if static_kv:
                    k, v = prev_key, prev_value
                else:
                    k, v = torch.cat([prev_key, k], dim=2), torch.cat([prev_value, v], dim=2)
            key_padding_mask = MultiheadAttention._append_prev_key_padding_mask(
                key_padding_mask=key_padding_mask,
                prev_key_padding_mask=saved_state.get("prev_key_padding_mask"),
                batch_size=k.size(0),
                src_len=k.size(2),
                static_kv=static_kv,
            )
            saved_state["prev_key"] = k.contiguous()
            saved_state["prev_value"] = v.contiguous()
            saved_state["prev_key_padding_mask"] = key_padding_mask
            self._set_input_buffer(incremental_state, saved_state)
        if key_padding_mask is not None and key_padding_mask.dim() == 0:
            key_padding_mask = None  # fairseq's stand-in for "none" in scripted code

        # fairseq's masks, broadcast to B x H x T x S: attn_mask is additive
        # (-inf: future positions), key_padding_mask is nonzero at padding
        sdpa_mask = None
        if key_padding_mask is not None:
            sdpa_mask = ~key_padding_mask.to(torch.bool)[:, None, None, :]  # True: attend
        if attn_mask is not None:
            additive = attn_mask.to(q.dtype)[None, None]
            sdpa_mask = additive if sdpa_mask is None else additive.masked_fill(~sdpa_mask, float("-inf"))
        attn = F.scaled_dot_product_attention(q, k, v, attn_mask=sdpa_mask, scale=self.scaling)
        attn = attn.permute(2, 0, 1, 3).reshape(tgt_len, bsz, heads * head_dim)
        return self.out_proj(attn)  # the pre-hook applies the head mask

    def _scale_heads(self, out_proj, inputs):
        head_mask = self.head_mask
        if head_mask is None:
            return None
        (attn,) = inputs  # T x B x (heads * head_dim)
        if head_mask.dim() == 1 and self.head_output_hook is None and not head_mask.requires_grad:
            # one mask for every sentence: one product with each channel's xi (its head's), the same numbers
            return (attn * self._channel_scale(head_mask, attn),)
        tgt_len, bsz, width = attn.shape
        head_mask = head_mask.to(device=attn.device, dtype=attn.dtype)
        if head_mask.dim() == 1:
            scale = head_mask.view(1, 1, self.num_heads, 1)
        else:
            mask_bsz = head_mask.size(0)
            if bsz != mask_bsz:
                if bsz % mask_bsz != 0:
                    raise HeadMaskError(
                        f"per-sentence head mask has {mask_bsz} rows "
                        f"but the batch has {bsz} sentences"
                    )
                head_mask = head_mask.repeat_interleave(bsz // mask_bsz, dim=0)
            scale = head_mask.view(1, bsz, self.num_heads, 1)
        head_outputs = attn.view(tgt_len, bsz, self.num_heads, -1)  # T x B x H x d
        scaled = head_outputs * scale
        if self.head_output_hook is not None:
            self.head_output_hook(self, head_outputs, scaled)
        return (scaled.view(tgt_len, bsz, width),)

    def _channel_scale(self, head_mask: Tensor, attn: Tensor) -> Tensor:
        """``head_mask`` repeated over each head's channels, in ``attn``'s dtype and device: built once per mask
        (again only when the mask is another tensor, changed in place, or meets another dtype), so that a masked
        call adds a single elementwise product, not the reshapes and conversions around it."""
        cached = getattr(self, "_cached_channel_scale", None)
        if (cached is None or cached[0] is not head_mask or cached[1] != head_mask._version
                or cached[2].dtype != attn.dtype or cached[2].device != attn.device):
            scale = head_mask.detach().to(device=attn.device, dtype=attn.dtype).repeat_interleave(self.head_dim)
            cached = self._cached_channel_scale = (head_mask, head_mask._version, scale)
        return cached[2]


def transformer_layers(model) -> Tuple[List[torch.nn.Module], List[torch.nn.Module]]:
    """The encoder's and the decoder's layers of a fairseq Transformer (either may be empty)."""
    encoder = getattr(model, "encoder", None)
    encoder = getattr(encoder, "sentence_encoder", encoder)  # RoBERTa's RobertaEncoder wraps it
    encoder_layers = getattr(encoder, "layers", None)
    decoder_layers = getattr(getattr(model, "decoder", None), "layers", None)
    if encoder_layers is None and decoder_layers is None:
        raise HeadMaskError(
            f"{type(model).__name__} is not a fairseq Transformer "
            "(no encoder.layers, encoder.sentence_encoder.layers or decoder.layers)"
        )
    return list(encoder_layers or []), list(decoder_layers or [])


def attention_modules(model) -> Dict[Tuple[str, int], MultiheadAttention]:
    """(attention_type, 0-based layer) -> attention module of a fairseq Transformer.

    Encoder-decoder models (``transformer``) have all three types; encoder-only
    ones (RoBERTa, whose layers sit in ``encoder.sentence_encoder``) have
    Enc-Enc self-attention only; decoder-only ones (``transformer_lm``)
    Dec-Dec only.
    """
    encoder_layers, decoder_layers = transformer_layers(model)
    modules = {}
    for layer_index, layer in enumerate(encoder_layers):
        modules[("enc-enc", layer_index)] = layer.self_attn
    for layer_index, layer in enumerate(decoder_layers):
        modules[("dec-dec", layer_index)] = layer.self_attn
        if getattr(layer, "encoder_attn", None) is not None:
            modules[("enc-dec", layer_index)] = layer.encoder_attn
    for key, module in modules.items():
        if not isinstance(module, MultiheadAttention):
            raise HeadMaskError(
                f"{key[0]} layer {key[1] + 1} is a {type(module).__name__}, "
                "not a fairseq MultiheadAttention"
            )
    return modules


def install_masked_attention(model) -> Dict[Tuple[str, int], MaskedMultiheadAttention]:
    """Make every attention module of ``model`` maskable; returns them by key."""
    return {
        key: MaskedMultiheadAttention.from_module(module, *key)
        for key, module in attention_modules(model).items()
    }


def head_layout(model) -> HeadLayout:
    """Layers and heads per attention type of a fairseq Transformer."""
    heads_by_type: Dict[str, List[int]] = {}
    for (attention_type, _), module in sorted(attention_modules(model).items()):
        heads_by_type.setdefault(attention_type, []).append(module.num_heads)
    layout = {}
    for attention_type in ATTENTION_TYPES:
        heads = heads_by_type.get(attention_type)
        if heads is None:
            continue
        if len(set(heads)) != 1:
            raise HeadMaskError(
                f"{attention_type} layers have different head counts {heads}"
            )
        layout[attention_type] = (len(heads), heads[0])
    return layout


def set_head_mask(model, head_mask: Optional[HeadMask]) -> None:
    """Set (or with None, clear) the mask of every attention module.

    Each tensor is ``(layers, heads)`` or, per sentence, ``(layers, batch, heads)``.
    A type missing from ``head_mask`` is left unmasked.
    """
    for (attention_type, layer_index), module in install_masked_attention(model).items():
        if head_mask is None or attention_type not in head_mask:
            module.head_mask = None
        else:
            module.head_mask = head_mask[attention_type][layer_index]


@contextlib.contextmanager
def head_mask_applied(model, head_mask: Optional[HeadMask]) -> Iterator[None]:
    """``set_head_mask`` for the block; the masks set before come back after it."""
    modules = install_masked_attention(model)
    previous = {key: module.head_mask for key, module in modules.items()}
    set_head_mask(model, head_mask)
    try:
        yield
    finally:
        for key, module in modules.items():
            module.head_mask = previous[key]


@contextlib.contextmanager
def unfused_attention() -> Iterator[None]:
    """Masked and narrowed modules take fairseq's unfused path in the block
    (the reference the fused path is tested and benchmarked against)."""
    previous = MaskedMultiheadAttention.use_sdpa
    MaskedMultiheadAttention.use_sdpa = False
    try:
        yield
    finally:
        MaskedMultiheadAttention.use_sdpa = previous


@contextlib.contextmanager
def fused_attention_everywhere() -> Iterator[None]:
    """Every installed module, masked or not, computes attention with the fused
    kernel where it computes what fairseq's would: an unpruned model timed
    against a shrunk one then differs from it in its heads only, not in its kernel."""
    previous = MaskedMultiheadAttention.sdpa_everywhere
    MaskedMultiheadAttention.sdpa_everywhere = True
    try:
        yield
    finally:
        MaskedMultiheadAttention.sdpa_everywhere = previous


def current_head_mask(model) -> Optional[HeadMask]:
    """The mask every module holds now (None when no module masks a head).

    A model built by the ``fairseq-headprune`` task already holds its
    checkpoint's recorded mask and ``--head-mask``: studies start from it.
    """

    layout = head_layout(model)
    head_mask = {t: torch.ones(layers, heads) for t, (layers, heads) in layout.items()}
    for (attention_type, layer), module in install_masked_attention(model).items():
        if module.head_mask is not None:
            if module.head_mask.dim() != 1:
                raise HeadMaskError("the model holds per-sentence masks, not one mask")
            head_mask[attention_type][layer] = module.head_mask.detach().float().cpu()
    if all(bool((m != 0).all()) for m in head_mask.values()):
        return None
    return head_mask


def masked_head_slices(model) -> List[Tuple[Tensor, int, Tensor]]:
    """(parameter, dimension, indices) of every masked head's own weights.

    What a head owns is ``unit_weights.HEAD_PARAMETERS``: its rows of the
    query, key and value projections (weights and biases) and its columns
    of the output projection.
    """
    return [held for module in install_masked_attention(model).values() if module.num_heads
            for held in masked_unit_slices(module, HEAD_PARAMETERS, module.head_mask)]
