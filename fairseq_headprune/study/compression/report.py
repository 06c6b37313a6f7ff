"""``compress``'s OUT/report.md, written from OUT/report.json (every number read from the stages' records)."""

from typing import List, Optional

from fairseq_headprune.constants import TRANSLATION_FAMILY
from fairseq_headprune.study.compression.records import CompressReport, ExportRecord, trained_where
from fairseq_headprune.study.statistics.significance import p_value_cell


def _number(value: Optional[float], digits: int = 2) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def _count(value: int) -> str:
    return f"{value:,}"


def _pruned_lines(report: CompressReport) -> List[str]:
    search, fisher, layers = report.search, report.fisher, report.layers
    flops = search.flops
    kept_share = 100.0 * report.flops_kept_share
    what = {"heads": "heads", "joint": "heads and FFN neurons together"}.get(search.structure, search.structure)
    flops_kept = ("" if search.cost == "flops" else
                  f"; the attention and FFN layers keep {kept_share:.1f}% of their FLOPs per token")
    full_cost = layers.full_cost if layers else search.full_cost
    lines = [
        f"- **Target** `{report.target}`: the search ({what}, Kwon et al. 2022) keeps "
        f"{search.mask_cost:g} of the unpruned model's {full_cost:g} {search.unit} "
        f"({100.0 * search.mask_cost / full_cost:.1f}%; the budget {search.budget:g})"
        f"{flops_kept} ({flops.sequence_length} attended positions per token).",
        f"- **Pruned**: {search.heads_pruned} of {search.heads_total} heads"
        + (f" (`{search.spec}`)" if search.spec else "")
        + (f"; {search.neurons_pruned} of {search.neurons_total} FFN neurons" if search.neurons_total else "")
        + ".",
        f"- **Fisher information** of the masks on {', '.join(fisher.subsets)} ({fisher.sentences} sentences).",
    ]
    if layers:
        steps = ", ".join(f"{step.stack} layer {step.layer} ({step.loss:.3f})" for step in layers.steps)
        lines.insert(0, f"- **Whole layers removed** first: `{layers.spec}`, one at a time by the loss on "
                        f"{', '.join(layers.subsets)} ({layers.sentences} sentences; {layers.base_loss:.3f} "
                        f"with every layer): {steps}; the shallower model keeps "
                        f"{100.0 * layers.kept_cost / layers.full_cost:.1f}% of the {layers.cost} cost "
                        f"before the search.")
    decoding = search.decoding_flops
    if decoding:
        layers_full = layers.full_cost if layers else None
        kept, whole = decoding.layers_share(layers_full), decoding.whole_share(layers_full)
        lines.insert(1, f"- **Decoding FLOPs** per translated sentence (beam {decoding.beam}, "
                        f"{decoding.source_length} source tokens, {decoding.target_steps} decoder steps, </s> "
                        f"included): the attention and FFN layers keep {100.0 * kept:.1f}% of the unpruned "
                        f"model's; with the output projection, which no pruning removes, the model keeps "
                        f"{100.0 * whole:.1f}%.")
    tuning = search.tuning
    if tuning is None:
        lines.append(f"- **Mask tuning**: none ({search.tuning_skipped or '`--no-tune`'}).")
    else:
        lines.append(f"- **Mask tuning** by least squares on {tuning.sentences} sentences: {tuning.fitted} "
                     f"of {tuning.layers} layers fitted, folded into the compressed weights.")
    finetune = report.finetune
    if finetune is not None:
        start = ("the tuned weights (the tuning folded in, the pruned units masked)" if finetune.start == "tuned"
                 else "the original weights with the pruned units masked (no tuning)")
        lines.append(f"- **Fine-tuning** with the pruned units held at zero: {finetune.updates} updates on "
                     f"{finetune.train_subset} in {finetune.seconds_training:.1f} s"
                     + (" " + trained_where(finetune.device, finetune.precision, finetune.processes)
                        if finetune.device else "")
                     + ", learning rate "
                     f"{finetune.lr:g} ({finetune.lr_schedule}, {finetune.warmup_updates} warm-up "
                     f"updates), from {start}"
                     + ("; the targets: the unpruned model's translations of the training sources (sequence-level "
                        "distillation)" if finetune.targets == "distilled" else "")
                     + (f"; the loss: {1 - finetune.word_distillation.weight:g} of the label-smoothed "
                        f"cross-entropy and {finetune.word_distillation.weight:g} of the cross-entropy against "
                        "the unpruned model's word distributions (word-level distillation)"
                        if finetune.word_distillation else "") + ".")
        if finetune.memory:
            lines.append(f"- **Memory**: {finetune.memory.text()} (an estimate: "
                         "docs/removal-and-export.md, \"Memory\").")
    distill = report.distill
    if distill is not None:
        lines.append(f"- **Distillation data**: the unpruned model translated the {distill.sentences} sentences of "
                     f"{distill.split} in {distill.seconds_translating:.1f} s ({distill.target_tokens} "
                     f"target tokens against the references' {distill.reference_tokens}; "
                     f"{distill.identical_to_reference} translations equal their reference).")
    return lines


