#!/usr/bin/env python
"""Stop a fairseq-headprune run at several points, run it again, and compare with an uninterrupted run.

usage: interrupt_check.py [--signals INT,KILL] [--points 0.2,0.5,0.8] [--measured WORDS] [--seed PATHS]
                          WORK_DIR -- fairseq-headprune COMMAND ...

The command must hold ``{out}`` where its output directory goes. It runs once uninterrupted into
WORK_DIR/reference, timed; then, for each signal and each point (a fraction of that time), into a fresh
directory, stopped there with the signal, and run again to its end. Each resumed directory is compared with
the reference: every checkpoint (``*.pt``) by its model's tensors, every table (``*.tsv``) byte for byte,
every JSON file with its clock readings left out (keys naming seconds, time, date, wall, elapsed or a
process, and the hashes of checkpoint files, which hold fairseq's training clock). One line per run; exit 1
if any differs. A stop that came after the run had ended is reported as such (choose earlier points).

A run that times decoding (``compress --export``, ``--target speedup``) measures other speeds in every
directory: ``--measured speedup,per_second`` leaves out the JSON keys holding any of those words, and the
tables whose file name holds one, as it leaves out clock readings; the decisions, scores and weights are still
compared. A resumed ``compress`` run records its earlier stages as kept where the reference ran them (a
stage's ``status``): ``status`` among the words leaves that out too. ``--seed compress.json,plan`` copies
those paths of the reference into each directory before its first run, so that a run whose choices follow
its timing (the speed-up plan) resumes from the same choices.

Each run starts with SIGINT at its default (a process launched in the background by a shell inherits SIGINT
ignored, and Python then installs no KeyboardInterrupt handler: a Ctrl-C check there would test nothing).
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time

CLOCK_WORDS = ("second", "time", "date", "wall", "elapsed", "process", "started", "minutes")
# a checkpoint file's hash covers fairseq's training clock (extra_state): its tensors are compared instead
HASHES_OF_CHECKPOINTS = ("checkpoint_sha256",)
SKIPPED = (".tmp-", "partial", ".lock")


def parse_arguments():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("work_dir")
    parser.add_argument("--signals", default="INT,KILL", help="signals to stop with (default INT,KILL)")
    parser.add_argument("--points", default="0.2,0.5,0.8",
                        help="where to stop, as fractions of the uninterrupted run's time (default 0.2,0.5,0.8)")
    parser.add_argument("--measured", default="", metavar="WORDS",
                        help="comma-separated words: JSON keys and table names holding one are speed measurements, "
                        "left out of the comparison (default: none)")
    parser.add_argument("--seed", default="", metavar="PATHS",
                        help="comma-separated paths of the reference run copied into each directory before it runs")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- fairseq-headprune COMMAND ... {out} ...")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command or not any("{out}" in part for part in command):
        parser.error("give the command after --, with {out} where its output directory goes")
    try:
        signals = [getattr(signal, "SIG" + name.strip().upper()) for name in args.signals.split(",")]
        points = [float(p) for p in args.points.split(",")]
    except (AttributeError, ValueError) as error:
        parser.error(f"--signals or --points: {error}")
    if not all(0 < p < 1 for p in points):
        parser.error("--points: fractions between 0 and 1")
    measured = tuple(word.strip().lower() for word in args.measured.split(",") if word.strip())
    seeded = [path.strip() for path in args.seed.split(",") if path.strip()]
    return args.work_dir, command, signals, points, measured, seeded


def default_sigint():
    """In the child before it runs: SIGINT at its default, whatever the check itself inherited."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def seed_from(reference, out, seeded):
    os.makedirs(out, exist_ok=True)
    for relative in seeded:
        source, target = os.path.join(reference, relative), os.path.join(out, relative)
        if os.path.isdir(source):
            shutil.copytree(source, target)
        else:
            shutil.copy2(source, target)


def with_out(command, out):
    return [part.replace("{out}", out) for part in command]


def result_files(out, measured=()):
    found = {}
    for folder, _, names in os.walk(out):
        for name in names:
            path = os.path.join(folder, name)
            relative = os.path.relpath(path, out)
            if (name.endswith((".pt", ".tsv", ".json")) and not any(s in relative for s in SKIPPED)
                    and not (name.endswith(".tsv") and any(w in name.lower() for w in measured))):
                found[relative] = path
    return found


def without_clocks(value, measured=()):
    if isinstance(value, dict):
        return {k: without_clocks(v, measured) for k, v in value.items()
                if not any(w in k.lower() for w in CLOCK_WORDS + measured) and k not in HASHES_OF_CHECKPOINTS}
    if isinstance(value, list):
        return [without_clocks(v, measured) for v in value]
    if isinstance(value, str) and os.path.isabs(value):
        return os.path.basename(value)  # the run's own directory differs
    return value


def differences(reference, resumed, measured=()):
    from fairseq_headprune.engine.checkpoints.info import same_weights

    expected, found = result_files(reference, measured), result_files(resumed, measured)
    problems = [f"missing {name}" for name in sorted(set(expected) - set(found))]
    problems += [f"extra {name}" for name in sorted(set(found) - set(expected))]
    for name in sorted(set(expected) & set(found)):
        first, second = expected[name], found[name]
        if name.endswith(".pt"):
            same = same_weights(first, second)
        elif name.endswith(".json"):
            with open(first) as a, open(second) as b:
                try:
                    same = without_clocks(json.load(a), measured) == without_clocks(json.load(b), measured)
                except ValueError:
                    same = False
        else:
            with open(first, "rb") as a, open(second, "rb") as b:
                same = a.read() == b.read()
        if not same:
            problems.append(f"{name} differs")
    return problems


def main():
    work, command, signals, points, measured, seeded = parse_arguments()
    os.makedirs(work, exist_ok=True)
    reference = os.path.join(work, "reference")
    shutil.rmtree(reference, ignore_errors=True)
    began = time.monotonic()
    subprocess.run(with_out(command, reference), check=True, stdout=subprocess.DEVNULL, preexec_fn=default_sigint)
    seconds = time.monotonic() - began
    print(f"uninterrupted: {seconds:.1f} s, {len(result_files(reference))} result files", flush=True)
    failed = 0
    for stop in signals:
        for point in points:
            out = os.path.join(work, f"{stop.name}-{point:g}")
            shutil.rmtree(out, ignore_errors=True)
            if seeded:
                seed_from(reference, out, seeded)
            process = subprocess.Popen(with_out(command, out), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                       text=True, preexec_fn=default_sigint)
            try:
                process.wait(timeout=seconds * point)
                print(f"{stop.name} at {point:g}: the run ended before the stop", flush=True)
                continue
            except subprocess.TimeoutExpired:
                process.send_signal(stop)
            _, stderr = process.communicate()
            last = (stderr.strip().splitlines() or [""])[-1]
            resumed = subprocess.run(with_out(command, out), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     text=True, preexec_fn=default_sigint)
            problems = differences(reference, out, measured) if resumed.returncode == 0 else [
                f"the rerun failed: {resumed.stderr.strip()[-300:]}"]
            failed += bool(problems)
            print(f"{stop.name} at {point:g} ({seconds * point:.0f} s, exit {process.returncode}"
                  f"{', ' + repr(last) if stop != signal.SIGKILL else ''}): "
                  f"{'; '.join(problems) if problems else 'resumed to the same results'}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
