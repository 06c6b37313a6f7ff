#!/usr/bin/env python
"""Does a CTranslate2 latency table predict the speed-up of a mask? Predicted against measured, one run.

Measures the model's table with `fairseq-headprune latency --engine ctranslate2`
(the shape given here), prices the mask with it (each block's price keeping
all of its units less its price keeping what the mask keeps, summed; the
prediction is whole / (whole - saved)), then exports the unpruned and the
masked model (`fairseq-headprune export --head-mask --ffn-mask`) and times
both in the table's shape (as many random source sentences of as many
tokens, the same beam, as many tokens generated), each in a process of its
own, in rotated rounds (fairseq-headprune's timing module). The measured
speed-up is the median over the rounds of the two passes' ratio. The mask
must keep the same count in every layer of a group, so that nothing is
padded. Run it on an idle machine: on 2 cores beside other work the
variants' passes vary too much for their differences to mean anything.

usage: scripts/benchmarks/benchmark_latency_prediction.py --data DATA_BIN --path CKPT
           --head-mask SPEC [--ffn-mask SPEC] [--sentences 8] [--sequence-length 12]
           [--target-length 6] [--beam 2] [--repeats 40] [--work DIR] [--json FILE]
"""

import argparse
import json
import os
import random
import statistics
import sys
import tempfile


def headprune(*arguments):
    """Run a fairseq-headprune command in its own process; its one-line error ends the benchmark."""
    from fairseq_headprune.cli import run_in_own_process

    return run_in_own_process(arguments, "benchmark_latency_prediction")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="fairseq-preprocess output directory")
    parser.add_argument("--path", required=True, help="the unpruned checkpoint")
    parser.add_argument("--head-mask", required=True, help="heads to remove, the same count in every layer of a type")
    parser.add_argument("--ffn-mask", help="FFN neurons to remove, the same count in every layer of a type")
    parser.add_argument("--sentences", type=int, default=8, help="sentences per batch (default 8)")
    parser.add_argument("--sequence-length", type=int, default=12, help="source tokens (default 12)")
    parser.add_argument("--target-length", type=int, default=6, help="tokens generated (default 6)")
    parser.add_argument("--beam", type=int, default=2, help="beam size (default 2)")
    parser.add_argument("--repeats", type=int, default=40,
                        help="rounds of the table and of the measurement (default 40)")
    parser.add_argument("--work", help="directory for the table and the exported models (default: a temporary one)")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    if min(args.sentences, args.sequence_length, args.target_length, args.beam, args.repeats) < 1:
        parser.error("--sentences, --sequence-length, --target-length, --beam and --repeats must be positive")

    from fairseq_headprune.constants import CTRANSLATE2_ENGINE
    from fairseq_headprune.engine.timing.isolated import SystemSpec, time_systems
    from fairseq_headprune.study.compression.decoding import DecodingOptions
    from fairseq_headprune.study.masks.ffn_mask import parse_ffn_mask
    from fairseq_headprune.study.masks.head_mask import parse_head_mask

    work = args.work or tempfile.mkdtemp(prefix="benchmark-latency-prediction-")
    os.makedirs(work, exist_ok=True)
    table_file = os.path.join(work, "latency.json")
    headprune("latency", args.data, "--path", args.path, "--out", table_file, "--engine", "ctranslate2",
              "--sentences", args.sentences, "--sequence-length", args.sequence_length, "--target-length",
              args.target_length, "--beam", args.beam, "--repeats", args.repeats, "--no-progress", "--cpu")
    masks = ["--head-mask", args.head_mask] + (["--ffn-mask", args.ffn_mask] if args.ffn_mask else [])
    for name, options in (("unpruned", []), ("masked", masks)):
        headprune("export", args.data, "--path", args.path, *options, "--out-dir", os.path.join(work, name),
                  "--no-progress", "--cpu")
    with open(table_file, encoding="utf-8") as stream:
        table = json.load(stream)
    whole = table["settings"]["whole_model_ms"]
    # the layouts from the table's own blocks; what the masks keep per block, as a search prices it
    head_layout, ffn_layout = {}, {}
    for name, prices in table["per_layer_ms"].items():
        layer_type, layer = name.split(":")
        head_layout[layer_type] = (max(int(layer), head_layout.get(layer_type, (0, 0))[0]), len(prices) - 1)
    for name, counts in table["kept_counts"].items():
        layer_type, layer = name.split(":")
        ffn_layout[layer_type] = (max(int(layer), ffn_layout.get(layer_type, (0, 0))[0]), counts[-1])
    head_mask = parse_head_mask(args.head_mask, head_layout)
    ffn_mask = parse_ffn_mask(args.ffn_mask, ffn_layout) if args.ffn_mask else None
    saved = 0.0
    for name, prices in table["per_layer_ms"].items():
        layer_type, layer = name.split(":")
        saved += prices[-1] - prices[int(head_mask[layer_type][int(layer) - 1].sum().item())]
    for name, prices in table["ffn_layer_ms"].items():
        if ffn_mask is None:
            continue
        layer_type, layer = name.split(":")
        kept = int(ffn_mask[layer_type][int(layer) - 1].sum().item())
        counts = table["kept_counts"][name]
        if kept not in counts:
            sys.exit(f"benchmark_latency_prediction: {name} keeps {kept} neurons; the table prices {counts}")
        saved += prices[-1] - prices[counts.index(kept)]
    predicted = whole / (whole - saved)

    words = [line.split()[0] for line in open(os.path.join(args.data, "dict.en.txt"), encoding="utf-8")]
    draw = random.Random(1)
    batches = table["settings"]["batches_per_pass"]
    sources = {args.sentences: {
        "sources": [[[draw.choice(words) for _ in range(args.sequence_length)] for _ in range(args.sentences)]
                    for _ in range(batches)],
        "source_lengths": [args.sequence_length + 1] * batches}}
    options = DecodingOptions.fixed_length(args.beam, args.target_length).to_dict()
    specs = [SystemSpec(name, CTRANSLATE2_ENGINE, name, "float32", os.path.join(work, name),
                        threads=table["settings"]["threads"], options=options) for name in ("unpruned", "masked")]
    seconds = time_systems(specs, [args.sentences], args.repeats, sentences=sources).passes[0].seconds
    measured = statistics.median(a / b for a, b in zip(seconds["unpruned"], seconds["masked"]))
    print(f"table: whole model {whole:.1f} ms ({table['settings']['timed']}); the mask saves {saved:.1f} ms")
    print(f"predicted {predicted:.2f}x, measured {measured:.2f}x ({100.0 * (predicted - measured) / measured:+.0f}%), "
          f"median over {args.repeats} rounds")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as stream:
            json.dump({"predicted": predicted, "measured": measured, "whole_model_ms": whole, "saved_ms": saved,
                       "seconds": seconds, "table": table["settings"]}, stream, indent=1)


if __name__ == "__main__":
    main()
