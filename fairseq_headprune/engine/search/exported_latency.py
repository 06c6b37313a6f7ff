"""Per-layer latency as an export engine decodes, for a latency budget on the deployment engine (Kwon et al. 2022,
4.1).

An export engine (CTranslate2) runs a model whole, so a layer cannot be timed
alone as ``latency.measure_latency_table`` times fairseq's. Instead the model
is exported (``ExportEngine.write``) once per variant, every layer of one
group narrowed alike and the rest whole: the encoder's attention layers
keeping k heads; the decoder's self- and cross-attention layers keeping k
heads (together where the engine gives them one head count,
``ExportEngine.tied_attention_types``); one FFN type's layers keeping k
neurons. Each variant decodes as it will in deployment: beam search of
``beam`` beams over a batch of random source sentences, generating exactly
``target_length`` tokens (the encoder runs once per sentence, the decoder and
the output projection once per generated token for batch x beam rows).

Every group is timed at a few unit counts only (``measured_counts``: none,
half and all of them), and all the variants and the whole model are timed in
one run, each in a process of its own, taking turns pass by pass
(``engine.timing.isolated``), so that the machine's drift falls on all of them
alike. On 2 CPU cores a pass varies by about 10%, more than what a group's
single unit adds: a difference between two narrowings a few units apart would
price noise. Few variants timed many times, far apart, measure what a group
adds with the least noise for the time spent. The machine's speed drifts
within a run too (a system's passes a minute apart differ by up to 1.7x on 2
cores), so a variant's time is taken against the whole model's pass of the
same round (``round_share``: the median over the rounds of their ratio) and
priced at the whole model's median time. A group's price at any unit
count is read off the straight lines between its measured variants (the
variant's time less the narrowest one's, non-decreasing), and divided evenly
among the group's layers (a decoder layer's between its self- and
cross-attention). The whole model's time is recorded too: what pruning never
shrinks (embeddings, the output projection, beam search, the layers at their
narrowest) is its difference from the layers' prices, so that a search
predicts the speed-up of a mask as whole / (whole - what the mask saves).
"""

import math
import os
import statistics
import tempfile
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from tqdm import tqdm

from fairseq_headprune.constants import ATTENTION_TYPES, TRANSLATION_FAMILY
from fairseq_headprune.engine.export.base import ExportEngine
from fairseq_headprune.engine.runners.batches import model_device
from fairseq_headprune.engine.search.latency import timed_neuron_counts
from fairseq_headprune.engine.search.model_costs import device_description, model_architecture
from fairseq_headprune.engine.timing.isolated import SystemSpec, time_systems
from fairseq_headprune.modules.masked_ffn import ffn_layout, set_ffn_mask
from fairseq_headprune.modules.masked_multihead_attention import head_layout, set_head_mask
from fairseq_headprune.study.compression.decoding import DecodingOptions
from fairseq_headprune.study.compression.speed import round_share
from fairseq_headprune.study.search.costs import Block, LatencyTable
from fairseq_headprune.study.search.settings import LatencySettings

WHOLE_MODEL = "whole model"
# sentences decoded per timed pass (in batches of the table's batch size): a pass of one small batch lasts
# milliseconds, and a busy machine's time slices then make one pass of a variant differ from the next by more
# than what a group of layers adds
PASS_SENTENCES = 64


def measure_exported_latency_table(engine: ExportEngine, family, cfg, task, model,
                                   settings: LatencySettings) -> LatencyTable:
    """The latency table of ``model`` exported by ``engine`` at ``settings.quantization`` (see the module)."""
    version = engine.version()
    layout, widths = head_layout(model), ffn_layout(model)
    groups: List[Tuple[Tuple[str, ...], List[int]]] = []
    tied = [types for types in engine.tied_attention_types if set(types) <= set(ATTENTION_TYPES)]
    stacks = [*tied, *((t,) for t in ATTENTION_TYPES if not any(t in types for types in tied))]
    for types in sorted(stacks, key=lambda types: ATTENTION_TYPES.index(types[0])):
        present = tuple(t for t in types if t in layout)
        if present:
            groups.append((present, list(range(layout[present[0]][1] + 1))))
    for ffn_type, (_, neurons) in widths.items():
        groups.append(((ffn_type,), timed_neuron_counts(neurons, settings.neuron_step)))
    device = model_device(model)
    threads = torch.get_num_threads()
    translation = family.name == TRANSLATION_FAMILY
    sentences = _random_sentences(task, settings, translation)
    options = DecodingOptions.fixed_length(settings.beam, settings.target_length)
    measured = [(types, measured_counts(priced[-1])) for types, priced in groups]
    bar = tqdm(total=1 + sum(len(counts) - 1 for _, counts in measured), desc=f"latency ({engine.title})",
               unit="variant", disable=not settings.progress, leave=False)

    def system(name: str, path: str) -> SystemSpec:
        return SystemSpec(name, engine.name, "variant", settings.quantization, path, family=family.name,
                          threads=threads, device=device.type, options=options.to_dict())

    try:
        with tempfile.TemporaryDirectory(prefix=f"headprune-{engine.name}-latency-") as directory:
            whole_path = os.path.join(directory, "whole")
            _export_variant(engine, family, cfg, task, model, (), 0, settings.quantization, whole_path)
            specs = [system(WHOLE_MODEL, whole_path)]
            bar.update(1)
            for types, counts in measured:
                for kept in counts[:-1]:  # the widest is the whole model
                    path = os.path.join(directory, f"{'+'.join(types)}-{kept}")
                    _export_variant(engine, family, cfg, task, model, types, kept, settings.quantization, path)
                    specs.append(system(_variant_name(types, kept), path))
                    bar.update(1)
            run = time_systems(specs, [settings.batch_size], settings.repeats, sentences=sentences)
    finally:
        bar.close()
        set_head_mask(model, None)
        set_ffn_mask(model, None)
    seconds = run.passes[0].seconds
    whole_seconds = seconds[WHOLE_MODEL]
    whole = 1000.0 * statistics.median(whole_seconds)
    variants_ms: Dict[str, Dict[str, float]] = {}  # per group, per kept count: the variant's time, ms
    per_layer: Dict[Block, List[float]] = {}
    counts: Dict[Block, List[int]] = {}
    for (types, priced), (_, timed) in zip(groups, measured):
        times = [whole * round_share(seconds[_variant_name(types, kept)], whole_seconds) for kept in timed[:-1]]
        times.append(whole)
        variants_ms["+".join(types)] = dict(zip(map(str, timed), times))
        prices = interpolated_prices(timed, times, priced)
        blocks = [(t, layer) for t in types for layer in range(_layers(layout, widths, t))]
        for block in blocks:
            per_layer[block] = [price / len(blocks) for price in prices]
            if types[0] not in ATTENTION_TYPES:
                counts[block] = list(priced)
    batches = len(sentences[settings.batch_size]["sources"])
    return LatencyTable(
        per_layer, device_description(device), model_architecture(model),
        {"batch_size": settings.batch_size, "sequence_length": settings.sequence_length,
         "target_length": settings.target_length, "beam": settings.beam, "repeats": settings.repeats,
         engine.name: version, "threads": threads,
         "whole_model_ms": whole, "whole_model_seconds": seconds[WHOLE_MODEL], "variants_ms": variants_ms,
         "batches_per_pass": batches,
         "timed": (f"beam search ({settings.beam} beams) generating {settings.target_length} tokens for each of "
                   f"{settings.batch_size} sentences of {settings.sequence_length} tokens per batch, "
                   f"{batches} batch{'es' if batches > 1 else ''} a pass, the whole model and "
                   "each variant in its own process, in turn, over the narrowest variant of its group")},
        counts, engine.name, settings.quantization,
    )


