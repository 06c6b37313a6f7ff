"""``fairseq-headprune mask``: check a head-mask spec against a checkpoint; print or save it."""

import argparse

from fairseq_headprune.errors import ResultFileError, SettingsError
from fairseq_headprune.study.masks.head_mask import (
    count_masked,
    head_mask_to_spec,
    masked_heads,
    parse_head_mask,
    write_mask_file,
)


def command_mask(args: argparse.Namespace) -> int:
    from fairseq_headprune.engine.checkpoints.info import checkpoint_head_layout

    if args.out and not args.out.lower().endswith((".json", ".tsv")):
        raise SettingsError(f"--out must end in .json or .tsv: {args.out}")
    if (args.spec is None) == (args.from_gates is None):
        raise SettingsError("give a SPEC or --from-gates CKPT (one of them)")
    layout = checkpoint_head_layout(args.path)
    if args.from_gates is not None:
        head_mask = gates_mask(args.from_gates, layout)
    else:
        head_mask = parse_head_mask(args.spec, layout)
    total = sum(layers * heads for layers, heads in layout.values())
    print("layout\t" + " ".join(f"{t}={layers}x{h}" for t, (layers, h) in layout.items()))
    print(f"masked\t{count_masked(head_mask)} of {total} heads")
    print(f"spec\t{head_mask_to_spec(head_mask)}")
    if args.list:
        for attention_type, layer, head in masked_heads(head_mask):
            print(f"{attention_type}\t{layer}\t{head}")
    if args.out:
        write_mask_file(head_mask, args.out)
        print(f"wrote\t{args.out}")
    return 0


def gates_mask(path: str, layout):
    """The exact-budget mask learned by ``--criterion headprune_gates`` in the checkpoint ``path``."""
    from fairseq_headprune.criterions.headprune_gates import gate_mask_from_state, gate_summary
    from fairseq_headprune.engine.checkpoints.info import load_checkpoint_state

    state = load_checkpoint_state(path)
    criterion_state = state.get("criterion") or {}
    head_mask, kept = gate_mask_from_state(criterion_state)
    if head_mask is None:
        raise ResultFileError(f"--from-gates {path} holds no head gates (train with --criterion headprune_gates)")
    shapes = {t: tuple(m.shape) for t, m in head_mask.items()}
    if shapes != {t: tuple(shape) for t, shape in layout.items()}:
        raise ResultFileError(f"--from-gates {path} has gates for another model ({shapes}), not {dict(layout)}")
    summary = gate_summary(criterion_state)
    print(f"gates	{kept} heads kept (the largest log_alpha); during training {summary['expected_heads']:.2f} "
          f"expected open, {summary['open_heads']:.0f} open without noise")
    return head_mask


def add_parser(commands) -> None:
    mask = commands.add_parser(
        "mask",
        help="check a head-mask spec against a checkpoint; print or save it",
        description="Parse SPEC for the model in CKPT, print its canonical form and "
        "the number of masked heads, and optionally write it as a .json/.tsv mask file.",
    )
    mask.add_argument("spec", metavar="SPEC", nargs="?", help='head-mask spec, e.g. "E:1:6 A:2:1,3"')
    mask.add_argument(
        "--from-gates", metavar="GATES.pt",
        help="instead of SPEC: the mask learned by fairseq-train --criterion headprune_gates (the checkpoint it "
        "wrote): exactly its --gate-target-heads heads, those with the largest gate log_alpha",
    )
    mask.add_argument("--path", required=True, metavar="CKPT", help="fairseq checkpoint")
    mask.add_argument("--out", metavar="FILE", help="write the mask to FILE (.json or .tsv)")
    mask.add_argument("--list", action="store_true", help="list every masked head")
    mask.set_defaults(handler=command_mask)
