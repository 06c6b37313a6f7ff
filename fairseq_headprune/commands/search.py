"""``fairseq-headprune search`` and ``latency``: a mask for a budget (Kwon et al. 2022)."""

import argparse

from fairseq_headprune.commands.common import (
    add_device_arguments,
    add_importance_arguments,
    add_tuning_arguments,
    importance_settings,
    tuning_settings,
)
from fairseq_headprune.constants import (
    COST_KINDS,
    DEFAULT_SEQUENCE_LENGTH,
    FAIRSEQ_ENGINE,
    LATENCY_ENGINES,
    PRUNED_STRUCTURES,
)
from fairseq_headprune.study.masks.ffn_mask import ffn_mask_to_spec
from fairseq_headprune.study.masks.head_mask import head_mask_to_spec, layer_name
from fairseq_headprune.study.search.costs import SearchBudget
from fairseq_headprune.study.search.settings import LatencySettings, SearchSettings


def search_settings(args: argparse.Namespace) -> SearchSettings:
    from fairseq_headprune.engine.checkpoints.info import checkpoint_family

    return SearchSettings(
        data=args.data, checkpoint=args.path, out_dir=args.out_dir, budget=SearchBudget.parse(args.budget),
        cost=args.cost,
        latency_table=args.latency_table, sequence_length=args.sequence_length, fisher_file=args.fisher,
        importance=importance_settings(args, method="fisher"),
        rearrange=not args.no_rearrange, tuning=tuning_settings(args), family=checkpoint_family(args.path),
        cpu=args.cpu, progress=not args.no_progress, fairseq_args=list(args.fairseq_args),
        structure=args.structure, uniform=args.uniform, neuron_step=args.neuron_step,
        latency_engine=args.latency_engine, latency_precision=args.latency_precision,
        tie_decoder_heads=args.tie_decoder_heads, source_length=args.source_length,
        target_length=args.target_length,
    )


def command_search(args: argparse.Namespace) -> int:
    settings = search_settings(args)  # before the engine (and fairseq) is imported: bad input fails fast
    from fairseq_headprune.engine.pipelines.search import run_search
    from fairseq_headprune.engine.search.mask_tuning import layer_tuning_summary

    outcome = run_search(settings)
    result = outcome.result
    print(f"Fisher information: {outcome.fisher_source}")
    print(f"budget {settings.budget.text} = {result.budget:g} {result.unit} of {outcome.costs.full_cost():g}; "
          f"the mask costs {result.cost:g} {result.unit}")
    print(f"pruned {outcome.heads_pruned} of {outcome.heads_total} heads: {head_mask_to_spec(result.head_mask)}")
    if result.ffn_mask is not None:

        print(f"pruned {outcome.neurons_pruned} of {outcome.neurons_total} FFN neurons: "
              f"{ffn_mask_to_spec(result.ffn_mask)}")
    flops = outcome.flops
    print(f"FLOPs kept: {flops.kept:.4g} of {flops.full:.4g} {flops.unit} "
          f"({100.0 * flops.share:.1f}%, {flops.sequence_length} attended positions)")
    if outcome.decoding is not None:
        decoding = outcome.decoding
        print(f"decoding FLOPs per sentence (beam {decoding.beam}, {decoding.source_length} source tokens, "
              f"{decoding.target_steps} decoder steps, </s> included): the layers keep "
              f"{100.0 * decoding.layers_share():.1f}%; with the output projection "
              f"({decoding.output_projection:.4g}, never pruned) the model keeps "
              f"{100.0 * decoding.whole_share():.1f}%")
    if outcome.predicted_speedup is not None:
        print(f"predicted speed-up of the whole model (latency table): {outcome.predicted_speedup:.2f}x")
    elif outcome.prediction_note:
        print(outcome.prediction_note)
    estimate = f"estimated loss increase (Fisher, diagonal) {result.diagonal_loss:.5f}"
    before = result.details.get("block_loss_before_rearrangement")
    if result.rearranged and before is not None and outcome.costs.prices_heads:
        estimate += (f"; block-diagonal {before:.5f} before rearrangement, {result.block_loss:.5f} after "
                     f"({result.swaps} swaps)")
    elif result.block_loss is not None and outcome.costs.prices_heads:
        estimate += f"; block-diagonal {result.block_loss:.5f}"
    print(estimate)
    if outcome.tuning is not None:
        summary = outcome.tuning.summary()
        print(f"mask tuning on {outcome.tuning.settings['sentences']} sentences "
              f"({', '.join(settings.tuning.subsets)}): {summary.fitted} of {summary.layers} layers fitted")
        for line in layer_tuning_summary(outcome.tuning):
            print(line)
    timing = ", ".join(f"{name} {value:.1f} s" for name, value in outcome.seconds.items())
    print(f"time: {timing}")
    print("wrote\t" + " ".join(outcome.files))
    return 0


