#!/usr/bin/env python
"""Does a speed-up plan predict what its compressed model measures? Each attempt's planned against measured, one run.

``fairseq-headprune compress --target speedup=Nx`` chooses a shape from a plan
that times every shape with every layer narrowed alike, on the Fisher split's
first sentences forced to a fixed target length. The model it then builds
has per-layer widths from a search and decodes its own translations. This
benchmark takes a finished run (``--run OUT``) and, for every attempt, times
the attempt's two exported CTranslate2 models, the unpruned one and the
compressed one, both with their vocabulary map, on the run's evaluation split
(its first ``--sentences``, the run's own beam and length settings, free
decoding; a shape at a smaller beam, ``--allow-beam``, the compressed model
at it against the unpruned model at the run's beam), each in a process of
its own, in ``--repeats`` rotated rounds (fairseq-headprune's timing
module, the one ``compress`` measures with). The measured speed-up is
``compress``'s own estimator (the median over the rounds of the two pass
times' ratio); the plan's error is (predicted - measured) / measured. Run it
on an idle machine.

usage: scripts/benchmarks/benchmark_speedup_plan.py --run OUT [--sentences 150] [--repeats 10]
           [--batch-sizes 1 64] [--threads 2] [--json FILE]
"""

import argparse
import json
import os
import sys


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", required=True, help="the output directory of compress --target speedup=Nx")
    parser.add_argument("--sentences", type=int,
                        help="the evaluation split's first N sentences (default: as many as compress timed)")
    parser.add_argument("--repeats", type=int, default=10, help="rotated rounds (default 10)")
    parser.add_argument("--batch-sizes", type=int, nargs="+",
                        help="batch sizes (default: the plan's)")
    parser.add_argument("--threads", type=int, help="CPU threads per process (default: the run's)")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()

    from fairseq_headprune.engine.runtime.console import quiet_libraries

    quiet_libraries()
    import torch

    from fairseq_headprune.constants import CTRANSLATE2_ENGINE
    from fairseq_headprune.engine.checkpoints.loading import load_generation_model
    from fairseq_headprune.engine.compression.deployment import engine_inputs
    from fairseq_headprune.engine.timing.isolated import SystemSpec, time_systems
    from fairseq_headprune.study.compression.decoding import DecodingOptions
    from fairseq_headprune.study.compression.records import Prediction
    from fairseq_headprune.study.compression.speed import paired_speedup
    from fairseq_headprune.study.compression.speedup.records import SpeedupReport
    from fairseq_headprune.study.settings import settings_as_options

    def fail(message):
        sys.exit(f"benchmark_speedup_plan: {message}")

    report_file = os.path.join(args.run, "report.json")
    if not os.path.isfile(report_file):
        fail(f"{report_file} does not exist: --run takes the output directory of a finished "
             "compress --target speedup=Nx")
    with open(report_file, encoding="utf-8") as stream:
        try:
            report = SpeedupReport.from_dict(json.load(stream))
        except (ValueError, KeyError) as error:
            fail(f"{report_file} is not a speed-up run's report ({error})")
    if args.repeats < 1 or (args.sentences is not None and args.sentences < 1):
        fail("--repeats and --sentences must be positive")
    batch_sizes = args.batch_sizes or report.plan.batch_sizes
    results, environment = [], None
    loaded = {}  # the attempts share the unpruned checkpoint, its data and decoding options: loaded once
    for attempt in report.attempts:
        directory = os.path.join(args.run, attempt.dir)
        with open(os.path.join(directory, "compress.json"), encoding="utf-8") as stream:
            identity = json.load(stream)["identity"]
        models = {weights: os.path.join(directory, "export", weights) for weights in ("unpruned", "compressed")}
        if not all(os.path.isfile(os.path.join(path, "vmap.txt")) for path in models.values()):
            fail(f"{directory}/export holds no two models with vocabulary maps (is the attempt finished?)")
        shape = attempt.shape
        sentences = args.sentences or identity["speed"]["sentences"]
        split = identity["evaluate"]["split"]
        threads = args.threads or identity["speed"]["threads"] or torch.get_num_threads()
        generation_args = settings_as_options(identity["fairseq_args"])  # the run's options, as a command line
        key = (identity["data"], identity["checkpoint"], tuple(generation_args), split, sentences)
        if key not in loaded:
            cfg, task, _ = load_generation_model(identity["data"], identity["checkpoint"], generation_args, cpu=True)
            loaded[key] = (DecodingOptions.of_generation(cfg.generation).to_dict(),
                           engine_inputs(task, split, batch_sizes, sentences, torch.device("cpu")))
        options, inputs = loaded[key]
        # a shape at a smaller beam (--allow-beam) decodes at it, against the unpruned model at the run's beam
        beams = {"unpruned": options["beam"], "compressed": shape.candidate.beam or options["beam"]}
        specs = [SystemSpec(f"ct2 {weights} vmap", CTRANSLATE2_ENGINE, weights, "float32", path, split=split,
                            threads=threads, options={**options, "beam": beams[weights]}, use_vmap=True)
                 for weights, path in models.items()]
        print(f"attempt {attempt.attempt}: {shape.candidate.name}; {sentences} sentences of {split}, "
              f"{args.repeats} rounds, {threads} threads", flush=True)
        run = time_systems(specs, batch_sizes, args.repeats, sentences=inputs)
        environment = run.environment
        for passes in run.passes:
            measured = paired_speedup(passes.seconds["ct2 unpruned vmap"], passes.seconds["ct2 compressed vmap"])
            predicted = shape.speedups.get(passes.batch_size)
            by_compress = attempt.speedups.get(passes.batch_size)
            error = None if predicted is None else Prediction(predicted, measured).relative_error
            results.append({"attempt": attempt.attempt, "shape": shape.candidate.name,
                            "batch_size": passes.batch_size, "predicted": predicted,
                            "measured_by_compress": by_compress, "measured": measured,
                            "relative_error": error, "seconds": passes.seconds})
            line = f"  batch {passes.batch_size}: measured {measured:.2f}x"
            if by_compress is not None:
                line += f" (compress measured {by_compress:.2f}x)"
            if predicted is not None:
                line += f", planned {predicted:.2f}x ({100.0 * error:+.0f}%)"
            print(line, flush=True)
    errors = [abs(r["relative_error"]) for r in results if r["relative_error"] is not None]
    if errors:
        print(f"largest error of the plan: {100.0 * max(errors):.0f}% over {len(errors)} measurements "
              f"({sum(e <= 0.15 for e in errors)} within 15%)")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as stream:
            json.dump({"run": os.path.abspath(args.run), "batch_sizes": batch_sizes, "repeats": args.repeats,
                       "environment": environment, "results": results},
                      stream, indent=1)


if __name__ == "__main__":
    main()
