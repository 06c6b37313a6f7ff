"""Options the removal benchmarks (``scripts/benchmarks/benchmark_*_speed.py``) share; not a sub-command."""

import argparse


def add_removal_arguments(parser: argparse.ArgumentParser) -> None:
    """Which heads are removed, where the shrunk checkpoints and measurements go, fairseq's path beside."""
    parser.add_argument("--importance", help="importance .json: remove the least important heads")
    parser.add_argument("--seed", type=int, default=1, help="seed of the random choice (default: 1)")
    parser.add_argument("--cpu", action="store_true", help="CPU even if a GPU is present")
    parser.add_argument("--no-unfused", action="store_true",
                        help="skip the masked and shrunk models on fairseq's unfused attention path")
    parser.add_argument("--json", metavar="FILE", help="also write the measurements as JSON")
    parser.add_argument("--keep-dir", metavar="DIR",
                        help="keep the shrunk checkpoints in DIR (default: a temporary directory)")
