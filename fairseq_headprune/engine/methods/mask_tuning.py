"""Mask tuning on a loaded model: teacher-forced passes, one layer at a time (``study.mask_tuning``).

Layers are tuned in the order the forward pass meets them (encoder, then
each decoder layer's self-attention before its encoder-decoder attention),
each on the outputs of the layers before it already pruned and tuned, as
Kwon et al. (2022, section 4.3) tune layer by layer. For each batch the
unpruned model gives the target Y(t) (every head's contribution summed) and
the pruned model the kept heads' contributions A_h(t), both read from the
per-head outputs the masked attention module hands its hook; padding
positions are left out. Scales and corrections are then folded into the
output projection (``tuning_folded``), exactly what ``shrink --tuning`` writes.
"""

import contextlib
import time
from typing import Iterator, List, Optional, Sequence

import torch

from ...errors import StudyError
from ...study.settings import TuningSettings
from ..runners.batches import collated_samples
from ...study.masks.head_mask import HeadMask, full_mask
from ...study.methods.mask_tuning import (
    DEFAULT_MAX_CONDITION,
    DEFAULT_SCALE_BOUND,
    Layer,
    MaskTuning,
    TuningSums,
    solve_layer,
)


def forward_order(layout) -> List[Layer]:
    """Attention layers in the order a forward pass computes them."""
    order = [("enc-enc", layer) for layer in range(layout.get("enc-enc", (0, 0))[0])]
    decoder_layers = max(layout.get("dec-dec", (0, 0))[0], layout.get("enc-dec", (0, 0))[0])
    for layer in range(decoder_layers):
        order += [(t, layer) for t in ("dec-dec", "enc-dec") if t in layout and layer < layout[t][0]]
    return order


def _positions(sample: dict, attention_type: str, pad: int) -> torch.Tensor:
    """T x B: the query positions of ``attention_type`` that hold a token (not padding)."""
    net_input = sample["net_input"]
    tokens = net_input["src_tokens"] if attention_type == "enc-enc" else net_input.get(
        "prev_output_tokens", net_input["src_tokens"])
    return tokens.ne(pad).transpose(0, 1)


def head_contributions(module, head_outputs: torch.Tensor, heads: Optional[Sequence[int]] = None) -> torch.Tensor:
    """T x B x H' x d_model: each head's output (of ``heads``; default all) through its columns of the
    output projection, without its bias."""
    weight = module.out_proj.weight.view(module.out_proj.out_features, module.num_heads, -1)  # d x H x d_h
    if heads is not None:
        index = torch.tensor(list(heads), dtype=torch.long, device=head_outputs.device)
        head_outputs, weight = head_outputs.index_select(2, index), weight.index_select(1, index)
    return torch.einsum("tbhe,dhe->tbhd", head_outputs, weight)


