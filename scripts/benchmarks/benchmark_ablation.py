#!/usr/bin/env python
"""How much does one sweep process save, and how much does sharing work across configurations add?

Runs the single-head sweep (the baseline plus every head masked alone, or the
heads --heads selects) several ways, all in this one run, and prints the
ratios of issue 19's speed goals:

1. Processes (each time includes process start and model loading):
   `fairseq-headprune ablate` with configuration batching and encoder reuse
   (the defaults), `ablate --configs-per-batch 1` (neither), and one
   `fairseq-generate --head-mask SPEC` process per configuration (what the
   authors' scripts do). Goal: the per-process loop takes at least 5x the
   default sweep. Every configuration must get the same BLEU both ways.
2. In one process, model loaded once: the serial limit (fairseq's generator
   decoding each configuration alone), then the sweep's batches of
   --configs-per-batch configurations without and with encoder reuse.
   Goal: the sweep's time per configuration at most 0.8x the serial limit.
   The three ways are interleaved chunk by chunk (in a rotating order), so
   that slow drifts of the machine's speed fall on all of them alike.
   Every way must give the same hypotheses. On a CPU, hooks also time the
   serial run's encoder and decoder layers, and the script prints how much
   of the serial time exact sharing of work across configurations could
   skip at most (the encoder passes of configurations that mask no Enc-Enc
   head; decoder layers below a configuration's first masked decoder layer,
   counted as if every beam followed the unmasked model's), which bounds
   the ratio any such sharing can reach on that device.
3. The significance step's time per configuration.
4. Sharding over --shard-ranks processes (default 2; 0 skips), both ways,
   each rank on its share of the threads: by configurations (what
   `ablate`/`prune`/`dynamics` do under torchrun: batches of
   configurations dealt round robin) and by sentences (every rank decodes
   every configuration on its share of each batch). Prints each way's wall
   time (the slowest rank, model loading left out) and checks that the
   shares together give the hypotheses of one process.

usage: scripts/benchmarks/benchmark_ablation.py --data DATA_BIN --path CKPT
           [--subset test] [--heads SPEC] [--batch-size 128] [--beam 5]
           [--configs-per-batch 4] [--fp16 | --bf16] [--cpu]
           [--skip-processes] [--shard-ranks 2] [--work-dir DIR] [--json FILE]
"""

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import warnings

import fairseq_headprune

BIN_DIR = os.path.dirname(sys.executable)
USER_DIR = os.path.dirname(os.path.abspath(fairseq_headprune.__file__))  # fairseq-generate --user-dir
PROCESS_GOAL = 5.0  # per-process loop / one sweep process, at least
SERIAL_GOAL = 0.8  # sweep time per configuration / serial limit, at most

warnings.filterwarnings("ignore")  # fairseq/hydra deprecation notices; the ratios are the output


def run(command):
    env = dict(os.environ, PATH=BIN_DIR + os.pathsep + os.environ.get("PATH", ""))
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        sys.exit(f"benchmark_ablation: error: {' '.join(command[:2])} failed:\n{result.stderr[-2000:]}")
    return result.stdout


def timed_ablate(args, generation, out_dir, *extra):
    """Wall seconds of one `ablate` process, and its BLEU per configuration."""
    shutil.rmtree(out_dir, ignore_errors=True)
    command = ["fairseq-headprune", "ablate", args.data, "--path", args.path, "--gen-subset", args.subset,
               "--out-dir", out_dir, "--no-progress", *generation, *extra]
    if args.heads:
        command += ["--heads", args.heads]
    start = time.perf_counter()
    run(command)
    seconds = time.perf_counter() - start
    with open(os.path.join(out_dir, "single.json")) as stream:
        table = json.load(stream)
    bleu = {"baseline": table["settings"]["baseline_bleu"]}
    bleu.update({row["config"]: row["bleu"] for row in table["rows"]})
    specs = {"baseline": "none"}
    specs.update({row["config"]: row["spec"] for row in table["rows"]})
    return seconds, bleu, specs