def _quality(report: CompressReport) -> List[str]:
    evaluation = report.evaluation
    label, test = evaluation.label, evaluation.test
    lines = [
        f"## {label[:1].upper() + label[1:]} on {evaluation.split}",
        "",
        f"{evaluation.sentences} sentences; {evaluation.description}. The compressed model is tested against "
        f"the unpruned one ({test.test}, {test.samples} resamples, seed {test.seed}).",
        "",
        f"| model | {label} | Δ | p-value | 95% interval |",
        "|---|---:|---:|---:|---|",
        f"| unpruned | {_number(evaluation.unpruned)} | | | |",
        *([f"| pruned, before fine-tuning | {_number(evaluation.before_finetune)} | "
           f"{evaluation.before_finetune - evaluation.unpruned:+.2f} | | |"]
          if evaluation.before_finetune is not None else []),
        f"| compressed | {_number(evaluation.compressed)} | {evaluation.delta:+.2f} | "
        f"{p_value_cell(evaluation.p_value, test.samples)} | "
        + ("" if evaluation.ci_low is None else f"{evaluation.ci_low:.2f}–{evaluation.ci_high:.2f}")
        + " |",
        "",
        ("The difference is significant" if evaluation.significant else "The difference is not significant")
        + f" at p < {test.alpha:g}.",
    ]
    return lines


def _size(report: CompressReport) -> List[str]:
    shrink = report.shrink
    parameters = shrink.parameters
    removed = 1.0 - parameters.compressed / parameters.unpruned
    layers = report.layers
    by_part = "By part:"
    if layers is not None and layers.parameters is not None and layers.parameters.kept:
        # the shrink stage's table starts from the shallower model: say so, and what the layers took first
        kept = layers.parameters.kept
        by_part = (f"Removing `{layers.spec}` first took the model to {_count(kept)} parameters "
                   f"({1.0 - kept / parameters.unpruned:.1%} fewer); the table, by part, starts from that "
                   f"shallower model and shows what the search removed from it:")
    lines = [
        "## Size",
        "",
        f"{_count(parameters.unpruned)} parameters unpruned, {_count(parameters.compressed)} compressed "
        f"({removed:.1%} fewer; shared embeddings counted once). {by_part}",
        "",
    ]
    rows = [line.split("\t") for line in shrink.report]
    if not rows:  # whole layers removed only: the search removed nothing from the shallower model
        return lines[:-2] + [lines[-2].replace(by_part, by_part.split(";")[0] + ".")]
    lines.append("| " + " | ".join(rows[0]) + " |")
    lines.append("|---|" + "---:|" * (len(rows[0]) - 1))
    lines += ["| " + " | ".join(row) + " |" for row in rows[1:]]
    return lines


