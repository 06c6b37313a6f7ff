"""``compress --target speedup=Nx``'s console: the cost estimate, each stage, each attempt as it starts and once
decided, the plan, what each step bought and the result, all from the records ``engine.pipelines.speedup.run``
hands over (report.md and report.json render the same records)."""

import sys

from fairseq_headprune.study.compression.records import trained_where
from fairseq_headprune.study.compression.speedup.report import before_finetune_text
from fairseq_headprune.study.statistics.significance import p_value_text


def print_stage(stage: str, status: str, seconds) -> None:
    """A stage starting, kept from an earlier run, or done (every compress run prints its stages so)."""
    if status == "running":
        print(f"{stage}\t...", flush=True)
    elif status == "kept":
        print(f"{stage}\tkept from an earlier run", flush=True)
    else:
        print(f"{stage}\tdone in {seconds:.1f} s", flush=True)


def _print_attempt_start(number: int, shape, continues) -> None:
    """An attempt's shape, as it starts (``engine.pipelines.speedup.run``)."""
    damage = "not measured" if shape.damage is None else f"+{shape.damage:.3f} loss"
    print(f"attempt {number}\t{shape.candidate.name} ({shape.flops_share:.1%} of the decoding FLOPs kept, damage "
          f"{damage})" + (f", fine-tuning continued from attempt {continues}" if continues is not None else ""),
          flush=True)


def _attempt_printer(max_bleu_loss: float):
    """What an attempt measured and the decision that followed, from its record (what report.json holds): where
    a GPU fine-tuned it, that too (the CPU trains in float32 alone; report.md states either)."""
    def print_attempt(record) -> None:
        score, finetune = record.score, record.finetune
        print(f"attempt {record.attempt}\t{score.metric} {score.delta:+.2f} on {score.split} "
              f"(tolerance -{max_bleu_loss:g})"
              + (f" after {finetune.updates} updates ({finetune.stopped})" if finetune.stopped else "")
              + (" " + trained_where(finetune.device, finetune.precision, finetune.processes)
                 if finetune.device not in ("", "cpu") or finetune.processes > 1 else "")
              + f", {record.speedups.text(lows=record.speedup_lows)} like for like: {record.decision}", flush=True)
    return print_attempt


def _print_warning(text: str) -> None:
    print(f"warning\t{text}", flush=True)


def _print_cost(lines) -> None:
    for line in lines:
        print(f"cost\t{line}", flush=True)


def command_speedup(settings, dry_run: bool = False) -> int:
    """``--target speedup=Nx``: the cost, the plan, each attempt and the result (``engine.pipelines.speedup.run``);
    ``dry_run``: the cost alone."""
    from fairseq_headprune.engine.pipelines.speedup.run import run_speedup

    outcome = run_speedup(settings, on_stage=print_stage, on_attempt_start=_print_attempt_start,
                          on_attempt=_attempt_printer(settings.speedup.max_bleu_loss), on_warning=_print_warning,
                          on_cost=_print_cost, dry_run=dry_run)
    report = outcome.report
    if report is None:
        print(f"dry run\tstopped before the plan; the same command without --dry-run runs it from "
              f"{settings.out_dir}/cost", flush=True)
        return 0
    plan, result = report.plan, report.result
    batches = plan.batch_sizes
    chosen = report.chosen
    print(f"plan\t{len(plan.candidates)} shapes timed against the unpruned model with its vocabulary map, their "
          f"damage measured on {plan.split}"
          + (f" ({plan.damage_sentences} of its {plan.damage_sampled_from} sentences)" if plan.damage_sampled_from
             else "") + f"; chosen: {chosen.candidate.name} ("
          + chosen.speedups.text(batches)
          + ("" if chosen.damage is None else f"; damage +{chosen.damage:.3f}"
             + ("" if chosen.damage_se is None else f" ± {chosen.damage_se:.3f}") + " loss") + ")")
    for step, speedups in report.breakdown.items():
        print(f"bought\t{step}: {speedups.text(batches)}")
    decided, reported = result.decided, result.reported
    print(f"result\tattempt {result.attempt} on {reported.split}: "
          + result.speedups.text(batches)
          + f" like for like; {reported.metric} {reported.unpruned:.2f} -> {reported.compressed:.2f} "
          f"({reported.delta:+.2f}, {p_value_text(reported.p_value, reported.samples)})"
          + before_finetune_text(report)
          + f"; decided on {decided.split}: {decided.delta:+.2f} ({p_value_text(decided.p_value, decided.samples)}), "
          + ("within" if report.within_tolerance else "NOT within") + " the tolerance; target "
          + ("reached" if report.reached_target else "NOT reached at every batch size"))
    for batch, row in result.prediction.items():
        print(f"predicted\tbatch {batch}\t{row.predicted:.2f}x by the plan's timing of the shape, measured "
              f"{row.measured:.2f}x ({100.0 * row.relative_error:+.0f}%)")
    print(f"compressed\t{result.checkpoint}")
    print(f"exported\t{result.exported}")
    print("wrote\t" + " ".join(outcome.files))
    sys.stdout.flush()
    return 0
