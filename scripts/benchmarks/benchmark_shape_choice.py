#!/usr/bin/env python
"""Does choosing the least damaged shape beat choosing the one that keeps the most FLOPs? One plan, both shapes.

``compress --target speedup=Nx`` chooses, among the shapes its plan times fast
enough, the least damaged before fine-tuning (the validation loss with the
shape's layers removed and every layer narrowed by Fisher information). The
earlier rule chose the one that keeps the most decoding FLOPs. This benchmark
takes a finished speed-up run, given by the same arguments as its command,
compresses the shape the earlier rule would have chosen exactly as the run's
attempts are compressed (the same plan, layers chosen by the loss, search,
fine-tuning until it is enough, its stop rule), into OUT/flops-max/, and sets
it beside the shape the run chose, fine-tuned alike (its first attempt, in
OUT/damage/, linked, evaluated on test there unless it was the run's result):
damage, fine-tuning, validation and test BLEU change (paired bootstrap),
speed-ups like for like. Both are judged by the same code on the same splits;
the test split is translated once for each.

usage: scripts/benchmarks/benchmark_shape_choice.py DATA --path CKPT --target speedup=Nx --out-dir OUT [the run's
           other compress options, fairseq's generation options ...] [--json FILE]
"""

import json
import os
import sys


def main():
    argv = list(sys.argv[1:])
    json_file = None
    if "--json" in argv:
        index = argv.index("--json")
        json_file = argv[index + 1] if index + 1 < len(argv) else sys.exit("benchmark_shape_choice: --json FILE")
        del argv[index:index + 2]
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        sys.exit(0 if argv else 2)

    from fairseq_headprune.cli import build_parser
    from fairseq_headprune.commands.compress import compress_settings
    from fairseq_headprune.engine.runtime.console import quiet_libraries
    from fairseq_headprune.errors import HeadPruneError
    from fairseq_headprune.study.compression.speedup.records import SpeedupReport
    from fairseq_headprune.study.compression.speedup.rules import choose_candidate
    from fairseq_headprune.study.compression.speedup.shapes import PlannedCandidate
    from fairseq_headprune.study.statistics.significance import p_value_text

    quiet_libraries()

    def fail(message):
        sys.exit(f"benchmark_shape_choice: {message}")

    args, extra = build_parser().parse_known_args(["compress", *argv])
    args.fairseq_args = extra
    try:
        settings = compress_settings(args)
    except HeadPruneError as error:
        fail(str(error))
    report_file = os.path.join(settings.out_dir, "report.json")
    if not os.path.isfile(report_file):
        fail(f"{report_file} does not exist: give the arguments of a finished compress --target speedup=Nx run")
    with open(report_file, encoding="utf-8") as stream:
        report = SpeedupReport.from_dict(json.load(stream))
    plan = report.plan
    # the earlier rule: the most decoding FLOPs kept among the shapes fast enough, damage not looked at
    unmeasured = [PlannedCandidate(c.candidate, c.flops_share, c.speedups) for c in plan.candidates]
    flops_max = choose_candidate(unmeasured, report.factor, plan.margin)
    chosen = plan.chosen
    print(f"plan: {len(plan.candidates)} shapes; chosen by damage: {plan.candidates[chosen].candidate.name}; "
          f"by FLOPs kept: {plan.candidates[flops_max].candidate.name}", flush=True)
    if flops_max == chosen:
        print("the two rules choose the same shape: nothing to compare")
        return

    from fairseq_headprune.engine.pipelines.speedup.run import compress_shape

    def tell(stage, status, seconds):
        if status != "running":
            print(f"flops-max\t{stage}\t{status}" + ("" if seconds is None else f" in {seconds:.1f} s"), flush=True)

    rows = []
    for rule, shape in (("damage", chosen), ("flops-max", flops_max)):
        first = report.attempts[0]
        if rule == "damage" and report.result.attempt == 1 and first.continued_from is None:
            rows.append((rule, report.result, first))  # the run's result is that shape's first fine-tuning
            continue
        try:
            record, result = compress_shape(settings, shape, os.path.join(settings.out_dir, rule), tell)
        except HeadPruneError as error:
            fail(str(error))
        rows.append((rule, result, record))
    batches = plan.batch_sizes
    print("\nrule\tshape\tdecoding FLOPs kept\tdamage\tfine-tuning\tvalid BLEU change\ttest BLEU change\t"
          + "\t".join(f"batch {b}" for b in batches))
    figures = []
    for rule, outcome, attempt in rows:
        shape = attempt.shape
        decided, reported = outcome.decided, outcome.reported
        finetune = attempt.finetune
        print(f"{rule}\t{shape.candidate.name}\t{100 * shape.flops_share:.1f}%\t+{shape.damage:.3f}\t"
              f"{finetune.updates} updates ({finetune.stopped})\t{decided.delta:+.2f} "
              f"({p_value_text(decided.p_value, decided.samples)})\t{reported.delta:+.2f} "
              f"({p_value_text(reported.p_value, reported.samples)})\t"
              + "\t".join(f"{outcome.speedups.get(b, float('nan')):.2f}x" for b in batches))
        figures.append({"rule": rule, "shape": shape.to_dict(), "finetune": finetune.to_dict(),
                        "decided": decided.to_dict(), "reported": reported.to_dict(),
                        "speedups": outcome.speedups.to_dict()})
    if json_file:
        with open(json_file, "w", encoding="utf-8") as stream:
            json.dump({"run": os.path.abspath(settings.out_dir), "rows": figures}, stream, indent=1)


if __name__ == "__main__":
    main()
