#!/usr/bin/env python
"""Seconds per configuration of an ablation sweep with the default batching, with a grid of --configs-per-batch x
sentences per batch, and in the authors' loop (one stock fairseq-generate process per configuration).

Every sweep system is a process of its own, started once (imports and CUDA set-up paid
once), that runs `fairseq-headprune ablate` of the same configurations (the
single-head sweep of the first --configurations heads, or of --heads) into a fresh
directory each round and gives its cached GPU memory back after each: `defaults`
gives no batching option (on a GPU the sweep chooses both for the device and says
so; on the CPU it keeps 4 configurations per batch and fairseq's batching), each grid
point gives both. A sweep's seconds per configuration are those its stored
configurations record (their translation; loading the model is paid once per sweep
whatever the batching, and shows in the wall seconds). The authors' loop is timed on
--generate-configurations of the configurations, each a stock `fairseq-generate
--head-mask SPEC` process, wall time with its start-up, as their scripts pay it. One
system runs at a time (the others wait, idle), in --rounds rounds, each round
starting one system later, so that drift falls on all alike. On a GPU the idle
systems' CUDA contexts (a few hundred MB each) count as used when the defaults
measure the free memory.

Prints the device and versions, a table (median and range over the rounds), the
share of the best grid point's speed the defaults reach, and on a GPU each sweep's
peak memory beside the defaults' stated choice.

usage: scripts/benchmarks/benchmark_batching.py --data DATA_BIN --path CKPT [--subset test]
           [--configurations 16 | --heads SPEC] [--configs-grid 1 4 16] [--batch-grid fairseq 16 64]
           [--rounds 2] [--generate-configurations 3] [--cpu] [--json FILE] [-- FAIRSEQ_OPTIONS ...]
(FAIRSEQ_OPTIONS: generation options for every system, default --beam 5; --fp16 for half precision)
"""

import argparse
import contextlib
import gc
import glob
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

import torch

import fairseq_headprune
from fairseq_headprune.version import __version__

BIN_DIR = os.path.dirname(sys.executable)
USER_DIR = os.path.dirname(os.path.abspath(fairseq_headprune.__file__))
FAIRSEQ_BATCHING = "fairseq"  # a grid value: no --batch-size, fairseq's own batching (--max-tokens 12000)
AUTHORS = "authors' loop"

warnings.filterwarnings("ignore")


def worker():
    """One system: for each request line (the ablate command's arguments, JSON), the sweep run in this process,
    answered by one JSON line: its exit status, console and peak GPU memory."""
    from fairseq_headprune.cli import main

    answer, cuda = sys.stdout, torch.cuda.is_available()
    for line in sys.stdin:
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        console = io.StringIO()
        with contextlib.redirect_stdout(console):
            status = main(json.loads(line))
        peak = torch.cuda.max_memory_allocated() if cuda else None
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()  # the next system measures the free memory
        answer.write(json.dumps({"status": status, "console": console.getvalue(), "peak_bytes": peak}) + "\n")
        answer.flush()


def run(command):
    env = dict(os.environ, PATH=BIN_DIR + os.pathsep + os.environ.get("PATH", ""))
    started = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        sys.exit(f"benchmark_batching: error: {' '.join(map(str, command[:4]))} ... failed:\n{result.stderr[-2000:]}")
    return result.stdout, time.perf_counter() - started


def sweep_seconds(out_dir, subset):
    """Translation seconds per masked configuration, as the sweep stored them."""
    seconds = []
    for path in glob.glob(os.path.join(out_dir, "sweeps", subset, "configs", "*.json")):
        with open(path, encoding="utf-8") as stream:
            record = json.load(stream)
        if record["name"] != "baseline":
            seconds.append(record["seconds"])
    return sum(seconds) / len(seconds)


