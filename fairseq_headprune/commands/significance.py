"""``fairseq-headprune significance``: the sweeps' paired tests on hypothesis or prediction files."""

import argparse
import os

from fairseq_headprune.commands.common import add_test_arguments, test_settings
from fairseq_headprune.errors import SettingsError, StudyError
from fairseq_headprune.study.importance.ablation import (
    ConfigScores,
    compare_with_baseline,
    reported_bleu,
    result_rows,
    text_scores,
)
from fairseq_headprune.study.output.files import read_lines, write_json
from fairseq_headprune.study.statistics.metrics import BLEU_METRICS, CLASSIFICATION_METRICS, LANGUAGE_MODEL_METRICS
from fairseq_headprune.study.statistics.significance import p_value_cell


def command_significance(args: argparse.Namespace) -> int:
    if args.metric in LANGUAGE_MODEL_METRICS:
        return _perplexity_significance(args)
    if not args.systems:
        raise StudyError("give at least one SYSTEM to test against the BASELINE")
    if args.metric is not None:
        return _classification_significance(args)
    settings = test_settings(args)
    metric = BLEU_METRICS[args.bleu]
    test_metric = metric.for_test(settings.test)
    references = read_lines(args.reference)
    files = [args.baseline] + list(args.systems)
    texts = [read_lines(path) for path in files]
    for path, lines in zip(files, texts):
        if len(lines) != len(references):
            raise StudyError(f"{path} has {len(lines)} lines but the reference {args.reference} has {len(references)}")
    if not references:
        raise StudyError(f"the reference {args.reference} is empty")
    scores = [text_scores(os.path.basename(path), references, lines, test_metric) for path, lines in zip(files, texts)]
    results = compare_with_baseline(
        scores[0], scores[1:], settings, test_metric, references,
        tokenize="none" if args.bleu == "tokenized" else "13a",
    )
    rows = result_rows(scores[0], scores[1:], results, args.bleu)
    base = reported_bleu(scores[0], args.bleu)
    print(
        f"{metric.description}; {settings.test} test, {settings.samples} resamples "
        f"(sample ratio {settings.sample_ratio:g}), seed {settings.seed}; significant: p < {settings.alpha:g}"
    )
    header = f"{'system':<32} {'BLEU':>7} {'95% CI':>17} {'ΔBLEU':>7} {'p-value':>8}  significant"
    print(header)
    print(f"{files[0][-32:]:<32} {base:>7.2f} {'':>17} {'':>7} {'':>8}  (baseline)")
    for path, row in zip(files[1:], rows):
        interval = "" if row["ci_low"] is None else f"[{row['ci_low']:.2f}, {row['ci_high']:.2f}]"
        print(
            f"{path[-32:]:<32} {row['bleu']:>7.2f} {interval:>17} {row['delta']:>+7.2f} "
            f"{p_value_cell(row['p_value'], settings.resamples):>8}  {'yes' if row['significant'] else 'no'}"
        )
    if args.json:
        write_json(
            {"settings": {"bleu": args.bleu, "test": settings.to_dict(), "reference": args.reference,
                          "baseline": args.baseline, "baseline_bleu": base}, "rows": rows},
            args.json,
            indent=1,
        )
        print(f"wrote\t{args.json}")
    return 0


def _classification_significance(args: argparse.Namespace) -> int:
    """Gold labels in REF, one predicted label per line in BASELINE and each SYSTEM."""

    settings = test_settings(args)
    metric = CLASSIFICATION_METRICS[args.metric]
    metric.for_test(settings.test)
    references = read_lines(args.reference)
    if not references:
        raise StudyError(f"the gold labels {args.reference} are empty")
    files = [args.baseline] + list(args.systems)
    systems, values = [], []
    for path in files:
        predictions = read_lines(path)
        if len(predictions) != len(references):
            raise StudyError(f"{path} has {len(predictions)} lines but the gold labels {args.reference} "
                             f"have {len(references)}")
        statistics = metric.example_statistics(references, predictions)
        values.append(metric.score(statistics))
        # the tests read only the statistics (and, for sacreBLEU's, the text) of ConfigScores
        systems.append(ConfigScores(os.path.basename(path), "", {}, None, None, statistics, predictions))
    results = compare_with_baseline(systems[0], systems[1:], settings, metric)
    print(f"{metric.description}; {settings.test} test" + (
        f", {settings.samples} resamples, seed {settings.seed}" if settings.test == "bootstrap" else ""
    ) + f"; significant: p < {settings.alpha:g}")
    print(f"{'system':<32} {metric.column:>8} {'delta':>7} {'p-value':>8}  significant")
    print(f"{files[0][-32:]:<32} {values[0]:>8.2f} {'':>7} {'':>8}  (baseline)")
    rows = []
    for path, value, result in zip(files[1:], values[1:], results):
        print(f"{path[-32:]:<32} {value:>8.2f} {value - values[0]:>+7.2f} "
              f"{p_value_cell(result.p_value, settings.resamples):>8}  {'yes' if result.significant else 'no'}")
        rows.append({"system": path, metric.column: value, "delta": value - values[0],
                     "p_value": result.p_value, "significant": result.significant, **result.extra})
    if args.json:
        write_json({"settings": {"metric": metric.name, "test": settings.to_dict(), "reference": args.reference,
                                 "baseline": args.baseline, f"baseline_{metric.column}": values[0]},
                    "rows": rows}, args.json, indent=1)
        print(f"wrote\t{args.json}")
    return 0


