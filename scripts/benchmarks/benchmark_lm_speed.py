#!/usr/bin/env python
"""Does removing heads make a fairseq language model faster? Tokens per second, scoring and generating.

For each fraction of heads removed (the least important ones given an
importance file, otherwise a seeded random choice), writes the shrunk
checkpoint with `fairseq-headprune shrink`, then, at each batch size, with
the unpruned LM, the same with those heads masked and the shrunk one (the
masked and shrunk ones also on fairseq's unfused attention path, unless
--no-unfused):

- scoring: target tokens per second of fairseq's SequenceScorer over the
  first --sentences sentences (what fairseq-eval-lm runs); the summed loss
  of the masked and shrunk models must agree (relative 1e-4);
- generating: new tokens per second of fairseq's SequenceGenerator, greedy
  (or sampling from the --sampling-topk most likely tokens, seeded alike for
  every model), continuing each sentence's first --prompt tokens by
  --generate tokens with the incremental state (what fairseq-interactive runs
  for an LM); the continuations of the masked and shrunk models are compared
  token for token.

Each model runs in a process of its own, one at a time (fairseq-headprune's
timing module). Prints the median and min-max over rotated rounds and the
speed-ups.

usage: scripts/benchmarks/benchmark_lm_speed.py --data DATA_BIN --path CKPT
           [--subset test] [--fractions 0.5] [--batch-sizes 1 4 16 64]
           [--sentences 256] [--prompt 4] [--generate 24] [--sampling-topk K] [--repeats 3]
           [--importance FILE] [--seed 1] [--cpu] [--no-unfused]
           [--json FILE] [--keep-dir DIR]
"""

import argparse
import math
import os
import statistics
import sys
import tempfile
import warnings

import torch

from removal_support import add_removal_arguments

warnings.filterwarnings("ignore")  # fairseq/hydra deprecation notices; the table is the output