def _random_sentences(task, settings: LatencySettings, translation: bool) -> Dict[int, Dict[str, list]]:
    """Batches of ``batch_size`` random sentences of ``sequence_length`` words from the dictionary (not its
    specials), as many as make ``PASS_SENTENCES`` sentences a pass: the sources of a translation model, the
    prompts of a language model."""
    generator = torch.Generator().manual_seed(0)
    dictionary = task.source_dictionary if translation else task.target_dictionary
    words = dictionary.symbols[dictionary.nspecial:]
    batches = math.ceil(PASS_SENTENCES / settings.batch_size)
    ids = torch.randint(len(words), (batches, settings.batch_size, settings.sequence_length), generator=generator)
    return {settings.batch_size: {"sources": [[[words[i] for i in row] for row in batch] for batch in ids.tolist()],
                                  "source_lengths": [settings.sequence_length + 1] * batches}}


def _variant_name(types: Sequence[str], kept: int) -> str:
    return f"{'+'.join(types)} keeping {kept}"


def _layers(layout, widths, layer_type: str) -> int:
    return layout[layer_type][0] if layer_type in layout else widths[layer_type][0]


def _export_variant(engine: ExportEngine, family, cfg, task, model, types: Sequence[str], kept: int,
                    quantization: str, path: str) -> None:
    """Save the model with every layer of ``types`` keeping its first ``kept`` units (heads or neurons)."""
    layout, widths = head_layout(model), ffn_layout(model)
    head_mask = {t: torch.ones(shape) for t, shape in layout.items()}
    ffn_mask = {t: torch.ones(shape) for t, shape in widths.items()}
    for layer_type in types:
        (head_mask if layer_type in layout else ffn_mask)[layer_type][:, kept:] = 0.0
    export_masked(engine, family, cfg, task, model, head_mask, ffn_mask, quantization, path)


def export_masked(engine: ExportEngine, family, cfg, task, model, head_mask, ffn_mask, quantization: str, path: str,
                  vocabulary_map: Optional[str] = None) -> None:
    """Export ``model`` under these masks (with the vocabulary map file ``vocabulary_map``, if given); the masks
    stay set (the callers clear them once they are done)."""
    set_head_mask(model, head_mask)
    set_ffn_mask(model, ffn_mask)
    engine.write(family, cfg, task, model, quantization, path, vocabulary_map)


def measured_counts(units: int) -> List[int]:
    """The unit counts a group is timed at: none, half and all of them."""
    return sorted({0, units // 2, units})


def interpolated_prices(timed: Sequence[int], milliseconds: Sequence[float], priced: Sequence[int]) -> List[float]:
    """A group's price keeping each of ``priced`` units: its time read off the straight lines between the timed
    variants (``timed`` units, ``milliseconds``), less the narrowest variant's, made non-decreasing (a variant
    timed slower than a wider one is noise, not a cost) and never above the widest variant's."""
    base, top = milliseconds[0], milliseconds[-1]
    prices, running = [], 0.0
    for kept in priced:
        right = next(i for i, count in enumerate(timed) if count >= kept)
        if timed[right] == kept:
            value = milliseconds[right]
        else:
            left = right - 1
            fraction = (kept - timed[left]) / (timed[right] - timed[left])
            value = milliseconds[left] + fraction * (milliseconds[right] - milliseconds[left])
        running = max(running, min(value, top) - base)
        prices.append(running)
    return prices
