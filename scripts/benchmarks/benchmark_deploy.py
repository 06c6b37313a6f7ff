#!/usr/bin/env python
"""What a pruned model buys in deployment: fairseq vs CTranslate2, unpruned vs compressed, fp32 vs int8.

In one run, on the same sentences and the same batches (fairseq's own
batching of the split), decodes with beam search at each batch size with:
the unpruned model in fairseq, the compressed (shrunk) model in fairseq, the
unpruned model exported to CTranslate2 and the compressed model exported to
CTranslate2 (at each of --quantizations, default float32 and int8; with
--vocabulary-map, both exported models timed again with their maps). Each system runs in its own
process, one pass at a time; the repeats rotate the order, so that the
machine's drift falls on every system alike. Prints sentences/s and target tokens/s (median and min-max over the
repeats), the speed-up against the unpruned model in fairseq, like for like
(against the unpruned model in the same engine, compute type and map setting)
and against the stock conversion (the unpruned model in CTranslate2 at the
same compute type, without a map), BLEU (sacreBLEU on the split's tokens, against its
references) and how many hypotheses equal the fairseq model's of the same
weights; the device, threads and versions. The compressed model is
``--compressed CKPT`` (a shrunk checkpoint) or the checkpoint with
``--head-mask``/``--ffn-mask`` removed by ``fairseq-headprune shrink``.
The measurement is the engine's (``engine/compression/deployment.py``), the one
``fairseq-headprune compress`` reports.

usage: scripts/benchmarks/benchmark_deploy.py --data DATA_BIN --path CKPT
           (--compressed SHRUNK.pt | --head-mask SPEC [--ffn-mask SPEC])
           [--subset test] [--sentences N] [--batch-sizes 1 64] [--beam 5] [--repeats 5]
           [--quantizations float32 int8] [--vocabulary-map] [--threads 2] [--cuda] [--work DIR] [--json FILE]
"""

import argparse
import json
import os
import sys
import tempfile
import warnings

import torch

warnings.filterwarnings("ignore")  # fairseq/hydra deprecation notices; the table is the output