class Systems:
    """The systems' worker processes and commands, and what each measured."""

    def __init__(self, args, generation, heads, specs, work):
        self.args, self.generation, self.heads, self.specs, self.work = args, generation, heads, specs, work
        self.seconds, self.walls, self.peaks, self.stated = {}, {}, {}, []
        self.rows, self.workers = {}, {}

    def start(self):
        """Every sweep system's process, started together (each waits for its first request)."""
        env = dict(os.environ, PATH=BIN_DIR + os.pathsep + os.environ.get("PATH", ""))
        for name in self.rows:
            if name != AUTHORS:
                log = open(os.path.join(self.work, f"{name.replace(' ', '_')}.log"), "w", encoding="utf-8")
                self.workers[name] = subprocess.Popen(
                    [sys.executable, os.path.abspath(__file__), "--worker"], stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE, stderr=log, text=True, env=env)

    def stop(self):
        for process in self.workers.values():
            process.stdin.close()
            process.wait()

    def sweep(self, name, round_index):
        out_dir = os.path.join(self.work, f"{name.replace(' ', '_')}.{round_index}")
        command = ["ablate", self.args.data, "--path", self.args.path, "--gen-subset", self.args.subset,
                   "--out-dir", out_dir, "--no-progress", "--heads", self.heads, *self.generation]
        configs_per_batch, batch_size = self.rows[name]
        if name != "defaults":
            command += ["--configs-per-batch", str(configs_per_batch)]
            command += [] if batch_size == FAIRSEQ_BATCHING else ["--batch-size", str(batch_size)]
        command += ["--cpu"] if self.args.cpu else []
        process = self.workers[name]
        started = time.perf_counter()
        process.stdin.write(json.dumps(command) + "\n")
        process.stdin.flush()
        answer = process.stdout.readline()
        wall = time.perf_counter() - started
        if not answer or json.loads(answer)["status"] != 0:
            sys.exit(f"benchmark_batching: error: the {name} sweep failed (see {self.work}, kept)")
        answer = json.loads(answer)
        self.stated += [line for line in answer["console"].splitlines()
                        if line.startswith("device batching:") and name == "defaults"]
        self.peaks.setdefault(name, []).append(answer["peak_bytes"])
        self.record(name, sweep_seconds(out_dir, self.args.subset), wall)
        shutil.rmtree(out_dir, ignore_errors=True)

    def authors_loop(self):
        walls = []
        for spec in self.specs[:self.args.generate_configurations]:
            command = ["fairseq-generate", self.args.data, "--user-dir", USER_DIR, "--task", "fairseq-headprune",
                       "--path", self.args.path, "--gen-subset", self.args.subset, "--head-mask", spec, "--quiet",
                       "--required-batch-size-multiple", "1", *self.generation]
            walls.append(run(command + (["--cpu"] if self.args.cpu else []))[1])
        self.record(AUTHORS, sum(walls) / len(walls), sum(walls))

    def record(self, name, seconds, wall):
        self.seconds.setdefault(name, []).append(seconds)
        self.walls.setdefault(name, []).append(wall)


def configurations(args):
    """The --heads spec of the sweep and every configuration's own spec (the single-head sweep's order)."""
    from fairseq_headprune.engine.checkpoints.info import checkpoint_head_layout
    from fairseq_headprune.study.importance.ablation import single_head_configs
    from fairseq_headprune.study.masks.head_mask import combine_masks, head_mask_to_spec, parse_head_mask

    layout = checkpoint_head_layout(args.path)
    chosen = parse_head_mask(args.heads, layout) if args.heads else None
    configs = single_head_configs(layout, chosen)[:None if args.heads else args.configurations]
    mask = None
    for config in configs:
        mask = combine_masks(mask, config.head_mask)
    return head_mask_to_spec(mask), [config.spec for config in configs]


def device_line(args, generation):
    precision = "float16" if "--fp16" in generation else "bfloat16" if "--bf16" in generation else "float32"
    if torch.cuda.is_available() and not args.cpu:
        device = f"cuda ({torch.cuda.get_device_name(0)})"
    else:
        from fairseq_headprune.engine.timing.isolated import cpu_model_and_flags

        device = f"cpu ({cpu_model_and_flags()[0]}, {torch.get_num_threads()} threads)"
    return f"fairseq-headprune {__version__}, torch {torch.__version__}, {device}, {precision}"


def median_range(values, digits=3):
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def report(systems, grid, count, gpu):
    """The table, the defaults' share of the best grid point, and what it all was."""
    best = min(grid, key=lambda name: statistics.median(systems.seconds[name]))
    best_seconds = statistics.median(systems.seconds[best])
    print(f"{'system':<18}{'configs/batch':>14}{'sentences/batch':>17}{'s per configuration':>26}"
          f"{'wall s':>9}{'speed vs best':>15}" + (f"{'peak GiB':>10}" if gpu else ""))
    for name, (configs_per_batch, batch_size) in systems.rows.items():
        seconds = systems.seconds[name]
        peak = systems.peaks.get(name)
        print(f"{name:<18}{configs_per_batch:>14}{batch_size:>17}{median_range(seconds):>26}"
              f"{statistics.median(systems.walls[name]):>9.1f}{best_seconds / statistics.median(seconds):>15.2f}"
              + (f"{max(peak) / 1024 ** 3:>10.2f}" if gpu and peak else ""))
    defaults = statistics.median(systems.seconds["defaults"])
    authors = statistics.median(systems.seconds[AUTHORS])
    defaults_wall = statistics.median(systems.walls["defaults"]) / count
    print(f"the defaults reach {best_seconds / defaults:.0%} of the best grid point's speed ({best}: "
          f"{best_seconds:.3f} s a configuration, the defaults {defaults:.3f} s)")
    print(f"the authors' loop takes {authors / defaults:.1f}x the defaults' time per configuration "
          f"({authors / defaults_wall:.1f}x the defaults' wall time per configuration, start-up included, "
          f"at {count} configurations a sweep)")
    for line in sorted(set(systems.stated)):
        print(f"the defaults stated: {line}")
    if not systems.stated:
        print("the defaults chose nothing (the CPU): 4 configurations per batch, fairseq's batching "
              "(--max-tokens 12000)")
    return {"best": best, "defaults_share_of_best": best_seconds / defaults,
            "authors_over_defaults": authors / defaults, "authors_over_defaults_wall": authors / defaults_wall}


