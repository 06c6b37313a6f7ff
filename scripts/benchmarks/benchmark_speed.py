#!/usr/bin/env python
"""Does removing heads make translation faster? Unpruned vs masked vs shrunk.

For each fraction of heads removed (the least important ones given an
importance file, otherwise a seeded random choice), writes the shrunk
checkpoint with `fairseq-headprune shrink`, then translates the same
sentences with beam search at each batch size with three models: the
unpruned one, the same with those heads masked, and the shrunk one.  Prints
the median and min-max time over rotated rounds and the speed-ups (paper,
Table 4), and checks that masked and shrunk give the same hypotheses. Each
model decodes in a process of its own, one at a time (fairseq-headprune's
timing module), and every layer computes attention with torch's fused
scaled_dot_product_attention; the masked and shrunk models on fairseq's
unfused path are timed beside them unless --no-unfused.

usage: scripts/benchmarks/benchmark_speed.py --data DATA_BIN --path CKPT
           [--subset test] [--fractions 0.25 0.5 0.75] [--batch-sizes 1 64]
           [--sentences 200] [--repeats 3] [--beam 5] [--importance FILE] [--cpu]
           [--json FILE] [--keep-dir DIR] [--no-unfused]
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
    parser.add_argument("--data", required=True, help="binarized data directory")
    parser.add_argument("--path", required=True, help="unpruned checkpoint")
    parser.add_argument("--subset", default="test", help="split to translate (default: test)")
    parser.add_argument("--fractions", type=float, nargs="+", default=[0.25, 0.5, 0.75],
                        help="fractions of all heads to remove (default: 0.25 0.5 0.75)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 64],
                        help="sentences per batch (default: 1 64)")
    parser.add_argument("--sentences", type=int, default=200, help="first N sentences (default: 200)")
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds, every model once a round (default: 3)")
    parser.add_argument("--beam", type=int, default=5, help="beam size (default: 5)")
    add_removal_arguments(parser)
    args = parser.parse_args()

    from fairseq_headprune import cli

    cli.quiet_libraries()
    from fairseq_headprune.engine.checkpoints.loading import load_generation_model
    from fairseq_headprune.engine.checkpoints.shrink import checkpoint_parameters
    from fairseq_headprune.engine.timing.isolated import machine_description, time_systems
    from fairseq_headprune.errors import HeadPruneError
    from fairseq_headprune.modules.masked_multihead_attention import head_layout

    from removal_support import FAIRSEQ_PATH, environment_line, removal_systems, shrunk_checkpoint, write_measurements

    try:  # the parent only reads the model's heads: every timed model runs in a process of its own
        _, _, model = load_generation_model(args.data, args.path, cpu=True)
    except HeadPruneError as error:
        sys.exit(f"benchmark_speed: error: {error}")
    layout = head_layout(model)
    total = sum(layers * heads for layers, heads in layout.values())
    threads = torch.get_num_threads()
    generation = ["--beam", str(args.beam), "--required-batch-size-multiple", "1"]
    workdir = args.keep_dir or tempfile.mkdtemp(prefix="benchmark-speed-")
    os.makedirs(workdir, exist_ok=True)
    measurements, environment = [], machine_description(threads)
    print(environment_line(environment, threads))
    for fraction in args.fractions:
        removed, _, spec, pruned_path = shrunk_checkpoint(args.path, layout, fraction, args.importance, args.seed,
                                                          workdir)
        systems = removal_systems("translation", args.data, args.path, pruned_path, spec, args.subset, args.sentences,
                                  generation, threads, args.cpu, unfused=not args.no_unfused)
        try:
            run = time_systems(systems, args.batch_sizes, args.repeats)
        except HeadPruneError as error:
            sys.exit(f"benchmark_speed: error: {error}")
        if not measurements:
            count = len(run.passes[0].ids)
            print(f"{count} sentences of {args.subset}, beam {args.beam}, median (min-max) seconds of {args.repeats} "
                  "rounds")
            print("every model runs torch's scaled_dot_product_attention"
                  + (f"; '{FAIRSEQ_PATH.strip()}' columns: the masked and shrunk models on fairseq's unfused path"
                     if not args.no_unfused else ""))
        names = [system.name for system in systems]
        print(f"\n{len(removed)} of {total} heads removed ({len(removed) / total:.0%}): {spec}")
        print(f"{'batch':>5s} " + " ".join(f"{name:>20s}" for name in names))
        for passes in run.passes:
            times, outputs = passes.seconds, passes.outputs
            median = {name: statistics.median(v) for name, v in times.items()}
            tokens = {name: sum(len(h.split()) + 1 for h in hypotheses) for name, hypotheses in outputs.items()}
            print(f"{passes.batch_size:5d} " + " ".join(
                f"{f'{median[n]:.2f} ({min(times[n]):.2f}-{max(times[n]):.2f})':>20s}" for n in names))
            per_token = {name: median[name] / tokens[name] for name in names}
            ratios = {
                "masked_vs_unpruned": median["masked"] / median["unpruned"],
                "speedup_shrunk_vs_unpruned": median["unpruned"] / median["shrunk"],
                "speedup_shrunk_vs_unpruned_per_token": per_token["unpruned"] / per_token["shrunk"],
                "speedup_shrunk_vs_masked": median["masked"] / median["shrunk"],
            }
            same = {"masked_shrunk": outputs["masked"] == outputs["shrunk"]}
            if not args.no_unfused:
                ratios["speedup_masked_vs_fairseq_path"] = median["masked" + FAIRSEQ_PATH] / median["masked"]
                ratios["speedup_shrunk_vs_fairseq_path"] = median["shrunk" + FAIRSEQ_PATH] / median["shrunk"]
                same["masked_fairseq_path"] = outputs["masked"] == outputs["masked" + FAIRSEQ_PATH]
                same["shrunk_fairseq_path"] = outputs["shrunk"] == outputs["shrunk" + FAIRSEQ_PATH]
            print(f"      masked/unpruned {ratios['masked_vs_unpruned']:.2f}x; "
                  f"shrunk faster than unpruned: {ratios['speedup_shrunk_vs_unpruned']:.2f}x in total time, "
                  f"{ratios['speedup_shrunk_vs_unpruned_per_token']:.2f}x per output token "
                  f"(output tokens: unpruned {tokens['unpruned']}, pruned {tokens['shrunk']}); "
                  f"shrunk/masked {ratios['speedup_shrunk_vs_masked']:.2f}x", flush=True)
            if not args.no_unfused:
                print(f"      fused vs fairseq's path: masked {ratios['speedup_masked_vs_fairseq_path']:.2f}x, "
                      f"shrunk {ratios['speedup_shrunk_vs_fairseq_path']:.2f}x faster", flush=True)
            print("      same hypotheses: " + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in same.items()),
                  flush=True)
            measurements.append({
                "removed_heads": len(removed), "total_heads": total, "removed_fraction": len(removed) / total,
                "spec": spec, "batch_size": passes.batch_size, "sentences": len(passes.ids), "beam": args.beam,
                "seconds": {name: sorted(v) for name, v in times.items()},
                "median_seconds": median, "output_tokens": tokens, **ratios,
                "same_hypotheses": same,
                "shrunk_checkpoint": pruned_path if args.keep_dir else None,
                "processes": {name: process["pid"] for name, process in run.processes.items()},  # one per model
                "parameters": {"unpruned": checkpoint_parameters(args.path),
                               "shrunk": checkpoint_parameters(pruned_path)},
                # the shrunk checkpoint has no optimizer state
                "checkpoint_bytes": {"unpruned": os.path.getsize(args.path), "shrunk": os.path.getsize(pruned_path)},
            })
    write_measurements(args.json, environment, args.cpu, args.subset, args.importance, measurements)
    if args.json:
        print(f"wrote\t{args.json}")


if __name__ == "__main__":
    main()
