"""``fairseq-headprune compress``: checkpoint to compressed, exported and evaluated model in one command."""

import argparse
import dataclasses
import math
import sys
from typing import Optional

from fairseq_headprune.commands.common import (
    add_device_arguments,
    add_finetune_resources,
    add_importance_arguments,
    add_test_arguments,
    add_tuning_arguments,
    generation_precision,
    importance_settings,
    test_settings,
    tuning_settings,
)
from fairseq_headprune.commands.compress.speedup import command_speedup, print_stage
from fairseq_headprune.constants import CTRANSLATE2_ENGINE, QUANTIZATIONS
from fairseq_headprune.engine.export.engines import export_engines
from fairseq_headprune.errors import SettingsError
from fairseq_headprune.study.compression.deployment_settings import (
    DEFAULT_SPEED_BATCH_SIZES,
    DEFAULT_SPEED_REPEATS,
    DEFAULT_SPEED_SENTENCES,
    DEPLOY_DEVICES,
    DeploymentSettings,
)
from fairseq_headprune.study.compression.precision import (
    AUTO_CANDIDATES,
    AUTO_QUANTIZATION,
    DEFAULT_QUANTIZATION_TOLERANCE,
    choice_summary,
)
from fairseq_headprune.study.compression.settings import (
    DEFAULT_DISTILL_WEIGHT,
    DEFAULT_TRANSLATION_FINETUNE_UPDATES,
    DISTILL_KINDS,
    NO_DISTILL,
    CompressSettings,
    default_distill,
    default_finetune_updates,
)
from fairseq_headprune.study.compression.speedup.rules import SCREEN_ROUNDS
from fairseq_headprune.study.compression.speedup.settings import (
    OPTION_PREFIX,
    SPEEDUP_LR_SHARE,
    STOP_SHARE_OF_TOLERANCE,
    SpeedupSettings,
)
from fairseq_headprune.study.compression.target import SPEEDUP_TARGET, parse_target
from fairseq_headprune.study.finetune.settings import (
    CHECKPOINT_PRECISION,
    DEFAULT_PATIENCE,
    FINETUNE_LR_SHARE,
    FINETUNE_PRECISIONS,
    FINETUNE_WARMUP_SHARE,
    VALIDATION_SPLITS,
    FinetuneSettings,
    FinetuneStop,
)
from fairseq_headprune.study.settings import SweepSettings
from fairseq_headprune.study.statistics.significance import p_value_text


def compress_settings(args: argparse.Namespace) -> CompressSettings:
    from fairseq_headprune.engine.checkpoints.info import checkpoint_family

    target = parse_target(args.target)  # a bad target is named before the checkpoint is read
    export = args.export
    if target.kind == SPEEDUP_TARGET and export is None:  # a speed-up is measured in CTranslate2
        export = CTRANSLATE2_ENGINE
    evaluation = SweepSettings(
        data=args.data, checkpoint=args.path, out_dir=args.out_dir, gen_subset=args.gen_subset, bleu=args.bleu,
        test=test_settings(args), cpu=args.cpu, progress=not args.no_progress,
        generation_args=list(args.fairseq_args), family=checkpoint_family(args.path), metric_name=args.metric,
    )
    speedup = speedup_settings(args, target.kind == SPEEDUP_TARGET)
    finetune = _finetune_settings(args, speedup if target.kind == SPEEDUP_TARGET else None, evaluation.family)
    distill = (default_distill(target.kind, finetune.updates) if args.distill is None
               else None if args.distill == NO_DISTILL else args.distill)
    return CompressSettings(
        evaluation=evaluation, target=target, importance=importance_settings(args, method="fisher"),
        tuning=tuning_settings(args), latency_table=args.latency_table, finetune=finetune,
        export_format=export, quantization=args.quantization, uniform=args.uniform,
        quantization_tolerance=args.quantization_tolerance,
        vocabulary_map=args.vocabulary_map,
        drop_layers={"encoder": args.drop_encoder_layers, "decoder": args.drop_decoder_layers},
        distill=distill, distill_weight=args.distill_weight,
        speedup=speedup,
        deployment=DeploymentSettings(list(args.speed_batch_sizes), args.speed_sentences or None, args.repeats,
                                      args.threads, precision=generation_precision(args.fairseq_args),
                                      beams=list(args.speed_beams), device=args.deploy_device),
    )


