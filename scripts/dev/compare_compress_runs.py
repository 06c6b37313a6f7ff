#!/usr/bin/env python3
"""Compare two ``compress`` runs of the same settings made by two versions of the package: a refactor's check
that every output stayed the same.

usage: scripts/dev/compare_compress_runs.py pin BEFORE AFTER
       scripts/dev/compare_compress_runs.py diff BEFORE AFTER [--console-before FILE --console-after FILE]

pin   starts AFTER (a new directory) with BEFORE's run record and its measured plan (``compress.json``, ``plan/``
      and ``halves/`` of a ``--target speedup=Nx`` run), so that the run in AFTER makes its attempts from the same
      timed shapes: run the same compress command with ``--out-dir AFTER`` next (a record of other settings is
      refused there, which checks that the run's identity is unchanged too).
diff  compares what the two runs wrote: every JSON file with the measured times and speeds left out (they
      differ from run to run) and, for those, the same keys and types; ``report.md`` and the consoles with their
      numbers of seconds, minutes, speed-ups and sentences per second masked; every checkpoint's tensors bit for
      bit (the file's hash left out: a checkpoint records its run's paths) and every exported model byte for byte.
      Prints each difference; exit status 1 when there is one.
"""

import argparse
import difflib
import filecmp
import json
import os
import re
import shutil
import sys

# measured on the clock: left out of the JSON compared (any key holding one of these words)
VOLATILE_KEYS = ("sha256", "seconds", "minutes", "speedup", "per_second", "environment", "ratio", "prediction",
                 "map_gain", "out_of_order", "timing", "latency", "measured", "predicted", "relative_error", "started",
                 "lows", "interval", "rows")
# numbers measured on the clock in Markdown and console lines
VOLATILE_TEXT = re.compile(r"[-+]?\d+(\.\d+)?\s*(x|×|s\b|min\b|sent/s|examples/s|%\)|% against)")
NUMBER = re.compile(r"\d+(\.\d+)?")
TIMED_ROW = re.compile(r"^(\| \d+ \| (?:beam \d+ \| )?(?:fairseq|ct2) [^|]*\|)(.*)$")  # a speed table's row
TIMED_SECTIONS = ("## Time", "## Stages")  # every number in them is measured on the clock
BINARY_SUFFIXES = (".pt", ".bin")


def pin(before: str, after: str) -> None:
    if os.path.exists(after):
        sys.exit(f"compare_compress_runs: {after} exists; pin starts a new directory")
    os.makedirs(after)
    shutil.copy2(os.path.join(before, "compress.json"), after)
    for stage in ("plan", "halves"):
        if os.path.isdir(os.path.join(before, stage)):
            shutil.copytree(os.path.join(before, stage), os.path.join(after, stage))
    print(f"{after}: the run record and plan of {before}; run the same compress command with --out-dir {after}")


def _steady(value, before_root: str, after_root: str):
    """``value`` without the measured keys, the run's own directory written as ``OUT``."""
    if isinstance(value, dict):
        return {k: _steady(v, before_root, after_root) for k, v in value.items()
                if not any(word in k for word in VOLATILE_KEYS)}
    if isinstance(value, list):
        return [_steady(v, before_root, after_root) for v in value]
    if isinstance(value, str):
        return value.replace(before_root, "OUT").replace(after_root, "OUT")
    return value


