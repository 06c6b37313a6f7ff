"""Per-layer latency of attention and FFN layers on this device, for a latency budget (Kwon et al. 2022, 4.1).

Each attention layer is timed alone with 0 .. H heads kept, each FFN layer
with 0, s, 2s, ... N neurons kept (s: the neuron step); the table records
the engine, device, precision and the model's shape, so a table of another
engine, device, precision or model is refused when it is read
(``study.search.costs``).
"""

import copy
import math
import statistics
import time
from typing import Dict, List

import torch
from tqdm import tqdm

from fairseq_headprune.constants import FAIRSEQ_ENGINE
from fairseq_headprune.engine.runners.batches import model_device
from fairseq_headprune.engine.search.model_costs import device_description, model_architecture, model_precision
from fairseq_headprune.modules.masked_ffn import ffn_layers
from fairseq_headprune.modules.masked_multihead_attention import attention_modules, install_masked_attention
from fairseq_headprune.modules.pruned_heads import shrink_attention
from fairseq_headprune.study.search.costs import LatencyTable
from fairseq_headprune.study.search.settings import LatencySettings

LATENCY_NEURON_STEPS = 16  # an FFN layer is timed at about this many neuron counts (and none)


def measure_latency_table(model, settings: LatencySettings) -> LatencyTable:
    """Median milliseconds of each attention layer keeping its first k heads, and each FFN layer its first k neurons.

    A layer is timed alone on random inputs of ``sequence_length`` positions
    (keys and values too) and ``batch_size`` sentences, as a full-sequence
    (teacher-forced) pass: an attention layer narrowed with ``shrink_attention``
    for each k = 0 .. H, as ``shrink`` narrows it; an FFN layer as ``fc2(act(fc1 x))``
    with the first k rows of ``fc1`` and columns of ``fc2``, for k every neuron step.
    """
    install_masked_attention(model)
    device = model_device(model)
    dtype = next(model.parameters()).dtype
    modules = attention_modules(model)
    blocks = ffn_layers(model)
    counts = {key: timed_neuron_counts(layer.fc2.in_features, settings.neuron_step) for key, layer in blocks.items()}
    per_layer: Dict[tuple, List[float]] = {}
    generator = torch.Generator(device="cpu").manual_seed(0)

    def random_input(width):
        return torch.randn(settings.sequence_length, settings.batch_size, width, generator=generator).to(device, dtype)

    bar = tqdm(total=sum(m.num_heads + 1 for m in modules.values()) + sum(len(c) for c in counts.values()),
               desc="latency", unit="shape", disable=not settings.progress, leave=False)
    try:
        for key, module in modules.items():
            query, memory = random_input(module.out_proj.out_features), random_input(module.out_proj.out_features)
            timings = []
            for kept in range(module.num_heads + 1):
                narrowed = copy.deepcopy(module)
                shrink_attention(narrowed, list(range(kept)))
                key_value = memory if module.encoder_decoder_attention else query
                timings.append(_median_ms(lambda: narrowed(query, key_value, key_value, need_weights=False),
                                          settings.repeats, device))
                bar.update(1)
            per_layer[key] = timings
        for key, layer in blocks.items():
            hidden = random_input(layer.fc1.in_features)
            timings = []
            for kept in counts[key]:
                fc1, fc2 = _narrowed_linear(layer.fc1, kept, rows=True), _narrowed_linear(layer.fc2, kept, rows=False)
                timings.append(_median_ms(lambda: fc2(layer.activation_fn(fc1(hidden))), settings.repeats, device))
                bar.update(1)
            per_layer[key] = timings
    finally:
        bar.close()
    return LatencyTable(
        per_layer, device_description(device), model_architecture(model),
        {"batch_size": settings.batch_size, "sequence_length": settings.sequence_length,
         "repeats": settings.repeats, "torch": torch.__version__, "dtype": str(dtype)},
        counts, FAIRSEQ_ENGINE, model_precision(model),
    )


def timed_neuron_counts(neurons: int, step) -> List[int]:
    """0, s, 2s, ... and the whole layer (s: the step, by default about 1/16 of the layer)."""
    step = step or max(1, math.ceil(neurons / LATENCY_NEURON_STEPS))
    return sorted(set(range(0, neurons + 1, step)) | {neurons})


def _narrowed_linear(linear: torch.nn.Linear, kept: int, rows: bool) -> torch.nn.Linear:
    """A copy of ``linear`` keeping its first ``kept`` output rows (``rows``) or input columns (and the bias)."""
    weight = linear.weight[:kept] if rows else linear.weight[:, :kept]
    narrowed = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=linear.bias is not None,
                               device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        narrowed.weight.copy_(weight)
        if linear.bias is not None:
            narrowed.bias.copy_(linear.bias[:kept] if rows else linear.bias)
    return narrowed


def _median_ms(call, repeats: int, device: torch.device) -> float:
    synchronize = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    with torch.no_grad():
        for _ in range(3):  # warm-up
            call()
        synchronize()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            call()
            synchronize()
            times.append(1000.0 * (time.perf_counter() - start))
    return statistics.median(times)