def _perplexity_significance(args: argparse.Namespace) -> int:
    """Per-sentence ``LOSS TOKENS`` files; no reference, so the first file is the baseline."""

    settings = test_settings(args)
    metric = LANGUAGE_MODEL_METRICS[args.metric]
    metric.for_test(settings.test)
    files = [args.reference, args.baseline] + list(args.systems)
    systems, values, tokens = [], [], None
    for path in files:
        lines = read_lines(path)
        if not lines:
            raise StudyError(f"{path} is empty")
        try:
            statistics = metric.example_statistics(None, lines)
        except SettingsError as error:
            raise StudyError(f"{path}: {error}") from None
        if tokens is None:
            tokens = statistics[:, 1]
        elif len(statistics) != len(tokens) or (statistics[:, 1] != tokens).any():
            raise StudyError(f"{path} does not score the sentences of {files[0]} "
                             f"({len(statistics)} sentences against {len(tokens)}, or other token counts)")
        values.append(metric.score(statistics))
        systems.append(ConfigScores(os.path.basename(path), "", {}, None, None, statistics, lines))
    results = compare_with_baseline(systems[0], systems[1:], settings, metric)
    print(f"{metric.description}; {settings.test} test, {settings.samples} resamples, seed {settings.seed}, "
          f"{len(tokens)} sentences, {int(tokens.sum())} tokens; significant: p < {settings.alpha:g}")
    print(f"{'system':<32} {metric.column:>9} {'95% CI':>19} {'delta':>8} {'p-value':>8}  significant")
    print(f"{files[0][-32:]:<32} {values[0]:>9.3f} {'':>19} {'':>8} {'':>8}  (baseline)")
    rows = []
    for path, system, value, result in zip(files[1:], systems[1:], values[1:], results):
        interval = f"[{result.ci_low:.3f}, {result.ci_high:.3f}]"
        print(f"{path[-32:]:<32} {value:>9.3f} {interval:>19} {value - values[0]:>+8.3f} "
              f"{p_value_cell(result.p_value, settings.resamples):>8}  {'yes' if result.significant else 'no'}")
        rows.append({"system": path, metric.column: value, "delta": value - values[0],
                     "loss": float(system.stats[:, 0].sum() / tokens.sum()),
                     "ci_low": result.ci_low, "ci_high": result.ci_high,
                     "p_value": result.p_value, "significant": result.significant})
    if args.json:
        write_json({"settings": {"metric": metric.name, "test": settings.to_dict(), "baseline": files[0],
                                 f"baseline_{metric.column}": values[0],
                                 "baseline_loss": float(systems[0].stats[:, 0].sum() / tokens.sum()),
                                 "sentences": len(tokens), "tokens": int(tokens.sum())},
                    "rows": rows}, args.json, indent=1)
        print(f"wrote\t{args.json}")
    return 0


def add_parser(commands) -> None:
    significance = commands.add_parser(
        "significance",
        help="paired significance test of hypothesis files against a baseline",
        description="Score each SYSTEM and the BASELINE against REF (one sentence per line) "
        "and test each SYSTEM against the BASELINE: BLEU, its 95% bootstrap interval, "
        "ΔBLEU and p-value. With --metric accuracy or mcc the files hold one label per line "
        "(REF the gold labels, the others predictions) and the metric is tested instead. "
        "With --metric ppl there is no REF: every file holds one 'LOSS TOKENS' line per sentence "
        "(summed loss in base 2, token count) and the first file is the baseline.",
    )
    significance.add_argument("reference", metavar="REF", help="reference file")
    significance.add_argument("baseline", metavar="BASELINE", help="baseline hypotheses")
    significance.add_argument("systems", metavar="SYSTEM", nargs="*", help="hypotheses to test")
    significance.add_argument(
        "--metric", choices=sorted(CLASSIFICATION_METRICS) + sorted(LANGUAGE_MODEL_METRICS),
        help="accuracy, mcc: the files are labels, one per line: test accuracy (with --test bootstrap, "
        "t-test or mcnemar) or Matthews correlation (bootstrap) instead of BLEU; ppl: the files are "
        "per-sentence 'LOSS TOKENS' lines of language models, the first the baseline (bootstrap)",
    )
    add_test_arguments(significance)
    # the old spelling, kept for a release: this command takes no fairseq options it could shadow
    significance.add_argument("--seed", dest="test_seed", type=int, help=argparse.SUPPRESS)
    significance.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    significance.set_defaults(handler=command_significance)