@contextlib.contextmanager
def tuning_folded(model, tuning: MaskTuning, layers: Optional[Sequence[Layer]] = None) -> Iterator[None]:
    """The tuned scales and bias corrections folded into the output projections (restored on exit)."""
    from ...modules.masked_multihead_attention import attention_modules

    modules = attention_modules(model)
    saved = {}
    try:
        with torch.no_grad():
            for key in (tuning.layers if layers is None else layers):
                module, values = modules[key], tuning.layers[key]
                projection = module.out_proj
                saved[key] = (projection.weight.detach().clone(),
                              None if projection.bias is None else projection.bias.detach().clone())
                heads = module.num_heads
                scales = torch.tensor(values.scales, dtype=projection.weight.dtype, device=projection.weight.device)
                columns = scales.repeat_interleave(projection.weight.size(1) // heads)
                projection.weight.mul_(columns.unsqueeze(0))
                if projection.bias is not None:
                    projection.bias.add_(torch.tensor(values.bias, dtype=projection.bias.dtype,
                                                      device=projection.bias.device))
        yield
    finally:
        with torch.no_grad():
            for key, (weight, bias) in saved.items():
                modules[key].out_proj.weight.copy_(weight)
                if bias is not None:
                    modules[key].out_proj.bias.copy_(bias)


class _LayerProbe:
    """Reads one layer's per-head outputs during a forward pass (the masked module's hook)."""

    def __init__(self, module):
        self.module = module
        self.head_outputs: Optional[torch.Tensor] = None

    def __call__(self, module, head_outputs, scaled) -> None:
        self.head_outputs = head_outputs.detach()

    @contextlib.contextmanager
    def attached(self) -> Iterator["_LayerProbe"]:
        previous = self.module.head_output_hook
        self.module.head_output_hook = self
        try:
            yield self
        finally:
            self.module.head_output_hook = previous


def tune_mask(
    model,
    head_mask: HeadMask,
    samples: Sequence[dict],
    pad: int,
    scale_bound: float = DEFAULT_SCALE_BOUND,
    max_condition: float = DEFAULT_MAX_CONDITION,
    progress: bool = True,
    description: str = "mask tuning",
) -> MaskTuning:
    """Fit every layer that loses a head, in forward order; ``samples``: teacher-forced batches."""
    from tqdm import tqdm

    from ...modules.masked_multihead_attention import head_mask_applied, head_layout, install_masked_attention

    modules = install_masked_attention(model)
    layout = head_layout(model)
    ones = full_mask(layout)
    layers = [key for key in forward_order(layout) if bool((head_mask[key[0]][key[1]] == 0).any())]
    tuning = MaskTuning({t: m.clone() for t, m in head_mask.items()}, {})
    start = time.perf_counter()
    positions_total = 0
    model.eval()
    bar = tqdm(total=len(layers) * len(samples), desc=description, unit="batch", disable=not progress, leave=False)
    try:
        for key in layers:
            module = modules[key]
            kept = [h for h in range(layout[key[0]][1]) if head_mask[key[0]][key[1], h] != 0]
            sums = TuningSums.zeros(len(kept), module.out_proj.out_features)
            probe = _LayerProbe(module)
            for sample in samples:
                positions = _positions(sample, key[0], pad)
                with torch.no_grad(), probe.attached():
                    with head_mask_applied(model, ones):  # the unpruned model: the target
                        model(**sample["net_input"])
                    targets = head_contributions(module, probe.head_outputs).sum(dim=2)[positions]
                    with head_mask_applied(model, head_mask), tuning_folded(model, tuning):  # pruned, tuned so far
                        model(**sample["net_input"])
                    contributions = head_contributions(module, probe.head_outputs, kept)[positions]
                sums.add(contributions, targets)
                bar.update(1)
            tuning.layers[key] = solve_layer(sums, kept, layout[key[0]][1], scale_bound, max_condition)
            positions_total = max(positions_total, sums.positions)
    finally:
        bar.close()
    tuning.settings.update({
        "seconds": time.perf_counter() - start,
        "sentences": int(sum(int(s["nsentences"]) for s in samples)),
        "positions": positions_total,
        "scale_bound": scale_bound,
        "max_condition": max_condition,
    })
    return tuning


def layer_tuning_summary(tuning: MaskTuning) -> List[str]:
    """Console lines: per tuned layer, fitted or not, and the reconstruction error before and after."""
    lines = []
    for (t, layer), values in tuning.layers.items():
        kept = sum(1 for s in values.scales if s != 0)
        state = "fitted" if values.fitted else f"binary ({values.reason})"
        scales = ", ".join(f"{s:.2f}" for s in values.scales if s != 0)
        lines.append(f"  {t} layer {layer + 1}: {kept} heads kept, {state}; scales [{scales}]; "
                     f"reconstruction error {values.error_binary:.4f} -> {values.error_tuned:.4f}")
    return lines



def tuning_samples(task, model, settings: TuningSettings) -> List[dict]:
    """Teacher-forced batches of the tuning splits (collated once, on the model's device)."""
    samples = collated_samples(task, model, settings.subsets, settings.max_tokens,
                               None if settings.max_tokens else 64, settings.limit)
    if not samples:
        raise StudyError(f"--tune-subset {' '.join(settings.subsets)} holds no sentence")
    return samples