LM_OPTIONS = ["--sample-break-mode", "eos"]  # one sentence per sample


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="binarized language_modeling data directory")
    parser.add_argument("--path", required=True, help="unpruned transformer_lm checkpoint")
    parser.add_argument("--subset", default="test", help="split to score and continue (default: test)")
    parser.add_argument("--fractions", type=float, nargs="+", default=[0.5],
                        help="fractions of all heads to remove (default: 0.5)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4, 16, 64],
                        help="sentences per batch (default: 1 4 16 64)")
    parser.add_argument("--sentences", type=int, default=256, help="first N sentences long enough (default: 256)")
    parser.add_argument("--prompt", type=int, default=4, help="prompt tokens of each sentence (default: 4)")
    parser.add_argument("--generate", type=int, default=24, help="tokens generated after the prompt (default: 24)")
    parser.add_argument("--sampling-topk", type=int, metavar="K",
                        help="generate by sampling from the K most likely tokens (seeded by --seed; default: greedy)")
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds, every model once a round (default: 3)")
    add_removal_arguments(parser)
    args = parser.parse_args()
    if min(args.batch_sizes + [args.sentences, args.prompt, args.generate, args.repeats, args.sampling_topk or 1]) < 1:
        sys.exit("benchmark_lm_speed: error: --batch-sizes, --sentences, --prompt, --generate, --sampling-topk and "
                 "--repeats must be positive")
    if not all(0.0 < f < 1.0 for f in args.fractions):
        sys.exit("benchmark_lm_speed: error: --fractions must lie strictly between 0 and 1")

    from fairseq_headprune import cli

    cli.quiet_libraries()
    from fairseq_headprune.constants import LANGUAGE_MODEL_FAMILY
    from fairseq_headprune.engine.checkpoints.loading import load_evaluation_model
    from fairseq_headprune.engine.checkpoints.shrink import checkpoint_parameters
    from fairseq_headprune.engine.timing.isolated import machine_description, time_systems
    from fairseq_headprune.errors import HeadPruneError
    from fairseq_headprune.modules.masked_multihead_attention import head_layout

    from removal_support import environment_line, rate_cells, removal_systems, shrunk_checkpoint, write_measurements

    try:  # the parent only reads the model's heads: every timed model runs in a process of its own
        _, task, model = load_evaluation_model(LANGUAGE_MODEL_FAMILY, args.data, args.path, LM_OPTIONS, cpu=True)
        task.load_dataset(args.subset)
    except (HeadPruneError, FileNotFoundError) as error:
        sys.exit(f"benchmark_lm_speed: error: {error}")
    layout = head_layout(model)
    total = sum(layers * heads for layers, heads in layout.values())
    dataset = task.dataset(args.subset)
    count = len([i for i in range(len(dataset)) if dataset.sizes[i] > args.prompt][: args.sentences])
    if not count:
        sys.exit(f"benchmark_lm_speed: error: no sentence of {args.subset} is longer than --prompt {args.prompt}")
    decoding = f"sampling from the top {args.sampling_topk}" if args.sampling_topk else "greedy"
    continuation = {"prompt": args.prompt, "generate": args.generate, "sampling_topk": args.sampling_topk,
                    "seed": args.seed}
    threads = torch.get_num_threads()
    workdir = args.keep_dir or tempfile.mkdtemp(prefix="benchmark-lm-speed-")
    os.makedirs(workdir, exist_ok=True)
    measurements, environment = [], machine_description(threads)
    print(environment_line(environment, threads))
    print(f"{args.subset}: tokens per second, median (min-max) of {args.repeats} rounds; scoring the first "
          f"{args.sentences} sentences (whole batches), generating: the first {count} longer than {args.prompt} "
          f"tokens, their {args.prompt} prompt tokens continued by {args.generate}, {decoding}")
    for fraction in args.fractions:
        removed, _, spec, pruned_path = shrunk_checkpoint(args.path, layout, fraction, args.importance, args.seed,
                                                          workdir)
        print(f"\n{len(removed)} of {total} heads removed ({len(removed) / total:.0%}): {spec}")
        for mode, mode_continuation in (("scoring", None), ("generating", continuation)):
            systems = removal_systems(LANGUAGE_MODEL_FAMILY, args.data, args.path, pruned_path, spec, args.subset,
                                      args.sentences if mode == "scoring" else count, LM_OPTIONS, threads, args.cpu,
                                      unfused=not args.no_unfused, continuation=mode_continuation)
            try:
                run = time_systems(systems, args.batch_sizes, args.repeats)
            except HeadPruneError as error:
                sys.exit(f"benchmark_lm_speed: error: {error}")
            names = [system.name for system in systems]
            print(f"{mode:>10s} {'batch':>5s} " + " ".join(f"{name:>20s}" for name in names)
                  + "  shrunk/unpruned  same output")
            for passes in run.passes:
                outputs = passes.outputs
                if mode == "scoring":  # scored target tokens; the summed losses (base 2) agree within 1e-4
                    tokens = passes.input_tokens
                    losses = {name: sum(float(row.split()[0]) for row in outputs[name]) for name in names}
                    same = all(math.isclose(losses[n], losses["masked"], rel_tol=1e-4)
                               for n in names if n != "unpruned")
                    sentences = len(outputs["unpruned"])
                else:  # tokens generated past the prompts (the final </s> included), compared token for token
                    sentences = len(outputs["unpruned"])
                    tokens = sum(len(t.split()) for t in outputs["unpruned"]) - sentences * args.prompt
                    same = all(outputs[n] == outputs["masked"] for n in names if n != "unpruned")
                rates = {name: [tokens / s for s in passes.seconds[name]] for name in names}
                median = {name: statistics.median(v) for name, v in rates.items()}
                print(f"{'':>10s} {passes.batch_size:5d} {rate_cells(rates, 20)}  "
                      f"{median['shrunk'] / median['unpruned']:14.2f}x  {same}", flush=True)
                measurements.append({
                    "mode": mode if mode == "scoring" else f"generating ({decoding})",
                    "removed_heads": len(removed), "total_heads": total, "spec": spec,
                    "batch_size": passes.batch_size, "sentences": sentences, "tokens": tokens,
                    "tokens_per_second": {n: sorted(v) for n, v in rates.items()},
                    "median_tokens_per_second": median,
                    "speedup_shrunk_vs_unpruned": median["shrunk"] / median["unpruned"],
                    "speedup_masked_vs_unpruned": median["masked"] / median["unpruned"],
                    "same_output_as_masked": same,
                    "processes": {name: process["pid"] for name, process in run.processes.items()},  # one per model
                "parameters": {"unpruned": checkpoint_parameters(args.path),
                                   "shrunk": checkpoint_parameters(pruned_path)},
                })
    write_measurements(args.json, environment, args.cpu, args.subset, args.importance, measurements)
    if args.json:
        print(f"wrote\t{args.json}")


if __name__ == "__main__":
    main()
