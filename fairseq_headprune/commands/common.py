"""Options and plumbing the sub-commands share, and their conversion to settings.

Each option group has one ``add_*`` function that declares it and one
``*_settings`` function that turns the parsed values into the typed settings
of ``study/settings.py``; the layers below never see the namespace.
"""

import argparse
from typing import List, Optional

from fairseq_headprune.constants import (
    DEFAULT_ALPHA,
    DEFAULT_CONFIGS_PER_BATCH,
    DEFAULT_GRANULARITY,
    DEFAULT_HELD_ASIDE,
    DEFAULT_IMPORTANCE_LOSS,
    DEFAULT_IMPORTANCE_METHOD,
    DEFAULT_LABEL_SMOOTHING,
    DEFAULT_MAX_CONDITION,
    DEFAULT_MAX_PERCENT,
    DEFAULT_RESAMPLES,
    DEFAULT_SCALE_BOUND,
    DEFAULT_SIGNIFICANCE_SEED,
    DEFAULT_STEP_PERCENT,
    DEFAULT_TUNE_LAYERS,
    DEFAULT_TUNE_LIMIT,
    GRANULARITIES,
    IMPORTANCE_LOSSES,
    IMPORTANCE_METHODS,
    SIGNIFICANCE_TESTS,
    STRUCTURES,
    TRANSLATION_FAMILY,
    TUNE_LAYERS,
)
from fairseq_headprune.study.finetune.memory import HEADROOM
from fairseq_headprune.study.pruning.settings import CurveSettings
from fairseq_headprune.study.search.settings import TuningSettings
from fairseq_headprune.study.settings import DETOKENIZERS, ImportanceSettings, SweepSettings, parse_choices
from fairseq_headprune.study.statistics.metrics import BLEU_METRICS
from fairseq_headprune.study.statistics.significance import SignificanceSettings


def add_test_arguments(parser: argparse.ArgumentParser) -> None:
    """The reported BLEU and the paired significance test (ablate, prune, dynamics, significance)."""
    group = parser.add_argument_group("significance test")
    group.add_argument(
        "--bleu", choices=sorted(BLEU_METRICS), default="tokenized",
        help="BLEU to report and test: tokenized (fairseq's bleu scorer on the tokenized "
        "output, the paper's text; default) or sacrebleu (detokenized, 13a; what the "
        "authors' released scripts ran)",
    )
    group.add_argument(
        "--test", choices=SIGNIFICANCE_TESTS, default="bootstrap",
        help="bootstrap: Koehn's paired bootstrap with full-size resamples (default); "
        "compare-mt: compare-mt's exact procedure (half-size resamples, its BLEU, its "
        "p = 1 - max win fraction); sacrebleu-bs / sacrebleu-ar: sacreBLEU's paired "
        "bootstrap / approximate randomisation; for accuracy also t-test (paired, on per-example "
        "correctness, as the paper tests BERT) and mcnemar (McNemar's exact test)",
    )
    group.add_argument(
        "--samples", type=int, default=DEFAULT_RESAMPLES,
        help=f"resamples (or AR trials); default {DEFAULT_RESAMPLES}",
    )
    group.add_argument(
        "--test-seed", type=int, default=DEFAULT_SIGNIFICANCE_SEED, metavar="N",
        help=f"resampling seed of the test (default {DEFAULT_SIGNIFICANCE_SEED}; fairseq's own --seed is passed on)",
    )
    group.add_argument(
        "--sample-ratio", type=float,
        help="fraction of the sentences in each resample (default 1.0; 0.5 for --test compare-mt)",
    )
    group.add_argument(
        "--alpha", type=float, default=DEFAULT_ALPHA, help=f"significance level (default {DEFAULT_ALPHA:g})"
    )


def test_settings(args: argparse.Namespace) -> SignificanceSettings:
    return SignificanceSettings(
        test=args.test, samples=args.samples, seed=args.test_seed, sample_ratio=args.sample_ratio, alpha=args.alpha
    )