def _shape(value):
    """``value``'s structure: every key and list length, each leaf's type (the measured values themselves vary)."""
    if isinstance(value, dict):
        return {key: _shape(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_shape(item) for item in value]
    return type(value).__name__


def _masked(lines, roots):
    masked, timed = [], False
    for line in lines:
        for root in roots:
            line = line.replace(root, "OUT")
        if line.startswith("#"):
            timed = line.startswith(TIMED_SECTIONS)
        row = TIMED_ROW.match(line)
        if timed:
            line = NUMBER.sub("#", line)
        elif row:
            line = row.group(1) + NUMBER.sub("#", row.group(2))
        masked.append(VOLATILE_TEXT.sub("#", line))
    return masked


def _stage_line(line: str) -> bool:
    """A console line that says a stage runs, ran or was kept: the one run kept what the other made."""
    return line.endswith("\t...") or "\tdone in" in line or "\tkept from" in line


def _files(root: str):
    for folder, _, names in os.walk(root):
        for name in names:
            yield os.path.relpath(os.path.join(folder, name), root)


def diff(before: str, after: str, console_before=None, console_after=None) -> int:
    from fairseq_headprune.engine.checkpoints.info import same_weights

    roots = (os.path.abspath(before), os.path.abspath(after))
    problems, compared = [], {"json": 0, "text": 0, "binary": 0}
    before_files, after_files = set(_files(before)), set(_files(after))
    for missing in sorted(before_files ^ after_files):
        if not missing.endswith((".log", ".tsv")) and "/train" not in missing:
            problems.append(f"only in {'BEFORE' if missing in before_files else 'AFTER'}: {missing}")
    for name in sorted(before_files & after_files):
        one, two = os.path.join(before, name), os.path.join(after, name)
        if name.endswith(".json"):
            compared["json"] += 1
            with open(one, encoding="utf-8") as a, open(two, encoding="utf-8") as b:
                whole_left, whole_right = json.load(a), json.load(b)
            left, right = _steady(whole_left, *roots), _steady(whole_right, *roots)
            if left != right:
                problems.append(f"{name}: " + _first_json_difference(left, right))
            elif _shape(whole_left) != _shape(whole_right):  # the measured keys too: the same keys and types
                problems.append(f"{name}: " + _first_json_difference(_shape(whole_left), _shape(whole_right)))
        elif name.endswith(".md"):
            compared["text"] += 1
            with open(one, encoding="utf-8") as a, open(two, encoding="utf-8") as b:
                changed = list(difflib.unified_diff(_masked(a.read().splitlines(), roots),
                                                    _masked(b.read().splitlines(), roots), lineterm="", n=0))
            if changed:
                problems.append(f"{name}:\n  " + "\n  ".join(changed[2:12]))
        elif name.endswith(BINARY_SUFFIXES) and "/train" not in name:
            compared["binary"] += 1
            same = same_weights(one, two) if name.endswith(".pt") else filecmp.cmp(one, two, shallow=False)
            if not same:
                problems.append(f"{name}: the {'tensors' if name.endswith('.pt') else 'bytes'} differ")
    if console_before and console_after:
        with open(console_before, encoding="utf-8") as a, open(console_after, encoding="utf-8") as b:
            steady = [line for line in a.read().splitlines() if not _stage_line(line)]
            other = [line for line in b.read().splitlines() if not _stage_line(line)]
        changed = list(difflib.unified_diff(_masked(steady, roots), _masked(other, roots), lineterm="", n=0))
        if changed:
            problems.append("console:\n  " + "\n  ".join(changed[2:20]))
    print(f"compared {compared['json']} JSON files, {compared['text']} Markdown files and {compared['binary']} "
          "weight files (.pt: tensors; .bin: bytes)" + (" and the consoles" if console_before else ""))
    for problem in problems:
        print(problem)
    print("identical" if not problems else f"{len(problems)} difference(s)")
    return 1 if problems else 0


def _first_json_difference(left, right, path="") -> str:
    if isinstance(left, dict) and isinstance(right, dict):
        for key in sorted(set(left) | set(right)):
            if key not in left or key not in right:
                return f"{path}/{key} only in {'AFTER' if key not in left else 'BEFORE'}"
            if left[key] != right[key]:
                return _first_json_difference(left[key], right[key], f"{path}/{key}")
    if isinstance(left, list) and isinstance(right, list) and len(left) == len(right):
        for index, (a, b) in enumerate(zip(left, right)):
            if a != b:
                return _first_json_difference(a, b, f"{path}[{index}]")
    return f"{path}: {str(left)[:200]} != {str(right)[:200]}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=("pin", "diff"))
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--console-before", metavar="FILE")
    parser.add_argument("--console-after", metavar="FILE")
    args = parser.parse_args(argv)
    if args.action == "pin":
        pin(args.before, args.after)
        return 0
    for path in (args.before, args.after):
        if not os.path.isdir(path):
            sys.exit(f"compare_compress_runs: {path} is not a directory")
    return diff(args.before, args.after, args.console_before, args.console_after)


if __name__ == "__main__":
    sys.exit(main())