# the timing's settings and this script's flags for them (its errors name the flags)
FLAGS = {"speed_batch_sizes": "--batch-sizes", "speed_sentences": "--sentences", "repeats": "--repeats",
         "threads": "--threads"}


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="fairseq-preprocess output directory")
    parser.add_argument("--path", required=True, help="the unpruned checkpoint")
    parser.add_argument("--compressed", help="a shrunk checkpoint of --path (default: shrink with the masks)")
    parser.add_argument("--head-mask", help="heads to remove (without --compressed)")
    parser.add_argument("--ffn-mask", help="FFN neurons to remove (without --compressed)")
    parser.add_argument("--subset", default="test", help="split to decode (default: test)")
    parser.add_argument("--sentences", type=int, help="first N sentences of the split (default: all)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 64], help="(default: 1 64)")
    parser.add_argument("--beam", type=int, default=5, help="beam size (default 5)")
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds of every system (default 5)")
    parser.add_argument("--quantizations", nargs="+", default=["float32", "int8"],
                        help="CTranslate2 compute types to export and time (default: float32 int8)")
    parser.add_argument("--vocabulary-map", action="store_true",
                        help="also time both exported models with their vocabulary maps (export --vocabulary-map)")
    parser.add_argument("--threads", type=int, default=2, help="CPU threads of both engines (default 2)")
    parser.add_argument("--cuda", action="store_true", help="decode on the GPU")
    parser.add_argument("--work", help="directory for the shrunk and exported models (default: a temporary one)")
    parser.add_argument("--json", help="also write the measurements here")
    args = parser.parse_args()
    if args.compressed is None and args.head_mask is None and args.ffn_mask is None:
        parser.error("give --compressed CKPT, or --head-mask/--ffn-mask to shrink --path with")
    if args.repeats < 1 or args.beam < 1 or any(b < 1 for b in args.batch_sizes):
        parser.error("--repeats, --beam and --batch-sizes must be positive")
    if args.cuda and not torch.cuda.is_available():
        parser.error("--cuda: no GPU is available")
    return args


def headprune(*arguments):
    """Run a fairseq-headprune command in its own process; its one-line error ends the benchmark."""
    from fairseq_headprune.cli import run_in_own_process

    return run_in_own_process(arguments, "benchmark_deploy")


def prepare_models(args, work):
    """The compressed checkpoint and the CTranslate2 directories (made once; reused in --work)."""
    compressed = args.compressed
    if compressed is None:
        compressed = os.path.join(work, "compressed.pt")
        if not os.path.exists(compressed):
            masks = [o for option, spec in (("--head-mask", args.head_mask), ("--ffn-mask", args.ffn_mask))
                     if spec for o in (option, spec)]
            headprune("shrink", "--path", args.path, *masks, "--out", compressed)
    exported = {}
    for name, checkpoint in (("unpruned", args.path), ("compressed", compressed)):
        for quantization in args.quantizations:
            out = os.path.join(work, f"ct2-{name}-{quantization}" + ("-vmap" if args.vocabulary_map else ""))
            if not os.path.exists(os.path.join(out, "model.bin")):
                headprune("export", args.data, "--path", checkpoint, "--out-dir", out, "--quantization", quantization,
                          *(["--vocabulary-map"] if args.vocabulary_map else []), *([] if args.cuda else ["--cpu"]))
            exported[(name, quantization)] = out
    return compressed, exported


def print_table(rows, batch_size, subset, repeats):
    """The rows of one batch size, as one table."""
    batch_rows = [row for row in rows if row.batch_size == batch_size]
    print(f"\nbatch size {batch_size}: {batch_rows[0].sentences} sentences of {subset}, {repeats} repeats")
    print(f"{'system':<28} {'sent/s':>16} {'tok/s':>8} {'vs fairseq':>10} {'like for like':>13} "
          f"{'vs stock':>9} {'BLEU':>6} {'same hyps':>10}")
    for row in batch_rows:
        like, stock, same = row.speedup_like_for_like, row.speedup_vs_stock_conversion, row.same_hypotheses
        same = "" if same is None else f"{same}/{row.sentences}"
        print(f"{row.system:<28} {row.sentences_per_second:7.1f} ({row.sentences_per_second_min:.1f}-"
              f"{row.sentences_per_second_max:.1f}) {row.tokens_per_second:8.0f} "
              f"{row.speedup_vs_fairseq_unpruned:9.2f}x {'' if like is None else f'{like:12.2f}x':>13} "
              f"{'' if stock is None else f'{stock:8.2f}x':>9} {row.bleu:6.2f} {same:>10}")


def main():
    args = parse_args()
    torch.set_num_threads(args.threads)

    from fairseq_headprune import cli

    cli.quiet_libraries()  # before fairseq is imported: its import logs notices the table does not need
    from fairseq_headprune.constants import CTRANSLATE2_ENGINE
    from fairseq_headprune.engine.compression.deployment import deployment_environment, measure_speed
    from fairseq_headprune.errors import HeadPruneError
    from fairseq_headprune.study.compression.decoding import DecodingOptions
    from fairseq_headprune.study.compression.deployment_settings import DeploymentSettings

    work = args.work or tempfile.mkdtemp(prefix="benchmark-deploy-")
    os.makedirs(work, exist_ok=True)
    compressed, exported = prepare_models(args, work)
    options = DecodingOptions(beam=args.beam, lenpen=1.0)
    device = torch.device("cuda" if args.cuda else "cpu")
    try:
        settings = DeploymentSettings(batch_sizes=list(args.batch_sizes), sentences=args.sentences,
                                      repeats=args.repeats, threads=args.threads)
        rows, _, machine = measure_speed("translation", {"unpruned": args.path, "compressed": compressed}, exported,
                                         args.data, args.subset, ["--beam", str(args.beam), "--lenpen", "1"],
                                         settings, device, options=options,
                                         progress=lambda line: print(line, file=sys.stderr, flush=True),
                                         vocabulary_mapped=("unpruned", "compressed") if args.vocabulary_map else (),
                                         export_format=CTRANSLATE2_ENGINE)
    except HeadPruneError as error:
        sys.exit(f"benchmark_deploy: {error.worded(FLAGS)}")
    environment = {**deployment_environment(device, args.threads), **machine}
    print(f"device: {environment['device']} ({environment['cpu']}; {' '.join(environment['isa'])}), threads: "
          f"{args.threads}; torch {environment['torch']}, ctranslate2 {environment['ctranslate2']}, "
          f"fairseq-headprune {environment['fairseq_headprune']}; beam {args.beam}, length penalty 1")
    for line in environment.get("ctranslate2_kernels", []):
        print(f"ctranslate2: {line}")
    print(f"timing: {environment['isolation']}")
    for batch_size in args.batch_sizes:
        print_table(rows, batch_size, args.subset, args.repeats)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as stream:
            json.dump({**environment, "device": device.type, "device_description": environment["device"],
                       "threads": args.threads, "beam": args.beam, "path": os.path.abspath(args.path),
                       "compressed": os.path.abspath(compressed), "rows": [row.to_dict() for row in rows]},
                      stream, indent=1)


if __name__ == "__main__":
    main()