def add_sweep_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of every command that translates a split under many masks (ablate, prune, dynamics)."""
    parser.add_argument(
        "--sacrebleu-detokenize", choices=DETOKENIZERS, default="auto",
        help="how output becomes detokenized text for sacreBLEU: auto (Moses detokenizer "
        "unless fairseq's --tokenizer already detokenizes; default), moses, none",
    )
    parser.add_argument(
        "--references", metavar="FILE",
        help="raw (detokenized) references of --gen-subset, one per line in corpus order, "
        "for --bleu sacrebleu (default: the data's target side, detokenized)",
    )
    parser.add_argument(
        "--configs-per-batch", type=int, metavar="K",
        help="translate K masked configurations together, each batch repeated K times (memory grows like a K "
        f"times larger batch; 1: one at a time). Default: {DEFAULT_CONFIGS_PER_BATCH} on the CPU; on a GPU, K and "
        "the sentences per batch (unless --batch-size or --max-tokens is given) are chosen from its free memory "
        "and the model's size, and stated on the console",
    )
    parser.add_argument(
        "--no-encoder-reuse", action="store_true",
        help="run the encoder once per configuration even when configurations translated together "
        "mask no Enc-Enc head differently (by default they share one encoder pass; the same translations)",
    )
    parser.add_argument(
        "--metric", choices=("accuracy", "mcc"),
        help="classifier checkpoints (sentence_prediction): the metric reported and tested, accuracy "
        "(default) or mcc (Matthews correlation, as fairseq's --report-mcc); a language model "
        "(language_modeling) is scored by perplexity, a translation model by --bleu",
    )
    add_test_arguments(parser)
    add_device_arguments(parser)


def add_finetune_resources(group) -> None:
    """--finetune-processes and --finetune-memory, for the commands that fine-tune (``FinetuneSettings``)."""
    group.add_argument(
        "--finetune-processes", type=int, default=1, metavar="N",
        help="train each fine-tuning on N data-parallel processes of this machine through fairseq's distributed "
        "training (on a GPU one per GPU, NCCL; on the CPU N processes sharing its threads, gloo), every update "
        "seeing the batches one process accumulates: each process accumulates ceil(F / N) of the checkpoint's F "
        "(--update-freq); the other stages run in this process. Like the device, not part of the run's settings "
        "(default 1)")
    group.add_argument(
        "--finetune-memory", type=float, metavar="GB",
        help="the memory each fine-tuning may plan to use on its device, shared by its processes on the CPU. "
        "Before it trains, the memory of the student's training state, the teacher beside it and a batch's "
        f"activations is estimated; where it exceeds {100 * HEADROOM:g}%% of this, the checkpoint's batches are halved "
        "and twice as many accumulated per update, down to one holding the longest training pair, or it stops "
        "with one line. Stated in the report (default: what the device has free)")


def add_device_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cpu", action="store_true", help="run on the CPU even if a GPU is present")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def sweep_settings(args: argparse.Namespace, checkpoint: str, family: str = TRANSLATION_FAMILY) -> SweepSettings:
    """``checkpoint``: --path (ablate, prune), or the directory of epoch checkpoints (dynamics)."""
    return SweepSettings(
        data=args.data, checkpoint=checkpoint, out_dir=args.out_dir, gen_subset=args.gen_subset,
        bleu=args.bleu, test=test_settings(args), detokenize=args.sacrebleu_detokenize,
        references=args.references, configs_per_batch=args.configs_per_batch,
        share_encoder=not args.no_encoder_reuse, cpu=args.cpu,
        progress=not args.no_progress, generation_args=list(args.fairseq_args),
        family=family, metric_name=args.metric,
    )


def add_importance_arguments(parser, method: bool = True, batch_size: bool = False, aliases: bool = False) -> None:
    """How importance (or Fisher information) is estimated: one declaration, ``--importance-*``, for every command.

    ``method=False``: the command always estimates Fisher scores. ``aliases``:
    the importance command's older spellings (``--subset`` ...) stay as hidden aliases.
    """
    def add(name, alias=None, **options):
        parser.add_argument(f"--importance-{name}", **options)
        if aliases and alias:
            hidden = {k: v for k, v in options.items() if k not in ("default", "help", "metavar")}
            parser.add_argument(alias, dest=f"importance_{name.replace('-', '_')}", help=argparse.SUPPRESS, **hidden)

    add("subset", "--subset", nargs="+", default=["valid"], metavar="SPLIT",
        help="splits to estimate on (default: valid; the paper uses newstest2009-2012)")
    add("limit", "--limit", type=int, metavar="N", help="use only the first N sentences of each split")
    add("max-tokens", "--max-tokens", type=int, metavar="N", help="tokens per batch")
    if batch_size:
        add("batch-size", "--batch-size", type=int, metavar="N",
            help="sentences per batch (default: 64 on the CPU; on a GPU chosen from its free memory and the "
            "model's size, and stated; 64 at --importance-granularity batch; none with --importance-max-tokens)")
        if aliases:
            parser.add_argument("--max-sentences", dest="importance_batch_size", type=int, help=argparse.SUPPRESS)
    add("granularity", "--granularity", choices=GRANULARITIES, default=DEFAULT_GRANULARITY,
        help="the unit x of E_x: |dL/dxi_h| per sentence (the paper, default), per target token (the "
        "authors' code) or per batch")
    if method:
        add("method", choices=IMPORTANCE_METHODS, default=DEFAULT_IMPORTANCE_METHOD,
            help="gradient (default): I_h = E_x |dL(x)/dxi_h|, the paper's importance; fisher: F_h = E_x "
            "(dL(x)/dxi_h)^2, the mask's diagonal Fisher information (Kwon et al. 2022), from the same backward pass")
    add("structures", "--structures", default="heads", metavar="LIST",
        help="what to score, comma-separated: heads (default), or heads,ffn to score every FFN neuron too "
        "(E_x |dL/dzeta_i| of a mask variable on fc2's input, from the same backward pass)")
    add("loss", "--loss", choices=IMPORTANCE_LOSSES, default=DEFAULT_IMPORTANCE_LOSS,
        help="loss to differentiate (default: nll, plain cross-entropy as the authors' code; "
        "label_smoothed: label-smoothed cross-entropy with --importance-label-smoothing)")
    add("label-smoothing", "--label-smoothing", type=float, default=DEFAULT_LABEL_SMOOTHING, metavar="EPS",
        help=f"label smoothing epsilon of --importance-loss label_smoothed (default {DEFAULT_LABEL_SMOOTHING:g})")


def importance_settings(args: argparse.Namespace, method: Optional[str] = None) -> ImportanceSettings:
    """The settings of ``add_importance_arguments``'s options (``method``: fixed, when the command has none)."""
    return ImportanceSettings(
        subsets=list(args.importance_subset), limit=args.importance_limit, max_tokens=args.importance_max_tokens,
        max_sentences=getattr(args, "importance_batch_size", None), granularity=args.importance_granularity,
        loss=args.importance_loss, label_smoothing=args.importance_label_smoothing,
        method=method or args.importance_method,
        neurons="ffn" in parse_choices(args.importance_structures, STRUCTURES, "importance_structures"),
    )