def processes(args, generation, work, measurements):
    """Part 1: one sweep process (with and without batching and reuse) vs one process per configuration."""
    default_seconds, sweep_bleu, specs = timed_ablate(
        args, generation, os.path.join(work, "ablate"), "--configs-per-batch", str(args.configs_per_batch)
    )
    count = len(specs)
    print(f"one ablate process, {args.configs_per_batch} configurations per batch, encoder reuse: "
          f"{count} configurations in {default_seconds:.1f} s ({default_seconds / count:.2f} s each)")
    plain_seconds, plain_bleu, _ = timed_ablate(
        args, generation, os.path.join(work, "ablate-plain"), "--configs-per-batch", "1"
    )
    print(f"one ablate process, one configuration at a time: {plain_seconds:.1f} s "
          f"({plain_seconds / count:.2f} s each)")

    start = time.perf_counter()
    generate_bleu = {}
    for name, spec in specs.items():
        output = run(["fairseq-generate", args.data, "--user-dir", USER_DIR,
                      "--task", "fairseq-headprune", "--path", args.path, "--gen-subset", args.subset,
                      "--head-mask", spec, "--quiet", *generation])
        generate_bleu[name] = float(re.search(r"BLEU4 = ([\d.]+)", output).group(1))
    generate_seconds = time.perf_counter() - start
    print(f"one fairseq-generate per configuration: {generate_seconds:.1f} s ({generate_seconds / count:.2f} s each)")
    ratio = generate_seconds / default_seconds
    print(f"speed-up of the sweep: {ratio:.2f}x with batching and encoder reuse "
          f"(goal: at least {PROCESS_GOAL:g}x: {'met' if ratio >= PROCESS_GOAL else 'NOT met'}), "
          f"{generate_seconds / plain_seconds:.2f}x one configuration at a time")
    mismatches = [n for n in specs if not (round(sweep_bleu[n], 2) == round(plain_bleu[n], 2) == generate_bleu[n])]
    print(f"same BLEU (2 decimals, as fairseq-generate prints) all three ways for {count - len(mismatches)} "
          f"of {count} configurations" + (f"; differ: {', '.join(mismatches)}" if mismatches else ""))
    measurements["processes"] = {
        "configurations": count, "ablate_seconds": default_seconds, "ablate_one_at_a_time_seconds": plain_seconds,
        "fairseq_generate_seconds": generate_seconds, "speedup": ratio,
        "speedup_one_at_a_time": generate_seconds / plain_seconds, "same_bleu": not mismatches,
    }
    return specs


