#!/usr/bin/env python
"""Try generated command lines on a tiny model and count how each ended.

usage: fuzz_cli.py --cache DIR [--cases 500] [--seed 1] [--timeout 20] [--jobs 2] [--json FILE]

Each case is one study command (from the parsers, as ``fairseq-headprune --help`` lists them) with its
required inputs filled in on the tiny model in DIR (the test suite's cache, ``HEADPRUNE_TEST_CACHE``) and one
to three of its options drawn at random, each given a value that is odd for its kind (negative, zero, huge,
not a number, empty, an unknown choice, a missing path, a file where a directory goes, an existing result),
or a plausible one. Every case runs in a process of its own (forked from this one, which has loaded the
plugin once) and ends as one of:

  refused     exit 2 with one line on stderr (the plugin's error or argparse's)
  ran         exit 0
  working     still running at --timeout: it passed every check and started real work
  traceback   a Python traceback on stderr
  lost        an existing file given as an output was changed without --overwrite
  other       any other ending (its stderr is kept in --json)

Exit 1 if a case ended in a traceback, lost or other.
"""

import argparse
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import time

ODD_NUMBERS = ("-1", "0", "1e9", "abc", "", "nan", "0.5")
ODD_TEXTS = ("", "none", "bogus", "E:9:9", "1/0", ",")
SKIPPED_COMMANDS = ("train", "generate", "validate", "interactive", "eval-lm", "preprocess", "report")


def parse_arguments():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--cache", required=True, help="the tiny model's directory (HEADPRUNE_TEST_CACHE)")
    parser.add_argument("--cases", type=int, default=500)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=20.0, help="seconds before a case counts as working")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--json", help="write every case and its ending here")
    args = parser.parse_args()
    if args.cases <= 0 or args.jobs <= 0 or args.timeout <= 0:
        parser.error("--cases, --jobs and --timeout must be positive")
    checkpoint = os.path.join(args.cache, "checkpoints", "checkpoint8.pt")
    if not os.path.isfile(checkpoint) or not os.path.isdir(os.path.join(args.cache, "bin")):
        parser.error(f"--cache: {args.cache} holds no tiny model (checkpoints/checkpoint8.pt and bin/)")
    return args


class Inputs:
    """Real inputs on the tiny model, and odd paths, in a scratch directory."""

    def __init__(self, cache: str, scratch: str):
        self.data = os.path.join(cache, "bin")
        self.checkpoints = os.path.join(cache, "checkpoints")
        self.checkpoint = os.path.join(self.checkpoints, "checkpoint8.pt")
        self.scratch = scratch
        self.text = os.path.join(scratch, "sentences.txt")
        with open(self.text, "w") as stream:
            stream.write("le chat est noir\nil pleut\n")
        self.existing = os.path.join(scratch, "existing.json")
        self.missing = os.path.join(scratch, "missing", "deeper")

    def fresh(self, name: str) -> str:
        return tempfile.mkdtemp(prefix=name + "-", dir=self.scratch)

    def required(self, dest: str, command: str):
        """A working value of a required setting (None: the fuzzer knows none)."""
        values = {"data": self.data, "path": self.checkpoint, "checkpoints": self.checkpoints,
                  "before": self.checkpoint, "after": self.checkpoint, "reference": self.text,
                  "baseline": self.text, "systems": self.text, "head_mask": "E:1:1", "spec": "E:1:1",
                  "budget": "50%", "target": "flops=50%", "kind": "demo", "language": "fr"}
        if dest in values:
            return values[dest]
        if dest == "out_dir":
            return os.path.join(self.fresh(command), "out")
        if dest == "out":
            return os.path.join(self.fresh(command), "out.pt" if command == "shrink" else "out.json")
        return None

    def odd_path(self, rng: random.Random, command: str) -> str:
        return rng.choice([self.missing, self.existing, self.text, self.scratch, self.data,
                           os.path.join(self.fresh(command), "new")])


def option_value(action, inputs: Inputs, rng: random.Random, command: str):
    """Command-line tokens giving ``action`` a value (odd or plausible), or [] for a flag."""
    if action.nargs == 0:
        return []
    if action.choices:
        value = rng.choice(list(action.choices) + ["bogus"])
    elif action.type in (int, float):
        value = rng.choice(ODD_NUMBERS + (str(action.default),) if action.default is not None else ODD_NUMBERS)
    elif action.metavar and any(w in str(action.metavar) for w in ("FILE", "DIR", "CKPT", ".pt", ".json", ".tsv")):
        value = inputs.odd_path(rng, command)
    else:
        value = rng.choice(ODD_TEXTS + ((str(action.default),) if action.default is not None else ()))
    return [value]