def command_latency(args: argparse.Namespace) -> int:
    from fairseq_headprune.engine.pipelines.search import run_latency

    table = run_latency(LatencySettings(
        data=args.data, checkpoint=args.path, out=args.out, batch_size=args.batch_size,
        sequence_length=args.sequence_length, repeats=args.repeats, cpu=args.cpu, progress=not args.no_progress,
        fairseq_args=list(args.fairseq_args), neuron_step=args.neuron_step, engine=args.engine,
        quantization=args.quantization, target_length=args.target_length,
    ))
    shape = table.settings
    if table.engine == FAIRSEQ_ENGINE:
        print(f"{table.engine} on {table.device}, {table.precision}; {args.batch_size} sentences x "
              f"{shape['sequence_length']} positions, median of {args.repeats}")
    else:
        print(f"{table.engine} on {table.device}, {table.precision}; beam {shape['beam']}, {args.batch_size} sentences "
              f"of {shape['sequence_length']} source tokens, {shape['target_length']} generated; the whole model "
              f"decodes in {shape['whole_model_ms']:.1f} ms, median of {args.repeats}, each variant in its own process")
    if table.engine != FAIRSEQ_ENGINE:
        print("each layer priced at what it adds over its narrowest (the decoder's self- and cross-attention "
              "keep one head count); use with search --uniform --latency-engine "
              f"{table.engine} --latency-precision {table.precision}")
    print("layer\tms keeping 0, 1, ... heads (FFN layers: the neurons in brackets)")
    for block, timings in table.per_layer.items():
        counts = table.counts.get(block)
        cells = [f"{t:.3f}" if counts is None else f"{t:.3f} [{k}]" for t, k in zip(timings, counts or timings)]
        print(f"{layer_name(*block)}\t" + " ".join(cells))
    print(f"wrote\t{args.out}")
    return 0


def add_parsers(commands) -> None:
    _add_search_parser(commands)
    _add_latency_parser(commands)


def _add_search_parser(commands) -> None:
    search = commands.add_parser(
        "search",
        help="the heads (and FFN neurons) to keep within a budget, by the masks' Fisher information, "
        "rearranged and optionally tuned (Kwon et al. 2022)",
        description="Find the mask that minimises the Fisher estimate of the loss increase, "
        "1/2 (1-m)^T F (1-m), within --budget: heads kept, FLOPs per token, or latency from a "
        "table the latency command measured on this device. --structure ffn searches FFN neurons, joint "
        "heads and neurons together (one knapsack over attention and FFN layers). The search uses the "
        "diagonal of F; rearrangement then swaps heads within each layer with its block of F (the number "
        "kept per layer stays). --tune-masks fits each pruned layer's kept-unit scales and an output-bias "
        "correction by least squares. Writes OUT/mask.json (for any command's --head-mask or shrink), "
        "OUT/ffn_mask.json when neurons are searched (for --ffn-mask), OUT/search.json and, tuned, "
        "OUT/tuning.json (for shrink --tuning).",
    )
    search.add_argument("data", metavar="DATA", help="fairseq-preprocess output directory")
    search.add_argument("--path", required=True, metavar="CKPT", help="fairseq checkpoint")
    search.add_argument("--out-dir", required=True, metavar="DIR", help="where the mask and its record go")
    search.add_argument(
        "--budget", required=True, metavar="B",
        help="what the pruned model keeps, in --cost's unit: a number (36 heads kept; FLOPs per token; ms) or "
        "a percentage of the unpruned model's cost (50%%: half of it kept)",
    )
    _add_cost_arguments(search)
    search.add_argument("--fisher", metavar="FILE",
                        help="importance.json of importance --importance-method fisher (default: estimate it)")
    search.add_argument("--no-rearrange", action="store_true", help="keep the diagonal search's mask")
    group = search.add_argument_group("Fisher estimation (without --fisher)")
    add_importance_arguments(group, method=False)
    add_tuning_arguments(search, "also tune the masks found: least-squares scales of the kept heads and "
                         "neurons and an output-bias correction per layer (a fit kept only if it lowers the loss on "
                         "held-aside batches), written to OUT/tuning.json", per_order=False)
    add_device_arguments(search)
    search.set_defaults(handler=command_search, accepts_fairseq_args=True)


