"""``fairseq-headprune ablate``: the ablation studies of Michel et al. section 3."""

import argparse

from fairseq_headprune.commands.common import add_study_inputs, add_sweep_arguments, sweep_settings
from fairseq_headprune.constants import ABLATION_MODES
from fairseq_headprune.study.importance.ablation import ablation_summary
from fairseq_headprune.study.importance.settings import AblationSettings
from fairseq_headprune.study.settings import parse_types
from fairseq_headprune.study.statistics.significance import p_value_text


def settings_from(args: argparse.Namespace) -> AblationSettings:
    from fairseq_headprune.engine.checkpoints.info import checkpoint_family

    return AblationSettings(
        sweep=sweep_settings(args, args.path, checkpoint_family(args.path)), mode=args.mode,
        types=parse_types(args.types), heads=args.heads, select_subset=args.select_subset,
        cross_subset=args.cross_subset, cross_data=args.cross_data,
    )


def print_single(outcome, settings: AblationSettings) -> None:
    """The single-head sweep's summary: how many heads change the score significantly, the largest change each way
    (a bootstrap's p of 0 as ``p < 1/resamples``), each head named by its ``--head-mask`` spec."""
    test, metric = settings.sweep.test, settings.sweep.metric
    significant, worst, best = ablation_summary(outcome.rows, metric.higher_is_better)
    print(f"baseline {metric.label} {outcome.baseline_score:.2f}; {len(outcome.rows)} heads masked one at a time; "
          f"{significant} significant at p < {test.alpha:g}")
    worse, better = ("largest drop", "largest gain") if metric.higher_is_better else ("largest rise", "largest fall")
    for label, row in ((worse, worst), (better, best)):
        print(f"{label}  {row['delta']:+.2f}  {row['spec']} ({p_value_text(row['p_value'], test.resamples)})")
    print(f"wrote\t{outcome.written[0]}")


def command_ablate(args: argparse.Namespace) -> int:
    settings = settings_from(args)  # before the engine (and fairseq) is imported: bad input fails fast
    from fairseq_headprune.engine.pipelines.ablate import run_ablation

    outcome = run_ablation(settings)
    if outcome is None:  # a rank other than 0 of a sharded sweep
        return 0
    label = settings.sweep.metric.label
    if settings.mode == "all-but-one":
        print(f"baseline {label} {outcome.baseline_score:.2f} on {outcome.split}; "
              f"best Δ{label} per layer when one head is kept:")
        for entry in outcome.best:
            line = f"  {entry['attention_type']}\tlayer {entry['layer']}\thead {entry['head']}\t{entry['delta']:+.2f}"
            if settings.select_subset:
                line += (f"\tchosen on {settings.select_subset}: "
                         f"head {entry['selected_head']} {entry['selected_delta']:+.2f}")
            print(line)
        print(f"wrote\t{outcome.written[0]}")
        return 0
    print_single(outcome, settings)
    if outcome.pearson is not None:
        r, p = outcome.pearson
        print(f"cross-domain: Pearson r = {r:.3f} (p = {p:.3g}) between Δ{label} on {outcome.split} "
              f"and on {outcome.cross_split}")
        print(f"wrote\t{outcome.written[1]}")
    return 0


def add_parser(commands) -> None:
    ablate = commands.add_parser(
        "ablate",
        help="ablation sweeps with paired-bootstrap significance (paper section 3)",
        description="Translate a split with fairseq's SequenceGenerator under many head masks, "
        "loading the model once (or, for a classifier or language-model checkpoint, score it: "
        "accuracy or Matthews correlation, perplexity): every head masked alone (--mode single, Table 1), every "
        "head kept alone in its layer (--mode all-but-one, Table 2), or the single-head "
        "sweep on two test sets (--mode cross-domain, Figure 2). Every configuration is "
        "tested against the unmasked model. Results are stored per configuration as they "
        "finish: a rerun continues where it stopped. Any other option is passed to "
        "fairseq-generate's parser (--beam, --lenpen, --remove-bpe, --batch-size, "
        "--max-tokens, --tokenizer, --bpe, ...); for a classifier to fairseq-validate's "
        "(--batch-size, --max-tokens, --head-mask), for a language model to fairseq-eval-lm's "
        "(--sample-break-mode, --tokens-per-sample, --context-window, --max-tokens, ...).",
    )
    add_study_inputs(ablate)
    ablate.add_argument("--path", required=True, metavar="CKPT", help="fairseq checkpoint")
    ablate.add_argument("--mode", choices=ABLATION_MODES, default="single", help="which study (default: single)")
    ablate.add_argument(
        "--types", metavar="TYPES",
        help="attention types to ablate, e.g. 'enc-dec' or 'E,D' (default: all three)",
    )
    ablate.add_argument(
        "--heads", metavar="SPEC",
        help="single/cross-domain: ablate only the heads this spec selects, e.g. 'E:1:* A:6:1-4'",
    )
    ablate.add_argument(
        "--select-subset", metavar="SPLIT",
        help="all-but-one: also choose each layer's best head on SPLIT and report its "
        "score on --gen-subset (the paper's appendix A)",
    )
    ablate.add_argument("--cross-subset", metavar="SPLIT", help="cross-domain: the out-of-domain test split")
    ablate.add_argument(
        "--cross-data", metavar="DIR",
        help="cross-domain: data directory of --cross-subset (default: DATA; same dictionaries)",
    )
    add_sweep_arguments(ablate)
    ablate.set_defaults(handler=command_ablate, accepts_fairseq_args=True)