def _speed(report: CompressReport) -> List[str]:
    speed = report.speed
    environment = speed.environment
    translation = report.family == TRANSLATION_FAMILY
    unit = "sentences" if translation else "examples"
    lines = [
        "## Decoding speed" if translation else "## Speed",
        "",
        f"On {environment['device']}; torch {environment['torch']}, fairseq "
        f"{environment['fairseq']}, CTranslate2 {environment['ctranslate2'] or 'not installed'}, "
        f"fairseq-headprune {environment['fairseq_headprune']}. The first {speed.settings.sentences or 'all'} "
        f"{unit} of {speed.split}, every system on the same batches and in its own process, a warm-up then "
        f"{speed.settings.repeats} rounds with the order rotated; median rate (min–max)."
        + (f" Beam {speed.decoding.beam}, length penalty {speed.decoding.lenpen:g} in both engines."
           if speed.decoding else "")
        + (f" CPU: {environment['cpu']} ({', '.join(environment.get('isa') or ['no vector extensions listed'])})."
           if environment.get("cpu") else "")
        + (f" CTranslate2's kernels: {'; '.join(environment['ctranslate2_kernels'])}."
           if environment.get("ctranslate2_kernels") else ""),
        "",
    ]
    if translation and not any(row.ctranslate2 for row in speed.rows):
        lines += ["No CTranslate2 model was timed (run with `--export ctranslate2`).", ""]
    headline = _like_for_like_line(speed.rows)
    if headline:
        lines += [headline, ""]
    sources = _speed_sources(speed.rows)
    if sources:
        lines += sources + [""]
    lines += [
        f"| batch | system | {unit}/s | tokens/s | vs fairseq unpruned | like for like | vs the stock conversion | "
        + ("BLEU | " if translation else "") + "same outputs |",
        "|---:|---|---:|---:|---:|---:|---:|" + ("---:|" if translation else "") + "---:|",
    ]
    for row in speed.rows:
        same = ("" if row.same_hypotheses is None
                else f"{row.same_hypotheses}/{row.sentences} as {row.same_hypotheses_as}")
        like, stock = row.speedup_like_for_like, row.speedup_vs_stock_conversion
        lines.append(
            f"| {row.batch_size} | {row.system} | {row.sentences_per_second:.1f} "
            f"({row.sentences_per_second_min:.1f}–{row.sentences_per_second_max:.1f}) | "
            f"{row.tokens_per_second:.0f} | {row.speedup_vs_fairseq_unpruned:.2f}× | "
            f"{'' if like is None else f'{like:.2f}×'} | {'' if stock is None else f'{stock:.2f}×'} | "
            + (f"{_number(row.bleu)} | " if translation else "") + f"{same} |"
        )
    if translation:
        lines += ["", "BLEU here is sacreBLEU on the timed sentences' tokens (no tokenization); the evaluation "
                      "above is the reference."]
    prediction = report.speedup_prediction
    if prediction and prediction.measured:
        lines += ["", f"The search's latency table predicted {prediction.predicted:.2f}× for the exported model "
                      f"at batch {prediction.batch_size} (beam {prediction.beam}); measured here: "
                      f"{prediction.measured:.2f}× ({100.0 * prediction.relative_error:+.0f}%)."]
    return lines


def _like_for_like_line(rows) -> str:
    """The headline: each compressed model against the unpruned one in the same engine, compute type and map."""
    compressed = [row for row in rows if row.compressed and row.speedup_like_for_like is not None]
    if not compressed:
        return ""
    by_system: dict = {}
    for row in compressed:
        by_system.setdefault(row.system, []).append(f"{row.speedup_like_for_like:.2f}× at batch "
                                                       f"{row.batch_size}")
    return ("**Like for like** (against the unpruned model in the same engine, compute type and vocabulary-map "
            "setting, the same beam): " + "; ".join(f"{system} {', '.join(values)}"
                                                    for system, values in by_system.items()) + ".")


def _speed_sources(rows) -> List[str]:
    """Where the speed-up over fairseq's unpruned model comes from, step by step, for each compressed model timed
    with its vocabulary map: CTranslate2 (the unpruned model converted as it is), its vocabulary map (the unpruned
    model with and without), and compressing (like for like). Each factor is a quotient of the row's own speed-ups,
    so their product is its speed-up over fairseq's unpruned model."""
    lines = []
    for row in rows:
        total, like, stock = (row.speedup_vs_fairseq_unpruned, row.speedup_like_for_like,
                              row.speedup_vs_stock_conversion)
        if not row.vocabulary_mapped or None in (total, like, stock):
            continue
        lines.append(f"- batch {row.batch_size}, `{row.system}`: CTranslate2 {total / stock:.2f}× (the unpruned "
                     f"model converted as it is) × its vocabulary map {stock / like:.2f}× (the unpruned model with "
                     f"and without) × compressing {like:.2f}× (like for like) = {total:.2f}× fairseq's unpruned "
                     f"model.")
    if not lines:
        return []
    return ["**Where the speed-up comes from**, each factor the ratio of two rows below:", "", *lines]


