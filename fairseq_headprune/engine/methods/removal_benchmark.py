"""What the removal benchmarks (``scripts/benchmarks/benchmark_*_speed.py``) share: which heads go, and timing.

Michel et al.'s Table 4 times a model with heads removed against the
unpruned one. The benchmarks remove the least important heads (given an
importance file) or a seeded random choice, write the shrunk checkpoint, and
time every model on the same batches (``removal_systems``), each in a
process of its own, in rotation, so that the machine's drift falls on every
model alike (``engine.timing.isolated``).
"""

import math
import os
import statistics
import time
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from ...errors import StudyError
from ...study.masks.head_mask import HeadLayout, HeadMask, full_mask, head_mask_to_spec
from ...study.methods.importance_scores import read_importance_file
from ...study.output.files import write_json
from ..checkpoints.shrink import shrink_checkpoint
from ..timing.isolated import FAIRSEQ, FAIRSEQ_ATTENTION, FUSED_ATTENTION, SystemSpec

# (type, 0-based layer, 0-based head)
Head = Tuple[str, int, int]


def heads_to_remove(layout: HeadLayout, count: int, importance_file: Optional[str], seed: int) -> List[Head]:
    """The ``count`` heads to remove: lowest normalised importance first, or a seeded random order."""
    heads = [(t, layer, h) for t, (layers, n) in layout.items() for layer in range(layers) for h in range(n)]
    if importance_file:
        scores = read_importance_file(importance_file, layout).normalized
        heads.sort(key=lambda key: float(scores[key[0]][key[1], key[2]]))
    else:
        order = torch.randperm(len(heads), generator=torch.Generator().manual_seed(seed)).tolist()
        heads = [heads[i] for i in order]
    return heads[:count]


def shrunk_checkpoint(path: str, layout: HeadLayout, fraction: float, importance_file: Optional[str], seed: int,
                      workdir: str) -> Tuple[List[Head], HeadMask, str, str]:
    """The heads removed, their mask and spec, and the checkpoint ``shrink`` writes without them."""
    total = sum(layers * heads for layers, heads in layout.values())
    removed = heads_to_remove(layout, math.ceil(fraction * total), importance_file, seed)
    head_mask = full_mask(layout)
    for attention_type, layer, head in removed:
        head_mask[attention_type][layer, head] = 0.0
    spec = head_mask_to_spec(head_mask)
    pruned_path = os.path.join(workdir, f"pruned-{fraction}.pt")
    shrink_checkpoint(path, pruned_path, spec)
    return removed, head_mask, spec, pruned_path


FAIRSEQ_PATH = " (fairseq)"  # the name's suffix of a system on fairseq's unfused attention path


def removal_systems(family: str, data: str, checkpoint: str, shrunk: str, spec: str, split: str,
                    examples: Optional[int], fairseq_args: Sequence[str], threads: int, cpu: bool,
                    unfused: bool, continuation: Optional[Dict[str, object]] = None) -> List[SystemSpec]:
    """What a removal benchmark times, each system in a process of its own: the unpruned model, the same with the
    heads of ``spec`` masked (the task's ``--head-mask``) and the ``shrunk`` checkpoint, all three on torch's fused
    attention kernel so that they differ in their heads only; with ``unfused`` also the masked and shrunk models
    on fairseq's unfused path (the reference the fused one is timed against). ``continuation``: a language model's
    systems generate (``lm_continuation_system``) instead of scoring."""

    def system(name: str, model: str, masked: bool, attention: str = FUSED_ATTENTION) -> SystemSpec:
        return SystemSpec(name, FAIRSEQ, name, "float32", model, family=family, data=data, split=split,
                          sentences=examples,
                          generation_args=[*fairseq_args, *(["--head-mask", spec] if masked else [])],
                          cpu=cpu, device="cpu" if cpu else "cuda", threads=threads, attention=attention,
                          continuation=continuation)

    systems = [system("unpruned", checkpoint, False), system("masked", checkpoint, True),
               system("shrunk", shrunk, False)]
    if unfused:
        systems += [system("masked" + FAIRSEQ_PATH, checkpoint, True, FAIRSEQ_ATTENTION),
                    system("shrunk" + FAIRSEQ_PATH, shrunk, False, FAIRSEQ_ATTENTION)]
    return systems