def _add_cost_arguments(search) -> None:
    """What the budget counts and prunes, and the tables and counts that price it."""
    search.add_argument("--cost", choices=COST_KINDS, default="heads",
                        help="what the budget counts (default: heads): heads kept (--structure heads only), "
                        "FLOPs per token of the attention and FFN layers searched, their FLOPs per translated "
                        "sentence in beam search (decoding-flops: the encoder once per source token, the decoder "
                        "once per step and beam row, at fairseq's --beam and the valid split's mean lengths), or "
                        "latency (ms)")
    search.add_argument(
        "--structure", choices=PRUNED_STRUCTURES, default="heads",
        help="what to prune: attention heads (default), FFN neurons, or both in one search (joint); ffn and "
        "joint need neuron Fisher scores (importance --importance-method fisher --importance-structures "
        "heads,ffn, or estimated here) and a --cost of flops or latency",
    )
    search.add_argument("--uniform", action="store_true",
                        help="every layer of an attention type keeps the same number of heads (one head count "
                        "per stack, for engines that need one)")
    search.add_argument("--tie-decoder-heads", action="store_true",
                        help="with --uniform: the decoder's self- and cross-attention layers keep one head count "
                        "too, as CTranslate2 runs a decoder, so that the mask exports to it without padding")
    search.add_argument("--neuron-step", type=int, metavar="N",
                        help="FFN layers keep a multiple of N neurons (or all); default: about 128 counts per "
                        "layer, or the latency table's steps")
    search.add_argument("--latency-table", metavar="FILE",
                        help="for --cost latency: the latency command's table for this model and device")
    search.add_argument("--latency-engine", choices=LATENCY_ENGINES, default=FAIRSEQ_ENGINE,
                        help="for --cost latency: the engine the model will run in, which the table must have "
                        "timed (default fairseq; ctranslate2 needs --uniform)")
    search.add_argument("--latency-precision", metavar="TYPE",
                        help="for --cost latency: the precision the table must have timed (default: the "
                        "model's for fairseq, float32 for ctranslate2)")
    search.add_argument(
        "--sequence-length", type=int, default=DEFAULT_SEQUENCE_LENGTH, metavar="N",
        help=f"for --cost flops: attended positions per token (default {DEFAULT_SEQUENCE_LENGTH})",
    )
    search.add_argument("--source-length", type=int, metavar="N",
                        help="for --cost decoding-flops: source tokens per sentence, </s> left out (default: the "
                        "valid split's mean)")
    search.add_argument("--target-length", type=int, metavar="N",
                        help="for --cost decoding-flops: generated tokens per sentence, </s> left out (default: "
                        "the valid split's mean)")


def _add_latency_parser(commands) -> None:
    latency = commands.add_parser(
        "latency",
        help="measure each attention layer's latency keeping 0 .. H heads and each FFN layer's keeping k "
        "neurons, for search --cost latency",
        description="Time every attention layer of CKPT on this device with its first k heads kept, for "
        "every k, and every FFN layer with its first k neurons kept, k in steps of --neuron-step, on random "
        "inputs (a full-sequence pass of --sentences sentences of --sequence-length positions; median of "
        "--repeats). With --engine ctranslate2 the model is exported to CTranslate2 once per variant, every "
        "layer of one group narrowed alike (the encoder's attention, the decoder's self- and cross-attention "
        "together, one FFN type), and the whole model's beam search is timed as it decodes in deployment (--beam "
        "beams, --target-length tokens generated per sentence). Each group is timed keeping none, half and all of "
        "its units, all the variants in one run, each in its own process, taking turns pass by pass; a layer "
        "is priced at what its group adds over its narrowest, read off the straight lines between those three, "
        "and the whole model's time is recorded so that search can predict a mask's speed-up. The table records "
        "the engine, the device, the precision and the model's shape; search refuses it for another model, "
        "device, engine or precision.",
    )
    latency.add_argument("data", metavar="DATA", help="fairseq-preprocess output directory (its dictionaries)")
    latency.add_argument("--path", required=True, metavar="CKPT", help="fairseq checkpoint (every head)")
    latency.add_argument("--out", required=True, metavar="FILE.json", help="the table to write")
    latency.add_argument("--sentences", dest="batch_size", type=int, default=32, metavar="N",
                         help="sentences of the synthetic batch each layer is timed on (default 32)")
    latency.add_argument("--sequence-length", type=int, metavar="N",
                         help=f"positions: of every timed layer (fairseq; default {DEFAULT_SEQUENCE_LENGTH}), of the "
                         "source sentences (ctranslate2; default: the mean source length of DATA's valid split)")
    latency.add_argument("--target-length", type=int, metavar="N",
                         help="with --engine ctranslate2: tokens each beam search generates (default: the mean "
                         "target length of DATA's valid split)")

    latency.add_argument("--repeats", type=int, default=20, metavar="N", help="timed passes per shape (default 20)")
    latency.add_argument("--neuron-step", type=int, metavar="N",
                         help="time FFN layers keeping 0, N, 2N, ... neurons and all (default: 16 steps per layer)")
    latency.add_argument("--engine", choices=LATENCY_ENGINES, default=FAIRSEQ_ENGINE,
                         help="what runs the timed layers: fairseq (each layer alone, default) or ctranslate2 "
                         "(the model exported, as fairseq-headprune export writes it)")
    latency.add_argument("--quantization", default="float32", metavar="TYPE",
                         help="with --engine ctranslate2: the compute type timed (float32, int8, int8_float32, "
                         "float16, bfloat16; default float32)")
    add_device_arguments(latency)
    latency.set_defaults(handler=command_latency, accepts_fairseq_args=True)