def _beams(report: CompressReport) -> List[str]:
    """``--speed-beams``: the compressed model at other beam sizes, against the unpruned model at the same beam and
    at the run's."""
    evaluation, speed = report.evaluation, report.speed
    if not evaluation.beams:
        return []
    run_beam = None if speed.decoding is None else speed.decoding.beam
    label, samples = evaluation.label, evaluation.test.samples
    lines = ["", "## Beam sizes", "",
             f"The compressed model decoded with other beam sizes than the run's ({run_beam}); each {label} tested "
             f"against the unpruned model at the same beam and at beam {run_beam}.", "",
             f"| beam | {label} unpruned | {label} compressed | Δ, same beam | p | "
             f"Δ vs unpruned at beam {run_beam} | p |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    for row in evaluation.beams:
        lines.append(f"| {row.beam} | {_number(row.unpruned)} | {_number(row.compressed)} | "
                     f"{row.delta:+.2f} | {p_value_cell(row.p_value, samples)} | "
                     f"{row.delta_vs_run_beam:+.2f} | {p_value_cell(row.p_value_vs_run_beam, samples)} |")
    compressed = [row for row in speed.beam_rows if row.compressed]
    if compressed:
        lines += ["", f"| beam | batch | system | sentences/s | like for like (same beam) | vs unpruned at beam "
                      f"{run_beam} |", "|---:|---:|---|---:|---:|---:|"]
        for row in compressed:
            like, run = row.speedup_like_for_like, row.speedup_vs_run_beam
            lines.append(f"| {row.beam} | {row.batch_size} | {row.system} | "
                         f"{row.sentences_per_second:.1f} | {'' if like is None else f'{like:.2f}×'} | "
                         f"{'' if run is None else f'{run:.2f}×'} |")
    return lines


def _quantization_choice(exported: Optional[ExportRecord]) -> List[str]:
    """``--quantization auto``: every compute type timed, its speed and BLEU, and the one kept."""
    choice = None if exported is None else exported.quantization_choice
    if choice is None:
        return []
    lines = ["", "## Compute type (`--quantization auto`)", ""]
    if choice.note:
        return lines + [choice.note + "."]
    batch_sizes = list(choice.candidates[0].sentences_per_second)
    lines += ["| compute type | " + " | ".join(f"sent/s, batch {b}" for b in batch_sizes) + " | BLEU | kept |",
              "|---|" + "---:|" * len(batch_sizes) + "---:|---|"]
    for candidate in choice.candidates:
        rates = " | ".join(f"{candidate.sentences_per_second[b]:.1f}" for b in batch_sizes)
        kept = "**chosen**" if candidate.compute_type == choice.chosen else (
            f"more than {choice.tolerance:g} BLEU below float32" if candidate.compute_type in choice.too_inaccurate
            else "slower")
        lines.append(f"| {candidate.compute_type} | {rates} | {candidate.bleu:.2f} | {kept} |")
    lines += ["", f"The compressed model, exported in float32 and loaded at each compute type, each in its own "
                  f"process, decoded the first {choice.sentences or 'all'} sentences of {choice.split} "
                  "(without the vocabulary map); BLEU is sacreBLEU on their tokens, averaged over the batch sizes. "
                  f"The fastest over all batch sizes whose BLEU is within {choice.tolerance:g} of float32's "
                  "is exported."]
    return lines


def _readable_target(target: str) -> str:
    """A target as a reader takes it: a speed-up attempt's computed share (``decoding-flops=41.1721%``) to one
    decimal; the run's identity keeps the exact one."""
    kind, _, value = target.partition("=")
    if value.endswith("%") and "." in value:
        return f"{kind}={float(value[:-1]):.1f}%"
    return target


def compression_report_markdown(report: CompressReport) -> str:
    """The report of one compress run, from its report.json."""
    files = report.files
    exported = report.export
    lines = [
        f"# Compressed model: {_readable_target(report.target)}",
        "",
        f"`fairseq-headprune compress` of `{report.checkpoint}` on `{report.data}` ({report.family}).",
        "",
        f"- **Compressed checkpoint**: `{files.checkpoint}` (its heads and neurons removed; load it with the "
        "plugin's task, e.g. `fairseq-headprune generate DATA --path` it).",
    ]
    if exported is not None:
        lines.append(f"- **{exported.format} model**: `{files.exported}` ({exported.quantization}).")
    lines += _pruned_lines(report) + [""] + _quality(report) + [""] + _size(report) + [""] + _speed(report)
    lines += _beams(report)
    lines += _quantization_choice(exported)
    lines += ["", "## Stages", "", "| stage | this run | seconds |", "|---|---|---:|"]
    for stage, status in report.stages.items():
        seconds = status.seconds
        lines.append(f"| {stage} | {'kept from an earlier run' if status.status == 'kept' else 'ran'} | "
                     f"{'' if seconds is None else f'{seconds:.1f}'} |")
    return "\n".join(lines) + "\n"
