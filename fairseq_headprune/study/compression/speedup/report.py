"""``compress --target speedup=Nx``'s OUT/report.md, written from its report (``records.SpeedupReport``)."""

from typing import List

from fairseq_headprune.study.compression.records import ScoreChange, trained_where
from fairseq_headprune.study.compression.speedup.records import AttemptRecord, PlanRecord, SpeedupReport
from fairseq_headprune.study.compression.speedup.rules import REFINED_REACHING, SCREEN_SHORTFALL, damage_order
from fairseq_headprune.study.compression.speedup.shapes import disturbed_plan_text
from fairseq_headprune.study.statistics.significance import p_value_cell, p_value_text


def _change(score: ScoreChange) -> str:
    return (f"{score.metric} {score.unpruned:.2f} -> {score.compressed:.2f} ({score.delta:+.2f}, "
            f"{p_value_text(score.p_value, score.samples)})")


def _finetuning(attempt: AttemptRecord) -> str:
    finetune = attempt.finetune
    text = f"{finetune.updates} updates"
    if finetune.seconds is not None:
        where = trained_where(finetune.device, finetune.precision, finetune.processes)
        text += f" in {finetune.seconds / 60:.1f} min {where}"
    if finetune.stopped:
        text += f", stopped: {finetune.stopped}"
    if finetune.kept_updates is not None and finetune.kept_updates != finetune.updates:
        text += f", kept the one after {finetune.kept_updates}"
    return text + (f", continuing {attempt.continued_from}" if attempt.continued_from else "")


def _curves(report: SpeedupReport) -> List[str]:
    """Each attempt's validations during its fine-tuning (the recovery curve)."""
    lines = []
    for attempt in report.attempts:
        curve = attempt.finetune.curve
        if not curve:
            continue
        if not lines:
            reference, split = report.plan.stop_score, report.plan.stop_subset or attempt.score.split
            lines = ["", "## Recovery during fine-tuning", "",
                     f"fairseq's validation BLEU on {split} (tokenized, the run's beam and lengths) "
                     "after each number of updates"
                     + ("." if reference is None else
                        f"; the unpruned model scores {reference:.2f} there (the studies' evaluation)."), ""]
        points = ", ".join(f"{point.updates}: {point.bleu:.2f}" for point in curve)
        lines.append(f"- attempt {attempt.attempt} ({attempt.shape.candidate.name}): {points}")
    return lines


def _halves_text(report: SpeedupReport) -> str:
    """What read which half of the decision split (``--decision-half``)."""
    halves = report.halves
    if halves is None:
        return ""
    return (f" {halves.decide} and {halves.fit} are the odd- and even-numbered sentences of {halves.split} "
            f"({halves.decide_sentences} and {halves.fit_sentences}): the Fisher scores, the plan's damage, mask "
            f"tuning and the fine-tuning's validations (its stop and the checkpoint kept) read {halves.fit}, so that "
            f"{halves.decide} judges what was chosen on other sentences.")


def before_finetune_text(report: SpeedupReport) -> str:
    """The result's score before its fine-tuning, for the result line: a continued fine-tuning started from the
    earlier attempt's fine-tuned weights, so that score is where the continuation began, and says so."""
    reported = report.result.reported
    if reported.before_finetune is None:
        return ""
    continued = next((a.continued_from for a in report.attempts if a.attempt == report.result.attempt), None)
    if continued:
        return f", {reported.before_finetune:.2f} where its fine-tuning continued from {continued}"
    return f", {reported.before_finetune:.2f} before fine-tuning"


def _rounds_text(plan: PlanRecord) -> str:
    """The plan's timing rounds: all at --repeats, or screened first and refined where the timing decides."""
    if not plan.screened:
        return f"{plan.repeats} rotated rounds"
    refined = sum(candidate.rounds == plan.repeats for candidate in plan.candidates)
    return (f"in rotated rounds: every shape {plan.screen_rounds} round{'s' if plan.screen_rounds > 1 else ''}, "
            f"then the {refined} whose timing decides the choice (timed within {SCREEN_SHORTFALL:.0%} of the target "
            f"at every batch size, the least damaged down to the {_ordinal(REFINED_REACHING)} at the target plus "
            f"the margin) {plan.repeats} rounds")


def _ordinal(number: int) -> str:
    return {1: "first", 2: "second", 3: "third", 4: "fourth", 5: "fifth"}.get(number, f"{number}th")


