"""What the removal benchmarks (``benchmark_*_speed.py`` beside it) share: their options, which heads go, and timing.

Michel et al.'s Table 4 times a model with heads removed against the
unpruned one. The benchmarks remove the least important heads (given an
importance file) or a seeded random choice, write the shrunk checkpoint, and
time every model on the same batches (``removal_systems``), each in a
process of its own, in rotation, so that the machine's drift falls on every
model alike (``engine.timing.isolated``).
"""

import argparse
import math
import os
import statistics
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from fairseq_headprune.constants import FAIRSEQ_ATTENTION, FUSED_ATTENTION
from fairseq_headprune.engine.timing.isolated import FAIRSEQ, SystemSpec
from fairseq_headprune.study.importance.scores import read_importance_file
from fairseq_headprune.study.masks.head_mask import HeadLayout, HeadMask, full_mask, head_mask_to_spec
from fairseq_headprune.study.output.files import write_json

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
    # imported here: fairseq's import logs at INFO before the command has set its logging up
    from fairseq_headprune.engine.checkpoints.shrink import shrink_checkpoint

    total = sum(layers * heads for layers, heads in layout.values())
    removed = heads_to_remove(layout, math.ceil(fraction * total), importance_file, seed)
    head_mask = full_mask(layout)
    for attention_type, layer, head in removed:
        head_mask[attention_type][layer, head] = 0.0
    spec = head_mask_to_spec(head_mask)
    pruned_path = os.path.join(workdir, f"pruned-{fraction}.pt")
    shrink_checkpoint(path, pruned_path, head_mask)
    return removed, head_mask, spec, pruned_path


FAIRSEQ_PATH = " (fairseq)"  # the name's suffix of a system on fairseq's unfused attention path


def removal_systems(family: str, data: str, checkpoint: str, shrunk: str, spec: str, split: str,
                    examples: Optional[int], fairseq_args: Sequence[str], threads: int, cpu: bool,
                    unfused: bool, continuation: Optional[Dict[str, object]] = None,
                    options: Optional[Dict[str, object]] = None) -> List[SystemSpec]:
    """What a removal benchmark times, each system in a process of its own: the unpruned model, the same with the
    heads of ``spec`` masked (the task's ``--head-mask``) and the ``shrunk`` checkpoint, all three on torch's fused
    attention kernel so that they differ in their heads only; with ``unfused`` also the masked and shrunk models
    on fairseq's unfused path (the reference the fused one is timed against). ``continuation``: a language model's
    systems generate (``lm_continuation_system``) instead of scoring. ``options``: a translation's beam search for
    every system (``DecodingOptions.to_dict``; None: the one ``fairseq_args`` set)."""

    def system(name: str, model: str, masked: bool, attention: str = FUSED_ATTENTION) -> SystemSpec:
        return SystemSpec(name, FAIRSEQ, name, "float32", model, family=family, data=data, split=split,
                          sentences=examples,
                          generation_args=[*fairseq_args, *(["--head-mask", spec] if masked else [])],
                          cpu=cpu, device="cpu" if cpu else "cuda", threads=threads, attention=attention,
                          continuation=continuation, options=options)

    systems = [system("unpruned", checkpoint, False), system("masked", checkpoint, True),
               system("shrunk", shrunk, False)]
    if unfused:
        systems += [system("masked" + FAIRSEQ_PATH, checkpoint, True, FAIRSEQ_ATTENTION),
                    system("shrunk" + FAIRSEQ_PATH, shrunk, False, FAIRSEQ_ATTENTION)]
    return systems


def environment_line(environment: Dict[str, object], threads: int) -> str:
    """The CPU and its vector instructions, the threads, torch's version and how the models were timed."""
    return (f"cpu: {environment['cpu']} ({' '.join(environment['isa'])}), threads: {threads}, "
            f"torch {torch.__version__}; {environment['isolation']}")


def ratio_cell(ratios: Sequence[float]) -> str:
    """Paired per-round ratios as 'median (min-max)'."""
    return f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"


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


def add_removal_arguments(parser: argparse.ArgumentParser) -> None:
    """Which heads are removed, where the shrunk checkpoints and measurements go, fairseq's path beside."""
    parser.add_argument("--importance", help="importance .json: remove the least important heads")
    parser.add_argument("--seed", type=int, default=1, help="seed of the random choice (default: 1)")
    parser.add_argument("--cpu", action="store_true", help="CPU even if a GPU is present")
    parser.add_argument("--no-unfused", action="store_true",
                        help="skip the masked and shrunk models on fairseq's unfused attention path")
    parser.add_argument("--json", metavar="FILE", help="also write the measurements as JSON")
    parser.add_argument("--keep-dir", metavar="DIR",
                        help="keep the shrunk checkpoints in DIR (default: a temporary directory)")
