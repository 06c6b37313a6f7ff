#!/usr/bin/env python
"""The fine-tune's memory estimate against its measured peak: a few updates of the fine-tune `compress` makes.

Fine-tunes CKPT a few updates as `compress` would (the pruned units none, the teacher beside it with --teacher:
word-level distillation from CKPT itself), in a process of its own for each --memory budget, and prints the
memory plan (`study.finetune.memory`: the student's training state, the teacher, a batch; the batch chosen)
beside the process's peak resident memory (the CPU) or the peak of allocated GPU memory. The peak includes what
the estimate leaves out: the interpreter, torch and fairseq themselves, and the allocator's slack.

usage: scripts/benchmarks/benchmark_finetune_memory.py --data DATA_BIN --path CKPT
           [--teacher] [--updates 3] [--memory GB [GB ...]] [--cpu] [--json FILE]
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile

GB = 1e9


def measure(data: str, path: str, teacher: bool, updates: int, memory, cpu: bool) -> dict:
    """One fine-tune in this process: its memory plan and its peak memory."""
    import torch

    import fairseq_headprune.compat.torch_load  # noqa: F401
    from fairseq_headprune.engine.finetune.held import finetune_held, write_masked_start
    from fairseq_headprune.study.finetune.settings import FinetuneSettings

    with tempfile.TemporaryDirectory(prefix="headprune-memory-bench-") as work:
        start = os.path.join(work, "start.pt")
        write_masked_start(path, start, None, None)
        settings = FinetuneSettings(updates=updates, lr=1e-5, memory_gb=memory)
        outcome = finetune_held(start, data, os.path.join(work, "train"), "translation", settings, cpu=cpu,
                                progress=False, teacher=path if teacher else None, stop=("update", updates))
    on_gpu = outcome.device == "cuda"
    peak = (torch.cuda.max_memory_allocated() if on_gpu
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    return {"memory_given_gb": memory, "plan": outcome.memory, "updates": outcome.updates,
            "peak_bytes": float(peak), "peak_of": "allocated GPU memory" if on_gpu else "resident memory"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="binarized data directory with a train split")
    parser.add_argument("--path", required=True, help="checkpoint")
    parser.add_argument("--teacher", action="store_true", help="word-level distillation: the checkpoint beside it")
    parser.add_argument("--updates", type=int, default=3,
                        help="updates per fine-tune (default 3: Adam's moments exist from the first step on, "
                        "so the second and later updates hold everything at once)")
    parser.add_argument("--memory", type=float, nargs="+", default=[None], metavar="GB",
                        help="--finetune-memory budgets, one fine-tune each (default: what the device has free)")
    parser.add_argument("--cpu", action="store_true", help="on the CPU even if a GPU is present")
    parser.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a child: one budget, JSON out
    args = parser.parse_args()
    if args.updates < 2:
        parser.error("--updates must be at least 2 (the first update holds no Adam moments during its pass)")
    if args.one:
        print(json.dumps(measure(args.data, args.path, args.teacher, args.updates, args.memory[0], args.cpu)))
        return 0
    from fairseq_headprune.study.finetune.memory import MemoryPlan

    rows = []
    for memory in args.memory:
        command = [sys.executable, os.path.abspath(__file__), "--one", "--data", args.data, "--path", args.path,
                   "--updates", str(args.updates)] + (["--teacher"] if args.teacher else []) + (
                   ["--cpu"] if args.cpu else []) + ([] if memory is None else ["--memory", str(memory)])
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            print(f"benchmark_finetune_memory: the fine-tune failed: {result.stderr.strip().splitlines()[-1]}",
                  file=sys.stderr)
            return 1
        row = json.loads(result.stdout.strip().splitlines()[-1])
        plan = MemoryPlan.from_dict(row["plan"])
        rows.append(row)
        given = "free" if memory is None else f"{memory:g} GB given"
        print(f"{given}\testimate {plan.total / GB:.2f} GB, measured peak {row['peak_bytes'] / GB:.2f} GB "
              f"({row['peak_of']}, {row['updates']} updates)\t{plan.text()}", flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as stream:
            json.dump(rows, stream, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