def main():
    if sys.argv[1:] == ["--worker"]:
        worker()
        return
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="binarized data directory")
    parser.add_argument("--path", required=True, help="checkpoint")
    parser.add_argument("--subset", default="test", help="split to translate (default: test)")
    parser.add_argument("--configurations", type=int, default=16, metavar="N",
                        help="sweep the first N heads masked one at a time (default: 16)")
    parser.add_argument("--heads", metavar="SPEC", help="sweep these heads instead (ablate --heads)")
    parser.add_argument("--configs-grid", type=int, nargs="+", default=[1, 4, 16], metavar="K",
                        help="--configs-per-batch values of the grid (default: 1 4 16; those above the sweep's "
                        "configurations are left out)")
    parser.add_argument("--batch-grid", nargs="+", default=[FAIRSEQ_BATCHING, "16", "64"], metavar="B",
                        help=f"sentences per batch of the grid; {FAIRSEQ_BATCHING}: fairseq's own batching "
                        "(--max-tokens 12000) (default: fairseq 16 64)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of every system (default: 2)")
    parser.add_argument("--generate-configurations", type=int, default=3, metavar="N",
                        help="configurations the authors' loop is timed on (default: 3)")
    parser.add_argument("--cpu", action="store_true", help="the CPU even if a GPU is present")
    parser.add_argument("--json", metavar="FILE", help="also write the measurements as JSON")
    args = parser.parse_args(argv[:split])
    generation = argv[split + 1:] or ["--beam", "5"]
    if any(option in generation for option in ("--batch-size", "--max-sentences", "--max-tokens")):
        parser.error("the grid sets the batch size: give no --batch-size, --max-sentences or --max-tokens after --")
    if args.rounds < 1 or args.generate_configurations < 1 or min(args.configs_grid) < 1:
        parser.error("--rounds, --generate-configurations and --configs-grid take positive numbers")
    heads, specs = configurations(args)
    work = tempfile.mkdtemp(prefix="benchmark_batching.")
    systems = Systems(args, generation, heads, specs, work)
    systems.rows["defaults"] = ("default", "default")
    grid = []
    for configs_per_batch in sorted(k for k in set(args.configs_grid) if k <= len(specs)):
        for batch_size in args.batch_grid:
            name = f"grid {configs_per_batch} x {batch_size}"
            systems.rows[name] = (configs_per_batch, batch_size)
            grid.append(name)
    systems.rows[AUTHORS] = (1, FAIRSEQ_BATCHING)
    gpu = torch.cuda.is_available() and not args.cpu
    print(device_line(args, generation))
    print(f"{args.path}, {args.subset}, {len(specs)} configurations ({heads}), {' '.join(generation)}; "
          f"{args.rounds} rounds, one system at a time, each in a process of its own, rotated; the authors' "
          f"loop on {min(len(specs), args.generate_configurations)} configurations", flush=True)
    names = list(systems.rows)
    systems.start()
    for round_index in range(args.rounds):
        for name in names[round_index % len(names):] + names[:round_index % len(names)]:
            if name == AUTHORS:
                systems.authors_loop()
            else:
                systems.sweep(name, round_index)
    systems.stop()
    summary = report(systems, grid, len(specs), gpu)
    shutil.rmtree(work, ignore_errors=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as stream:
            json.dump({"command": sys.argv, "device": device_line(args, generation), "seconds": systems.seconds,
                       "walls": systems.walls, "peaks": systems.peaks, "rows": systems.rows,
                       "stated": systems.stated, **summary}, stream, indent=1)


if __name__ == "__main__":
    main()
