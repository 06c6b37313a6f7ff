"""Mask tuning on a loaded model, layer by layer on stored layer inputs (``study.methods.mask_tuning``).

Kwon et al. (2022, section 4.3) tune the pruned model's layers in forward
order, each on the outputs of the layers below it already pruned and tuned.
Like their reference implementation (``prune/rescale.py``,
``collect_layer_inputs``), the inputs of every Transformer layer are kept
for both models, the unpruned teacher and the pruned student, and each
layer is run on them alone: one pass of the whole model to read the first
layer's input and fairseq's own call arguments (a forward pre-hook), then
per layer one teacher pass and one student pass per tuned sub-layer, so the
cost is linear in depth. Decoder layers read the student's own encoder
output, which ``model.encoder`` computes once the encoder is tuned.

A sub-layer is an attention block (the units are its heads) or an FFN block
(its neurons). The target of its fit is the unpruned model's sum at the
sub-layer's residual connection minus the student's residual input and the
output bias, read where fairseq adds them (``residual_connection``), so the
fit also corrects the drift the layers below left in the residual stream.
A fit is kept only if it lowers the loss on a held-aside part of the tuning
data (a forward pass of those batches); otherwise the layer stays binary.
Scales and corrections are folded into ``out_proj`` / ``fc2``
(``tuning_folded``), exactly what ``shrink --tuning`` writes.
"""

import contextlib
import math
import time
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import torch

from ...constants import DEFAULT_HELD_ASIDE, DEFAULT_TUNE_LAYERS, FFN_TYPES, TUNE_LAYERS
from ...errors import StudyError
from ...modules.masked_ffn import ffn_layers, ffn_layout, ffn_mask_applied, install_ffn_masks
from ...modules.masked_multihead_attention import (
    head_layout,
    head_mask_applied,
    install_masked_attention,
    transformer_layers,
)
from ...study.masks.ffn_mask import FfnMask
from ...study.masks.head_mask import HeadMask, full_mask
from ...study.methods.least_squares_tuning import (
    DEFAULT_MAX_CONDITION,
    DEFAULT_SCALE_BOUND,
    Layer,
    LayerTuning,
    MaskTuning,
    TuningSums,
    solve_layer,
)
from ...study.settings import TuningSettings
from ..runners.batches import collated_samples, load_split
from .tuning_guard import LossFunction, mean_loss, split_held_aside, token_nll

# sub-layers of an encoder and a decoder layer, in the order fairseq's layer adds their residuals
_ENCODER_SUBLAYERS = ("enc-enc", "enc-ffn")
_DECODER_SUBLAYERS = ("dec-dec", "enc-dec", "dec-ffn")



def forward_order(layout, ffn_shapes=None) -> List[Layer]:
    """Attention and FFN sub-layers in the order a forward pass computes them."""
    shapes = dict(layout, **(ffn_shapes or {}))

    def layers_of(types):
        return max((shapes[t][0] for t in types if t in shapes), default=0)

    order = []
    for types in (_ENCODER_SUBLAYERS, _DECODER_SUBLAYERS):
        for layer in range(layers_of(types)):
            order += [(t, layer) for t in types if t in shapes and layer < shapes[t][0]]
    return order


def _positions(sample: dict, sublayer_type: str, pad: int) -> torch.Tensor:
    """T x B: the positions of the sub-layer's stack that hold a token (not padding)."""
    net_input = sample["net_input"]
    encoder_side = sublayer_type in _ENCODER_SUBLAYERS
    tokens = net_input["src_tokens"] if encoder_side else net_input.get("prev_output_tokens", net_input["src_tokens"])
    return tokens.ne(pad).transpose(0, 1)