def lm_continuation_system(name: str, task, model, split: str, batch_size: int, sentences: Optional[int],
                           prompt: int, generate: int, sampling_topk: Optional[int], seed: int):
    """A language model continuing the first ``sentences`` sentences of ``split`` longer than ``prompt`` tokens:
    each cut to its first ``prompt`` tokens and continued by ``generate`` with fairseq's SequenceGenerator and the
    incremental state (what fairseq-interactive runs for an LM), greedy or sampled from the ``sampling_topk``
    likeliest tokens with the same seed for every model. Returns, as ``deployment.fairseq_scoring_system`` does,
    the system (its outputs: every prompt and continuation's token ids, joined by spaces), the sentences, and no
    count of input tokens (None: a benchmark counts the tokens generated from the outputs)."""
    from fairseq import utils
    from fairseq.dataclass.configs import GenerationConfig

    from .deployment import DecodingSystem

    task.load_dataset(split)
    dataset = task.dataset(split)
    long_enough = [i for i in range(len(dataset)) if dataset.sizes[i] > prompt][:sentences]
    if not long_enough:
        raise StudyError(f"no sentence of {split} is longer than the prompt ({prompt} tokens)")
    device = next(model.parameters()).device
    prompts = []
    for start in range(0, len(long_enough), batch_size):
        sample = dataset.collater([dataset[i] for i in long_enough[start:start + batch_size]])
        sample = utils.move_to_cuda(sample) if device.type == "cuda" else sample
        lengths = torch.full_like(sample["net_input"]["src_lengths"], prompt)
        prompts.append(dict(sample, net_input={"src_tokens": sample["net_input"]["src_tokens"][:, :prompt],
                                               "src_lengths": lengths}))
    length = prompt + generate
    generator = task.build_generator([model], GenerationConfig(
        beam=1, max_len_a=0, max_len_b=length, min_len=length, sampling=sampling_topk is not None,
        sampling_topk=sampling_topk or -1))

    def decode():
        torch.manual_seed(seed)
        start = time.perf_counter()
        with torch.no_grad():
            continued = [h[0]["tokens"].tolist() for sample in prompts
                         for h in task.inference_step(generator, [model], sample)]
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start, [" ".join(map(str, tokens)) for tokens in continued]

    system = DecodingSystem(name, FAIRSEQ, "", str(next(model.parameters()).dtype).replace("torch.", ""), decode)
    return system, len(long_enough), None


def environment_line(environment: Dict[str, object], threads: int) -> str:
    """The CPU and its vector instructions, the threads, torch's version and how the models were timed."""
    return (f"cpu: {environment['cpu']} ({' '.join(environment['isa'])}), threads: {threads}, "
            f"torch {torch.__version__}; {environment['isolation']}")


def rate_cells(rates: Dict[str, List[float]], width: int) -> str:
    """Each run's rates as 'median (min-max)', right-aligned in ``width`` characters."""
    return " ".join(f"{f'{statistics.median(v):.0f} ({min(v):.0f}-{max(v):.0f})':>{width}s}" for v in rates.values())


def write_measurements(path: Optional[str], environment: Dict[str, object], cpu: bool, subset: str,
                       importance: Optional[str], measurements: List[Dict[str, object]]) -> None:
    """``--json``: where the models ran (the device, as the reports name it, and the machine), the choice of heads
    and every measurement."""
    if path:
        device = "cpu" if cpu or not torch.cuda.is_available() else "cuda"
        write_json({**environment, "device": device, "torch": torch.__version__, "subset": subset,
                    "importance": importance, "measurements": measurements}, path, indent=1)