def speedup_settings(args: argparse.Namespace, speedup_target: bool) -> Optional[SpeedupSettings]:
    """The speed-up search's options given (each declared by its ``SpeedupSettings`` field), its defaults for the
    rest; None where the target is another (where one is given, an error)."""
    given = {}
    for option in dataclasses.fields(SpeedupSettings):
        value = getattr(args, option.name)
        if value is not None:
            given[option.name] = value / 100.0 if option.metadata["percent"] else value
    if given and not speedup_target:
        flags = ["--" + name.replace("_", "-") for name in given]
        listed = flags[0] if len(flags) == 1 else ", ".join(flags[:-1]) + " and " + flags[-1]
        raise SettingsError(f"{listed} go{'es' if len(flags) == 1 else ''} with --target speedup=Nx")
    return SpeedupSettings(**given) if speedup_target else None


def _finetune_settings(args: argparse.Namespace, speedup: Optional[SpeedupSettings], family: str
                       ) -> FinetuneSettings:
    """The fine-tuning: with --target speedup until enough on the decision split (``FinetuneStop``), under a ceiling
    of as many updates as the checkpoint trained, at ``SPEEDUP_LR_SHARE`` of its peak learning rate; otherwise a
    fixed length (``default_finetune_updates``)."""
    from fairseq_headprune.engine.checkpoints.info import training_history

    stop_options = {"--finetune-minutes": args.finetune_minutes, "--finetune-patience": args.finetune_patience,
                    "--finetune-valid-interval": args.finetune_valid_interval}
    given = [option for option, value in stop_options.items() if value is not None]
    if given and speedup is None:
        raise SettingsError(f"{given[0]} goes with --target speedup=Nx, whose fine-tuning stops once it is enough")
    updates, data = args.finetune_updates, None
    if args.finetune_epochs is not None:
        data = _epochs_data(args, speedup, family)
        updates = max(1, int(math.ceil(args.finetune_epochs * data.updates_per_epoch)))
    if updates is None:
        updates = training_history(args.path).batches if speedup is not None else default_finetune_updates(family)
        if speedup is not None and not updates:
            raise SettingsError(f"{args.path} does not say how many updates it was trained for; give the fine-tuning "
                                "a ceiling (--finetune-updates N or --finetune-epochs E)")
    until = None
    if speedup is not None and updates:
        patience = DEFAULT_PATIENCE if args.finetune_patience is None else args.finetune_patience
        until = FinetuneStop(subset=speedup.decision_subset, interval=args.finetune_valid_interval, patience=patience,
                             minutes=args.finetune_minutes, data=data)
    return FinetuneSettings(updates, args.finetune_lr, args.finetune_warmup, until=until,
                            lr_share=SPEEDUP_LR_SHARE if speedup is not None else FINETUNE_LR_SHARE,
                            precision=args.finetune_precision, seed=args.finetune_seed,
                            processes=args.finetune_processes, memory_gb=args.finetune_memory)


def _epochs_data(args: argparse.Namespace, speedup: Optional[SpeedupSettings], family: str):
    """--finetune-epochs E: the fine-tuning's data counted (``engine.finetune.data``), whose updates per epoch make
    the ceiling; kept for the run, which does not count it again."""
    if speedup is None:
        raise SettingsError("--finetune-epochs goes with --target speedup=Nx, as its fine-tuning's ceiling (a fixed "
                            "length is --finetune-updates N)")
    if args.finetune_updates is not None:
        raise SettingsError("give --finetune-updates N or --finetune-epochs E, not both")
    epochs = args.finetune_epochs
    if not (math.isfinite(epochs) and epochs > 0):
        raise SettingsError(f"--finetune-epochs must be a positive number, got {epochs:g}")
    from fairseq_headprune.engine.finetune.data import finetune_data

    return finetune_data(args.path, args.data, family, FinetuneSettings(updates=1), speedup.decision_subset)


