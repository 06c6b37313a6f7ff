#!/usr/bin/env python
"""Does removing heads make translation faster? Unpruned vs masked vs shrunk.

For each fraction of heads removed (the least important ones given an
importance file, otherwise a seeded random choice), writes the shrunk
checkpoint with `fairseq-headprune shrink`, then translates the same
sentences with beam search at each batch size with three models: the
unpruned one, the same with those heads masked, and the shrunk one.  Prints
the median and min-max time over interleaved repeats and the speed-ups
(paper, Table 4), and checks that masked and shrunk give the same hypotheses.
Masked and shrunk layers compute attention with torch's fused
scaled_dot_product_attention; the same models on fairseq's unfused path
(before this plugin routed them) are timed beside them unless --no-unfused.

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

from fairseq_headprune.commands.benchmark_options import add_removal_arguments

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
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats (default: 3)")
    parser.add_argument("--beam", type=int, default=5, help="beam size (default: 5)")
    add_removal_arguments(parser)
    args = parser.parse_args()

    from fairseq_headprune import cli

    cli.quiet_libraries()
    from fairseq_headprune.engine.checkpoints.loading import load_generation_model
    from fairseq_headprune.engine.runners.batches import model_device
    from fairseq_headprune.engine.runners.translator import translate_batches
    from fairseq_headprune.errors import HeadPruneError
    from fairseq_headprune.engine.methods.removal_benchmark import (
        model_runs, shrunk_checkpoint, timed_interleaved, write_measurements)
    from fairseq_headprune.modules.masked_multihead_attention import head_layout, head_mask_applied, set_head_mask

    try:
        _, task, model = load_generation_model(args.data, args.path, cpu=args.cpu)
    except HeadPruneError as error:
        sys.exit(f"benchmark_speed: error: {error}")
    device = model_device(model)
    layout = head_layout(model)
    total = sum(layers * heads for layers, heads in layout.values())
    task.load_dataset(args.subset)
    dataset = task.dataset(args.subset)
    count = min(args.sentences, len(dataset))
    # longest first, as fairseq batches by length
    order = sorted(range(count), key=lambda i: -int(dataset.num_tokens(i)))

    def batches_of(size):
        samples = []
        for start in range(0, count, size):
            sample = dataset.collater([dataset[i] for i in order[start:start + size]])
            if device.type == "cuda":
                from fairseq import utils

                sample = utils.move_to_cuda(sample)
            samples.append(sample)
        return samples

    print(f"device: {device}, threads: {torch.get_num_threads()}, torch {torch.__version__}")
    print(f"{count} sentences of {args.subset}, beam {args.beam}, median (min-max) seconds of {args.repeats} repeats")
    print("masked and shrunk layers run torch's scaled_dot_product_attention"
          + ("; '(fairseq)' columns: the same models on fairseq's unfused path" if not args.no_unfused else ""))
    workdir = args.keep_dir or tempfile.mkdtemp(prefix="benchmark-speed-")
    os.makedirs(workdir, exist_ok=True)
    measurements = []
    for fraction in args.fractions:
        removed, head_mask, spec, pruned_path = shrunk_checkpoint(
            args.path, layout, fraction, args.importance, args.seed, workdir)
        _, shrunk_task, shrunk = load_generation_model(args.data, pruned_path, cpu=args.cpu)

        def unpruned_run(batches):
            set_head_mask(model, None)
            return translate_batches(task, model, batches, args.beam)

        def masked_run(batches):
            with head_mask_applied(model, head_mask):
                return translate_batches(task, model, batches, args.beam)

        def shrunk_run(batches):
            return translate_batches(shrunk_task, shrunk, batches, args.beam)

        runs = model_runs(unpruned_run, masked_run, shrunk_run, unfused=not args.no_unfused)
        print(f"\n{len(removed)} of {total} heads removed ({len(removed) / total:.0%}): {spec}")
        print(f"{'batch':>5s} " + " ".join(f"{name:>20s}" for name in runs))
        for size in args.batch_sizes:
            batches = batches_of(size)
            outputs, times = timed_interleaved(runs, batches, args.repeats)
            median = {name: statistics.median(v) for name, v in times.items()}
            tokens = {name: sum(len(h) for h in hypotheses) for name, hypotheses in outputs.items()}
            print(f"{size:5d} " + " ".join(
                f"{f'{median[n]:.2f} ({min(v):.2f}-{max(v):.2f})':>20s}" for n, v in times.items()))
            per_token = {name: median[name] / tokens[name] for name in runs}
            ratios = {
                "masked_vs_unpruned": median["masked"] / median["unpruned"],
                "speedup_shrunk_vs_unpruned": median["unpruned"] / median["shrunk"],
                "speedup_shrunk_vs_unpruned_per_token": per_token["unpruned"] / per_token["shrunk"],
                "speedup_shrunk_vs_masked": median["masked"] / median["shrunk"],
            }
            same = {"masked_shrunk": outputs["masked"] == outputs["shrunk"]}
            if not args.no_unfused:
                ratios["speedup_masked_vs_fairseq_path"] = median["masked (fairseq)"] / median["masked"]
                ratios["speedup_shrunk_vs_fairseq_path"] = median["shrunk (fairseq)"] / median["shrunk"]
                same["masked_fairseq_path"] = outputs["masked"] == outputs["masked (fairseq)"]
                same["shrunk_fairseq_path"] = outputs["shrunk"] == outputs["shrunk (fairseq)"]
            print(f"      masked/unpruned {ratios['masked_vs_unpruned']:.2f}x (goal <= 1.05x); "
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
                "spec": spec, "batch_size": size, "sentences": count, "beam": args.beam,
                "seconds": {name: sorted(v) for name, v in times.items()},
                "median_seconds": median, "output_tokens": tokens, **ratios,
                "same_hypotheses": same,
                "shrunk_checkpoint": pruned_path if args.keep_dir else None,
                "parameters": {"unpruned": sum(p.numel() for p in model.parameters()),
                               "shrunk": sum(p.numel() for p in shrunk.parameters())},
                # the shrunk checkpoint has no optimizer state
                "checkpoint_bytes": {"unpruned": os.path.getsize(args.path), "shrunk": os.path.getsize(pruned_path)},
            })
    write_measurements(args.json, device, args.subset, args.importance, measurements)
    if args.json:
        print(f"wrote\t{args.json}")


if __name__ == "__main__":
    main()
