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
unfused path are timed beside them unless --no-unfused. Ratios are paired
round by round (two passes of one round), so the machine's drift between
rounds cancels.

Each model's decoding work is counted (beam-search steps, and the hypotheses
those steps extend): heads removed without fine-tuning change the model's
predictions, and its beams can then stay alive longer, so that it decodes
more steps than the unpruned model and takes longer whatever a step costs.
--fixed-length N makes every model decode exactly N tokens per sentence
(fairseq's --min-len and --max-len-b N), the same work for all: what a mask
or a removal costs per step, as compress's plan times shapes.

usage: scripts/benchmarks/benchmark_speed.py --data DATA_BIN --path CKPT
           [--subset test] [--fractions 0.25 0.5 0.75] [--batch-sizes 1 64]
           [--sentences 200] [--repeats 3] [--beam 5] [--importance FILE] [--cpu]
           [--fixed-length N] [--json FILE] [--keep-dir DIR] [--no-unfused]
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
    parser.add_argument("--fixed-length", type=int, metavar="N",
                        help="every model decodes exactly N tokens per sentence, the same work for all "
                             "(default: each as its predictions end)")
    add_removal_arguments(parser)
    args = parser.parse_args()
    for name in ("sentences", "repeats", "beam", "fixed_length"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, got {value}")

    from fairseq_headprune import cli

    cli.quiet_libraries()
    from fairseq_headprune.engine.checkpoints.loading import load_generation_model
    from fairseq_headprune.engine.checkpoints.shrink import checkpoint_parameters
    from fairseq_headprune.engine.timing.isolated import machine_description, time_systems
    from fairseq_headprune.errors import HeadPruneError
    from fairseq_headprune.modules.masked_multihead_attention import head_layout
    from fairseq_headprune.study.compression.decoding import DecodingOptions

    from removal_support import (
        FAIRSEQ_PATH,
        environment_line,
        ratio_cell,
        removal_systems,
        shrunk_checkpoint,
        write_measurements,
    )

    try:  # the parent only reads the model's heads: every timed model runs in a process of its own
        _, _, model = load_generation_model(args.data, args.path, cpu=True)
    except HeadPruneError as error:
        sys.exit(f"benchmark_speed: error: {error}")
    layout = head_layout(model)
    total = sum(layers * heads for layers, heads in layout.values())
    threads = torch.get_num_threads()
    generation = ["--beam", str(args.beam), "--required-batch-size-multiple", "1"]
    options = DecodingOptions.fixed_length(args.beam, args.fixed_length).to_dict() if args.fixed_length else None
    workdir = args.keep_dir or tempfile.mkdtemp(prefix="benchmark-speed-")
    os.makedirs(workdir, exist_ok=True)
    measurements, environment = [], machine_description(threads)
    print(environment_line(environment, threads))
    for fraction in args.fractions:
        removed, _, spec, pruned_path = shrunk_checkpoint(args.path, layout, fraction, args.importance, args.seed,
                                                          workdir)
        systems = removal_systems("translation", args.data, args.path, pruned_path, spec, args.subset, args.sentences,
                                  generation, threads, args.cpu, unfused=not args.no_unfused, options=options)
        try:
            run = time_systems(systems, args.batch_sizes, args.repeats)
        except HeadPruneError as error:
            sys.exit(f"benchmark_speed: error: {error}")
        if not measurements:
            count = len(run.passes[0].ids)
            print(f"{count} sentences of {args.subset}, beam {args.beam}, median (min-max) seconds of {args.repeats} "
                  "rounds; ratios paired round by round, median (min-max)")
            print(f"decoding: exactly {args.fixed_length} tokens per sentence, the same work for every model"
                  if args.fixed_length else "decoding: each model until its beams end (its own number of steps)")
            print("every model runs torch's scaled_dot_product_attention"
                  + (f"; '{FAIRSEQ_PATH.strip()}' columns: the masked and shrunk models on fairseq's unfused path"
                     if not args.no_unfused else ""))
        names = [system.name for system in systems]
        print(f"\n{len(removed)} of {total} heads removed ({len(removed) / total:.0%}): {spec}")
        print(f"{'batch':>5s} " + " ".join(f"{name:>20s}" for name in names))
        for passes in run.passes:
            times, outputs, work = passes.seconds, passes.outputs, passes.decoder_work
            median = {name: statistics.median(v) for name, v in times.items()}
            tokens = {name: sum(len(h.split()) + 1 for h in hypotheses) for name, hypotheses in outputs.items()}
            print(f"{passes.batch_size:5d} " + " ".join(
                f"{f'{median[n]:.2f} ({min(times[n]):.2f}-{max(times[n]):.2f})':>20s}" for n in names))
            paired = {
                "masked_vs_unpruned": passes.paired_ratios("masked", "unpruned"),
                "speedup_shrunk_vs_unpruned": passes.paired_ratios("unpruned", "shrunk"),
                "speedup_shrunk_vs_masked": passes.paired_ratios("masked", "shrunk"),
            }
            if not args.no_unfused:
                paired["speedup_masked_vs_fairseq_path"] = passes.paired_ratios("masked" + FAIRSEQ_PATH, "masked")
                paired["speedup_shrunk_vs_fairseq_path"] = passes.paired_ratios("shrunk" + FAIRSEQ_PATH, "shrunk")
            ratios = {key: statistics.median(values) for key, values in paired.items()}
            # per unit of work, from the paired ratios: per output token (the best hypotheses' tokens and </s>),
            # per hypothesis a beam-search step extended
            rows = {name: work[name]["rows"] for name in names}
            ratios["speedup_shrunk_vs_unpruned_per_token"] = (ratios["speedup_shrunk_vs_unpruned"]
                                                              * tokens["shrunk"] / tokens["unpruned"])
            ratios["speedup_shrunk_vs_unpruned_per_hypothesis_step"] = (ratios["speedup_shrunk_vs_unpruned"]
                                                                        * rows["shrunk"] / rows["unpruned"])
            ratios["masked_vs_unpruned_per_hypothesis_step"] = (ratios["masked_vs_unpruned"]
                                                                * rows["unpruned"] / rows["masked"])
            same = {"masked_shrunk": outputs["masked"] == outputs["shrunk"]}
            if not args.no_unfused:
                same["masked_fairseq_path"] = outputs["masked"] == outputs["masked" + FAIRSEQ_PATH]
                same["shrunk_fairseq_path"] = outputs["shrunk"] == outputs["shrunk" + FAIRSEQ_PATH]
            print("      decoder work (steps, hypotheses extended): "
                  + ", ".join(f"{n} {work[n]['steps']}, {work[n]['rows']}" for n in names), flush=True)
            print(f"      masked/unpruned {ratio_cell(paired['masked_vs_unpruned'])}, "
                  f"{ratios['masked_vs_unpruned_per_hypothesis_step']:.2f}x per hypothesis extended; "
                  f"shrunk faster than unpruned: {ratio_cell(paired['speedup_shrunk_vs_unpruned'])} in total time, "
                  f"{ratios['speedup_shrunk_vs_unpruned_per_token']:.2f}x per output token, "
                  f"{ratios['speedup_shrunk_vs_unpruned_per_hypothesis_step']:.2f}x per hypothesis extended "
                  f"(output tokens: unpruned {tokens['unpruned']}, pruned {tokens['shrunk']}); "
                  f"shrunk/masked {ratio_cell(paired['speedup_shrunk_vs_masked'])}", flush=True)
            more = {unit: work["masked"][unit] / work["unpruned"][unit] - 1 for unit in ("steps", "rows")}
            if max(abs(v) for v in more.values()) > 0.02:
                said = [f"{abs(v):.0%} {'more' if v > 0 else 'fewer'} {what}" for v, what in
                        ((more["steps"], "beam-search steps"), (more["rows"], "hypotheses extended"))]
                print(f"      the pruned model decodes {said[0]} and {said[1]} than the unpruned one (its beams end "
                      "elsewhere): its time holds that work as well as its cost per step (--fixed-length N times "
                      "equal work)", flush=True)
            if not args.no_unfused:
                print(f"      fused vs fairseq's path: masked {ratio_cell(paired['speedup_masked_vs_fairseq_path'])}, "
                      f"shrunk {ratio_cell(paired['speedup_shrunk_vs_fairseq_path'])} faster", flush=True)
            print("      same hypotheses: " + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in same.items()),
                  flush=True)
            measurements.append({
                "removed_heads": len(removed), "total_heads": total, "removed_fraction": len(removed) / total,
                "spec": spec, "batch_size": passes.batch_size, "sentences": len(passes.ids), "beam": args.beam,
                "seconds": {name: sorted(v) for name, v in times.items()},
                "median_seconds": median, "output_tokens": tokens, **ratios,
                "paired_ratios": paired,
                "decoder_work": work, "fixed_length": args.fixed_length,
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
