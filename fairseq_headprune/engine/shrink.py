"""Remove heads for real: smaller attention projections (paper section 4.3).

A removed head loses its rows of the query, key and value projections and
its columns of the output projection; a layer that keeps no head keeps only
the output bias, so the residual path is unchanged.  The slicing is
fairseq's own ``MultiheadAttention._adaptive_prune_heads``.  The removed
heads are recorded in the model's config as a head-mask spec
(``headprune_pruned_heads``) so that the task can rebuild the smaller model
before fairseq loads the weights.
"""

from dataclasses import dataclass
from typing import Dict, List, Optional

import torch

from ..errors import CheckpointError, HeadMaskError, SettingsError
from ..modules.masked_multihead_attention import head_layout, install_masked_attention
from ..study.head_mask import HeadMask, parse_head_mask
from .checkpoint_info import config_value

PRUNED_HEADS_KEY = "headprune_pruned_heads"


def kept_heads(head_mask: HeadMask) -> Dict[str, List[List[int]]]:
    """0-based heads kept, per attention type and layer."""
    return {
        attention_type: [
            [head for head in range(layer_mask.numel()) if layer_mask[head] != 0]
            for layer_mask in mask
        ]
        for attention_type, mask in head_mask.items()
    }


def shrink_attention(module, keep: List[int]) -> None:
    """Keep only the heads ``keep`` (0-based, original numbering) of one module."""
    if list(keep) == list(range(module.num_heads)):
        return
    head_dim = module.head_dim
    if keep:
        module._adaptive_prune_heads([(h * head_dim, (h + 1) * head_dim) for h in keep])
    else:
        with torch.no_grad():
            for projection in (module.q_proj, module.k_proj, module.v_proj):
                projection.weight = torch.nn.Parameter(projection.weight[:0].detach().clone())
                if projection.bias is not None:
                    projection.bias = torch.nn.Parameter(projection.bias[:0].detach().clone())
                projection.out_features = 0
            module.out_proj.weight = torch.nn.Parameter(module.out_proj.weight[:, :0].detach().clone())
        module.num_heads = 0
        module.embed_dim = 0
    module.out_proj.in_features = module.out_proj.weight.size(1)
    # the query keeps the model's width while q/k/v are narrower
    module._set_skip_embed_dim_check()


def shrink_model(model, head_mask: HeadMask) -> Dict[str, List[int]]:
    """Remove the heads ``head_mask`` masks; returns heads kept per type and layer."""
    modules = install_masked_attention(model)
    plan = kept_heads(head_mask)
    for (attention_type, layer), module in modules.items():
        if attention_type in plan:
            if module.num_heads != head_mask[attention_type].shape[1]:
                raise HeadMaskError(f"{attention_type} layer {layer + 1} is already pruned")
            shrink_attention(module, plan[attention_type][layer])
    return {t: [len(layer) for layer in plan[t]] for t in plan}


def parameter_report(before: Dict[str, int], after: Dict[str, int]) -> List[str]:
    """TSV lines: part, parameters before, after, fraction removed."""
    lines = ["part\tbefore\tafter\tremoved"]
    for part in list(before):
        removed = 1.0 - after[part] / before[part] if before[part] else 0.0
        lines.append(f"{part}\t{before[part]}\t{after[part]}\t{removed:.1%}")
    return lines


def pruned_heads_of(model_cfg) -> Optional[str]:
    """The removed-heads spec recorded in a model config (Namespace or DictConfig)."""
    return config_value(model_cfg, PRUNED_HEADS_KEY)


def rebuild_pruned(model, model_cfg) -> Optional[str]:
    """Give a freshly built full-size model the shapes its checkpoint was pruned to."""
    spec = pruned_heads_of(model_cfg)
    if not spec:
        return None
    shrink_model(model, parse_head_mask(spec, head_layout(model)))
    return spec


# ---- on a checkpoint's state dict (no dictionaries needed) -------------------

_MODULE_PREFIXES = {
    "enc-enc": "encoder.layers.{}.self_attn.",
    "enc-dec": "decoder.layers.{}.encoder_attn.",
    "dec-dec": "decoder.layers.{}.self_attn.",
}
# RoBERTa's encoder layers sit one level deeper, under "decoder" in checkpoints released
# before fairseq renamed it (roberta.large.mnli; fairseq renames it on load)
_SENTENCE_ENCODER_PREFIXES = ("encoder.sentence_encoder.layers.", "decoder.sentence_encoder.layers.")


def module_prefixes(weights: Dict[str, torch.Tensor]) -> Dict[str, str]:
    """State-dict key prefix of each attention type's layer N (``.format(N)``)."""
    for prefix in _SENTENCE_ENCODER_PREFIXES:
        if any(key.startswith(prefix) for key in weights):
            return dict(_MODULE_PREFIXES, **{"enc-enc": prefix + "{}.self_attn."})
    return _MODULE_PREFIXES


def _unpack_in_proj(weights: Dict[str, torch.Tensor], prefix: str) -> None:
    """Old checkpoints pack q, k, v into in_proj_*; split them as fairseq does on load."""
    for kind in ("weight", "bias"):
        packed = weights.pop(prefix + "in_proj_" + kind, None)
        if packed is not None:
            for name, part in zip(("q_proj.", "k_proj.", "v_proj."), packed.chunk(3, dim=0)):
                weights[prefix + name + kind] = part.clone()