def command_compress(args: argparse.Namespace) -> int:
    settings = compress_settings(args)  # before the engine (and fairseq) is imported: bad input fails fast
    if settings.target.kind == SPEEDUP_TARGET:
        return command_speedup(settings, args.dry_run)
    if args.dry_run:
        raise SettingsError("--dry-run goes with --target speedup=Nx (it estimates the speed-up search's stages)")
    from fairseq_headprune.engine.pipelines.compress import run_compress

    outcome = run_compress(settings, on_stage=print_stage)
    report = outcome.report
    search, evaluation, parameters = report.search, report.evaluation, report.shrink.parameters
    layers, samples = report.layers, evaluation.test.samples
    if layers is not None:
        print(f"layers\tremoved {layers.spec} (validation loss {layers.base_loss:.3f} -> "
              f"{layers.steps[-1].loss:.3f}); {layers.cost} cost kept "
              f"{100.0 * layers.kept_cost / layers.full_cost:.1f}% before the search")
    distill = report.distill
    if distill is not None:
        print(f"distill\t{distill.sentences} training sentences translated by the unpruned model "
              f"({distill.identical_to_reference} equal to their reference)")
    print(f"pruned\t{search.heads_pruned} of {search.heads_total} heads"
          + (f", {search.neurons_pruned} of {search.neurons_total} FFN neurons" if search.neurons_total else "")
          + f"; FLOPs kept {100.0 * report.flops_kept_share:.1f}%")
    print(f"parameters\t{parameters.unpruned} -> {parameters.compressed} "
          f"({1.0 - parameters.compressed / parameters.unpruned:.1%} fewer)")
    print(f"{evaluation.label}\tunpruned {evaluation.unpruned:.2f}, compressed {evaluation.compressed:.2f} "
          f"({evaluation.delta:+.2f}, {p_value_text(evaluation.p_value, samples)}) on {evaluation.split}"
          + ("" if evaluation.before_finetune is None else
             f"; {evaluation.before_finetune:.2f} before fine-tuning"))
    run_beam = None if report.speed.decoding is None else report.speed.decoding.beam
    for row in evaluation.beams:
        print(f"beam {row.beam}\t{evaluation.label} unpruned {row.unpruned:.2f}, compressed "
              f"{row.compressed:.2f} ({row.delta:+.2f}, {p_value_text(row.p_value, samples)}); against the "
              f"unpruned model at beam {run_beam}: {row.delta_vs_run_beam:+.2f} "
              f"({p_value_text(row.p_value_vs_run_beam, samples)})")
    choice = None if report.export is None else report.export.quantization_choice
    if choice is not None:
        print(f"quantization\tauto: {choice_summary(choice)}")
    unit = {"sentences": "sent/s"}.get(report.speed.unit, "examples/s")
    for row in report.speed.rows:  # the compressed models like for like; the unpruned against fairseq's
        like, stock = row.speedup_like_for_like, row.speedup_vs_stock_conversion
        against = (f"{like:.2f}x like for like" if like is not None
                   else f"{row.speedup_vs_fairseq_unpruned:.2f}x fairseq unpruned")
        if stock is not None and stock != like:
            against += f"; {stock:.2f}x the stock conversion"
        print(f"speed\tbatch {row.batch_size}\t{row.system}\t{row.sentences_per_second:.1f} {unit}\t"
              f"{against}")
    for row in report.speed.beam_rows:
        if row.compressed:
            like, run = row.speedup_like_for_like, row.speedup_vs_run_beam
            print(f"speed\tbatch {row.batch_size}\tbeam {row.beam}\t{row.system}\t"
                  f"{row.sentences_per_second:.1f} {unit}\t{like:.2f}x like for like; {run:.2f}x the unpruned "
                  f"model at beam {run_beam}")
    prediction = report.speedup_prediction
    if prediction and prediction.measured:
        print(f"predicted\tbatch {prediction.batch_size}\t{prediction.predicted:.2f}x by the latency table, "
              f"measured {prediction.measured:.2f}x ({100.0 * prediction.relative_error:+.0f}%)")
    print(f"compressed\t{report.files.checkpoint}")
    if report.files.exported:
        print(f"exported\t{report.files.exported}")
    print("wrote\t" + " ".join(outcome.files))
    sys.stdout.flush()
    return 0


def _add_speedup_arguments(parser) -> None:
    """What --target speedup=Nx takes beside the fine-tuning's own options: one option per ``SpeedupSettings``
    field, its type, default, choices and help as the field declares them. Every default is None here, so that a
    value given with another target is refused (``speedup_settings``)."""
    parser.add_argument("--dry-run", action="store_true",
                          help=f"{OPTION_PREFIX}measure on this machine what one unit of each stage's work costs "
                          "(one export and one timed pass of the unpruned model, one loss pass, a few sentences "
                          "translated, a few fine-tune updates: OUT/cost), print each stage's expected minutes and "
                          "disk, and stop; the run itself resumes from there (every run prints the estimate before "
                          "its plan, and again once the plan has chosen a shape)")
    for option in dataclasses.fields(SpeedupSettings):
        meta, default = option.metadata, option.default
        shown = 100 * default if meta["percent"] else default
        default_text = meta["default_text"] or (f"{shown:g}" if isinstance(shown, (int, float)) else str(shown))
        flag = "--" + option.name.replace("_", "-")
        words = {"help": f"{OPTION_PREFIX}{meta['help']} (default: {default_text})".replace("%", "%%")}
        if isinstance(default, bool):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, **words)
        else:
            parser.add_argument(flag, type=type(default), choices=meta["choices"], metavar=meta["metavar"], **words)


