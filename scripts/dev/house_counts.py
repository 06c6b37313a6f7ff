#!/usr/bin/env python3
"""The bar figures of the house of the speed-up search (issue 83), counted on a source tree.

usage: scripts/dev/house_counts.py [ROOT]   (ROOT: a checkout; default: this one)

Prints, for the package under ROOT/fairseq_headprune:
- the modules that name CTranslate2 (any spelling, comments and docstrings included);
- string-key lookups (``x["key"]``, ``x.get("key")``) in the speed-up's modules (every module of a ``speedup``
  folder or with ``speedup`` in its name) and the report modules (``report*.py``);
- ``Dict[str, Any]``-style annotations (``Dict``, ``dict`` or ``Mapping`` from ``str`` to ``Any`` or ``object``);
- the package's modules and lines.
"""

import argparse
import os
import re
import sys

CTRANSLATE2 = re.compile(r"ctranslate2|\bct2\b", re.IGNORECASE)
STRING_LOOKUP = re.compile(r"""\[\s*["'][A-Za-z_][\w ]*["']\s*\]|\.get\(\s*["'][A-Za-z_]\w*["']""")
ANY_MAPPING = re.compile(r"\b(?:Dict|dict|Mapping)\[\s*str\s*,\s*(?:Any|object)\s*\]")


def modules(package: str):
    for folder, _, names in os.walk(package):
        for name in sorted(names):
            if name.endswith(".py"):
                yield os.path.join(folder, name)


def speedup_or_report(path: str, package: str) -> bool:
    relative = os.path.relpath(path, package)
    return ("speedup" in relative.split(os.sep)[:-1] or "speedup" in os.path.basename(relative)
            or os.path.basename(relative).startswith("report"))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", nargs="?", default=os.path.join(os.path.dirname(__file__), "..", ".."))
    args = parser.parse_args(argv)
    package = os.path.join(args.root, "fairseq_headprune")
    if not os.path.isdir(package):
        print(f"house_counts: no fairseq_headprune package under {args.root}", file=sys.stderr)
        return 2
    naming, lookups, annotations, lines, count = [], 0, 0, 0, 0
    for path in modules(package):
        with open(path, encoding="utf-8") as stream:
            text = stream.read()
        count, lines = count + 1, lines + text.count("\n")
        if CTRANSLATE2.search(text):
            naming.append(os.path.relpath(path, package))
        if speedup_or_report(path, package):
            lookups += len(STRING_LOOKUP.findall(text))
        annotations += len(ANY_MAPPING.findall(text))
    print(f"modules naming CTranslate2\t{len(naming)}")
    print(f"string-key lookups in the speed-up and report modules\t{lookups}")
    print(f"Dict[str, Any]-style annotations\t{annotations}")
    print(f"package modules, lines\t{count}, {lines}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
