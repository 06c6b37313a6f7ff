"""``fairseq-headprune export``: a masked, tuned or shrunk checkpoint as a model CTranslate2 runs."""

import argparse

from fairseq_headprune.commands.common import add_device_arguments
from fairseq_headprune.constants import CTRANSLATE2_ENGINE, QUANTIZATIONS
from fairseq_headprune.engine.export.engines import export_engines
from fairseq_headprune.errors import HeadMaskError
from fairseq_headprune.study.compression.deployment_settings import ExportSettings
from fairseq_headprune.study.masks.ffn_mask import parse_ffn_mask
from fairseq_headprune.study.masks.head_mask import parse_head_mask


def command_export(args: argparse.Namespace) -> int:
    from fairseq_headprune.engine.checkpoints.info import loaded_ffn_layout, loaded_head_layout
    from fairseq_headprune.engine.pipelines.export import run_export

    # the masks number the heads and neurons of the model the checkpoint loads as (a shrunk one's that stay)
    masks = {}
    for flag, spec, parse, layout_of in (("--head-mask", args.head_mask, parse_head_mask, loaded_head_layout),
                                         ("--ffn-mask", args.ffn_mask, parse_ffn_mask, loaded_ffn_layout)):
        if spec is not None:
            try:
                masks[flag] = parse(spec, layout_of(args.path))
            except HeadMaskError as error:
                raise HeadMaskError(f"{flag}: {error}") from error
    outcome = run_export(ExportSettings(
        data=args.data, checkpoint=args.path, out_dir=args.out_dir, format=args.format, quantization=args.quantization,
        head_mask=masks.get("--head-mask"), ffn_mask=masks.get("--ffn-mask"), tuning_file=args.tuning, cpu=args.cpu,
        fairseq_args=list(args.fairseq_args), vocabulary_map=args.vocabulary_map,
        vocabulary_map_candidates=args.vocabulary_map_candidates, vocabulary_map_common=args.vocabulary_map_common,
    ))
    for attention_type, counts in outcome.kept.items():
        print(f"heads kept\t{attention_type}\t{' '.join(map(str, counts))}")
    for side, count in outcome.num_heads.items():
        padding = outcome.padded[side]
        if side in outcome.headless:
            note = "; no head kept: each layer holds one zero head (CTranslate2 has no empty attention)"
        else:
            note = f"; {padding} zero heads pad the layers that keep fewer" if padding else ""
        print(f"{side}\t{count} heads per layer{note}")
    if outcome.vocabulary_map is not None:
        vmap = outcome.vocabulary_map
        print(f"vocabulary map\t{vmap['file']}: {vmap['per_token']} candidates per source token, {vmap['common']} "
              f"always; it covers {100.0 * vmap['valid_coverage']:.2f}% of the valid split's reference tokens "
              "(translate_batch(..., use_vmap=True) uses it)")
    print(f"wrote\t{outcome.out_dir} ({args.format}, {outcome.quantization})")
    return 0


def add_parser(commands) -> None:
    export = commands.add_parser(
        "export",
        help="write a masked, tuned or shrunk checkpoint as a CTranslate2 model (translation, language models)",
        description="Load CKPT with its recorded masks and removed heads or neurons (plus --head-mask, "
        "--ffn-mask, --tuning) and write it as a CTranslate2 model directory, built from the weights: "
        "CTranslate2 has one head count per encoder and per decoder, so layers that keep fewer heads are "
        "padded with zero heads (which add nothing) up to the stack's largest count; masked FFN neurons are "
        "left out. Vocabularies come from DATA. Needs the ctranslate2 package "
        "(pip install 'fairseq-headprune[ctranslate2]').",
    )
    export.add_argument("data", metavar="DATA", help="fairseq-preprocess output directory (its dictionaries)")
    export.add_argument("--path", required=True, metavar="CKPT", help="fairseq checkpoint (masked, tuned or shrunk)")
    export.add_argument("--head-mask", metavar="SPEC", help="heads to leave out besides those the checkpoint records")
    export.add_argument("--ffn-mask", metavar="SPEC", help="FFN neurons to leave out")
    export.add_argument("--tuning", metavar="TUNING.json",
                        help="a tuned mask (search --tune-masks): its heads left out, its scales folded in")
    export.add_argument("--format", choices=list(export_engines()), default=CTRANSLATE2_ENGINE,
                        help=f"the engine written for (default: {CTRANSLATE2_ENGINE})")
    export.add_argument("--quantization", choices=QUANTIZATIONS,
                        help="weight type of the exported model (default: float32); the installed CTranslate2 "
                        "must compute it on this device")
    export.add_argument("--out-dir", required=True, metavar="DIR", help="model directory to write (new or empty)")
    vocabulary = export.add_argument_group("vocabulary map (translation)")
    vocabulary.add_argument("--vocabulary-map", action="store_true",
                            help="also write vmap.txt, CTranslate2's vocabulary map built from DATA's training "
                            "pairs: translate_batch(use_vmap=True) then runs the output projection over the "
                            "candidates of the batch's source tokens only")
    vocabulary.add_argument("--vocabulary-map-candidates", type=int, default=20, metavar="N",
                            help="target tokens per source token, by Dice's coefficient over the pairs (default 20)")
    vocabulary.add_argument("--vocabulary-map-common", type=int, default=100, metavar="N",
                            help="the N most frequent target tokens are always candidates (default 100)")
    add_device_arguments(export)
    export.set_defaults(handler=command_export, accepts_fairseq_args=True)