def _add_model_arguments(parser) -> None:
    """What changes the model beyond the search: fine-tuning (and its targets), whole layers removed."""
    finetune = parser.add_argument_group("fine-tuning with the pruned units held at zero (fairseq-train)")
    finetune.add_argument(
        "--finetune-updates", type=int, metavar="N",
        help="fine-tune the tuned, masked model for N updates on the training split before removal, with the "
        "checkpoint's own architecture, criterion, optimizer and batch size; with --target speedup, at most N: it "
        "stops earlier once it is enough (--finetune-patience); 0: none (default with --target speedup: the data the "
        "checkpoint trained on, its updates times the processes it trained on, for one process here accumulates "
        f"what one of those did; {DEFAULT_TRANSLATION_FINETUNE_UPDATES} otherwise for a translation model, "
        "whose pruned masks can lose most of their BLEU without it, 0 for classifiers and language models)",
    )
    finetune.add_argument(
        "--finetune-epochs", type=float, metavar="E",
        help="with --target speedup: the fine-tuning's ceiling in epochs of the training split instead of "
        "--finetune-updates (E may be a fraction: 0.5 is half an epoch), counted at the checkpoint's batch")
    finetune.add_argument(
        "--finetune-patience", type=int, metavar="P",
        help="with --target speedup: the fine-tuning validates with fairseq's BLEU on --decision-subset, keeps the "
        "best checkpoint, and stops once within half the tolerance of the unpruned model's score there "
        f"({STOP_SHARE_OF_TOLERANCE:g} x --max-bleu-loss), or after P validations without a gain (fairseq's "
        f"--patience; default {DEFAULT_PATIENCE})")
    finetune.add_argument(
        "--finetune-valid-interval", type=int, metavar="N",
        help="with --target speedup: updates between the fine-tuning's validations (default: a tenth of the "
        f"ceiling, or sooner, once it has trained on {VALIDATION_SPLITS} times the target tokens of the split it "
        "validates on, so that a large training split is looked at early)")
    finetune.add_argument(
        "--finetune-minutes", type=float, metavar="M",
        help="with --target speedup: also stop the fine-tuning after M minutes of training (fairseq's "
        "--stop-time-hours; default: no limit but --finetune-updates)")
    finetune.add_argument(
        "--distill", choices=(*DISTILL_KINDS, NO_DISTILL),
        help="learn from the unpruned model (Kim & Rush 2016): sequence: fine-tune on its own beam translations of "
        "the training sources instead of the references (translated once, with the generation options given, into "
        "OUT/distill/data); word: towards its distribution over the vocabulary at every target position beside the "
        "references (--distill-weight; the unpruned model runs beside the one fine-tuned); none: on the references "
        "alone (default: word with --target speedup=Nx, none otherwise)",
    )
    finetune.add_argument("--distill-weight", type=float, default=DEFAULT_DISTILL_WEIGHT, metavar="W",
                          help="with --distill word: the teacher's share of the loss, the rest the label-smoothed "
                          f"cross-entropy of the references (default {DEFAULT_DISTILL_WEIGHT:g})")
    finetune.add_argument("--finetune-lr", type=float, metavar="LR",
                          help=f"its constant learning rate (default: {SPEEDUP_LR_SHARE:g} of the checkpoint's peak "
                          f"rate with --target speedup, {FINETUNE_LR_SHARE:g} of it otherwise)")
    finetune.add_argument("--finetune-precision", choices=FINETUNE_PRECISIONS, default=CHECKPOINT_PRECISION,
                          help="what the fine-tuning computes in on a GPU, its teacher passes and validation "
                          "translations too: checkpoint: the checkpoint's own --fp16/--bf16 (float32 if it trained "
                          "without), or one named. On the CPU fairseq trains in float32 only. Stated in the report; "
                          "like the device, not part of the run's settings, so a resumed run goes on in what it is "
                          "given (default: checkpoint)")
    add_finetune_resources(finetune)
    finetune.add_argument("--finetune-seed", type=int, metavar="SEED",
                          help="fairseq's --seed for the fine-tuning: the order of its batches and its dropout "
                          "(default: the checkpoint's own)")
    finetune.add_argument("--finetune-warmup", type=int, metavar="N",
                          help=f"linear warm-up updates (default: {100 * FINETUNE_WARMUP_SHARE:g}%% of the updates)")
    layers = parser.add_argument_group("whole layers")
    for stack in ("decoder", "encoder"):
        layers.add_argument(
            f"--drop-{stack}-layers", type=int, default=0, metavar="N",
            help=f"remove N whole {stack} layers before the search, one at a time, each the one whose removal "
            "raises the loss on the Fisher split least; the search then prunes heads and neurons of the shallower "
            "model until the target, a share of the unpruned model's cost, is met (not with a latency target; "
            "fine-tune after it, e.g. --finetune-updates 300 --distill sequence; default 0)",
        )


