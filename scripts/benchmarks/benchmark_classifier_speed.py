#!/usr/bin/env python
"""Does removing heads make a RoBERTa classifier faster? Michel et al. (2019), Table 4.

For each fraction of heads removed (the least important ones given an
importance file, otherwise a seeded random choice), writes the shrunk
checkpoint with `fairseq-headprune shrink`, then classifies the same
examples at each batch size (the paper's 1, 4, 16, 64) with the unpruned
classifier, the same with those heads masked, and the shrunk one (the
masked and shrunk ones also on fairseq's unfused attention path, unless
--no-unfused). Prints examples per second, median and min-max over
interleaved repeats, the speed-ups, and whether every model predicts the
same labels as the masked one.

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
import time
import warnings

import torch

from fairseq_headprune.commands.benchmark_options import add_removal_arguments

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
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats (default: 5)")
    add_removal_arguments(parser)
    args = parser.parse_args()
    if min(args.batch_sizes) < 1 or args.examples < 1 or args.repeats < 1:
        sys.exit("benchmark_classifier_speed: error: --batch-sizes, --examples and --repeats must be positive")
    if not all(0.0 < f < 1.0 for f in args.fractions):
        sys.exit("benchmark_classifier_speed: error: --fractions must lie strictly between 0 and 1")

    from fairseq_headprune import cli

    cli.quiet_libraries()
    from fairseq import utils
    from fairseq_headprune.constants import CLASSIFIER_FAMILY
    from fairseq_headprune.engine.families import family_named
    from fairseq_headprune.engine.methods.removal_benchmark import (
        device_line, model_runs, rate_cells, shrunk_checkpoint, timed_interleaved, write_measurements)
    from fairseq_headprune.errors import HeadPruneError
    from fairseq_headprune.modules.masked_multihead_attention import head_layout, head_mask_applied

    try:
        classifiers = family_named(CLASSIFIER_FAMILY)
        cfg, task, model = classifiers.load_for_importance(args.data, args.path, cpu=args.cpu)
        criterion = classifiers.criterion(cfg, task)
        task.load_dataset(args.subset)
    except (HeadPruneError, FileNotFoundError) as error:
        sys.exit(f"benchmark_classifier_speed: error: {error}")
    device = next(model.parameters()).device
    head_name = criterion.classification_head_name
    layout = head_layout(model)
    total = sum(layers * heads for layers, heads in layout.values())
    dataset = task.dataset(args.subset)
    count = min(args.examples, len(dataset))

    def batches_of(size):
        samples = [dataset.collater([dataset[i] for i in range(start, min(start + size, count))])
                   for start in range(0, count, size)]
        return [utils.move_to_cuda(s) for s in samples] if device.type == "cuda" else samples

    def classify(classifier, batches):
        """Seconds and the predicted labels (argmax) of every example."""
        predictions = []
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.no_grad():
            for sample in batches:
                logits, _ = classifier(**sample["net_input"], features_only=True, classification_head_name=head_name)
                predictions.append(logits.argmax(dim=-1))
        if device.type == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        return seconds, torch.cat(predictions).tolist()

    print(device_line(device))
    print(f"{count} examples of {args.subset}; examples per second, median (min-max) of {args.repeats} repeats")
    workdir = args.keep_dir or tempfile.mkdtemp(prefix="benchmark-classifier-speed-")
    os.makedirs(workdir, exist_ok=True)
    measurements = []
    for fraction in args.fractions:
        removed, head_mask, spec, pruned_path = shrunk_checkpoint(
            args.path, layout, fraction, args.importance, args.seed, workdir)
        _, _, shrunk = classifiers.load_for_importance(args.data, pruned_path, cpu=args.cpu)

        def masked(batches):
            with head_mask_applied(model, head_mask):
                return classify(model, batches)

        runs = model_runs(lambda b: classify(model, b), masked, lambda b: classify(shrunk, b),
                          unfused=not args.no_unfused)
        print(f"\n{len(removed)} of {total} heads removed ({len(removed) / total:.0%}): {spec}")
        print(f"{'batch':>5s} " + " ".join(f"{name:>22s}" for name in runs) + "  shrunk/unpruned  same labels")
        for size in args.batch_sizes:
            batches = batches_of(size)
            labels, seconds = timed_interleaved(runs, batches, args.repeats)
            rates = {name: [count / s for s in v] for name, v in seconds.items()}
            median = {name: statistics.median(v) for name, v in rates.items()}
            same = all(labels[name] == labels["masked"] for name in runs if name != "unpruned")
            print(f"{size:5d} {rate_cells(rates, 22)}  {median['shrunk'] / median['unpruned']:14.2f}x  {same}",
                  flush=True)
            measurements.append({
                "removed_heads": len(removed), "total_heads": total, "spec": spec, "batch_size": size,
                "examples": count, "examples_per_second": {n: sorted(v) for n, v in rates.items()},
                "median_examples_per_second": median,
                "speedup_shrunk_vs_unpruned": median["shrunk"] / median["unpruned"],
                "speedup_masked_vs_unpruned": median["masked"] / median["unpruned"],
                "same_labels_as_masked": same,
                "parameters": {"unpruned": sum(p.numel() for p in model.parameters()),
                               "shrunk": sum(p.numel() for p in shrunk.parameters())},
            })
    write_measurements(args.json, device, args.subset, args.importance, measurements)
    if args.json:
        print(f"wrote\t{args.json}")


if __name__ == "__main__":
    main()
