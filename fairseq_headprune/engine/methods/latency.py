"""Per-layer latency of attention on this device, for a latency budget (Kwon et al. 2022, section 4.1).

Each attention layer is timed alone with 0 .. H heads kept; the table
records the device and the model's shape, so a table of another device or
model is refused when it is read (``study.methods.mask_search``).
"""

import copy
import platform
import statistics
import time
from typing import Dict, List

import torch
from tqdm import tqdm

from ...modules.masked_multihead_attention import attention_modules, head_layout, install_masked_attention
from ...modules.pruned_heads import shrink_attention
from ...study.methods.mask_search import LatencyTable
from ...study.settings import LatencySettings
from ..runners.batches import model_device


def model_architecture(model) -> Dict[str, object]:
    """What a latency table must match: heads per layer and dimensions of each attention type."""
    layout = head_layout(model)
    dims = {}
    for (attention_type, _), module in attention_modules(model).items():
        dims.setdefault(attention_type, [int(module.out_proj.out_features), int(module.head_dim)])
    return {"layout": {t: list(shape) for t, shape in layout.items()}, "dims": dims}


def device_description(device: torch.device) -> str:
    """The device a latency table holds for: the GPU's name, or the CPU's model and threads."""
    if device.type == "cuda":
        return f"cuda: {torch.cuda.get_device_name(device)}"
    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as stream:
            cpu = next((line.split(":", 1)[1].strip() for line in stream if line.startswith("model name")), cpu)
    except OSError:
        pass
    return f"cpu: {cpu}, {torch.get_num_threads()} threads"


def measure_latency_table(model, settings: LatencySettings) -> LatencyTable:
    """Median milliseconds of each attention layer's forward pass keeping its first k heads, k = 0 .. H.

    A layer is timed alone on random inputs of ``sequence_length`` positions
    (keys and values too) and ``batch_size`` sentences, as a full-sequence
    (teacher-forced) pass; a copy of the layer is narrowed with
    ``shrink_attention`` for each k, as ``shrink`` narrows it.
    """
    install_masked_attention(model)
    device = model_device(model)
    modules = attention_modules(model)
    per_layer: Dict[tuple, List[float]] = {}
    generator = torch.Generator(device="cpu").manual_seed(0)
    bar = tqdm(total=sum(m.num_heads + 1 for m in modules.values()), desc="latency", unit="shape",
               disable=not settings.progress, leave=False)
    try:
        for key, module in modules.items():
            width = module.out_proj.out_features
            shape = (settings.sequence_length, settings.batch_size, width)
            query = torch.randn(*shape, generator=generator).to(device, next(model.parameters()).dtype)
            memory = torch.randn(*shape, generator=generator).to(device, query.dtype)
            timings = []
            for kept in range(module.num_heads + 1):
                narrowed = copy.deepcopy(module)
                shrink_attention(narrowed, list(range(kept)))
                key_value = memory if module.encoder_decoder_attention else query
                timings.append(_median_ms(lambda: narrowed(query, key_value, key_value, need_weights=False),
                                          settings.repeats, device))
                bar.update(1)
            per_layer[key] = timings
    finally:
        bar.close()
    return LatencyTable(
        per_layer, device_description(device), model_architecture(model),
        {"batch_size": settings.batch_size, "sequence_length": settings.sequence_length,
         "repeats": settings.repeats, "torch": torch.__version__, "dtype": str(next(model.parameters()).dtype)},
    )


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
