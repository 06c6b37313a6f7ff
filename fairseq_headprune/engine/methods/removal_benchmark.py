"""What the removal benchmarks (``scripts/benchmarks/benchmark_*_speed.py``) share: which heads go, and timing.

Michel et al.'s Table 4 times a model with heads removed against the
unpruned one. The benchmarks remove the least important heads (given an
importance file) or a seeded random choice, write the shrunk checkpoint, and
time every model on the same batches, repeats interleaved so that the
machine's drift falls on every model alike.
"""

import math
import os
import statistics
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from ...modules.masked_multihead_attention import unfused_attention
from ...study.masks.head_mask import HeadLayout, HeadMask, full_mask, head_mask_to_spec
from ...study.methods.importance_scores import read_importance_file
from ...study.output.files import write_json
from ..checkpoints.shrink import shrink_checkpoint

# (type, 0-based layer, 0-based head)
Head = Tuple[str, int, int]
# a timed model: the batches -> (seconds, outputs)
Run = Callable[[Sequence[dict]], Tuple[float, List]]


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


def model_runs(unpruned: Run, masked: Run, shrunk: Run, unfused: bool) -> Dict[str, Run]:
    """The runs every removal benchmark times, by name; with ``unfused`` also masked and shrunk on fairseq's path."""
    runs = {"unpruned": unpruned, "masked": masked, "shrunk": shrunk}
    if unfused:
        runs.update({"masked (fairseq)": on_fairseqs_path(masked), "shrunk (fairseq)": on_fairseqs_path(shrunk)})
    return runs


def on_fairseqs_path(run: Run) -> Run:
    """``run`` with masked and narrowed attention on fairseq's unfused path (the reference)."""
    def unfused_run(batches):
        with unfused_attention():
            return run(batches)
    return unfused_run


def timed_interleaved(runs: Dict[str, Run], batches, repeats: int) -> Tuple[Dict[str, List], Dict[str, List[float]]]:
    """Each run's output (from a warm-up run) and its seconds over ``repeats`` repeats, interleaved."""
    outputs = {name: run(batches)[1] for name, run in runs.items()}
    seconds: Dict[str, List[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            seconds[name].append(run(batches)[0])
    return outputs, seconds


def device_line(device: torch.device) -> str:
    """The device (and GPU name), threads and torch version a benchmark ran with."""
    name = f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else ""
    return f"device: {device}{name}, threads: {torch.get_num_threads()}, torch {torch.__version__}"


def rate_cells(rates: Dict[str, List[float]], width: int) -> str:
    """Each run's rates as 'median (min-max)', right-aligned in ``width`` characters."""
    return " ".join(f"{f'{statistics.median(v):.0f} ({min(v):.0f}-{max(v):.0f})':>{width}s}" for v in rates.values())


def write_measurements(path: Optional[str], device: torch.device, subset: str, importance: Optional[str],
                       measurements: List[Dict[str, object]]) -> None:
    """``--json``: the device, the choice of heads and every measurement."""
    if path:
        write_json({"device": str(device), "threads": torch.get_num_threads(), "torch": torch.__version__,
                    "subset": subset, "importance": importance, "measurements": measurements}, path, indent=1)
