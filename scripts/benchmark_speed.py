#!/usr/bin/env python
"""Does removing heads make translation faster? Unpruned vs masked vs shrunk.

For each fraction of heads removed (the least important ones given an
importance file, otherwise a seeded random choice), writes the shrunk
checkpoint with `fairseq-headprune shrink`, then translates the same
sentences with beam search at each batch size with three models: the
unpruned one, the same with those heads masked, and the shrunk one.  Prints
the median and min-max time over interleaved repeats and the speed-ups
(paper, Table 4), and checks that masked and shrunk give the same hypotheses.

usage: scripts/benchmark_speed.py --data DATA_BIN --path CKPT
           [--subset test] [--fractions 0.25 0.5 0.75] [--batch-sizes 1 64]
           [--sentences 200] [--repeats 3] [--beam 5] [--importance FILE] [--cpu]
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

warnings.filterwarnings("ignore")  # fairseq/hydra deprecation notices; the table is the output


def heads_to_remove(layout, count, importance_file, seed):
    """(type, layer, head) 0-based: lowest importance first, or a seeded random order."""
    from fairseq_headprune.study.importance import read_importance_file

    heads = [(t, l, h) for t, (layers, n) in layout.items() for l in range(layers) for h in range(n)]
    if importance_file:
        scores = read_importance_file(importance_file, layout).normalized
        heads.sort(key=lambda key: float(scores[key[0]][key[1], key[2]]))
    else:
        order = torch.randperm(len(heads), generator=torch.Generator().manual_seed(seed)).tolist()
        heads = [heads[i] for i in order]
    return heads[:count]



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
    parser.add_argument("--importance", help="importance .json: remove the least important heads")
    parser.add_argument("--seed", type=int, default=1, help="seed of the random choice (default: 1)")
    parser.add_argument("--cpu", action="store_true", help="CPU even if a GPU is present")
    parser.add_argument("--json", metavar="FILE", help="also write the measurements as JSON")
    parser.add_argument("--keep-dir", metavar="DIR",
                        help="keep the shrunk checkpoints in DIR (default: a temporary directory)")
    args = parser.parse_args()

    import fairseq_headprune  # noqa: F401
    from fairseq_headprune import cli

    cli._quiet_libraries()
    from fairseq_headprune.engine.loading import load_task_and_model, model_device
    from fairseq_headprune.engine.scoring import translate_batches
    from fairseq_headprune.errors import HeadPruneError
    from fairseq_headprune.study.head_mask import full_mask, head_mask_to_spec
    from fairseq_headprune.modules.masked_multihead_attention import head_layout, head_mask_applied, set_head_mask

    try:
        _, task, model = load_task_and_model(args.data, args.path, cpu=args.cpu)
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
    print(f"{'removed':>8s} {'batch':>5s} {'unpruned':>20s} {'masked':>20s} {'shrunk':>20s} "
          f"{'shrunk/unpruned':>15s} {'shrunk/masked':>13s} same")
    workdir = args.keep_dir or tempfile.mkdtemp(prefix="benchmark-speed-")
    os.makedirs(workdir, exist_ok=True)
    measurements = []
    for fraction in args.fractions:
        removed = heads_to_remove(layout, math.ceil(fraction * total), args.importance, args.seed)
        head_mask = full_mask(layout)
        for attention_type, layer, head in removed:
            head_mask[attention_type][layer, head] = 0.0
        spec = head_mask_to_spec(head_mask)
        pruned_path = os.path.join(workdir, f"pruned-{fraction}.pt")
        with open(os.devnull, "w") as quiet:
            stdout, sys.stdout = sys.stdout, quiet
            try:
                status = cli.main(["shrink", "--path", args.path, "--head-mask", spec, "--out", pruned_path])
            finally:
                sys.stdout = stdout
        if status != 0:
            sys.exit(1)
        _, shrunk_task, shrunk = load_task_and_model(args.data, pruned_path, cpu=args.cpu)

        def unpruned_run(batches):
            set_head_mask(model, None)
            return translate_batches(task, model, batches, args.beam)

        def masked_run(batches):
            with head_mask_applied(model, head_mask):
                return translate_batches(task, model, batches, args.beam)

        def shrunk_run(batches):
            return translate_batches(shrunk_task, shrunk, batches, args.beam)

        for size in args.batch_sizes:
            batches = batches_of(size)
            runs = {"unpruned": unpruned_run, "masked": masked_run, "shrunk": shrunk_run}
            times = {name: [] for name in runs}
            outputs = {}
            for name, run in runs.items():  # warm-up
                outputs[name] = run(batches)[1]
            for _ in range(args.repeats):
                for name, run in runs.items():
                    times[name].append(run(batches)[0])
            cells = {
                name: f"{statistics.median(v):.2f} ({min(v):.2f}-{max(v):.2f})" for name, v in times.items()
            }
            median = {name: statistics.median(v) for name, v in times.items()}
            lengths = {name: sum(len(h) for h in hypotheses) for name, hypotheses in outputs.items()}
            print(f"{len(removed) / total:8.0%} {size:5d} {cells['unpruned']:>20s} {cells['masked']:>20s} "
                  f"{cells['shrunk']:>20s} {median['unpruned'] / median['shrunk']:14.2f}x "
                  f"{median['masked'] / median['shrunk']:12.2f}x {outputs['masked'] == outputs['shrunk']}"
                  f"  (output tokens: unpruned {lengths['unpruned']}, pruned {lengths['shrunk']})",
                  flush=True)
            measurements.append({
                "removed_heads": len(removed), "total_heads": total, "removed_fraction": len(removed) / total,
                "spec": spec, "batch_size": size, "sentences": count, "beam": args.beam,
                "seconds": {name: sorted(v) for name, v in times.items()},
                "median_seconds": median,
                "speedup_shrunk_vs_unpruned": median["unpruned"] / median["shrunk"],
                "speedup_shrunk_vs_masked": median["masked"] / median["shrunk"],
                "same_hypotheses_masked_shrunk": outputs["masked"] == outputs["shrunk"],
                "shrunk_checkpoint": pruned_path if args.keep_dir else None,
                "parameters": {"unpruned": sum(p.numel() for p in model.parameters()),
                               "shrunk": sum(p.numel() for p in shrunk.parameters())},
                # the shrunk checkpoint has no optimizer state
                "checkpoint_bytes": {"unpruned": os.path.getsize(args.path), "shrunk": os.path.getsize(pruned_path)},
            })
    if args.json:
        from fairseq_headprune.study.files import write_json

        write_json({"device": str(device), "threads": torch.get_num_threads(), "torch": torch.__version__,
                    "subset": args.subset, "importance": args.importance, "measurements": measurements},
                   args.json, indent=1)
        print(f"wrote\t{args.json}")


if __name__ == "__main__":
    main()
