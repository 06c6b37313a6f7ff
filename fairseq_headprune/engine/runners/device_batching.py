"""The batching of a sweep or an importance pass on a GPU: free memory and the model's shape measured, the rule
applied (``study.device_batching``), the choice stated in one console line.

On the CPU nothing is measured and nothing printed: the defaults stay. A sweep
started before keeps the batches it was started with (its manifest records them),
so that a rerun on another device, or with other free memory, continues it.
"""

import dataclasses
import glob
import json
import os
from typing import Callable, List, Optional, Sequence, Tuple

import torch

from fairseq_headprune.constants import FAIRSEQ_GENERATE_MAX_TOKENS, TRANSLATION_FAMILY
from fairseq_headprune.engine.runners.batches import load_split, model_device
from fairseq_headprune.engine.runtime.ranks import current_ranks
from fairseq_headprune.modules.masked_multihead_attention import attention_modules, transformer_layers
from fairseq_headprune.study.device_batching import (
    ModelShape,
    SplitShape,
    SweepBatching,
    choose_importance_batch,
    choose_sweep_batching,
)
from fairseq_headprune.study.settings import ImportanceSettings, SweepSettings

SWEEP_MANIFESTS = os.path.join("sweeps", "*", "sweep.json")  # translation_sweep's layout of an output directory


def free_device_memory(model) -> Optional[int]:
    """Bytes free on the model's GPU (``free_cuda_memory``); None on the CPU."""
    device = model_device(model)
    return free_cuda_memory(device) if device.type == "cuda" else None


def free_cuda_memory(device: torch.device) -> int:
    """Bytes free on a GPU, what this process's allocator holds unused counted as free."""
    free, _ = torch.cuda.mem_get_info(device)
    return int(free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device))


def device_label(model) -> str:
    device = model_device(model)
    return f"{device} ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else str(device)


def model_shape(model, task, half: bool) -> ModelShape:
    """The rule's view of a translation model (``half``: it runs in float16 or bfloat16)."""
    encoder_layers, decoder_layers = transformer_layers(model)
    modules = attention_modules(model).values()
    return ModelShape(
        encoder_layers=len(encoder_layers), decoder_layers=len(decoder_layers),
        embed_dim=max(int(m.embed_dim) for m in modules),
        ffn_dim=max(int(layer.fc1.out_features) for layer in encoder_layers + decoder_layers),
        heads=max(int(m.num_heads) for m in modules), vocabulary=len(task.target_dictionary),
        value_bytes=2 if half else 4, parameters=sum(p.numel() for p in model.parameters()),
    )


def split_shape(task, splits: Sequence[str], limit: Optional[int] = None) -> SplitShape:
    """The largest split's sentence count (the first ``limit`` of each) and the longest sentences of all."""
    counts, sources, targets = [], [1], [1]
    for split in splits:
        load_split(task, split)
        dataset = task.dataset(split)
        count = len(dataset) if limit is None else min(limit, len(dataset))
        counts.append(count)
        source_sizes = getattr(dataset, "src_sizes", None)
        source_sizes = dataset.sizes if source_sizes is None else source_sizes
        target_sizes = getattr(dataset, "tgt_sizes", None)
        sources.append(int(max(source_sizes[:count], default=1)))
        targets.append(int(max(target_sizes[:count], default=1)) if target_sizes is not None else sources[-1])
    return SplitShape(max(counts), max(sources), max(targets))


def recorded_batching(out_dir: str) -> Optional[Tuple[Optional[int], Optional[int]]]:
    """(max_tokens, batch_size) a sweep in ``out_dir`` was started with; None if it holds none."""
    for manifest in sorted(glob.glob(os.path.join(out_dir, SWEEP_MANIFESTS))):
        try:
            with open(manifest, encoding="utf-8") as stream:
                identity = json.load(stream)["identity"]
            return identity["max_tokens"], identity["batch_size"]
        except (OSError, ValueError, KeyError):
            continue  # the sweep reports an unreadable manifest of its own
    return None


def sweep_batching(settings: SweepSettings, cfg, task, model, split: str, configurations: int,
                   free_memory: Callable[[object], Optional[int]] = free_device_memory) -> SweepSettings:
    """``settings`` with the batching decided: on a GPU, what the user left open chosen for the device.

    ``cfg`` (fairseq's, as the model was loaded) gets the batch size chosen or recorded, and so does
    ``generation_args``, for any model loaded later with them (another split's data). Translation models only:
    classifiers and language models keep the defaults. ``free_memory``: the measurement (tests give a number).
    """
    if settings.family != TRANSLATION_FAMILY:
        return settings
    dataset, generation_args = cfg.dataset, list(settings.generation_args)
    fixed = dataset.batch_size is not None or dataset.max_tokens is not None
    recorded = None if fixed else recorded_batching(settings.out_dir)
    if recorded is not None:  # a started sweep continues with the batches its identity holds
        dataset.max_tokens, dataset.batch_size = recorded
        generation_args += batch_options(*recorded)
        fixed = True
    free = free_memory(model)
    if free is None:  # the CPU: the defaults
        return dataclasses.replace(settings, generation_args=generation_args)
    max_tokens = dataset.max_tokens
    if fixed and max_tokens is None and dataset.batch_size is None:
        max_tokens = FAIRSEQ_GENERATE_MAX_TOKENS  # fairseq's own batching, as the translator applies it
    ranks = current_ranks()
    choice: SweepBatching = ranks.main_value(choose_sweep_batching(
        free, model_shape(model, task, bool(cfg.common.fp16 or cfg.common.bf16)), split_shape(task, [split]),
        cfg.generation.beam, configurations, settings.configs_per_batch, dataset.batch_size, max_tokens,
        ranks.world_size,
    ))
    if choice.batch_chosen:
        dataset.batch_size = choice.batch_size
        generation_args += batch_options(None, choice.batch_size)
    if choice.chosen and ranks.is_main:
        print(choice.describe(device_label(model)), flush=True)
    return dataclasses.replace(settings, configs_per_batch=choice.configs_per_batch, generation_args=generation_args,
                               configs_per_batch_chosen=choice.configs_chosen)


def batch_options(max_tokens: Optional[int], batch_size: Optional[int]) -> List[str]:
    """fairseq's options for a batching."""
    return ((["--max-tokens", str(max_tokens)] if max_tokens is not None else [])
            + (["--batch-size", str(batch_size)] if batch_size is not None else []))


def importance_batching(settings: ImportanceSettings, task, model,
                        free_memory: Callable[[object], Optional[int]] = free_device_memory) -> ImportanceSettings:
    """``settings`` with the sentences per batch chosen for the GPU when none was given (see the rule)."""
    free = free_memory(model)
    if free is None or settings.max_sentences is not None or settings.max_tokens is not None:
        return settings
    half = next(model.parameters()).dtype in (torch.float16, torch.bfloat16)
    ranks = current_ranks()
    choice = ranks.main_value(choose_importance_batch(
        free, model_shape(model, task, half), split_shape(task, settings.subsets, settings.limit),
        per_batch=settings.granularity == "batch",
    ))
    if not choice.chosen:
        return settings
    if ranks.is_main:
        print(choice.describe(device_label(model)), flush=True)
    return dataclasses.replace(settings, max_sentences=choice.batch_size)
