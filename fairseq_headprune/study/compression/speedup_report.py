"""``compress --target speedup=Nx``'s OUT/report.md, written from its report (``speedup_records.SpeedupReport``)."""

from fairseq_headprune.study.compression.speedup import disturbed_plan_text
from fairseq_headprune.study.compression.speedup_records import SpeedupReport
from fairseq_headprune.study.statistics.significance import p_value_cell, p_value_text


def speedup_report_markdown(report: SpeedupReport) -> str:
    """OUT/report.md of ``compress --target speedup=Nx``: the shapes timed, what each step bought, every attempt
    and the result (``engine.pipelines.speedup``)."""
    plan, result, factor = report.plan, report.result, report.factor
    batches = [str(b) for b in plan.batch_sizes]
    lines = [f"# compress {report.target}", "",
             f"`{report.checkpoint}`: decoding {factor:g}x as fast in CTranslate2 ({plan.quantization}) as the "
             f"unpruned model, both with the vocabulary map, losing at most {report.max_bleu_loss:g} BLEU.", "",
             "## Result", ""]
    speed = ", ".join(f"{result.speedups[b]:.2f}x at batch {b}" for b in batches if b in result.speedups)
    lines.append(f"Attempt {result.attempt}: {speed} like for like; BLEU {result.delta:+.2f} "
                 f"({p_value_text(result.p_value, result.samples)}); "
                 + ("within the tolerance" if report.within_tolerance else "**not** within the tolerance")
                 + ("; the target speed-up reached." if report.reached_target
                    else "; the target speed-up **not** reached at every batch size.")
                 + f" Its own report: `{result.report}`.")
    if result.prediction:
        timed = [f"{row.predicted:.2f}x at batch {b} ({100 * row.relative_error:+.0f}% against the "
                 f"{row.measured:.2f}x measured)" for b, row in result.prediction.items()]
        lines += ["", "The plan timed the shape (every layer narrowed alike) at " + ", ".join(timed) + "."]
    lines += ["", "## The shapes timed", "",
              f"Each shape exported with the vocabulary map and timed against the unpruned model with its own map, "
              f"each in its own process, {plan.repeats} rotated rounds, on the first {plan.sentences} "
              f"sentences of {plan.split}, beam {plan.beam}, exactly {plan.target_length} tokens "
              "generated. Decoding FLOPs: the attention and FFN layers', as a share of the unpruned model's.", "",
              "| shape | decoding FLOPs kept | " + " | ".join(f"batch {b}" for b in batches) + " |",
              "|---|---:|" + "---:|" * len(batches)]
    for index, candidate in enumerate(plan.candidates):
        mark = " **(chosen)**" if index == plan.chosen else ""
        lines.append(f"| {candidate.candidate.name}{mark} | {100.0 * candidate.flops_share:.1f}% | "
                     + " | ".join(f"{candidate.speedups[b]:.2f}x" for b in batches) + " |")
    if plan.out_of_order:
        lines += ["", "**Warning:** " + disturbed_plan_text(plan.out_of_order, "plan/") + "."]
    lines += ["", "What each step bought (the plan's timing run; speed-ups multiply):", ""]
    for step, speedups in report.breakdown.items():
        lines.append(f"- {step}: " + ", ".join(f"{speedups[b]:.2f}x at batch {b}" for b in batches if b in speedups))
    lines += ["", "## Attempts", "", "| attempt | shape | fine-tuning | BLEU change | p | "
              + " | ".join(f"batch {b}" for b in batches) + " | then |",
              "|---:|---|---|---:|---:|" + "---:|" * len(batches) + "---|"]
    for attempt in report.attempts:
        tuning = f"{attempt.finetune_updates} updates" + (f", continuing {attempt.continued_from}"
                                                          if attempt.continued_from else "")
        speeds = " | ".join(f"{attempt.speedups[b]:.2f}x" if b in attempt.speedups else "" for b in batches)
        lines.append(f"| {attempt.attempt} | {attempt.shape.candidate.name} | {tuning} | {attempt.delta:+.2f} | "
                     f"{p_value_cell(attempt.p_value, attempt.samples)} | {speeds} | {attempt.decision} |")
    return "\n".join(lines) + "\n"
