#!/usr/bin/env python
"""What a pruned model buys in deployment: fairseq vs CTranslate2, unpruned vs compressed, fp32 vs int8.

In one run, on the same sentences and the same batches (fairseq's own
batching of the split), decodes with beam search at each batch size with:
the unpruned model in fairseq, the compressed (shrunk) model in fairseq, the
unpruned model exported to CTranslate2 (float32 and int8) and the compressed
model exported to CTranslate2 (float32 and int8). Repeats are interleaved,
each in another order, so that the machine's drift falls on every system
alike. Prints sentences/s and target tokens/s (median and min-max over the
repeats), the speed-up against the unpruned model in fairseq and in
CTranslate2 at the same precision, BLEU (tokenized, against the split's
references) and how many hypotheses equal the fairseq model's of the same
weights; the device, threads and versions. The compressed model is
``--compressed CKPT`` (a shrunk checkpoint) or the checkpoint with
``--head-mask``/``--ffn-mask`` removed by ``fairseq-headprune shrink``.

usage: scripts/benchmark_deploy.py --data DATA_BIN --path CKPT
           (--compressed SHRUNK.pt | --head-mask SPEC [--ffn-mask SPEC])
           [--subset test] [--sentences N] [--batch-sizes 1 64] [--beam 5] [--repeats 3]
           [--threads 2] [--cuda] [--work DIR] [--json FILE]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

import torch

warnings.filterwarnings("ignore")  # fairseq/hydra deprecation notices; the table is the output


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
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats per system (default 3)")
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
    """Run a fairseq-headprune command; its one-line error ends the benchmark."""
    command = [os.path.join(os.path.dirname(sys.executable), "fairseq-headprune"), *map(str, arguments)]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"benchmark_deploy: {' '.join(map(str, arguments[:1]))} failed: {result.stderr.strip()}")
    return result.stdout


def prepare_models(args, work):
    """The compressed checkpoint and the four CTranslate2 directories (made once; reused in --work)."""
    compressed = args.compressed
    if compressed is None:
        compressed = os.path.join(work, "compressed.pt")
        if not os.path.exists(compressed):
            masks = [o for option, spec in (("--head-mask", args.head_mask), ("--ffn-mask", args.ffn_mask))
                     if spec for o in (option, spec)]
            headprune("shrink", "--path", args.path, *masks, "--out", compressed)
    exported = {}
    for name, checkpoint in (("unpruned", args.path), ("compressed", compressed)):
        for quantization in ("float32", "int8"):
            out = os.path.join(work, f"ct2-{name}-{quantization}")
            if not os.path.exists(os.path.join(out, "model.bin")):
                headprune("export", args.data, "--path", checkpoint, "--out-dir", out, "--quantization", quantization,
                          *([] if args.cuda else ["--cpu"]))
            exported[(name, quantization)] = out
    return compressed, exported


def main():
    args = parse_args()
    torch.set_num_threads(args.threads)
    import ctranslate2
    import sacrebleu

    from fairseq_headprune import cli
    from fairseq_headprune.engine.checkpoints.loading import load_generation_model
    from fairseq_headprune.engine.runners.batches import split_batches
    from fairseq_headprune.engine.runners.translator import translate_batches
    from fairseq_headprune.version import __version__

    cli._quiet_libraries()
    work = args.work or tempfile.mkdtemp(prefix="benchmark-deploy-")
    os.makedirs(work, exist_ok=True)
    compressed, exported = prepare_models(args, work)
    options = ["--beam", str(args.beam), "--lenpen", "1"]
    cfg, task, unpruned = load_generation_model(args.data, args.path, options, cpu=not args.cuda)
    _, shrunk_task, shrunk = load_generation_model(args.data, compressed, options, cpu=not args.cuda)
    device = "cuda" if args.cuda else "cpu"
    translators = {key: ctranslate2.Translator(path, device=device, intra_threads=args.threads, inter_threads=1)
                   for key, path in exported.items()}
    source_dictionary, target_dictionary = task.source_dictionary, task.target_dictionary

    def words(dictionary, ids):
        return [dictionary[i] for i in ids if i not in (dictionary.pad(), dictionary.eos())]

    print(f"device: {device}, threads: {args.threads}; torch {torch.__version__}, ctranslate2 "
          f"{ctranslate2.__version__}, fairseq-headprune {__version__}; beam {args.beam}, length penalty 1")
    measurements = []
    for batch_size in args.batch_sizes:
        dataset, batches = split_batches(task, args.subset, max_sentences=batch_size, limit=args.sentences)
        samples = [dataset.collater([dataset[i] for i in batch]) for batch in batches]
        if args.cuda:
            from fairseq import utils

            samples = [utils.move_to_cuda(s) for s in samples]
        ids = [int(i) for s in samples for i in s["id"]]
        sources = [[words(source_dictionary, row.tolist()) for row in s["net_input"]["src_tokens"]] for s in samples]
        references = [" ".join(words(target_dictionary, dataset[i]["target"].tolist())) for i in ids]

        def fairseq_run(model, run_task):
            def run():
                seconds, hypotheses = translate_batches(run_task, model, samples, args.beam)
                return seconds, [" ".join(words(target_dictionary, h)) for h in hypotheses]
            return run

        def ct2_run(translator):
            def run():
                start = time.perf_counter()
                hypotheses = []
                for batch in sources:
                    results = translator.translate_batch(batch, beam_size=args.beam, length_penalty=1.0,
                                                         max_batch_size=len(batch), max_decoding_length=256)
                    hypotheses += [" ".join(r.hypotheses[0]) for r in results]
                return time.perf_counter() - start, hypotheses
            return run

        systems = {"fairseq unpruned": fairseq_run(unpruned, task), "fairseq compressed": fairseq_run(shrunk, shrunk_task)}
        for (name, quantization), translator in translators.items():
            systems[f"ct2 {name} {quantization}"] = ct2_run(translator)
        outputs = {name: run()[1] for name, run in systems.items()}  # warm-up, and the hypotheses
        seconds = {name: [] for name in systems}
        names = list(systems)
        for repeat in range(args.repeats):
            for name in names[repeat % len(names):] + names[:repeat % len(names)]:  # a rotating order
                seconds[name].append(systems[name]()[0])
        tokens = {name: sum(len(h.split()) + 1 for h in hypotheses) for name, hypotheses in outputs.items()}
        print(f"\nbatch size {batch_size}: {len(ids)} sentences of {args.subset}, {args.repeats} repeats")
        print(f"{'system':<26} {'sent/s':>16} {'tok/s':>8} {'vs fairseq':>10} {'vs ct2 same':>11} {'BLEU':>6} "
              f"{'same hyps':>10}")
        base = statistics.median(seconds["fairseq unpruned"])
        for name in names:
            median = statistics.median(seconds[name])
            rates = [len(ids) / s for s in seconds[name]]
            same_weights = {"fairseq compressed": "fairseq compressed", "ct2 unpruned float32": "fairseq unpruned",
                            "ct2 compressed float32": "fairseq compressed"}.get(name)
            same = (sum(a == b for a, b in zip(outputs[name], outputs[same_weights])) if same_weights else None)
            reference_ct2 = name.replace("compressed", "unpruned") if name.startswith("ct2 compressed") else None
            vs_ct2 = statistics.median(seconds[reference_ct2]) / median if reference_ct2 else None
            bleu = sacrebleu.corpus_bleu(outputs[name], [references], tokenize="none", force=True).score
            row = {"batch_size": batch_size, "system": name, "seconds": seconds[name],
                   "sentences_per_second": len(ids) / median, "tokens_per_second": tokens[name] / median,
                   "speedup_vs_fairseq_unpruned": base / median, "speedup_vs_ct2_unpruned_same_precision": vs_ct2,
                   "bleu": bleu, "same_hypotheses_as": same_weights, "same_hypotheses": same, "sentences": len(ids)}
            measurements.append(row)
            print(f"{name:<26} {len(ids) / median:7.1f} ({min(rates):.1f}-{max(rates):.1f}) "
                  f"{tokens[name] / median:8.0f} {base / median:9.2f}x "
                  f"{'' if vs_ct2 is None else f'{vs_ct2:10.2f}x':>11} {bleu:6.2f} "
                  f"{'' if same is None else f'{same}/{len(ids)}':>10}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as stream:
            json.dump({"device": device, "threads": args.threads, "torch": torch.__version__,
                       "ctranslate2": ctranslate2.__version__, "beam": args.beam, "path": os.path.abspath(args.path),
                       "compressed": os.path.abspath(compressed), "rows": measurements}, stream, indent=1)


if __name__ == "__main__":
    main()
