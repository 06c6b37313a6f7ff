#!/usr/bin/env python
"""How fast is importance estimation? Tokens/s against a plain forward+backward.

On the same checkpoint and the same batches, times:
- plain: fairseq's label-smoothed cross-entropy, forward + backward through
  every parameter, no head mask (what one training step computes, less the
  optimizer);
- importance: what ``fairseq-headprune importance`` runs (the
  headprune_importance criterion, parameters frozen, gradients only to the
  head masks);
- importance in training: the same criterion with parameters trainable, as
  inside fairseq-train.
Prints median and spread of target tokens per second over repeats and the
ratio to plain (goal: importance >= 0.9).

usage: scripts/benchmarks/benchmark_importance.py --data DATA_BIN --path CKPT
           [--subset valid] [--repeats 5] [--max-tokens 4096] [--limit N] [--cpu]
"""

import argparse
import statistics
import sys
import time
import warnings

import torch

warnings.filterwarnings("ignore")  # fairseq/hydra deprecation notices; the table is the output


def time_forward_backward(model, criterion, samples):
    """Forward and backward through every trainable parameter, as in a training step."""
    model.zero_grad(set_to_none=True)
    start = time.perf_counter()
    for sample in samples:
        loss, _, _ = criterion(model, sample)
        loss.backward()
    elapsed = time.perf_counter() - start
    model.zero_grad(set_to_none=True)
    return elapsed


def time_importance(model, criterion, samples):
    from fairseq_headprune.engine.importance.translation import estimate_importance

    start = time.perf_counter()
    estimate_importance(model, criterion, samples, len(samples), progress=False)
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="binarized data directory")
    parser.add_argument("--path", required=True, help="checkpoint")
    parser.add_argument("--subset", default="valid", help="split (default: valid)")
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats (default: 5)")
    parser.add_argument("--max-tokens", type=int, default=4096, help="tokens per batch (default: 4096)")
    parser.add_argument("--limit", type=int, help="first N sentences only")
    parser.add_argument("--cpu", action="store_true", help="CPU even if a GPU is present")
    args = parser.parse_args()

    import fairseq_headprune.registry

    fairseq_headprune.registry.register_components()
    from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterion

    from fairseq_headprune.criterions.headprune_importance import HeadPruneImportanceCriterion
    from fairseq_headprune.engine.checkpoints.loading import load_generation_model
    from fairseq_headprune.engine.runners.batches import iterate_samples, model_device, split_batches
    from fairseq_headprune.errors import HeadPruneError

    try:
        _, task, model = load_generation_model(args.data, args.path, cpu=args.cpu)
        dataset, batches = split_batches(task, args.subset, max_tokens=args.max_tokens, limit=args.limit)
    except HeadPruneError as error:
        sys.exit(f"benchmark_importance: error: {error}")
    device = model_device(model)
    samples = list(iterate_samples(dataset, batches, device))
    tokens = sum(int(s["ntokens"]) for s in samples)
    model.eval()  # no dropout in any run, so all three compute the same loss
    plain = LabelSmoothedCrossEntropyCriterion(task, False, 0.1)
    importance = HeadPruneImportanceCriterion(task, False, 0.1)

    def synchronize():
        if device.type == "cuda":
            torch.cuda.synchronize()

    runs = {
        "plain forward+backward": lambda: time_forward_backward(model, plain, samples),
        "importance (fairseq-headprune importance)": lambda: time_importance(model, importance, samples),
        "importance inside training": lambda: time_forward_backward(model, importance, samples),
    }
    for run in runs.values():  # warm-up
        run()
    times = {name: [] for name in runs}
    for _ in range(args.repeats):
        for name, run in runs.items():  # interleaved, so drift hits every run alike
            synchronize()
            times[name].append(run())
            synchronize()

    print(f"device: {device}, threads: {torch.get_num_threads()}, torch {torch.__version__}")
    print(f"{len(samples)} batches, {tokens} target tokens, median of {args.repeats} repeats")
    reference = statistics.median(times["plain forward+backward"])
    print(f"{'run':44s} {'tokens/s':>10s} {'min-max tokens/s':>20s} {'ratio':>6s}")
    for name, values in times.items():
        median = statistics.median(values)
        spread = f"{tokens / max(values):.0f}-{tokens / min(values):.0f}"
        print(f"{name:44s} {tokens / median:10.0f} {spread:>20s} {reference / median:6.2f}")


if __name__ == "__main__":
    main()
