#!/usr/bin/env python
"""Does the plugin cost generation speed? Plain fairseq vs the masked attention.

Translates a split with beam search three ways on the same checkpoint:
fairseq's own translation task (reference), the fairseq-headprune task with
no head masked, and with one head masked.  Prints the median wall time over
repeats and the ratio to the reference; identical hypotheses are checked for
the unmasked run.

usage: scripts/benchmarks/benchmark_mask_overhead.py --data DATA_BIN --path CKPT
           [--subset test] [--repeats 5] [--batch-size 128] [--beam 5] [--head-mask E:1:1]
"""

import argparse
import statistics
import sys

import torch


def load(data, path, task_name):
    from fairseq import checkpoint_utils, options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    parser = options.get_generation_parser()
    args = options.parse_args_and_arch(parser, [data, "--task", task_name])
    task = tasks.setup_task(convert_namespace_to_omegaconf(args).task)
    models, _ = checkpoint_utils.load_model_ensemble([path], task=task)
    return task, models[0].eval()



def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="binarized data directory")
    parser.add_argument("--path", required=True, help="checkpoint")
    parser.add_argument("--subset", default="test", help="split to translate (default: test)")
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats (default: 5)")
    parser.add_argument("--batch-size", type=int, default=128, help="sentences per batch")
    parser.add_argument("--beam", type=int, default=5, help="beam size (default: 5)")
    parser.add_argument("--head-mask", default="E:1:1", help="mask for the masked run")
    args = parser.parse_args()

    import fairseq_headprune.registry

    fairseq_headprune.registry.register_components()  # the task and criterion; torch's allow-list on import
    from fairseq_headprune.engine.runners.translator import translate_batches
    from fairseq_headprune.errors import HeadMaskError
    from fairseq_headprune.modules.masked_multihead_attention import head_layout, set_head_mask
    from fairseq_headprune.study.masks.head_mask import parse_head_mask

    plain_task, plain_model = load(args.data, args.path, "translation")
    task, model = load(args.data, args.path, "fairseq-headprune")
    try:
        head_mask = parse_head_mask(args.head_mask, head_layout(model))
    except HeadMaskError as error:
        sys.exit(f"benchmark_mask_overhead: error: --head-mask: {error}")
    plain_task.load_dataset(args.subset)
    dataset = plain_task.dataset(args.subset)
    batches = [
        dataset.collater([dataset[i] for i in range(start, min(start + args.batch_size, len(dataset)))])
        for start in range(0, len(dataset), args.batch_size)
    ]

    runs = {
        "fairseq translation task": (plain_task, plain_model, None),
        "fairseq-headprune, no mask": (task, model, None),
        f"fairseq-headprune, {args.head_mask}": (task, model, head_mask),
    }
    times = {name: [] for name in runs}
    outputs = {}
    translate_batches(plain_task, plain_model, batches[:1], args.beam)  # warm-up
    for _ in range(args.repeats):
        for name, (run_task, run_model, run_mask) in runs.items():  # interleaved
            set_head_mask(model, run_mask)
            seconds, outputs[name] = translate_batches(run_task, run_model, batches, args.beam)
            times[name].append(seconds)
    set_head_mask(model, None)

    reference = statistics.median(times["fairseq translation task"])
    print(f"{len(dataset)} sentences, beam {args.beam}, batch {args.batch_size}, "
          f"{args.repeats} repeats, {torch.get_num_threads()} threads")
    print(f"{'run':40s} {'median s':>9s} {'min s':>7s} {'max s':>7s} {'ratio':>6s}")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:40s} {median:9.3f} {min(values):7.3f} {max(values):7.3f} {median / reference:6.3f}")
    same = outputs["fairseq translation task"] == outputs["fairseq-headprune, no mask"]
    print(f"unmasked hypotheses identical to fairseq's: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
