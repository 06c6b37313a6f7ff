"""Per-layer latency as CTranslate2 runs the model, for a latency budget on the deployment engine (Kwon et al. 2022, 4.1).

CTranslate2 runs a model whole, so a layer cannot be timed alone as
``latency.measure_latency_table`` times fairseq's. Instead the model is
exported (``export.ctranslate2_spec``) once per variant, every layer of one
group narrowed alike and the rest whole: the encoder's attention layers
keeping k heads; the decoder's self- and cross-attention layers keeping k
heads (CTranslate2 gives a decoder one head count); one FFN type's layers
keeping k neurons. Each variant's teacher-forced ``score_batch`` on the same
random sentences is timed, a group's variants interleaved repeat by repeat.

A layer keeping k units is priced at the time its group's variant adds over
the group's narrowest (0 heads, which CTranslate2 runs as one zero head; 0
neurons), divided evenly among the group's layers (a decoder layer's between
its self- and cross-attention); the prices are made non-decreasing in k, as
timing noise could otherwise price a wider layer below a narrower one. What
the layers cost at their narrowest, and what pruning never shrinks
(embeddings, the output projection, beam search), is in no layer's price.
"""

import os
import statistics
import tempfile
import time
from typing import Dict, List, Sequence, Tuple

import torch
from tqdm import tqdm

from ...constants import ATTENTION_TYPES, CTRANSLATE2_ENGINE, TRANSLATION_FAMILY
from ...modules.masked_ffn import ffn_layout, set_ffn_mask
from ...modules.masked_multihead_attention import head_layout, set_head_mask
from ...study.methods.search_costs import Block, LatencyTable
from ...study.settings import LatencySettings
from ..export.ctranslate2_spec import import_ctranslate2, save_spec
from ..runners.batches import model_device
from .deployment import load_ctranslate2_model
from .latency import timed_neuron_counts
from .model_costs import device_description, model_architecture

WARM_UP = 2  # untimed passes of each variant before the timed ones


def measure_ctranslate2_latency_table(family, cfg, task, model, settings: LatencySettings) -> LatencyTable:
    """The latency table of ``model`` exported to CTranslate2 at ``settings.quantization`` (see the module)."""
    ctranslate2 = import_ctranslate2()
    layout, widths = head_layout(model), ffn_layout(model)
    groups: List[Tuple[Tuple[str, ...], List[int]]] = []
    for types in (("enc-enc",), ("dec-dec", "enc-dec")):
        present = tuple(t for t in types if t in layout)
        if present:
            groups.append((present, list(range(layout[present[0]][1] + 1))))
    for ffn_type, (_, neurons) in widths.items():
        groups.append(((ffn_type,), timed_neuron_counts(neurons, settings.neuron_step)))
    device = model_device(model)
    threads = torch.get_num_threads()
    score = _scorer(task, settings, translation=family.name == TRANSLATION_FAMILY)
    per_layer: Dict[Block, List[float]] = {}
    counts: Dict[Block, List[int]] = {}
    bar = tqdm(total=sum(len(kept) for _, kept in groups), desc="latency (CTranslate2)", unit="variant",
               disable=not settings.progress, leave=False)
    try:
        with tempfile.TemporaryDirectory(prefix="headprune-ct2-latency-") as directory:
            for types, kept_counts in groups:
                engines = []
                for kept in kept_counts:
                    path = os.path.join(directory, f"{'+'.join(types)}-{kept}")
                    _export_variant(family, cfg, task, model, types, kept, settings.quantization, path)
                    engines.append(load_ctranslate2_model(path, device, threads, generator=not score.translation))
                    bar.update(1)
                milliseconds = _interleaved_medians(engines, score, settings.repeats)
                above_narrowest = _running_max([max(0.0, ms - milliseconds[0]) for ms in milliseconds])
                blocks = [(t, layer) for t in types for layer in range(_layers(layout, widths, t))]
                for block in blocks:
                    per_layer[block] = [ms / len(blocks) for ms in above_narrowest]
                    if types[0] not in ATTENTION_TYPES:
                        counts[block] = list(kept_counts)
                del engines
    finally:
        bar.close()
        set_head_mask(model, None)
        set_ffn_mask(model, None)
    return LatencyTable(
        per_layer, device_description(device), model_architecture(model),
        {"batch_size": settings.batch_size, "sequence_length": settings.sequence_length,
         "repeats": settings.repeats, "ctranslate2": ctranslate2.__version__, "threads": threads,
         "timed": "the whole model's score_batch per variant, over the narrowest variant of its group"},
        counts, CTRANSLATE2_ENGINE, settings.quantization,
    )


def _layers(layout, widths, layer_type: str) -> int:
    return layout[layer_type][0] if layer_type in layout else widths[layer_type][0]


def _export_variant(family, cfg, task, model, types: Sequence[str], kept: int, quantization: str, path: str) -> None:
    """Save the model with every layer of ``types`` keeping its first ``kept`` units (heads or neurons)."""
    layout, widths = head_layout(model), ffn_layout(model)
    head_mask = {t: torch.ones(shape) for t, shape in layout.items()}
    ffn_mask = {t: torch.ones(shape) for t, shape in widths.items()}
    for layer_type in types:
        (head_mask if layer_type in layout else ffn_mask)[layer_type][:, kept:] = 0.0
    set_head_mask(model, head_mask)
    set_ffn_mask(model, ffn_mask)
    with torch.no_grad():
        spec, _ = family.ctranslate2_spec(cfg, task, model)
    save_spec(spec, quantization, path)


class _Scorer:
    """Teacher-forced scoring of one fixed batch of random sentences by a Translator or a Generator."""

    def __init__(self, translation: bool, sources, targets):
        self.translation, self.sources, self.targets = translation, sources, targets

    def __call__(self, engine) -> None:
        if self.translation:
            engine.score_batch(self.sources, self.targets, max_batch_size=len(self.sources))
        else:
            engine.score_batch(self.targets, max_batch_size=len(self.targets))


def _scorer(task, settings: LatencySettings, translation: bool) -> _Scorer:
    """Random sentences of ``sequence_length`` tokens drawn from the dictionaries' words (not their specials)."""
    generator = torch.Generator().manual_seed(0)

    def sentences(dictionary):
        words = dictionary.symbols[dictionary.nspecial:]
        ids = torch.randint(len(words), (settings.batch_size, settings.sequence_length), generator=generator)
        return [[words[i] for i in row] for row in ids.tolist()]

    target = task.target_dictionary
    return _Scorer(translation, sentences(task.source_dictionary) if translation else None, sentences(target))


def _interleaved_medians(engines, score: _Scorer, repeats: int) -> List[float]:
    """Median milliseconds of each engine's pass, the engines taking turns in every repeat."""
    for engine in engines:
        for _ in range(WARM_UP):
            score(engine)
    times: List[List[float]] = [[] for _ in engines]
    for _ in range(repeats):
        for index, engine in enumerate(engines):
            start = time.perf_counter()
            score(engine)
            times[index].append((time.perf_counter() - start) * 1000.0)
    return [statistics.median(t) for t in times]


def _running_max(values: Sequence[float]) -> List[float]:
    result, highest = [], 0.0
    for value in values:
        highest = max(highest, value)
        result.append(highest)
    return result