def add_parser(commands) -> None:
    compress = commands.add_parser(
        "compress",
        help="checkpoint to smaller model in one command: Fisher search within a target or a speed-up, tuning, "
        "optional fine-tuning, removal, export to CTranslate2, evaluated against the unpruned model (Kwon et al. 2022)",
        description="Estimate the masks' Fisher information on a validation split, search the heads (and FFN "
        "neurons) to keep within --target, tune the kept units by least squares, optionally fine-tune with the "
        "pruned units held at zero, remove them for real (OUT/shrink/checkpoint.pt), optionally export to "
        "CTranslate2 (OUT/export/compressed), then evaluate the compressed model against the unpruned one on "
        "--gen-subset (BLEU, a classifier's accuracy or an LM's perplexity, with a paired test), count the "
        "parameters and time the decoding of both in fairseq and CTranslate2. Writes OUT/report.md and "
        "OUT/report.json. Each stage is written into its own subdirectory whole and skipped when there, so an "
        "interrupted run resumes; a rerun with other settings is refused. Options it does not know go to "
        "fairseq (--beam, --lenpen, --batch-size, --max-len-a/b ...).",
    )
    compress.add_argument("data", metavar="DATA", help="fairseq-preprocess output directory")
    compress.add_argument("--path", required=True, metavar="CKPT", help="fairseq checkpoint (the unpruned model)")
    compress.add_argument(
        "--target", required=True, metavar="KIND=P%|speedup=Nx",
        help="what the compressed model keeps, as a percentage of the unpruned model's: heads=50%% (half of the "
        "heads; heads searched), flops=50%% (half of the attention and FFN layers' FLOPs per token; heads and "
        "FFN neurons searched together), decoding-flops=50%% (translation: half of their FLOPs per translated "
        "sentence in beam search at fairseq's --beam and the valid split's mean lengths, where the decoder runs "
        "once per generated token and beam row), latency=60%% (of their latency, from --latency-table or a "
        "table measured first), or speedup=2x (translation: decoding twice as fast in CTranslate2 as the unpruned "
        "model, both with the vocabulary map, at every --speed-batch-sizes: shapes of whole layers removed and "
        "heads and neurons narrowed are exported, timed and their damage before fine-tuning measured first "
        "(OUT/plan), the least damaged shape fast enough is compressed and fine-tuned until it is enough "
        "(OUT/attempt-1), and where the BLEU on --decision-subset drops more than --max-bleu-loss the fine-tuning "
        "continues or a less damaged shape is tried; the result is evaluated and timed on --gen-subset once "
        "(OUT/result); implies --export ctranslate2)",
    )
    _add_speedup_arguments(compress)
    compress.add_argument("--out-dir", required=True, metavar="DIR",
                          help="the run's directory (new, empty, or this run's: resumed)")
    compress.add_argument("--gen-subset", default="test", metavar="SPLIT",
                          help="split the two models are evaluated and timed on (default: test)")
    compress.add_argument("--uniform", action=argparse.BooleanOptionalAction, default=None,
                          help="keep as many heads in every layer of a stack (with --export ctranslate2 the "
                          "decoder's self- and cross-attention alike too), so that CTranslate2 pads no head and "
                          "runs the pruned heads' savings (default: on with --export ctranslate2, which pads "
                          "every layer to its stack's largest head count; off otherwise)")
    compress.add_argument("--vocabulary-map", action=argparse.BooleanOptionalAction, default=None,
                          help="with --export ctranslate2 (translation): also export CTranslate2's vocabulary map, "
                          "built from DATA's training pairs (export --vocabulary-map), and time the compressed "
                          "model with and without it (default: on then)")
    compress.add_argument("--latency-table", metavar="FILE",
                          help="for a latency target: the latency command's table for this model and device "
                          "(with --export ctranslate2: timed with --engine ctranslate2 at --quantization). Without "
                          "it, compress measures one in search/latency.json: with --export ctranslate2 CTranslate2's "
                          "beam search at the largest --speed-batch-sizes and fairseq's --beam over 4 times --repeats "
                          "rounds, whose predicted speed-up is printed beside the measured one; else fairseq's layers "
                          "alone")
    compress.add_argument("--metric", choices=("accuracy", "mcc"),
                          help="classifier checkpoints: the metric reported and tested (default accuracy)")
    _add_model_arguments(compress)
    export = compress.add_argument_group("export")
    export.add_argument("--export", choices=list(export_engines()),
                        help="also write the compressed model (and, for the timing, the unpruned one) in this format")
    export.add_argument("--quantization", choices=(*QUANTIZATIONS, AUTO_QUANTIZATION),
                        help="weight type of the exported models (default: float32); the installed CTranslate2 must "
                        "compute it on this device. auto (translation): the compressed model is timed at each of "
                        f"{', '.join(AUTO_CANDIDATES['cpu'])} on a CPU ({', '.join(AUTO_CANDIDATES['cuda'])} on a "
                        "GPU) that CTranslate2 computes here, each in its own process, on the timed sentences, and "
                        "the fastest whose BLEU is within --quantization-tolerance of float32's is exported")
    export.add_argument("--quantization-tolerance", type=float, default=DEFAULT_QUANTIZATION_TOLERANCE,
                        metavar="BLEU", help="with --quantization auto: BLEU points below float32's that a faster "
                        f"compute type may lose (default {DEFAULT_QUANTIZATION_TOLERANCE:g})")
    speed = compress.add_argument_group("decoding speed")
    speed.add_argument("--speed-batch-sizes", type=int, nargs="+", default=list(DEFAULT_SPEED_BATCH_SIZES),
                       metavar="N",
                       help=f"batch sizes timed (default: {' '.join(map(str, DEFAULT_SPEED_BATCH_SIZES))})")
    speed.add_argument("--speed-sentences", type=int, default=DEFAULT_SPEED_SENTENCES, metavar="N",
                       help=f"first N sentences of --gen-subset timed (default {DEFAULT_SPEED_SENTENCES}; 0: all)")
    speed.add_argument("--repeats", type=int, default=DEFAULT_SPEED_REPEATS, metavar="N",
                       help="timed rounds after a warm-up, every system decoding once a round in its own process, "
                       f"the order rotated; --target speedup's plan times every shape {SCREEN_ROUNDS} round, then "
                       f"N rounds those that decide its choice (default {DEFAULT_SPEED_REPEATS})")
    speed.add_argument("--speed-beams", type=int, nargs="+", default=[], metavar="B",
                       help="translation: also evaluate and time both models at these beam sizes (e.g. 1 2), the "
                       "compressed one against the unpruned one at the same beam (like for like) and at --beam: "
                       "after distillation a smaller beam may keep the BLEU (Kim & Rush 2016) (default: none)")
    speed.add_argument("--deploy-device", choices=DEPLOY_DEVICES, default="cpu",
                       help="where the models are timed and the export's weight type is checked: where the "
                       "compressed model will run (default: cpu, even on a machine whose GPU fine-tunes and "
                       "evaluates; cuda: the GPU both torch and CTranslate2 see)")
    speed.add_argument("--threads", type=int, metavar="N",
                       help="CPU threads of both engines while timing (default: torch's current setting)")
    add_importance_arguments(compress.add_argument_group("Fisher information"), method=False)
    add_tuning_arguments(compress, "skip mask tuning (by default the kept units' scales and bias corrections are "
                         "fitted on --tune-subset and folded into the compressed weights)", per_order=False,
                         switch="--no-tune")
    add_test_arguments(compress)
    add_device_arguments(compress)
    # the search's budget is the target's share, the layers to drop its --drop-encoder-layers and
    # --drop-decoder-layers; the settings compress fills in itself (the head and FFN masks, the search's structure and
    # cost) have no flag, not even fairseq's --head-mask passed on: their errors keep their plain words
    compress.set_defaults(handler=command_compress, accepts_fairseq_args=True,
                          setting_flags={"budget": "--target", "drop_layers": "--drop-*-layers", "head_mask": None,
                                         "ffn_mask": None})
