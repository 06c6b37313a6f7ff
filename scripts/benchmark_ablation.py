#!/usr/bin/env python
"""How much faster is one `ablate` process than one fairseq-generate per configuration?

Runs the single-head sweep (the baseline plus every head masked alone, or the
heads --heads selects) twice: once as `fairseq-headprune ablate` in one
process, and once as one `fairseq-generate --head-mask SPEC` process per
configuration (what the authors' scripts do). Prints both wall times, their
ratio, whether every configuration got the same BLEU both ways, and the time
of the significance step per configuration.

usage: scripts/benchmark_ablation.py --data DATA_BIN --path CKPT
           [--subset test] [--heads SPEC] [--batch-size 128] [--beam 5]
           [--work-dir DIR] [--cpu]
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

BIN_DIR = os.path.dirname(sys.executable)
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(command):
    env = dict(os.environ, PATH=BIN_DIR + os.pathsep + os.environ.get("PATH", ""))
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        sys.exit(f"{' '.join(command)} failed:\n{result.stderr[-2000:]}")
    return result.stdout


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="binarized data directory")
    parser.add_argument("--path", required=True, help="checkpoint")
    parser.add_argument("--subset", default="test", help="split to translate (default: test)")
    parser.add_argument("--heads", help="ablate only these heads (spec; default: every head)")
    parser.add_argument("--batch-size", type=int, default=128, help="sentences per batch (default: 128)")
    parser.add_argument("--beam", type=int, default=5, help="beam size (default: 5)")
    parser.add_argument("--work-dir", help="keep the sweep here (default: a temporary directory)")
    parser.add_argument("--cpu", action="store_true", help="CPU even if a GPU is present")
    args = parser.parse_args()

    work = args.work_dir or tempfile.mkdtemp(prefix="benchmark_ablation.")
    sweep_dir = os.path.join(work, "ablate")
    shutil.rmtree(sweep_dir, ignore_errors=True)
    # every sentence scored (fairseq otherwise leaves out the last sentences mod 8)
    generation = ["--beam", str(args.beam), "--batch-size", str(args.batch_size),
                  "--required-batch-size-multiple", "1"] + (["--cpu"] if args.cpu else [])

    command = ["fairseq-headprune", "ablate", args.data, "--path", args.path, "--gen-subset", args.subset,
               "--out-dir", sweep_dir, "--no-progress", *generation]
    if args.heads:
        command += ["--heads", args.heads]
    start = time.perf_counter()
    run(command)
    sweep_seconds = time.perf_counter() - start
    with open(os.path.join(sweep_dir, "single.json")) as stream:
        table = json.load(stream)
    specs = {"baseline": "none"}
    specs.update({row["config"]: row["spec"] for row in table["rows"]})
    sweep_bleu = {row["config"]: row["bleu"] for row in table["rows"]}
    sweep_bleu["baseline"] = table["settings"]["baseline_bleu"]
    print(f"one ablate process: {len(specs)} configurations in {sweep_seconds:.1f} s "
          f"({sweep_seconds / len(specs):.2f} s each)")

    start = time.perf_counter()
    generate_bleu = {}
    for name, spec in specs.items():
        output = run(["fairseq-generate", args.data, "--user-dir", os.path.join(REPO, "fairseq_headprune"),
                      "--task", "fairseq-headprune", "--path", args.path, "--gen-subset", args.subset,
                      "--head-mask", spec, "--quiet", *generation])
        generate_bleu[name] = float(re.search(r"BLEU4 = ([\d.]+)", output).group(1))
    generate_seconds = time.perf_counter() - start
    print(f"one fairseq-generate per configuration: {generate_seconds:.1f} s "
          f"({generate_seconds / len(specs):.2f} s each)")
    print(f"speed-up of the sweep: {generate_seconds / sweep_seconds:.2f}x (goal: at least 3x)")

    mismatches = [n for n in specs if round(sweep_bleu[n], 2) != generate_bleu[n]]
    print(f"same BLEU (2 decimals, as fairseq-generate prints) for {len(specs) - len(mismatches)} "
          f"of {len(specs)} configurations" + (f"; differ: {', '.join(mismatches)}" if mismatches else ""))

    # the significance step alone: re-running ablate on the finished sweep only tests and writes tables
    sys.path.insert(0, REPO)
    from fairseq_headprune.study.ablation import ConfigScores, compare_with_baseline
    from fairseq_headprune.study.metrics import TOKENIZED_BLEU
    from fairseq_headprune.study.significance import SignificanceSettings
    from fairseq_headprune.engine.sweep import load_config_result

    results = [load_config_result(os.path.join(sweep_dir, "sweeps", args.subset), n) for n in specs]
    scores = [ConfigScores(r.name, r.spec, r.labels, r.bleu, r.sacrebleu, r.fairseq_stats) for r in results]
    start = time.perf_counter()
    compare_with_baseline(scores[0], scores[1:], SignificanceSettings(), TOKENIZED_BLEU)
    test_seconds = time.perf_counter() - start
    print(f"significance (paired bootstrap, 1000 resamples, {len(scores[0].stats)} sentences): "
          f"{test_seconds:.2f} s for {len(scores) - 1} configurations "
          f"({1000 * test_seconds / (len(scores) - 1):.1f} ms each)")
    if not args.work_dir:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