def in_process(args, generation, specs, measurements):
    """Part 2: the serial limit against the sweep's batches, without and with encoder reuse."""
    import torch

    from fairseq_headprune import cli

    cli.quiet_libraries()  # before fairseq is imported: its import logs notices the measurements do not need
    from fairseq_headprune.engine.checkpoints.loading import load_generation_model
    from fairseq_headprune.engine.runners.batches import model_device
    from fairseq_headprune.engine.runners.translator import SplitTranslator
    from fairseq_headprune.errors import HeadPruneError
    from fairseq_headprune.modules.masked_multihead_attention import head_layout
    from fairseq_headprune.study.importance.ablation import single_head_configs
    from fairseq_headprune.study.masks.head_mask import parse_head_mask

    from sharing_bound_support import ModuleTimes

    try:
        cfg, task, model = load_generation_model(args.data, args.path, generation, cpu=args.cpu)
        layout = head_layout(model)
        if specs is None:
            heads = parse_head_mask(args.heads, layout) if args.heads else None
            specs = {"baseline": "none"}
            specs.update({c.name: c.spec for c in single_head_configs(layout, heads)})
        masks = {n: None if s == "none" else parse_head_mask(s, layout) for n, s in specs.items()}
    except HeadPruneError as error:
        sys.exit(f"benchmark_ablation: error: {error}")
    device = model_device(model)
    dtype = "fp16" if args.fp16 else "bf16" if args.bf16 else "fp32"
    print(f"in one process: device {device}"
          + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else "")
          + f", {dtype}, threads {torch.get_num_threads()}, torch {torch.__version__}")
    masked = [n for n in masks if masks[n] is not None]
    chunks = [masked[i:i + args.configs_per_batch] for i in range(0, len(masked), args.configs_per_batch)]

    # three ways, each with a translator of its own (each scores its own outputs from scratch):
    # configurations decoded alone (the serial limit), and batched without and with encoder reuse
    ways = {"alone": (False, False), "without encoder reuse": (False, True), "with encoder reuse": (True, True)}
    translators = {way: SplitTranslator(cfg, task, model, args.subset, share_encoder=share)
                   for way, (share, _) in ways.items()}
    for way, translator in translators.items():  # warm-up, not timed (GPU kernels' first calls, allocator growth)
        translator.translate(None)
        if ways[way][1]:
            translator.translate_many([masks[n] for n in chunks[0]])
    seconds = dict.fromkeys(ways, 0.0)
    hypotheses = {way: {} for way in ways}
    # on a CPU every operation is synchronous, so hooks can time the modules of the serial run
    # (they run in every way, so that their small cost falls on all alike; the batched ways' times are dropped)
    timer = ModuleTimes(model) if device.type == "cpu" else None

    def decode(way, chunk):
        translator, batched = translators[way], ways[way][1]
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for group in [chunk] if batched else [[n] for n in chunk]:
            for name, translation in zip(group, translator.translate_many([masks[n] for n in group])):
                hypotheses[way][name] = translation.hypotheses
            if timer is not None:
                timer.finish(None if batched else group[0])
        if device.type == "cuda":
            torch.cuda.synchronize()
        seconds[way] += time.perf_counter() - start

    # interleaved, chunk by chunk and in a rotating order, so that the machine's drifts over
    # minutes fall on every way alike (the baseline alone, through fairseq's untouched code, in each)
    with timer if timer is not None else contextlib.nullcontext():
        for index, chunk in enumerate([["baseline"]] + chunks):
            order = list(ways)[index % 3:] + list(ways)[:index % 3]
            for way in order:
                decode(way, chunk)
    serial, serial_hypotheses = seconds["alone"] / len(masks), hypotheses["alone"]
    print(f"serial limit (each configuration decoded alone): {serial:.3f} s per configuration")
    rows = {}
    for label in ("without encoder reuse", "with encoder reuse"):
        per_configuration = seconds[label] / len(masks)
        same = hypotheses[label] == serial_hypotheses
        rows[label] = {"seconds_per_configuration": per_configuration, "ratio": per_configuration / serial,
                       "same_hypotheses": same}
        print(f"{args.configs_per_batch} configurations per batch, {label}: {per_configuration:.3f} s per "
              f"configuration, {per_configuration / serial:.2f}x the serial limit; same hypotheses as alone: {same}")
    best = rows["with encoder reuse"]["ratio"]
    print(f"goal: at most {SERIAL_GOAL:g}x the serial limit: "
          f"{'met' if best <= SERIAL_GOAL else 'NOT met'} ({best:.2f}x)")
    measurements["in_process"] = {
        "device": str(device), "dtype": dtype, "threads": torch.get_num_threads(),
        "configs_per_batch": args.configs_per_batch, "configurations": len(masks),
        "serial_seconds_per_configuration": serial, **rows,
    }
    if timer is not None:
        measurements["in_process"]["sharing_bound"] = report_sharing_bound(timer, masks, serial, rows)
    return specs, serial_hypotheses


def report_sharing_bound(timer, masks, serial, rows):
    """Print and return what exact sharing could save at most, beside what batching saved."""
    from sharing_bound_support import sharing_bound

    bound = sharing_bound(timer, masks, serial * len(masks))
    batching = 1 - rows["without encoder reuse"]["ratio"]
    bound["batching_saving"] = batching
    bound["best_ratio"] = 1 - bound["fraction"] - batching
    print(f"work configurations could share, at most (module times of the serial run): "
          f"{100 * bound['fraction']:.1f}% of the serial time = encoder passes of the configurations that mask "
          f"no Enc-Enc head {100 * bound['encoder']:.1f}% + decoder layers below each configuration's first "
          f"masked decoder layer, as if every beam followed the unmasked model's, "
          f"{100 * bound['decoder_below']:.1f}%; with batching's saving ({100 * batching:.1f}%), exact sharing "
          f"cannot bring this sweep below about {bound['best_ratio']:.2f}x the serial limit on this device")
    return bound


