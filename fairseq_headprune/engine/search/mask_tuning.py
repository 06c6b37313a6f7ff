"""Mask tuning on a loaded model, layer by layer on stored layer inputs (``study.search.tuning``).

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
from tqdm import tqdm

from fairseq_headprune.constants import FFN_TYPES
from fairseq_headprune.engine.runners.batches import collated_samples, load_split
from fairseq_headprune.engine.search.tuning_guard import LossFunction, mean_loss, split_held_aside, token_nll
from fairseq_headprune.errors import StudyError
from fairseq_headprune.modules.masked_ffn import ffn_layers, ffn_layout, ffn_mask_applied, install_ffn_masks
from fairseq_headprune.modules.masked_multihead_attention import (
    head_layout,
    head_mask_applied,
    install_masked_attention,
    transformer_layers,
)
from fairseq_headprune.modules.unit_weights import (
    HEAD_PARAMETERS,
    NEURON_PARAMETERS,
    folded_tuning,
    kept_units,
    unit_columns,
    unit_index,
)
from fairseq_headprune.study.masks.ffn_mask import FfnMask
from fairseq_headprune.study.masks.head_mask import HeadMask, full_mask
from fairseq_headprune.study.search.settings import TuningSettings
from fairseq_headprune.study.search.tuning import Layer, MaskTuning, TuningSums, solve_layer

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
    attention, blocks = install_masked_attention(model), ffn_layers(model)
    projections = {key: HEAD_PARAMETERS.output_linear(module) for key, module in attention.items()}
    projections.update({key: NEURON_PARAMETERS.output_linear(layer) for key, layer in blocks.items()})
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
                weight, bias = folded_tuning(projection.weight, projection.bias, values.scales, values.bias)
                projection.weight.copy_(weight)
                if bias is not None:
                    projection.bias.copy_(bias)
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


def tune_mask(model, head_mask: HeadMask, samples: Sequence[dict], pad: int,
              settings: Optional[TuningSettings] = None, ffn_mask: Optional[FfnMask] = None,
              loss: Optional[LossFunction] = None, progress: bool = True,
              description: str = "mask tuning") -> MaskTuning:
    """Fit the sub-layers the masks prune (``settings.layers="downstream"``: and every one that sees their drift),
    in forward order (Kwon et al. 2022, section 4.3).

    ``samples``: teacher-forced batches; a ``settings.held_aside`` share of them
    is not fitted on but decides whether each fit is kept (``loss``, default
    the target tokens' cross-entropy).
    """
    settings = settings or TuningSettings()
    tuner = _LayerwiseTuner(model, head_mask, ffn_mask, samples, pad, settings,
                            token_nll(pad) if loss is None else loss)
    start = time.perf_counter()
    with tuner.progress_bar(description, progress):
        tuner.tune()
    return tuner.finished(time.perf_counter() - start, samples)


class _LayerwiseTuner:
    """One tuning run: the teacher's layer calls, the student's masks and inputs, the fits kept so far."""

    def __init__(self, model, head_mask, ffn_mask, samples, pad, settings: TuningSettings, loss: LossFunction):
        self.model, self.pad, self.settings, self.loss = model, pad, settings, loss
        self.modules, self.neuron_hooks, self.blocks = install_masked_attention(model), install_ffn_masks(model), \
            ffn_layers(model)
        layout, neurons = head_layout(model), ffn_layout(model)
        self.student_heads = {t: m.clone().float() for t, m in full_mask(layout).items()}
        self.student_heads.update({t: m.clone().float() for t, m in head_mask.items()})
        self.student_neurons = {t: torch.ones(shape) for t, shape in neurons.items()}
        self.student_neurons.update({t: m.clone().float() for t, m in (ffn_mask or {}).items()})
        self.masks = dict(self.student_heads, **self.student_neurons)
        self.order = forward_order(layout, neurons)
        self.to_tune = set(_tuned_sublayers(self.order, self.masks, settings.layers))
        tunes_neurons = ffn_mask is not None or any(key[0] in FFN_TYPES for key in self.to_tune)
        self.tuning = MaskTuning({t: m.clone() for t, m in head_mask.items()}, {}, ffn_mask=(
            {t: m.clone() for t, m in self.student_neurons.items()} if tunes_neurons else None))
        self.fit_samples, self.held_samples = split_held_aside(samples, settings.held_aside)
        self.stacks = transformer_layers(model)  # (encoder layers, decoder layers)
        self.positions, self.held_loss, self.bar = 0, float("nan"), None

    @contextlib.contextmanager
    def progress_bar(self, description: str, progress: bool) -> Iterator[None]:
        passes = sum(len(stack) for stack in self.stacks) * 2 + len(self.to_tune)
        self.bar = tqdm(total=passes * len(self.fit_samples), desc=description, unit="pass", disable=not progress,
                        leave=False)
        try:
            yield
        finally:
            self.bar.close()

    def student(self) -> contextlib.ExitStack:
        """The pruned model with the fits kept so far folded in."""
        stack = contextlib.ExitStack()
        stack.enter_context(head_mask_applied(self.model, self.student_heads))
        stack.enter_context(ffn_mask_applied(self.model, self.student_neurons))
        stack.enter_context(tuning_folded(self.model, self.tuning))
        return stack

    def tune(self) -> None:
        """Both stacks in forward order, on the layer inputs read in one teacher pass per batch."""
        self.model.eval()
        encoder_layers, decoder_layers = self.stacks
        with torch.no_grad():
            with head_mask_applied(self.model, None), ffn_mask_applied(self.model, None):  # the teacher: every unit
                calls = [(_layer_calls(self.model, encoder_layers, s), _layer_calls(self.model, decoder_layers, s))
                         for s in self.fit_samples]
            with self.student():
                self.held_loss = mean_loss(self.model, self.loss, self.held_samples)
            for stack_index, types in enumerate((_ENCODER_SUBLAYERS, _DECODER_SUBLAYERS)):
                if self.stacks[stack_index]:
                    self._tune_stack(stack_index, types, [sample_calls[stack_index] for sample_calls in calls])

    def _tune_stack(self, stack_index: int, types, stack_calls) -> None:
        """Each layer of one stack: the teacher's targets, the fits, then the student's input to the next layer."""
        teacher_x = [c[0][0][0] for c in stack_calls]
        student_x = list(teacher_x)  # the embeddings are not pruned
        encoder_out = None
        if stack_index == 1 and self.stacks[0]:
            with self.student():  # the decoder reads the pruned (and tuned) encoder's output
                encoder_out = [self.model.encoder(s["net_input"]["src_tokens"],
                                                  src_lengths=s["net_input"].get("src_lengths"))["encoder_out"][0]
                               for s in self.fit_samples]
        for index, layer in enumerate(self.stacks[stack_index]):
            # the sub-layers in the order the layer adds their residuals (the tap's records)
            sublayers = [t for t in types if t in self.masks and index < self.masks[t].size(0) and (
                t != "enc-dec" or getattr(layer, "encoder_attn", None) is not None)]
            targets = self._teacher_targets(layer, index, sublayers, stack_calls, teacher_x)
            for position, sublayer_type in enumerate(sublayers):
                if (sublayer_type, index) in self.to_tune:
                    self._fit((sublayer_type, index), position, layer, stack_calls, student_x, encoder_out,
                              targets[sublayer_type])
            with self.student():
                for sample_index in range(len(self.fit_samples)):
                    student_x[sample_index] = _run_layer(
                        layer, stack_calls[sample_index][index], student_x[sample_index],
                        None if encoder_out is None else encoder_out[sample_index])
                    self.bar.update(1)

    def _teacher_targets(self, layer, index, sublayers, stack_calls, teacher_x) -> Dict[str, List[torch.Tensor]]:
        """The unpruned sums at the residual connections of the sub-layers to fit; the teacher's input moves on."""
        targets: Dict[str, List[torch.Tensor]] = {}
        with _ResidualTap(layer).attached() as tap:
            for sample_index, sample in enumerate(self.fit_samples):
                tap.records.clear()
                teacher_x[sample_index] = _run_layer(layer, stack_calls[sample_index][index], teacher_x[sample_index])
                for position, sublayer_type in enumerate(sublayers):
                    if (sublayer_type, index) in self.to_tune:
                        output, residual = tap.records[position]
                        targets.setdefault(sublayer_type, []).append(
                            (output + residual)[_positions(sample, sublayer_type, self.pad)])
                self.bar.update(1)
        return targets

    def _fit(self, key: Layer, position: int, layer, stack_calls, student_x, encoder_out, targets) -> None:
        """Solve one sub-layer; keep the fit only if it lowers the held-aside loss."""
        values = self._solve(key, position, layer, stack_calls, student_x, encoder_out, targets)
        if values.fitted:
            self.tuning.layers[key] = values
            with self.student():
                candidate_loss = mean_loss(self.model, self.loss, self.held_samples)
            values.loss_binary, values.loss_tuned = self.held_loss, candidate_loss
            if candidate_loss < self.held_loss:
                self.held_loss = candidate_loss
            else:
                values = values.as_binary(f"held-aside loss {self.held_loss:.5f} -> {candidate_loss:.5f} with the fit")
        self.tuning.layers[key] = values

    def _solve(self, key: Layer, position: int, layer, stack_calls, student_x, encoder_out, targets):
        """Stream one sub-layer's least-squares sums over the student's passes of its layer, and solve."""
        attention, index = self.modules.get(key), key[1]
        unit_mask = self.masks[key[0]][index]
        kept = list(kept_units(unit_mask))
        projection = (HEAD_PARAMETERS.output_linear(attention) if attention is not None
                      else NEURON_PARAMETERS.output_linear(self.blocks[key]))
        bias = projection.bias.detach() if projection.bias is not None else torch.zeros(projection.out_features)
        sums = TuningSums.zeros(len(kept), projection.out_features)
        probe = _UnitProbe(attention if attention is not None else self.neuron_hooks[key])
        with self.student(), _ResidualTap(layer).attached() as tap, probe.attached():
            for sample_index, sample in enumerate(self.fit_samples):
                tap.records.clear()
                _run_layer(layer, stack_calls[sample_index][index], student_x[sample_index],
                           None if encoder_out is None else encoder_out[sample_index])
                keep = _positions(sample, key[0], self.pad)
                target = targets[sample_index] - tap.records[position][1][keep] - bias  # minus the residual input
                if attention is not None:
                    sums.add(head_contributions(attention, probe.units, kept)[keep], target)
                else:
                    index_kept = unit_index(kept, device=probe.units.device)
                    sums.add_factored(probe.units[keep].index_select(1, index_kept),
                                      unit_columns(projection.weight.detach(), index_kept), target)
                self.bar.update(1)
        self.positions = max(self.positions, sums.positions)
        return solve_layer(sums, kept, unit_mask.numel(), self.settings.scale_bound, self.settings.max_condition)

    def finished(self, seconds: float, samples: Sequence[dict]) -> MaskTuning:
        """The tuning in forward order, with what it was fitted on and how."""
        tuning = self.tuning
        tuning.layers = {key: tuning.layers[key] for key in self.order if key in tuning.layers}
        tuning.settings.update({
            "seconds": seconds,
            "sentences": int(sum(int(s["nsentences"]) for s in samples)),
            "fit_sentences": int(sum(int(s["nsentences"]) for s in self.fit_samples)),
            "held_aside_sentences": int(sum(int(s["nsentences"]) for s in self.held_samples)),
            "held_aside_loss": self.held_loss,
            "positions": self.positions,
            "scale_bound": self.settings.scale_bound,
            "max_condition": self.settings.max_condition,
            "tuned_layers": self.settings.layers,
            "target": "unpruned output and residual minus the pruned residual (Kwon et al.'s rescale)",
        })
        return tuning


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
    samples = collated_samples(task, model, settings.subsets, settings.max_tokens, sentences, settings.limit,
                               "tune_max_tokens")
    if not samples:
        raise StudyError(f"the tune subset {' '.join(settings.subsets)} holds no sentence", setting="tune_subset")
    return samples