def add_curve_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of the importance-ordered pruning curve (prune and dynamics)."""
    parser.add_argument(
        "--step-percent", type=float, default=DEFAULT_STEP_PERCENT,
        help=f"pruning step, in %% of the heads in scope pruned (prune --structure ffn, joint: of their layers' "
        f"FLOPs) (default {DEFAULT_STEP_PERCENT:g})",
    )
    parser.add_argument(
        "--max-percent", type=float, default=DEFAULT_MAX_PERCENT,
        help=f"largest pruning level, in %% of the heads in scope pruned (default {DEFAULT_MAX_PERCENT:g}; "
        "search --budget and the budgets count what is kept)",
    )
    add_importance_arguments(parser.add_argument_group("importance estimation"))
    parser.add_argument(
        "--raw-importance", action="store_true",
        help="rank heads by raw importance, not importance normalised per layer (the paper normalises)",
    )


def curve_settings(args: argparse.Namespace) -> CurveSettings:
    return CurveSettings(step_percent=args.step_percent, max_percent=args.max_percent,
                         importance=importance_settings(args), raw_importance=args.raw_importance)


def add_tuning_arguments(parser: argparse.ArgumentParser, tune_option_help: str, per_order: bool = True,
                         switch: str = "--tune-masks") -> None:
    """Mask tuning by least squares: ``--tune-masks`` (a flag), and for prune ``--tune-orders ORDERS``.

    ``switch="--no-tune"``: tuning is on unless that flag is given (compress).
    """
    group = parser.add_argument_group("mask tuning (Kwon et al. 2022, section 4.3)")
    group.add_argument(switch, action="store_true", help=tune_option_help)
    if per_order:
        group.add_argument("--tune-orders", metavar="ORDERS",
                           help="with --tune-masks: the curves to draw tuned, comma-separated "
                           "(default: every --orders)")
    group.add_argument(
        "--tune-subset", nargs="+", default=["valid"], metavar="SPLIT",
        help="training or validation splits to fit the scales on, teacher-forced (default: valid; a test split "
        "is refused)",
    )
    group.add_argument(
        "--tune-limit", type=int, default=DEFAULT_TUNE_LIMIT, metavar="N",
        help=f"first N sentences of each tuning split (default {DEFAULT_TUNE_LIMIT})",
    )
    group.add_argument("--tune-max-tokens", type=int, metavar="N",
                       help="tokens per tuning batch (default: 64 sentences)")
    group.add_argument(
        "--tune-scale-bound", type=float, default=DEFAULT_SCALE_BOUND, metavar="B",
        help=f"a layer whose fit needs a scale above B in absolute value keeps its binary mask "
        f"(default {DEFAULT_SCALE_BOUND:g})",
    )
    group.add_argument(
        "--tune-max-condition", type=float, default=DEFAULT_MAX_CONDITION, metavar="C",
        help=f"directions of a layer's normal equations with an eigenvalue below the largest over C are not "
        f"fitted (their units keep scale 1: dead neurons, indistinguishable heads; default {DEFAULT_MAX_CONDITION:g})",
    )
    group.add_argument(
        "--tune-held-aside", type=float, default=DEFAULT_HELD_ASIDE, metavar="FRACTION",
        help=f"share of the tuning batches not fitted on: a layer's fit is kept only if it lowers the loss on "
        f"them, else the layer stays binary (default {DEFAULT_HELD_ASIDE:g})",
    )
    group.add_argument(
        "--tune-layers", choices=TUNE_LAYERS, default=DEFAULT_TUNE_LAYERS,
        help="which attention and FFN layers are fitted: the pruned ones, or (downstream, the default, as Kwon "
        "et al.'s reference) also every one whose input drifted: after a pruned layer on its side, or reading a "
        "pruned encoder's output",
    )


def tuning_settings(args: argparse.Namespace) -> "TuningSettings | None":
    """None unless --tune-masks was given (or, where tuning is the default, when --no-tune was)."""
    if getattr(args, "no_tune", False) or not getattr(args, "tune_masks", True):
        return None
    return TuningSettings(
        subsets=list(args.tune_subset), limit=args.tune_limit, max_tokens=args.tune_max_tokens,
        scale_bound=args.tune_scale_bound, max_condition=args.tune_max_condition,
        held_aside=args.tune_held_aside, layers=args.tune_layers,
    )


def add_study_inputs(parser: argparse.ArgumentParser, split_help: str = "split to translate (default: test)") -> None:
    """DATA, --gen-subset and --out-dir of the sweeping commands."""
    parser.add_argument("data", metavar="DATA", help="fairseq-preprocess output directory")
    parser.add_argument("--gen-subset", default="test", metavar="SPLIT", help=split_help)
    parser.add_argument("--out-dir", required=True, metavar="DIR", help="results directory (resumable)")


def fairseq_language_args(args: argparse.Namespace) -> List[str]:
    """-s/-t as fairseq options."""
    fairseq_args = []
    if args.source_lang:
        fairseq_args += ["--source-lang", args.source_lang]
    if args.target_lang:
        fairseq_args += ["--target-lang", args.target_lang]
    return fairseq_args


def generation_precision(fairseq_args) -> str:
    """The precision fairseq's generation runs in, read off its own flags (``--fp16``, ``--bf16``)."""
    arguments = list(fairseq_args)
    return "float16" if "--fp16" in arguments else "bfloat16" if "--bf16" in arguments else "float32"
