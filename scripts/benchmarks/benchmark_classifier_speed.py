#!/usr/bin/env python
"""Does removing heads make a RoBERTa classifier faster? Michel et al. (2019), Table 4.

For each fraction of heads removed (the least important ones given an
importance file, otherwise a seeded random choice), writes the shrunk
checkpoint with `fairseq-headprune shrink`, then classifies the same
examples at each batch size (the paper's 1, 4, 16, 64) with the unpruned
classifier, the same with those heads masked, and the shrunk one (the
masked and shrunk ones also on fairseq's unfused attention path, unless
--no-unfused), each in a process of its own, one at a time
(fairseq-headprune's timing module). Prints examples per second, median
and min-max over rotated rounds, the speed-ups, and whether every model
predicts the same labels as the masked one.

usage: scripts/benchmarks/benchmark_classifier_speed.py --data DATA_BIN --path CKPT
           [--subset valid] [--fractions 0.5] [--batch-sizes 1 4 16 64]
           [--examples 256] [--repeats 5] [--importance FILE] [--seed 1]
           [--cpu] [--no-unfused] [--json FILE] [--keep-dir DIR]
"""

import argparse
import os
import statistics
import sys
import tempfile
import warnings

import torch

from removal_support import add_removal_arguments

warnings.filterwarnings("ignore")  # fairseq/hydra deprecation notices; the table is the output


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="binarized sentence_prediction data directory")
    parser.add_argument("--path", required=True, help="unpruned classifier checkpoint")
    parser.add_argument("--subset", default="valid", help="split to classify (default: valid)")
    parser.add_argument("--fractions", type=float, nargs="+", default=[0.5],
                        help="fractions of all heads to remove (default: 0.5, as Table 4)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4, 16, 64],
                        help="examples per batch (default: 1 4 16 64, as Table 4)")
    parser.add_argument("--examples", type=int, default=256, help="first N examples (default: 256)")
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds, every model once a round (default: 5)")
    add_removal_arguments(parser)
    args = parser.parse_args()
    if min(args.batch_sizes) < 1 or args.examples < 1 or args.repeats < 1:
        sys.exit("benchmark_classifier_speed: error: --batch-sizes, --examples and --repeats must be positive")
    if not all(0.0 < f < 1.0 for f in args.fractions):
        sys.exit("benchmark_classifier_speed: error: --fractions must lie strictly between 0 and 1")

    from fairseq_headprune import cli

    cli.quiet_libraries()
    from fairseq_headprune.constants import CLASSIFIER_FAMILY
    from fairseq_headprune.engine.checkpoints.shrink import checkpoint_parameters
    from fairseq_headprune.engine.families import family_named
    from fairseq_headprune.engine.timing.isolated import machine_description, time_systems
    from fairseq_headprune.errors import HeadPruneError
    from fairseq_headprune.modules.masked_multihead_attention import head_layout

    from removal_support import environment_line, rate_cells, removal_systems, shrunk_checkpoint, write_measurements

    try:  # the parent only reads the model's heads: every timed model runs in a process of its own
        _, _, model = family_named(CLASSIFIER_FAMILY).load(args.data, args.path, cpu=True)
    except (HeadPruneError, FileNotFoundError) as error:
        sys.exit(f"benchmark_classifier_speed: error: {error}")
    layout = head_layout(model)
    total = sum(layers * heads for layers, heads in layout.values())
    threads = torch.get_num_threads()
    workdir = args.keep_dir or tempfile.mkdtemp(prefix="benchmark-classifier-speed-")
    os.makedirs(workdir, exist_ok=True)
    measurements, environment = [], machine_description(threads)
    print(environment_line(environment, threads))
    for fraction in args.fractions:
        removed, _, spec, pruned_path = shrunk_checkpoint(args.path, layout, fraction, args.importance, args.seed,
                                                          workdir)
        systems = removal_systems(CLASSIFIER_FAMILY, args.data, args.path, pruned_path, spec, args.subset,
                                  args.examples, [], threads, args.cpu, unfused=not args.no_unfused)
        try:
            run = time_systems(systems, args.batch_sizes, args.repeats)
        except HeadPruneError as error:
            sys.exit(f"benchmark_classifier_speed: error: {error}")
        names = [system.name for system in systems]
        if not measurements:
            print(f"the first {args.examples} examples of {args.subset} (whole batches); examples per second, median "
                  f"(min-max) of {args.repeats} rounds")
        print(f"\n{len(removed)} of {total} heads removed ({len(removed) / total:.0%}): {spec}")
        print(f"{'batch':>5s} " + " ".join(f"{name:>22s}" for name in names) + "  shrunk/unpruned  same labels")
        for passes in run.passes:
            count = len(passes.outputs["unpruned"])
            rates = {name: [count / s for s in passes.seconds[name]] for name in names}
            median = {name: statistics.median(v) for name, v in rates.items()}
            same = all(passes.outputs[name] == passes.outputs["masked"] for name in names if name != "unpruned")
            print(f"{passes.batch_size:5d} {rate_cells(rates, 22)}  {median['shrunk'] / median['unpruned']:14.2f}x"
                  f"  {same}", flush=True)
            measurements.append({
                "removed_heads": len(removed), "total_heads": total, "spec": spec, "batch_size": passes.batch_size,
                "examples": count, "examples_per_second": {n: sorted(v) for n, v in rates.items()},
                "median_examples_per_second": median,
                "speedup_shrunk_vs_unpruned": median["shrunk"] / median["unpruned"],
                "speedup_masked_vs_unpruned": median["masked"] / median["unpruned"],
                "same_labels_as_masked": same,
                "processes": {name: process["pid"] for name, process in run.processes.items()},  # one per model
                "parameters": {"unpruned": checkpoint_parameters(args.path),
                               "shrunk": checkpoint_parameters(pruned_path)},
            })
    write_measurements(args.json, environment, args.cpu, args.subset, args.importance, measurements)
    if args.json:
        print(f"wrote\t{args.json}")


if __name__ == "__main__":
    main()