def make_case(subparsers, inputs: Inputs, rng: random.Random, number: int):
    inputs.existing = os.path.join(inputs.scratch, f"existing{number}.json")  # this case's earlier result
    with open(inputs.existing, "w") as stream:
        stream.write('{"earlier": "results"}\n')
    command = rng.choice(sorted(c for c in subparsers.choices if c not in SKIPPED_COMMANDS))
    parser = subparsers.choices[command]
    argv, optional = [command], []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        if not action.option_strings:  # positional
            value = inputs.required(action.dest, command)
            if value is None and action.choices:
                value = sorted(action.choices)[0]
            if value is not None or action.nargs not in ("*", "?"):
                argv.append(str(value))
        elif action.required:
            argv += [action.option_strings[-1], str(inputs.required(action.dest, command))]
        elif action.dest != argparse.SUPPRESS and action.help != argparse.SUPPRESS:
            optional.append(action)
    existing_output = None
    for action in rng.sample(optional, k=min(len(optional), rng.randint(1, 3))):
        value = option_value(action, inputs, rng, command)
        if action.dest in ("out", "json", "report", "plot") and rng.random() < 0.5:
            value = [inputs.existing]
        if value == [inputs.existing]:
            existing_output = inputs.existing
        argv += [action.option_strings[-1], *value]
    if existing_output is None and rng.random() < 0.2:  # an output that exists already
        for flag in ("--out", "--json"):
            if flag in argv and argv.index(flag) + 1 < len(argv):
                argv[argv.index(flag) + 1] = existing_output = inputs.existing
                break
    return argv, existing_output


def run_case(argv, out_file, err_file):
    """Fork; the child runs the command with its output in the files; returns the child's pid."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setsid()
            with open(out_file, "w") as out, open(err_file, "w") as err:
                os.dup2(out.fileno(), 1)
                os.dup2(err.fileno(), 2)
            sys.stdout = os.fdopen(1, "w", buffering=1)
            sys.stderr = os.fdopen(2, "w", buffering=1)
            from fairseq_headprune.cli import main

            code = main(argv)
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        except BaseException:  # noqa: BLE001  (the child reports whatever ended it, as a traceback)
            import traceback

            traceback.print_exc()
            code = 1
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code if isinstance(code, int) else 1)
    return pid


def ending(status, killed, stderr, existing_before, existing_after, overwrite):
    if "Traceback (most recent call last)" in stderr:
        return "traceback"
    if existing_before is not None and existing_after != existing_before and not overwrite:
        return "lost"
    if killed:
        return "working"
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    code = os.waitstatus_to_exitcode(status)
    if code == 0:
        return "ran"
    if code == 2 and lines and (len(lines) == 1 or lines[0].startswith("usage:")) and "error" in lines[-1]:
        return "refused"
    return "other"


def main():
    args = parse_arguments()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)
    from fairseq_headprune.cli import build_parser  # the plugin loaded once, before the cases fork

    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    rng = random.Random(args.seed)
    scratch = tempfile.mkdtemp(prefix="fuzz-cli-")
    inputs = Inputs(args.cache, scratch)
    cases = [make_case(subparsers, inputs, rng, number) for number in range(args.cases)]
    results, running, index = [], {}, 0
    counts = {}
    began = time.monotonic()
    while index < len(cases) or running:
        while index < len(cases) and len(running) < args.jobs:
            argv, existing = cases[index]
            before = open(existing).read() if existing else None
            files = (os.path.join(scratch, f"case{index}.out"), os.path.join(scratch, f"case{index}.err"))
            running[run_case(argv, *files)] = (index, time.monotonic(), files, before)
            index += 1
        time.sleep(0.05)
        for pid, (number, started, files, before) in list(running.items()):
            done, status = os.waitpid(pid, os.WNOHANG)
            killed = False
            if not done and time.monotonic() - started > args.timeout:
                os.killpg(pid, signal.SIGKILL)
                _, status = os.waitpid(pid, 0)
                killed = True
            elif not done:
                continue
            del running[pid]
            stderr = open(files[1], errors="replace").read()
            argv, existing = cases[number]
            after = open(inputs.existing).read() if existing and os.path.isfile(existing) else None
            kind = ending(status, killed, stderr, before, after, "--overwrite" in argv)
            counts[kind] = counts.get(kind, 0) + 1
            results.append({"argv": argv, "ending": kind, "stderr": stderr[-2000:]})
            if kind in ("traceback", "lost", "other"):
                print(f"{kind}: fairseq-headprune {' '.join(argv)}\n  {stderr.strip()[-400:]}", flush=True)
    print(f"{len(cases)} cases in {time.monotonic() - began:.0f} s: " +
          ", ".join(f"{counts.get(k, 0)} {k}" for k in ("refused", "ran", "working", "traceback", "lost", "other")))
    if args.json:
        with open(args.json, "w") as stream:
            json.dump({"counts": counts, "cases": results}, stream, indent=1)
    shutil.rmtree(scratch, ignore_errors=True)
    return 1 if any(counts.get(k) for k in ("traceback", "lost", "other")) else 0


if __name__ == "__main__":
    sys.exit(main())
