"""``fairseq-headprune corpus``: the built-in synthetic demo corpus."""

import argparse
import math
import os

from fairseq_headprune.constants import DEFAULT_CORPUS_SEED
from fairseq_headprune.corpora.demo_corpus import write_acceptability_corpus, write_demo_corpus
from fairseq_headprune.corpora.gettext_corpus import write_gettext_corpus
from fairseq_headprune.corpora.nli_corpus import write_inference_corpus, write_pretraining_text
from fairseq_headprune.errors import SettingsError


def command_corpus(args: argparse.Namespace) -> int:

    if not math.isfinite(args.scale) or args.scale <= 0:
        raise SettingsError(f"--scale must be a positive (finite) number, got {args.scale}")
    if args.majority and args.kind != "translation":
        raise SettingsError("--majority is for --kind translation (the references' ceiling)")
    if args.kind == "gettext":
        counts = write_gettext_corpus(args.out_dir, language=args.language, locale_dir=args.locale_dir)
        files, what = "{en,%s}" % args.language, "message pairs"
    elif args.kind == "acceptability":
        counts = write_acceptability_corpus(args.out_dir, seed=args.seed, scale=args.scale)
        files, what = "{input0,label}", "labelled sentences"
    elif args.kind == "nli":
        counts = write_inference_corpus(args.out_dir, seed=args.seed, scale=args.scale)
        files, what = "{input0,input1,label}", "premise/hypothesis pairs"
        for split, count in write_pretraining_text(args.out_dir, seed=args.seed, scale=args.scale).items():
            print(f"pretrain.{split}\t{count} sentences\t{os.path.join(args.out_dir, 'pretrain.' + split)}.txt")
    else:
        counts = write_demo_corpus(args.out_dir, seed=args.seed, scale=args.scale, majority=args.majority)
        files, what = "{en,fr}", "sentence pairs"
    for split, count in counts.items():
        print(f"{split}\t{count} {what}\t{os.path.join(args.out_dir, split)}.{files}")
    return 0


def add_parser(commands) -> None:
    corpus = commands.add_parser(
        "corpus",
        help="write a built-in corpus (raw text): the synthetic demo corpora or real gettext message pairs",
        description="Write train/valid/test and a domain-shifted test-shifted split "
        "as SPLIT.en / SPLIT.fr (--kind acceptability: French sentences labelled acceptable or not, "
        "SPLIT.input0/.label; --kind nli: premise, hypothesis and label, SPLIT.input0/.input1/.label, "
        "with test-mismatched for the shifted domain); the same seed gives the same corpus.",
    )
    corpus.add_argument("out_dir", help="directory for the text files")
    corpus.add_argument(
        "--kind", choices=("translation", "acceptability", "nli", "gettext"), default="translation",
        help="translation (default): English -> French pairs; acceptability: does the French main verb "
        "agree with its subject (labels acceptable/unacceptable, about half each; a CoLA-like task "
        "for encoder-only models); nli: English premise/hypothesis pairs labelled entailment, neutral "
        "or contradiction (a thirds each; MultiNLI-like, 20000/1000/1000 train/valid/test and a "
        "domain-shifted test-mismatched), and pretrain.{train,valid}.txt (40000/1000 sentences) "
        "for masked-LM pretraining; gettext: real English -> LANGUAGE message pairs from the "
        "system's gettext catalogs (--locale-dir), one translation per message, split by a hash of "
        "the English side (500 test, 1500 valid, the rest train)",
    )
    corpus.add_argument(
        "--language", default="de", help="--kind gettext: the catalogs' language code (default de)"
    )
    corpus.add_argument(
        "--locale-dir", default="/usr/share/locale",
        help="--kind gettext: where LANGUAGE/LC_MESSAGES/*.mo are (default /usr/share/locale)",
    )
    corpus.add_argument(
        "--seed", type=int, default=DEFAULT_CORPUS_SEED, help=f"corpus seed (default {DEFAULT_CORPUS_SEED})"
    )
    corpus.add_argument(
        "--scale", type=float, default=1.0,
        help="multiply every split's size (default 1.0: 16000/500/300/300 pairs)",
    )
    corpus.add_argument(
        "--majority", action="store_true",
        help="translate every word by its most frequent translation: the same sentences with the references "
        "a perfect model would produce; scored against the sampled references it is the corpus's ceiling",
    )
    corpus.set_defaults(handler=command_corpus)