def shard_worker(args, generation):
    """One rank of part 4 (run as a subprocess): decode its share, print JSON."""
    import torch

    from fairseq_headprune import cli
    from fairseq_headprune.engine.checkpoints.loading import load_generation_model
    from fairseq_headprune.engine.runners.translator import SplitTranslator
    from fairseq_headprune.modules.masked_multihead_attention import head_layout
    from fairseq_headprune.study.masks.head_mask import parse_head_mask

    cli.quiet_libraries()
    way, rank, ranks = args.shard_worker[0], int(args.shard_worker[1]), int(args.shard_worker[2])
    with open(args.shard_specs, encoding="utf-8") as stream:
        specs = json.load(stream)
    cfg, task, model = load_generation_model(args.data, args.path, generation, cpu=args.cpu)
    layout = head_layout(model)
    names = [n for n in specs if specs[n] != "none"]
    chunks = [names[i:i + args.configs_per_batch] for i in range(0, len(names), args.configs_per_batch)]
    if way == "configurations":
        translator = SplitTranslator(cfg, task, model, args.subset)
        chunks = chunks[rank::ranks]
    else:
        translator = SplitTranslator(cfg, task, model, args.subset, sentence_shard=(rank, ranks))
    translator.translate(None)  # warm-up, not timed
    start = time.perf_counter()
    hypotheses = {}
    for chunk in chunks:
        masks = [parse_head_mask(specs[n], layout) for n in chunk]
        for name, translation in zip(chunk, translator.translate_many(masks)):
            hypotheses[name] = dict(zip(translator.sentence_ids, translation.hypotheses))
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    print(json.dumps({"seconds": time.perf_counter() - start, "hypotheses": hypotheses}))


