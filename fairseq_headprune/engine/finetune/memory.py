"""The fine-tune's memory on this machine (``study.finetune.memory``): the model's sizes read off its checkpoint,
the training split's longest pair, the device's free memory, and the batch chosen applied to fairseq's config."""

import os
import re
from typing import Optional

import numpy as np
import torch
from fairseq import tasks
from omegaconf import open_dict

from fairseq_headprune.constants import CLASSIFIER_FAMILY
from fairseq_headprune.engine.checkpoints.info import load_checkpoint_state
from fairseq_headprune.engine.checkpoints.state_dict import unique_parameter_count
from fairseq_headprune.engine.runners.device_batching import free_cuda_memory
from fairseq_headprune.study.compression.records import DEVICE_WORDS
from fairseq_headprune.study.finetune.memory import GB, MemoryPlan, TrainingShape, plan_memory

LAYER_KEY = re.compile(r"^(encoder|decoder)\.(?:sentence_encoder\.)?layers\.(\d+)\.")


def training_shape(checkpoint: str, family: str, cfg, teacher: Optional[str], precision: str) -> TrainingShape:
    """The sizes ``study.finetune.memory`` counts, read off the weights of ``checkpoint`` (and ``teacher``'s
    parameter count); the heads from the model's config."""
    weights = _mapped_weights(checkpoint)
    layers = {"encoder": set(), "decoder": set()}
    model_dim = ffn_dim = vocabulary = 0
    for key, tensor in weights.items():
        match = LAYER_KEY.match(key)
        if match:
            layers[match.group(1)].add(int(match.group(2)))
        if key.endswith("fc1.weight"):
            ffn_dim = max(ffn_dim, int(tensor.shape[0]))
        if key.endswith("embed_tokens.weight"):
            model_dim = max(model_dim, int(tensor.shape[1]))
            if key.startswith("decoder.") and family != CLASSIFIER_FAMILY:
                vocabulary = int(tensor.shape[0])
    model = cfg.model
    heads = max(int(getattr(model, name, 0) or 0) for name in ("encoder_attention_heads", "decoder_attention_heads"))
    student_parameters = _parameters(weights)
    del weights
    teacher_parameters = _parameters(_mapped_weights(teacher)) if teacher else 0
    return TrainingShape(student_parameters, teacher_parameters, model_dim, ffn_dim, heads,
                         len(layers["encoder"]), len(layers["decoder"]), vocabulary, precision)


def _mapped_weights(checkpoint: str):
    """A checkpoint's weights memory-mapped from its file: their shapes read, their values left on disk (a large
    checkpoint read into memory only to be counted would raise the process's peak)."""
    return load_checkpoint_state(checkpoint, mmap=True)["model"]


def _parameters(weights) -> int:
    """The parameters of a state dict (its floating-point tensors, shared embeddings counted once)."""
    return int(unique_parameter_count(tensor for tensor in weights.values() if torch.is_floating_point(tensor)))


def longest_pair(cfg) -> int:
    """The longest example of the training split in tokens (a pair's longer side), as fairseq batches it; at most
    the model's positions."""
    task = tasks.setup_task(cfg.task)
    task.load_dataset(cfg.dataset.train_subset, combine=False, epoch=1)
    longest = _largest(task.dataset(cfg.dataset.train_subset).sizes)
    limit = getattr(cfg.task, "max_source_positions", None) or getattr(cfg.task, "tokens_per_sample", None)
    return min(longest, int(limit)) if limit else longest


def _largest(sizes) -> int:
    """The largest of a dataset's sizes: an array (a pair's two sides as columns), or a list of them (a nested
    dataset's parts)."""
    if isinstance(sizes, (list, tuple)):
        return max(_largest(part) for part in sizes)
    return int(np.max(np.asarray(sizes)))


def free_memory(cpu: bool) -> float:
    """The bytes free on the fine-tune's device: the GPU's (``free_cuda_memory``), or the machine's available
    memory."""
    if not cpu:
        return float(free_cuda_memory(torch.device("cuda", 0)))
    try:
        with open("/proc/meminfo", encoding="utf-8") as stream:
            for line in stream:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    return float(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def resident_memory() -> float:
    """This process's resident bytes now (0 where the system does not say)."""
    try:
        with open("/proc/self/statm", encoding="utf-8") as stream:
            return float(stream.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, IndexError, ValueError):
        return 0.0


def plan_finetune_memory(cfg, start: str, family: str, teacher: Optional[str], precision: str,
                         memory_gb: Optional[float], processes: int) -> MemoryPlan:
    """The memory plan of the fine-tune under ``cfg`` (fairseq's training config, on its processes): each
    process's share of the device's free memory (``memory_gb`` given: that much), on the CPU the machine's
    memory shared by the processes (this process's own counted in both), on the GPU each process's own."""
    cpu = bool(cfg.common.cpu)
    process = resident_memory() if cpu else 0.0  # each process of several starts about as this one stands
    free = memory_gb * GB if memory_gb is not None else free_memory(cpu) + process
    if cpu:
        free /= processes
    dataset = cfg.dataset
    unit, batch = ("tokens", int(dataset.max_tokens)) if dataset.max_tokens else ("sentences", int(dataset.batch_size))
    device = DEVICE_WORDS["cpu" if cpu else "cuda"] + (" process" if processes > 1 else "")
    return plan_memory(training_shape(start, family, cfg, teacher, precision), device, free, unit, batch,
                       longest_pair(cfg), process=process)


def apply_memory_plan(cfg, plan: MemoryPlan) -> None:
    """fairseq's config trained at the plan's batch, the accumulation raised to keep an update's sentences."""
    if plan.accumulation == 1:
        return
    with open_dict(cfg):
        if plan.unit == "tokens":
            cfg.dataset.max_tokens = plan.chosen
        else:
            cfg.dataset.batch_size = plan.chosen
        cfg.optimization.update_freq = [int(freq) * plan.accumulation for freq in cfg.optimization.update_freq]