def shrink_state_dict(weights: Dict[str, torch.Tensor], head_mask: HeadMask) -> None:
    """Slice the masked heads out of a fairseq Transformer state dict, in place."""
    prefixes = module_prefixes(weights)
    for attention_type, mask in head_mask.items():
        for layer, layer_mask in enumerate(mask):
            prefix = prefixes[attention_type].format(layer)
            _unpack_in_proj(weights, prefix)
            heads = layer_mask.numel()
            width = weights[prefix + "q_proj.weight"].size(0)
            if width % heads:
                raise HeadMaskError(f"{attention_type} layer {layer + 1}: width {width} is not {heads} heads")
            head_dim = width // heads
            rows = torch.tensor(
                [h * head_dim + i for h in range(heads) if layer_mask[h] != 0 for i in range(head_dim)],
                dtype=torch.long,
            )
            for name in ("q_proj.", "k_proj.", "v_proj."):
                for kind in ("weight", "bias"):
                    key = prefix + name + kind
                    if key in weights:
                        weights[key] = weights[key].index_select(0, rows).clone()
            key = prefix + "out_proj.weight"
            weights[key] = weights[key].index_select(1, rows).clone()


def unique_parameter_count(tensors) -> int:
    """Elements of distinct tensors (shared embeddings counted once)."""
    seen, total = set(), 0
    for tensor in tensors:
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape))
        if key not in seen:
            seen.add(key)
            total += tensor.numel()
    return total


def state_parameter_counts(weights: Dict[str, torch.Tensor], layout) -> Dict[str, int]:
    """Attention-projection parameters per type and the model total, from a state dict."""
    counts = {}
    type_prefixes = module_prefixes(weights)
    for attention_type, (layers, _) in layout.items():
        prefixes = tuple(type_prefixes[attention_type].format(layer) for layer in range(layers))
        counts[attention_type] = sum(
            tensor.numel() for key, tensor in weights.items() if key.startswith(prefixes)
        )
    counts["total"] = unique_parameter_count(
        tensor
        for key, tensor in weights.items()
        # buffers fairseq keeps in the state dict are no parameters
        if tensor.is_floating_point() and not key.endswith((".version", "_float_tensor"))
    )
    return counts


# ---- a whole checkpoint -------------------------------------------------------


@dataclass
class ShrinkOutcome:
    """What ``shrink_checkpoint`` removed and how much smaller the model got."""

    removed: int  # heads removed
    total: int  # heads the model had
    spec: str  # the removed heads, as recorded in the new checkpoint
    recorded: Optional[str]  # the mask the checkpoint had been fine-tuned with, removed too
    report: List[str]  # TSV lines: part, parameters before, after, fraction removed


def shrink_checkpoint(path: str, out: str, spec: Optional[str], tuning_file: Optional[str] = None) -> ShrinkOutcome:
    """Write ``out``: ``path`` with the heads ``spec`` masks (and those it recorded) removed.

    ``tuning_file`` (``search --tune-masks``): its scales and bias corrections
    are folded into the output projections first, and its mask is removed
    (``spec``, if given too, must be the same mask).
    """
    import os

    from ..study.files import atomic_path
    from ..study.head_mask import combine_masks, count_masked, head_mask_to_spec
    from .checkpoint_info import (
        HEAD_MASK_KEY,
        load_checkpoint_state,
        model_config_object,
        record_config_value,
        state_head_layout,
    )

    if os.path.exists(out) and os.path.samefile(out, path) or os.path.abspath(out) == os.path.abspath(path):
        raise SettingsError(f"--out {out} is the input checkpoint; write the pruned model elsewhere")
    state = load_checkpoint_state(path)
    config = model_config_object(state)
    if config is None:
        raise CheckpointError(f"{path} has no model config (neither cfg nor args)")
    previous = pruned_heads_of(config)
    if previous:
        raise CheckpointError(
            f"{path} already has heads removed ({previous}); shrink the original checkpoint "
            "with every head to remove"
        )
    layout = state_head_layout(state)
    tuning = None
    if tuning_file is not None:
        from ..study.mask_tuning import read_tuning
        from .mask_tuning import fold_tuning_into_state

        tuning = read_tuning(tuning_file, layout)
        if spec is not None and head_mask_to_spec(parse_head_mask(spec, layout)) != tuning.spec:
            raise HeadMaskError(f"--head-mask {spec!r} is not the mask {tuning_file} was tuned for ({tuning.spec})")
        spec = tuning.spec
    if spec is None:
        raise SettingsError("give --head-mask SPEC, or --tuning FILE (its mask)")
    head_mask = parse_head_mask(spec, layout)
    recorded = config_value(config, HEAD_MASK_KEY)
    if recorded and tuning is not None:
        raise CheckpointError(f"{path} was fine-tuned with heads masked ({recorded}); tune its masks with those heads")
    if recorded:
        # a model fine-tuned with heads masked: those heads go too, and the record with them
        head_mask = combine_masks(parse_head_mask(recorded, layout), head_mask)
    if count_masked(head_mask) == 0:
        raise HeadMaskError(f"--head-mask {spec!r} removes no head")
    before = state_parameter_counts(state["model"], layout)
    if tuning is not None:
        fold_tuning_into_state(state["model"], tuning)
    shrink_state_dict(state["model"], head_mask)
    after = state_parameter_counts(state["model"], layout)
    removed_spec = head_mask_to_spec(head_mask)
    record_config_value(config, PRUNED_HEADS_KEY, removed_spec)
    if recorded:
        record_config_value(config, HEAD_MASK_KEY, None)
    # optimizer moments have the old shapes: fine-tune with --reset-optimizer
    state["last_optimizer_state"] = None
    with atomic_path(out) as temporary:
        torch.save(state, temporary)
    return ShrinkOutcome(
        removed=count_masked(head_mask), total=sum(layers * heads for layers, heads in layout.values()),
        spec=removed_spec, recorded=recorded, report=parameter_report(before, after),
    )