def sharding(args, generation, work, specs, serial_hypotheses, measurements):
    """Part 4: configuration sharding against sentence sharding, --shard-ranks processes at once."""
    import torch

    ranks = args.shard_ranks
    threads = max(1, torch.get_num_threads() // ranks)
    specs_file = os.path.join(work, "specs.json")
    with open(specs_file, "w", encoding="utf-8") as stream:
        json.dump(specs, stream)
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), PATH=BIN_DIR + os.pathsep + os.environ.get("PATH", ""))
    ways = {}
    for way in ("configurations", "sentences"):
        command = [sys.executable, os.path.abspath(__file__), "--shard-specs", specs_file, *sys.argv[1:]]
        workers = [subprocess.Popen(command + ["--shard-worker", way, str(rank), str(ranks)],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
                   for rank in range(ranks)]
        results = []
        for worker in workers:
            stdout, stderr = worker.communicate()
            if worker.returncode != 0:
                sys.exit(f"benchmark_ablation: error: a {way} shard failed:\n{stderr[-2000:]}")
            results.append(json.loads(stdout.strip().splitlines()[-1]))
        merged = {}
        for result in results:
            for name, by_id in result["hypotheses"].items():
                merged.setdefault(name, {}).update(by_id)
        # JSON made the sentence ids strings; one process's lists follow the sorted ids
        same = set(merged) == set(serial_hypotheses) - {"baseline"} and all(
            [by_id[k] for k in sorted(by_id, key=int)] == serial_hypotheses[name] for name, by_id in merged.items()
        )
        wall = max(r["seconds"] for r in results)
        rank_seconds = ", ".join(f"{r['seconds']:.1f}" for r in results)
        ways[way] = {"wall_seconds": wall, "rank_seconds": [r["seconds"] for r in results], "same_hypotheses": same}
        print(f"sharded by {way} over {ranks} processes of {threads} thread(s): {wall:.1f} s "
              f"(ranks: {rank_seconds} s); "
              f"same hypotheses as one process: {same}", flush=True)
    faster = min(ways, key=lambda w: ways[w]["wall_seconds"])
    other = "sentences" if faster == "configurations" else "configurations"
    print(f"faster: sharding by {faster} ({ways[other]['wall_seconds'] / ways[faster]['wall_seconds']:.2f}x)")
    measurements["sharding"] = {"ranks": ranks, "threads_per_rank": threads, **ways}


def significance_time(args, work, specs):
    """Part 3: the significance step alone, on the stored sweep."""
    from fairseq_headprune.engine.runners.translator import ConfigResult
    from fairseq_headprune.engine.sweeps.resumable_sweep import load_config_result
    from fairseq_headprune.study.importance.ablation import ConfigScores, compare_with_baseline
    from fairseq_headprune.study.statistics.metrics import TOKENIZED_BLEU
    from fairseq_headprune.study.statistics.significance import SignificanceSettings

    results = [load_config_result(os.path.join(work, "ablate", "sweeps", args.subset), n, ConfigResult)
               for n in specs]
    scores = [ConfigScores(r.name, r.spec, r.labels, r.bleu, r.sacrebleu, r.fairseq_stats) for r in results]
    start = time.perf_counter()
    compare_with_baseline(scores[0], scores[1:], SignificanceSettings(), TOKENIZED_BLEU)
    seconds = time.perf_counter() - start
    print(f"significance (paired bootstrap, 1000 resamples, {len(scores[0].stats)} sentences): "
          f"{seconds:.2f} s for {len(scores) - 1} configurations ({1000 * seconds / (len(scores) - 1):.1f} ms each)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="binarized data directory")
    parser.add_argument("--path", required=True, help="checkpoint")
    parser.add_argument("--subset", default="test", help="split to translate (default: test)")
    parser.add_argument("--heads", help="ablate only these heads (spec; default: every head)")
    parser.add_argument("--batch-size", type=int, default=128, help="sentences per batch (default: 128)")
    parser.add_argument("--beam", type=int, default=5, help="beam size (default: 5)")
    parser.add_argument("--configs-per-batch", type=int, default=4, metavar="K",
                        help="configurations translated together by the sweep (default: 4, ablate's default)")
    precision = parser.add_mutually_exclusive_group()
    precision.add_argument("--fp16", action="store_true", help="half precision (GPU)")
    precision.add_argument("--bf16", action="store_true", help="bfloat16")
    parser.add_argument("--cpu", action="store_true", help="CPU even if a GPU is present")
    parser.add_argument("--skip-processes", action="store_true",
                        help="only the in-process measurements (part 2), not the process comparison")
    parser.add_argument("--shard-ranks", type=int, default=2, metavar="N",
                        help="processes for the sharding comparison (default: 2; 0 skips it)")
    parser.add_argument("--shard-worker", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--shard-specs", help=argparse.SUPPRESS)
    parser.add_argument("--work-dir", help="keep the sweeps here (default: a temporary directory)")
    parser.add_argument("--json", metavar="FILE", help="also write the measurements as JSON")
    args = parser.parse_args()
    if args.configs_per_batch < 2:
        parser.error("--configs-per-batch must be at least 2 (batching is what is measured)")
    if args.bf16 and not args.skip_processes:
        parser.error("--bf16 needs --skip-processes: fairseq-generate ignores --bf16 (it translates in fp32)")

    work = args.work_dir or tempfile.mkdtemp(prefix="benchmark_ablation.")
    # every sentence scored (fairseq otherwise leaves out the last sentences mod 8)
    generation = ["--beam", str(args.beam), "--batch-size", str(args.batch_size),
                  "--required-batch-size-multiple", "1"]
    generation += ["--fp16"] if args.fp16 else ["--bf16"] if args.bf16 else []
    generation += ["--cpu"] if args.cpu else []
    if args.shard_worker:
        shard_worker(args, generation)
        return
    if args.shard_ranks < 0 or args.shard_ranks == 1:
        parser.error("--shard-ranks must be 0 (skip) or at least 2")
    measurements = {"command": sys.argv}
    specs = None if args.skip_processes else processes(args, generation, work, measurements)
    specs, serial_hypotheses = in_process(args, generation, specs, measurements)
    if not args.skip_processes:
        significance_time(args, work, specs)
    if args.shard_ranks:
        sharding(args, generation, work, specs, serial_hypotheses, measurements)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as stream:
            json.dump(measurements, stream, indent=1)
    if not args.work_dir:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