def head_contributions(module, head_outputs: torch.Tensor, heads: Optional[Sequence[int]] = None) -> torch.Tensor:
    """T x B x H' x d_model: each head's output (of ``heads``; default all) through its columns of the
    output projection, without its bias."""
    weight = module.out_proj.weight.view(module.out_proj.out_features, module.num_heads, -1)  # d x H x d_h
    if heads is not None:
        index = torch.tensor(list(heads), dtype=torch.long, device=head_outputs.device)
        head_outputs, weight = head_outputs.index_select(2, index), weight.index_select(1, index)
    return torch.einsum("tbhe,dhe->tbhd", head_outputs, weight)


def _output_projections(model) -> Dict[Layer, torch.nn.Linear]:
    """The projection each sub-layer's units are columns of: ``out_proj`` (heads), ``fc2`` (neurons)."""
    projections = {key: module.out_proj for key, module in install_masked_attention(model).items()}
    projections.update({key: layer.fc2 for key, layer in ffn_layers(model).items()})
    return projections


@contextlib.contextmanager
def tuning_folded(model, tuning: MaskTuning, layers: Optional[Sequence[Layer]] = None) -> Iterator[None]:
    """The tuned scales and bias corrections folded into ``out_proj`` / ``fc2`` (restored on exit)."""
    projections = _output_projections(model)
    saved = {}
    try:
        with torch.no_grad():
            for key in (tuning.layers if layers is None else layers):
                projection, values = projections[key], tuning.layers[key]
                saved[key] = (projection.weight.detach().clone(),
                              None if projection.bias is None else projection.bias.detach().clone())
                scales = torch.tensor(values.scales, dtype=projection.weight.dtype, device=projection.weight.device)
                columns = scales.repeat_interleave(projection.weight.size(1) // len(values.scales))
                projection.weight.mul_(columns.unsqueeze(0))
                if projection.bias is not None:
                    projection.bias.add_(torch.tensor(values.bias, dtype=projection.bias.dtype,
                                                      device=projection.bias.device))
        yield
    finally:
        with torch.no_grad():
            for key, (weight, bias) in saved.items():
                projections[key].weight.copy_(weight)
                if bias is not None:
                    projections[key].bias.copy_(bias)


class _ResidualTap:
    """Records (sub-layer output, residual input) at each of one layer's residual connections, in call order."""

    def __init__(self, layer):
        self.layer = layer
        self.records: List[Tuple[torch.Tensor, torch.Tensor]] = []

    def __call__(self, x, residual):
        self.records.append((x.detach(), residual.detach()))
        return self.original(x, residual)

    @contextlib.contextmanager
    def attached(self) -> Iterator["_ResidualTap"]:
        self.original = self.layer.residual_connection
        self.layer.residual_connection = self  # an instance attribute over fairseq's method
        try:
            yield self
        finally:
            del self.layer.residual_connection


class _UnitProbe:
    """Reads one sub-layer's unit outputs (per-head outputs or neuron activations) during a pass."""

    def __init__(self, hook_owner):
        self.hook_owner = hook_owner
        self.units: Optional[torch.Tensor] = None

    def __call__(self, owner, units, scaled) -> None:
        self.units = units.detach()

    @contextlib.contextmanager
    def attached(self) -> Iterator["_UnitProbe"]:
        name = "head_output_hook" if hasattr(self.hook_owner, "head_output_hook") else "output_hook"
        previous = getattr(self.hook_owner, name)
        setattr(self.hook_owner, name, self)
        try:
            yield self
        finally:
            setattr(self.hook_owner, name, previous)


def _layer_calls(model, layers, sample) -> List[Tuple[tuple, dict]]:
    """The (args, kwargs) fairseq passes each of ``layers`` in a forward pass of the model as it is set."""
    calls: Dict[int, Tuple[tuple, dict]] = {}
    handles = []
    for index, layer in enumerate(layers):
        def record(module, args, kwargs, index=index):
            # the input x is kept for the first layer only: the others' come from the replays
            calls[index] = (args if index == 0 else (None,) + tuple(args[1:]), dict(kwargs))
        handles.append(layer.register_forward_pre_hook(record, with_kwargs=True))
    try:
        model(**sample["net_input"])
    finally:
        for handle in handles:
            handle.remove()
    return [calls[index] for index in range(len(layers))]


def _run_layer(layer, call: Tuple[tuple, dict], x: torch.Tensor, encoder_out=None) -> torch.Tensor:
    """One fairseq layer on ``x`` with the call's other arguments (a decoder layer: ``encoder_out`` if given)."""
    args, kwargs = call
    args = (x,) + tuple(args[1:])
    if encoder_out is not None:
        args = args[:1] + (encoder_out,) + args[2:]
    output = layer(*args, **kwargs)
    return output[0] if isinstance(output, tuple) else output


def _tuned_sublayers(order: Sequence[Layer], masks: Dict[str, torch.Tensor], which: str) -> List[Layer]:
    """The sub-layers to fit: those that lose a unit, or (downstream) also every one whose input has drifted.

    A decoder sub-layer's input drifts after a pruned decoder sub-layer, or,
    once the encoder has a pruned sub-layer, from the first encoder-decoder
    attention on (it reads the drifted encoder output).
    """
    pruned = [key for key in order if bool((masks[key[0]][key[1]] == 0).any())]
    if which == "pruned":
        return pruned
    encoder_pruned = any(key[0] in _ENCODER_SUBLAYERS for key in pruned)
    tuned, drifted = [], {"encoder": False, "decoder": False}
    for key in order:
        side = "encoder" if key[0] in _ENCODER_SUBLAYERS else "decoder"
        if key[0] == "enc-dec" and encoder_pruned:
            drifted["decoder"] = True
        if key in pruned:
            drifted[side] = True
        if drifted[side]:
            tuned.append(key)
    return tuned


def tune_mask(
    model,
    head_mask: HeadMask,
    samples: Sequence[dict],
    pad: int,
    scale_bound: float = DEFAULT_SCALE_BOUND,
    max_condition: float = DEFAULT_MAX_CONDITION,
    progress: bool = True,
    description: str = "mask tuning",
    ffn_mask: Optional[FfnMask] = None,
    held_aside: float = DEFAULT_HELD_ASIDE,
    layers: str = DEFAULT_TUNE_LAYERS,
    loss: Optional[LossFunction] = None,
) -> MaskTuning:
    """Fit the sub-layers the masks prune (``layers="downstream"``: and every one that sees their drift) in forward order.

    ``samples``: teacher-forced batches; a ``held_aside`` share of them is not
    fitted on but decides whether each fit is kept (``loss``, default the
    target tokens' cross-entropy).
    """
    from tqdm import tqdm

    if layers not in TUNE_LAYERS:
        raise StudyError(f"--tune-layers must be one of {', '.join(TUNE_LAYERS)}, got {layers!r}")
    loss = token_nll(pad) if loss is None else loss
    modules = install_masked_attention(model)
    neuron_hooks = install_ffn_masks(model)
    blocks = ffn_layers(model)
    layout, neurons = head_layout(model), ffn_layout(model)
    student_heads = {t: m.clone().float() for t, m in full_mask(layout).items()}
    for t, mask in head_mask.items():
        student_heads[t] = mask.clone().float()
    student_neurons = {t: torch.ones(shape) for t, shape in neurons.items()}
    for t, mask in (ffn_mask or {}).items():
        student_neurons[t] = mask.clone().float()
    masks = dict(student_heads, **student_neurons)
    order = forward_order(layout, neurons)
    to_tune = set(_tuned_sublayers(order, masks, layers))
    tunes_neurons = any(key[0] in FFN_TYPES for key in to_tune)
    tuning = MaskTuning({t: m.clone() for t, m in head_mask.items()}, {}, ffn_mask=(
        {t: m.clone() for t, m in student_neurons.items()} if ffn_mask is not None or tunes_neurons else None))
    fit_samples, held_samples = split_held_aside(samples, held_aside)
    encoder_layers, decoder_layers = transformer_layers(model)
    start = time.perf_counter()
    positions_total = 0
    model.eval()
    passes = sum(len(stack) for stack in (encoder_layers, decoder_layers)) * 2 + len(to_tune)
    bar = tqdm(total=passes * len(fit_samples), desc=description, unit="pass", disable=not progress, leave=False)

    def student() -> contextlib.ExitStack:
        stack = contextlib.ExitStack()
        stack.enter_context(head_mask_applied(model, student_heads))
        stack.enter_context(ffn_mask_applied(model, student_neurons))
        stack.enter_context(tuning_folded(model, tuning))
        return stack

    try:
        with torch.no_grad():
            with head_mask_applied(model, None), ffn_mask_applied(model, None):  # the teacher: every unit
                calls = [(_layer_calls(model, encoder_layers, s), _layer_calls(model, decoder_layers, s))
                         for s in fit_samples]
            with student():
                held_loss = mean_loss(model, loss, held_samples)
            student_encoder_out = None
            for stack_index, (stack, types) in enumerate(((encoder_layers, _ENCODER_SUBLAYERS),
                                                         (decoder_layers, _DECODER_SUBLAYERS))):
                if not stack:
                    continue
                stack_calls = [sample_calls[stack_index] for sample_calls in calls]
                teacher_x = [c[0][0][0] for c in stack_calls]
                student_x = list(teacher_x)  # the embeddings are not pruned
                if stack_index == 1 and encoder_layers:
                    with student():
                        student_encoder_out = [model.encoder(s["net_input"]["src_tokens"],
                                                             src_lengths=s["net_input"].get("src_lengths"))
                                               ["encoder_out"][0] for s in fit_samples]
                for index, layer in enumerate(stack):
                    # the sub-layers in the order the layer adds their residuals (the tap's records)
                    sublayers = [t for t in types if t in masks and index < masks[t].size(0) and (
                        t != "enc-dec" or getattr(layer, "encoder_attn", None) is not None)]
                    targets = {}
                    with _ResidualTap(layer).attached() as tap:  # the teacher: sums at each residual connection
                        for sample_index, sample in enumerate(fit_samples):
                            tap.records.clear()
                            teacher_x[sample_index] = _run_layer(layer, stack_calls[sample_index][index],
                                                                 teacher_x[sample_index])
                            for position, t in enumerate(sublayers):
                                if (t, index) in to_tune:
                                    output, residual = tap.records[position]
                                    keep = _positions(sample, t, pad)
                                    targets.setdefault(t, []).append((output + residual)[keep])
                            bar.update(1)
                    for position, t in enumerate(sublayers):
                        key = (t, index)
                        if key not in to_tune:
                            continue
                        values, positions = _fit_sublayer(
                            key, position, layer, modules.get(key), neuron_hooks.get(key), blocks.get(key),
                            masks[t][index], fit_samples, stack_calls, index, student_x,
                            None if stack_index == 0 else student_encoder_out, targets[t], pad, student,
                            scale_bound, max_condition, bar)
                        positions_total = max(positions_total, positions)
                        if values.fitted:
                            tuning.layers[key] = values
                            with student():
                                candidate_loss = mean_loss(model, loss, held_samples)
                            values.loss_binary, values.loss_tuned = held_loss, candidate_loss
                            if candidate_loss < held_loss:
                                held_loss = candidate_loss
                            else:
                                values = values.as_binary(
                                    f"held-aside loss {held_loss:.5f} -> {candidate_loss:.5f} with the fit")
                        tuning.layers[key] = values
                    with student():
                        for sample_index in range(len(fit_samples)):
                            student_x[sample_index] = _run_layer(
                                layer, stack_calls[sample_index][index], student_x[sample_index],
                                None if student_encoder_out is None or stack_index == 0
                                else student_encoder_out[sample_index])
                            bar.update(1)
    finally:
        bar.close()
    tuning.layers = {key: tuning.layers[key] for key in order if key in tuning.layers}
    tuning.settings.update({
        "seconds": time.perf_counter() - start,
        "sentences": int(sum(int(s["nsentences"]) for s in samples)),
        "fit_sentences": int(sum(int(s["nsentences"]) for s in fit_samples)),
        "held_aside_sentences": int(sum(int(s["nsentences"]) for s in held_samples)),
        "held_aside_loss": held_loss,
        "positions": positions_total,
        "scale_bound": scale_bound,
        "max_condition": max_condition,
        "tuned_layers": layers,
        "target": "unpruned output and residual minus the pruned residual (Kwon et al.'s rescale)",
    })
    return tuning


def _fit_sublayer(key, position, layer, attention, neuron_hook, block, unit_mask, samples, calls, index,
                  student_x, encoder_out, targets, pad, student, scale_bound, max_condition, bar):
    """Stream one sub-layer's least-squares sums over the student's passes of its layer, and solve."""
    units = unit_mask.numel()
    kept = [u for u in range(units) if unit_mask[u] != 0]
    projection = attention.out_proj if attention is not None else block.fc2
    dim = projection.out_features
    bias = projection.bias.detach() if projection.bias is not None else torch.zeros(dim)
    sums = TuningSums.zeros(len(kept), dim)
    probe = _UnitProbe(attention if attention is not None else neuron_hook)
    with student(), _ResidualTap(layer).attached() as tap, probe.attached():
        for sample_index, sample in enumerate(samples):
            tap.records.clear()
            _run_layer(layer, calls[sample_index][index], student_x[sample_index],
                       None if encoder_out is None else encoder_out[sample_index])
            keep = _positions(sample, key[0], pad)
            residual = tap.records[position][1][keep]
            target = targets[sample_index] - residual - bias
            if attention is not None:
                sums.add(head_contributions(attention, probe.units, kept)[keep], target)
            else:
                index_kept = torch.tensor(kept, dtype=torch.long, device=probe.units.device)
                sums.add_factored(probe.units[keep].index_select(1, index_kept),
                                  projection.weight.detach().index_select(1, index_kept), target)
            bar.update(1)
    return solve_layer(sums, kept, units, scale_bound, max_condition), sums.positions


def layer_tuning_summary(tuning: MaskTuning) -> List[str]:
    """Console lines: per tuned layer, fitted or not, and the reconstruction error before and after."""
    lines = []
    for (t, layer), values in tuning.layers.items():
        kept = sum(1 for s in values.scales if s != 0)
        units = "neurons" if t in FFN_TYPES else "heads"
        state = "fitted" if values.fitted else f"binary ({values.reason})"
        scales = ""
        if t not in FFN_TYPES:
            scales = "; scales [" + ", ".join(f"{s:.2f}" for s in values.scales if s != 0) + "]"
        held = ""
        if math.isfinite(values.loss_binary) and math.isfinite(values.loss_tuned):
            held = f"; held-aside loss {values.loss_binary:.4f} -> {values.loss_tuned:.4f}"
        lines.append(f"  {t} layer {layer + 1}: {kept} {units} kept, {state}{scales}; "
                     f"reconstruction error {values.error_binary:.4f} -> {values.error_tuned:.4f}{held}")
    return lines


def tuning_samples(task, model, settings: TuningSettings) -> List[dict]:
    """Teacher-forced batches of the tuning splits (collated once, on the model's device).

    Batches of at most 64 sentences, and at least about ten batches for small
    limits, so that the held-aside share is a share of batches.
    """
    sentences = None
    if not settings.max_tokens:
        available = 0
        for subset in settings.subsets:
            load_split(task, subset)
            size = len(task.dataset(subset))
            available += size if settings.limit is None else min(size, settings.limit)
        sentences = max(1, min(64, math.ceil(available / 10)))
    samples = collated_samples(task, model, settings.subsets, settings.max_tokens, sentences, settings.limit)
    if not samples:
        raise StudyError(f"--tune-subset {' '.join(settings.subsets)} holds no sentence")
    return samples