def shapes_section(plan: PlanRecord) -> List[str]:
    """The plan's table: every shape timed, its decoding-FLOPs share and damage, least damaged first."""
    factor = plan.factor  # the target the plan chose for (part of the run's identity)
    batches = plan.batch_sizes
    screened = int(plan.screened)
    lines = ["", "## The shapes timed", "",
             f"Each shape exported with the vocabulary map and timed against the unpruned model with its own map, "
             f"each in its own process, {_rounds_text(plan)}, on the first {plan.sentences} "
             f"sentences of {plan.split}, beam {plan.beam}, exactly {plan.target_length} tokens "
             "generated. Decoding FLOPs: the attention and FFN layers', as a share of the unpruned model's. Damage: "
             f"the loss on {plan.damage_sentences} sentences of {plan.split}"
             + (f" (drawn at random from its {plan.damage_sampled_from})" if plan.damage_sampled_from else "")
             + " before fine-tuning, over the unpruned model's"
             + ("" if plan.base_loss is None else f" ({plan.base_loss:.3f})")
             + ", with the shape's layers removed (those the loss misses least) and every other layer keeping its "
             "heads and FFN neurons of highest Fisher information. The choice: the least damaged shape timed at "
             f"{factor * (1 + plan.margin):g}x or more at every batch size ({factor:g}x plus {plan.margin:.0%}), "
             f"else at {factor:g}x." + (" ± the damage's standard error over the batches." if any(
                 c.damage_se is not None for c in plan.candidates) else ""), "",
             "| shape | decoding FLOPs kept | damage | " + " | ".join(f"batch {b}" for b in batches) + " |"
             + (" rounds |" if screened else ""),
             "|---|---:|---:|" + "---:|" * (len(batches) + screened)]
    for index in damage_order(plan.candidates):
        candidate = plan.candidates[index]
        mark = " **(chosen)**" if index == plan.chosen else ""
        damage = "" if candidate.damage is None else f"+{candidate.damage:.3f}" + (
            "" if candidate.damage_se is None else f" ± {candidate.damage_se:.3f}")
        lines.append(f"| {candidate.candidate.name}{mark} | {100.0 * candidate.flops_share:.1f}% | {damage} | "
                     + " | ".join(f"{candidate.speedups[b]:.2f}x" for b in batches) + " |"
                     + (f" {candidate.rounds} |" if screened else ""))
    if plan.out_of_order:
        lines += ["", "**Warning:** " + disturbed_plan_text(plan.out_of_order, "plan/") + "."]
    return lines


def speedup_report_markdown(report: SpeedupReport) -> str:
    """OUT/report.md of ``compress --target speedup=Nx``: the result, the shapes timed and their damage, what each
    step bought, every attempt and its recovery (``engine.pipelines.speedup.run``)."""
    plan, result, factor = report.plan, report.result, report.factor
    batches = plan.batch_sizes
    decided, reported = result.decided, result.reported
    lines = [f"# compress {report.target}", "",
             f"`{report.checkpoint}`: decoding {factor:g}x as fast in CTranslate2 ({plan.quantization}) as the "
             f"unpruned model, both with the vocabulary map, losing at most {report.max_bleu_loss:g} BLEU. Every "
             f"decision read {decided.split}; {reported.split} was translated once, for the result."
             + _halves_text(report), "", "## Result", ""]
    lines.append(f"Attempt {result.attempt}, on {reported.split}: {result.speedups.text(batches)} like for like; "
                 f"{_change(reported)}"
                 + before_finetune_text(report)
                 + ("; the target speed-up reached." if report.reached_target
                    else "; the target speed-up **not** reached at every batch size."))
    lines += ["", f"Decided on {decided.split}: {_change(decided)}, "
                  + ("within the tolerance." if report.within_tolerance else "**not** within the tolerance.")
                  + f" Its evaluation and timing: `{result.report}`."]
    if result.prediction:
        timed = [f"{row.predicted:.2f}x at batch {b} ({100 * row.relative_error:+.0f}% against the "
                 f"{row.measured:.2f}x measured)" for b, row in result.prediction.items()]
        lines += ["", "The plan timed the shape (every layer narrowed alike) at " + ", ".join(timed) + "."]
    lines += shapes_section(plan)
    lines += ["", "What each step bought (the plan's timing run; speed-ups multiply):", ""]
    for step, speedups in report.breakdown.items():
        lines.append(f"- {step}: {speedups.text(batches)}")
    lines += ["", f"## Attempts (on {decided.split})", "",
              "| attempt | shape | fine-tuning | BLEU change | p | " + " | ".join(f"batch {b}" for b in batches)
              + " | then |", "|---:|---|---|---:|---:|" + "---:|" * len(batches) + "---|"]
    for attempt in report.attempts:
        speeds = " | ".join(_speed_cell(attempt, b) for b in batches)
        lines.append(f"| {attempt.attempt} | {attempt.shape.candidate.name} | {_finetuning(attempt)} | "
                     f"{attempt.score.delta:+.2f} | {p_value_cell(attempt.score.p_value, attempt.score.samples)} | "
                     f"{speeds} | {attempt.decision} |")
    lines += _curves(report)
    lines += _time(report)
    return "\n".join(lines) + "\n"


def _speed_cell(attempt: AttemptRecord, batch: int) -> str:
    """An attempt's speed-up at one batch size, with the low end of its interval over the timing rounds (what
    the decision read) where it was recorded."""
    if batch not in attempt.speedups:
        return ""
    low = attempt.speedup_lows.get(batch)
    return f"{attempt.speedups[batch]:.2f}x" + ("" if low is None else f" (low {low:.2f}x)")


def unreached_report_markdown(plan: PlanRecord, target: str, checkpoint: str, why: str) -> str:
    """OUT/report.md of a speed-up run whose plan timed no shape fast enough: why, and the plan's table."""
    return "\n".join([f"# compress {target}", "", f"`{checkpoint}`: no attempt was made. {why}.",
                      *shapes_section(plan)]) + "\n"


def _time(report: SpeedupReport) -> List[str]:
    """Minutes per part of the run, on the machine the speeds were timed on."""
    environment = report.plan.environment
    where = environment.get("cpu") or environment.get("device") or "this machine"
    lines = ["", "## Time", "", f"Minutes on {where} ({environment.get('threads', '?')} threads), each part as it "
             "ran (a stage an attempt took from an earlier one counted once):", "",
             "| part | minutes | of which fine-tuning |", "|---|---:|---:|"]
    minutes = report.minutes
    for part, value in minutes.items():
        if part.endswith("fine-tuning") or part == "in all":
            continue
        tuning = minutes.get(f"{part} fine-tuning")
        lines.append(f"| {part} | {value:.1f} | {'' if tuning is None else f'{tuning:.1f}'} |")
    lines.append(f"| in all | {minutes['in all']:.1f} | |")
    return lines
