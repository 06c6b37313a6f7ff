"""Per-layer latency as CTranslate2 decodes, for a latency budget on the deployment engine (Kwon et al. 2022, 4.1).

CTranslate2 runs a model whole, so a layer cannot be timed alone as
``latency.measure_latency_table`` times fairseq's. Instead the model is
exported (``export.ctranslate2_spec``) once per variant, every layer of one
group narrowed alike and the rest whole: the encoder's attention layers
keeping k heads; the decoder's self- and cross-attention layers keeping k
heads (CTranslate2 gives a decoder one head count); one FFN type's layers
keeping k neurons. Each variant decodes as it will in deployment: beam search
of ``beam`` beams over a batch of random source sentences, generating exactly
``target_length`` tokens (the encoder runs once per sentence, the decoder and
the output projection once per generated token for batch x beam rows). Every
variant runs in a process of its own and a group's variants take turns, pass
by pass (``engine.timing.isolated``).

A layer keeping k units is priced at k times what one unit of its group adds
(the narrowest variant keeps 0 heads, which CTranslate2 runs as one zero
head, or 0 neurons), divided evenly among the group's layers (a decoder
layer's between its self- and cross-attention). What a unit adds is the
slope of a straight line fitted by least squares to all of the group's
variants (0 where it falls): on 2 CPU cores the variants of a group that
costs little (the encoder's attention, the FFN layers at batch 64) differ by
less than the passes' noise (about 10%), so the difference of any two would
price noise. Each group is timed in a run of its own, and its widest variant
is the whole model: the group's times are taken as shares of that run's
whole-model time and priced at the median of those times, so that the
machine's drift between runs does not enter the prices. Every variant's
median time is recorded (``variants_ms``). The whole model's time is
recorded too: what pruning never shrinks (embeddings, the output projection,
beam search, the layers at their narrowest) is its difference from the layers'
prices, so that a search can predict the speed-up of a mask as
whole / (whole - what the mask saves).
"""

import os
import statistics
import tempfile
from typing import Dict, List, Sequence, Tuple

import torch
from tqdm import tqdm

from ...constants import ATTENTION_TYPES, CTRANSLATE2_ENGINE, TRANSLATION_FAMILY
from ...modules.masked_ffn import ffn_layout, set_ffn_mask
from ...modules.masked_multihead_attention import head_layout, set_head_mask
from ...study.methods.search_costs import Block, LatencyTable
from ...study.settings import LatencySettings
from ...study.methods.decoding import DecodingOptions
from ..export.ctranslate2_spec import import_ctranslate2, save_spec
from ..runners.batches import model_device
from ..timing.isolated import CTRANSLATE2, SystemSpec, time_systems
from .latency import timed_neuron_counts
from .model_costs import device_description, model_architecture


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
    translation = family.name == TRANSLATION_FAMILY
    sentences = _random_sentences(task, settings, translation)
    options = DecodingOptions.fixed_length(settings.beam, settings.target_length)
    per_layer: Dict[Block, List[float]] = {}
    counts: Dict[Block, List[int]] = {}
    whole_model_ms: List[float] = []
    variants_ms: Dict[str, Dict[str, float]] = {}  # per group, per kept count: the variant's median milliseconds
    group_saves: Dict[Tuple[str, ...], float] = {}  # per group: the share of the whole one unit adds
    bar = tqdm(total=sum(len(kept) for _, kept in groups), desc="latency (CTranslate2)", unit="variant",
               disable=not settings.progress, leave=False)
    try:
        with tempfile.TemporaryDirectory(prefix="headprune-ct2-latency-") as directory:
            for types, kept_counts in groups:
                specs = []
                for kept in kept_counts:
                    path = os.path.join(directory, f"{'+'.join(types)}-{kept}")
                    _export_variant(family, cfg, task, model, types, kept, settings.quantization, path)
                    specs.append(SystemSpec(f"{'+'.join(types)} keeping {kept}", CTRANSLATE2, "variant",
                                            settings.quantization, path, family=family.name, threads=threads,
                                            device=device.type, options=options.to_dict()))
                    bar.update(1)
                run = time_systems(specs, [settings.batch_size], settings.repeats, sentences=sentences)
                milliseconds = [1000.0 * statistics.median(run.passes[0].seconds[spec.name]) for spec in specs]
                variants_ms["+".join(types)] = dict(zip(map(str, kept_counts), milliseconds))
                whole_model_ms.append(milliseconds[-1])
                group_saves[types] = unit_share(kept_counts, [ms / milliseconds[-1] for ms in milliseconds])
    finally:
        bar.close()
        set_head_mask(model, None)
        set_ffn_mask(model, None)
    # each group was timed in its own run, minutes apart, and the machine's speed drifts: a group's times are
    # taken as shares of its own widest variant (the whole model, timed in that run) and priced at the whole
    # model's median time over the runs
    whole = statistics.median(whole_model_ms)
    for (types, kept_counts), per_unit in zip(groups, group_saves.values()):
        blocks = [(t, layer) for t in types for layer in range(_layers(layout, widths, t))]
        for block in blocks:
            per_layer[block] = [per_unit * kept * whole / len(blocks) for kept in kept_counts]
            if types[0] not in ATTENTION_TYPES:
                counts[block] = list(kept_counts)
    return LatencyTable(
        per_layer, device_description(device), model_architecture(model),
        {"batch_size": settings.batch_size, "sequence_length": settings.sequence_length,
         "target_length": settings.target_length, "beam": settings.beam, "repeats": settings.repeats,
         "ctranslate2": ctranslate2.__version__, "threads": threads,
         "whole_model_ms": whole, "whole_model_ms_per_group": whole_model_ms, "variants_ms": variants_ms,
         "timed": (f"beam search ({settings.beam} beams) generating {settings.target_length} tokens for each of "
                   f"{settings.batch_size} sentences of {settings.sequence_length} tokens, the whole model per "
                   "variant, each in its own process, over the narrowest variant of its group")},
        counts, CTRANSLATE2_ENGINE, settings.quantization,
    )


def _random_sentences(task, settings: LatencySettings, translation: bool) -> Dict[int, Dict[str, list]]:
    """One batch of random sentences of ``sequence_length`` words from the dictionary (not its specials): the
    sources of a translation model, the prompts of a language model."""
    generator = torch.Generator().manual_seed(0)
    dictionary = task.source_dictionary if translation else task.target_dictionary
    words = dictionary.symbols[dictionary.nspecial:]
    ids = torch.randint(len(words), (settings.batch_size, settings.sequence_length), generator=generator)
    return {settings.batch_size: {"sources": [[[words[i] for i in row] for row in ids.tolist()]],
                                  "source_lengths": [settings.sequence_length + 1]}}


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


def unit_share(kept_counts: Sequence[int], shares: Sequence[float]) -> float:
    """The share of the whole model's time one unit (head or neuron) of a group adds: the slope of the straight
    line fitted by least squares to the group's variants (share of the whole-model time against units kept), or
    0 where it falls. A line through all of them, not the difference of two, so that one noisy pass cannot
    price a group (the variants of a group that costs little differ by less than the timing noise)."""
    if len(set(kept_counts)) < 2:
        return 0.0
    slope, _ = statistics.linear_regression([float(k) for k in kept_counts], list(shares))
    return max(0.0, slope)
