#!/usr/bin/env python
"""Does removing heads make a fairseq language model faster? Tokens per second, scoring and generating.

For each fraction of heads removed (the least important ones given an
importance file, otherwise a seeded random choice), writes the shrunk
checkpoint with `fairseq-headprune shrink`, then, at each batch size, with
the unpruned LM, the same with those heads masked and the shrunk one (the
masked and shrunk ones also on fairseq's unfused attention path, unless
--no-unfused):

- scoring: target tokens per second of fairseq's SequenceScorer over the
  same sentences (what fairseq-eval-lm runs); the summed loss of the masked
  and shrunk models must agree (relative 1e-4);
- generating: new tokens per second of fairseq's SequenceGenerator, greedy
  (or sampling from the --sampling-topk most likely tokens, seeded alike for
  every model), continuing each sentence's first --prompt tokens by
  --generate tokens with the incremental state (what fairseq-interactive runs
  for an LM); the continuations of the masked and shrunk models are compared
  token for token.

Prints the median and min-max over interleaved repeats and the speed-ups.

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
import time
import warnings

import torch

from fairseq_headprune.commands.benchmark_options import add_removal_arguments

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
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats (default: 3)")
    add_removal_arguments(parser)
    args = parser.parse_args()
    if min(args.batch_sizes + [args.sentences, args.prompt, args.generate, args.repeats, args.sampling_topk or 1]) < 1:
        sys.exit("benchmark_lm_speed: error: --batch-sizes, --sentences, --prompt, --generate, --sampling-topk and "
                 "--repeats must be positive")
    if not all(0.0 < f < 1.0 for f in args.fractions):
        sys.exit("benchmark_lm_speed: error: --fractions must lie strictly between 0 and 1")

    from fairseq_headprune import cli

    cli.quiet_libraries()
    from fairseq import utils
    from fairseq.dataclass.configs import GenerationConfig
    from fairseq.sequence_scorer import SequenceScorer

    from fairseq_headprune.constants import LANGUAGE_MODEL_FAMILY
    from fairseq_headprune.engine.checkpoints.loading import load_evaluation_model
    from fairseq_headprune.engine.methods.removal_benchmark import (
        device_line, model_runs, rate_cells, shrunk_checkpoint, timed_interleaved, write_measurements)
    from fairseq_headprune.errors import HeadPruneError
    from fairseq_headprune.modules.masked_multihead_attention import head_layout, head_mask_applied

    def load(path):
        try:
            _, task, model = load_evaluation_model(LANGUAGE_MODEL_FAMILY, args.data, path, LM_OPTIONS, cpu=args.cpu)
            task.load_dataset(args.subset)
        except (HeadPruneError, FileNotFoundError) as error:
            sys.exit(f"benchmark_lm_speed: error: {error}")
        return task, model

    task, model = load(args.path)
    device = next(model.parameters()).device
    layout = head_layout(model)
    total = sum(layers * heads for layers, heads in layout.values())
    dataset = task.dataset(args.subset)
    long_enough = [i for i in range(len(dataset)) if dataset.sizes[i] > args.prompt][: args.sentences]
    if not long_enough:
        sys.exit(f"benchmark_lm_speed: error: no sentence of {args.subset} is longer than --prompt {args.prompt}")
    count = len(long_enough)
    scorer = SequenceScorer(task.target_dictionary)
    length = args.prompt + args.generate
    generation = GenerationConfig(beam=1, max_len_a=0, max_len_b=length, min_len=length,
                                  sampling=args.sampling_topk is not None, sampling_topk=args.sampling_topk or -1)
    decoding = f"sampling from the top {args.sampling_topk}" if args.sampling_topk else "greedy"

    def batches_of(size):
        samples = [dataset.collater([dataset[i] for i in long_enough[start:start + size]])
                   for start in range(0, count, size)]
        return [utils.move_to_cuda(s) for s in samples] if device.type == "cuda" else samples

    def prompts_of(batches):
        """Each batch cut to its first --prompt tokens: what the generator continues."""
        prompts = []
        for sample in batches:
            tokens = sample["net_input"]["src_tokens"][:, : args.prompt]
            prompts.append(dict(sample, net_input={"src_tokens": tokens,
                                                   "src_lengths": torch.full_like(sample["net_input"]["src_lengths"],
                                                                                  args.prompt)}))
        return prompts

    def timed(work):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.no_grad():
            output = work()
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start, output

    def score(lm, batches):
        """Seconds and the summed log-probability of every target token."""
        def work():
            return sum(float(h[0]["positional_scores"].double().sum())
                       for sample in batches for h in scorer.generate([lm], sample))
        return timed(work)

    def generate(lm, prompts):
        """Seconds and every continuation (token ids): greedy, or sampled with the same seed for every model."""
        generator = task.build_generator([lm], generation)

        def work():
            torch.manual_seed(args.seed)
            return [h[0]["tokens"].tolist() for sample in prompts
                    for h in task.inference_step(generator, [lm], sample)]
        return timed(work)

    print(device_line(device))
    print(f"{count} sentences of {args.subset}; tokens per second, median (min-max) of {args.repeats} repeats; "
          f"generation: {args.prompt} prompt tokens continued by {args.generate}, {decoding}")
    workdir = args.keep_dir or tempfile.mkdtemp(prefix="benchmark-lm-speed-")
    os.makedirs(workdir, exist_ok=True)
    measurements = []
    for fraction in args.fractions:
        removed, head_mask, spec, pruned_path = shrunk_checkpoint(
            args.path, layout, fraction, args.importance, args.seed, workdir)
        _, shrunk = load(pruned_path)

        def masked(run):
            def masked_run(lm, batches):
                with head_mask_applied(lm, head_mask):
                    return run(lm, batches)
            return masked_run

        print(f"\n{len(removed)} of {total} heads removed ({len(removed) / total:.0%}): {spec}")
        for mode, run in (("scoring", score), ("generating", generate)):
            runs = model_runs(lambda b, run=run: run(model, b), lambda b, run=run: masked(run)(model, b),
                              lambda b, run=run: run(shrunk, b), unfused=not args.no_unfused)
            print(f"{mode:>10s} {'batch':>5s} " + " ".join(f"{name:>20s}" for name in runs)
                  + "  shrunk/unpruned  same output")
            for size in args.batch_sizes:
                batches = batches_of(size) if mode == "scoring" else prompts_of(batches_of(size))
                outputs, seconds = timed_interleaved(runs, batches, args.repeats)
                # scored target tokens; or generated tokens past the prompts (the final EOS included)
                tokens = (sum(int(s["ntokens"]) for s in batches) if mode == "scoring"
                          else sum(len(t) for t in outputs["unpruned"]) - count * args.prompt)
                rates = {name: [tokens / s for s in v] for name, v in seconds.items()}
                median = {name: statistics.median(v) for name, v in rates.items()}
                if mode == "scoring":
                    same = all(math.isclose(outputs[n], outputs["masked"], rel_tol=1e-4) for n in runs if n != "unpruned")
                else:
                    same = all(outputs[n] == outputs["masked"] for n in runs if n != "unpruned")
                print(f"{'':>10s} {size:5d} {rate_cells(rates, 20)}  {median['shrunk'] / median['unpruned']:14.2f}x"
                      f"  {same}", flush=True)
                measurements.append({
                    "mode": mode if mode == "scoring" else f"generating ({decoding})",
                    "removed_heads": len(removed), "total_heads": total, "spec": spec,
                    "batch_size": size, "sentences": count, "tokens": tokens,
                    "tokens_per_second": {n: sorted(v) for n, v in rates.items()},
                    "median_tokens_per_second": median,
                    "speedup_shrunk_vs_unpruned": median["shrunk"] / median["unpruned"],
                    "speedup_masked_vs_unpruned": median["masked"] / median["unpruned"],
                    "same_output_as_masked": same,
                    "parameters": {"unpruned": sum(p.numel() for p in model.parameters()),
                                   "shrunk": sum(p.numel() for p in shrunk.parameters())},
                })
    write_measurements(args.json, device, args.subset, args.importance, measurements)
    if args.json:
        print(f"wrote\t{args.json}")


if __name__ == "__main__":
    main()
