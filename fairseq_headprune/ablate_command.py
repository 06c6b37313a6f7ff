"""``fairseq-headprune ablate`` and ``fairseq-headprune significance``.

``ablate`` loads a checkpoint once, sweeps head-mask configurations over a
split with ``sweep.run_sweep`` (resumable), tests every configuration against
the unmasked model and writes the paper's tables and figures.
``significance`` runs the same paired tests on hypothesis files.
"""

import glob
import json
import os
from typing import Dict, List, Optional, Sequence

from .ablation import (
    BASELINE,
    BLEU_KINDS,
    MODES,
    ConfigScores,
    HeadConfig,
    all_but_one_configs,
    baseline_config,
    best_per_layer,
    compare_with_baseline,
    latex_best_table,
    latex_single_table,
    markdown_best_table,
    markdown_single_table,
    pearson,
    reported_bleu,
    result_rows,
    single_head_configs,
    test_definition,
    write_rows_tsv,
)
from .atomic_files import write_json, write_text
from .bleu_stats import compare_mt_stats, corpus_bleu, fairseq_bleu_stats, sacrebleu_stats
from .evaluation import StudyError, read_lines
from .head_mask import ATTENTION_TYPES, HeadMaskError, parse_attention_type, parse_head_mask
from .significance import TESTS, SignificanceSettings
from .sweep import first_difference

SWEEPS_DIR = "sweeps"
# identity keys that may differ between the sweeps of one output directory
PER_SPLIT_KEYS = ("split", "sentences", "sentence_ids_sha256", "data", "sacrebleu_references")


def test_settings(args) -> SignificanceSettings:
    try:
        return SignificanceSettings(
            test=args.test, samples=args.samples, seed=args.seed, sample_ratio=args.sample_ratio, alpha=args.alpha
        )
    except ValueError as error:
        raise StudyError(str(error))


def _types(text: Optional[str]) -> List[str]:
    if not text:
        return list(ATTENTION_TYPES)
    try:
        types = [parse_attention_type(t) for t in text.replace(",", " ").split()]
    except HeadMaskError as error:
        raise StudyError(f"--types: {error}")
    return [t for t in ATTENTION_TYPES if t in types]


class SplitSweep:
    """One split of one data directory, swept into ``out_dir/sweeps/NAME``."""

    def __init__(self, args, cfg, task, model, split: str, name: str, references: Optional[str] = None):
        from .sweep import SplitTranslator

        self.args, self.split, self.name = args, split, name
        self.translator = SplitTranslator(
            cfg, task, model, split, detokenize=args.sacrebleu_detokenize, references=references
        )
        self.directory = os.path.join(args.out_dir, SWEEPS_DIR, name)

    def run(self, configs: Sequence[HeadConfig], base_mask) -> Dict[str, "ConfigScores"]:
        from .sweep import run_sweep

        identity = self.translator.identity(self.args.path, base_mask)
        check_out_dir(self.args.out_dir, identity)
        results = run_sweep(
            self.translator, configs, self.directory, identity, base_mask,
            progress=not self.args.no_progress, configs_per_batch=self.args.configs_per_batch,
        )
        return {name: self._scores(result) for name, result in results.items()}

    def _scores(self, result) -> ConfigScores:
        args = self.args
        tokenized = args.bleu == "tokenized"
        texts = result.hypotheses if tokenized else result.detokenized
        definition = test_definition(args.bleu, args.test)
        if definition == "fairseq":
            stats = result.fairseq_stats
        elif definition == "sacrebleu":
            stats = result.sacrebleu_stats
        else:
            stats = compare_mt_stats(self.references, texts)
        return ConfigScores(result.name, result.spec, result.labels, result.bleu, result.sacrebleu, stats, texts)

    @property
    def references(self) -> List[str]:
        if self.args.bleu == "tokenized":
            return self.translator.reference_text
        return self.translator.sacrebleu_references


def check_out_dir(out_dir: str, identity: Dict[str, object]) -> None:
    """Every sweep in one output directory must be of the same model and settings."""
    for manifest in sorted(glob.glob(os.path.join(out_dir, SWEEPS_DIR, "*", "sweep.json"))):
        try:
            with open(manifest, encoding="utf-8") as stream:
                other = json.load(stream)["identity"]
        except (OSError, ValueError, KeyError):
            continue  # run_sweep reports it if it is this split's
        shared = {k: v for k, v in identity.items() if k not in PER_SPLIT_KEYS}
        difference = first_difference({k: v for k, v in other.items() if k not in PER_SPLIT_KEYS}, shared)
        if difference is not None:
            raise StudyError(
                f"{out_dir} holds the results of a different sweep ({difference}, in {manifest}); "
                "use another output directory"
            )


def compare_sweep(args, sweep: SplitSweep, scores: Dict[str, ConfigScores], configs: Sequence[HeadConfig]):
    settings = test_settings(args)
    baseline = scores[BASELINE]
    systems = [scores[c.name] for c in configs if c.name != BASELINE]
    results = compare_with_baseline(
        baseline, systems, settings, test_definition(args.bleu, args.test), sweep.references,
        tokenize="none" if args.bleu == "tokenized" else "13a",
    )
    return baseline, result_rows(baseline, systems, results, args.bleu)


def settings_record(args, sweep: SplitSweep, baseline: ConfigScores) -> Dict[str, object]:
    return {
        "bleu": args.bleu,
        "bleu_description": BLEU_KINDS[args.bleu],
        "baseline_bleu": reported_bleu(baseline, args.bleu),
        "baseline_bleu_tokenized": baseline.bleu,
        "baseline_sacrebleu": baseline.sacrebleu,
        "test": test_settings(args).to_dict(),
        "split": sweep.split,
        "sweep_dir": os.path.abspath(sweep.directory),
        "checkpoint": os.path.abspath(args.path),
    }


def write_result_rows(prefix: str, rows, settings: Dict[str, object]) -> None:
    write_rows_tsv(rows, prefix + ".tsv")
    write_json({"settings": settings, "rows": rows}, prefix + ".json", indent=1)


def table_caption(args, what: str, split: str) -> str:
    settings = test_settings(args)
    return (
        f"{what} on {split}, {BLEU_KINDS[args.bleu]}; "
        f"marked: p < {settings.alpha:g} ({settings.test}, {settings.samples} resamples, seed {settings.seed})."
    )


def write_single_outputs(args, sweep, baseline, rows, prefix: str) -> None:
    from .plots import plot_delta_heatmaps, plot_score_histogram

    settings = settings_record(args, sweep, baseline)
    write_result_rows(prefix, rows, settings)
    caption = table_caption(args, "BLEU change when one head is masked", sweep.split)
    write_text(markdown_single_table(rows, settings["baseline_bleu"], caption), prefix + ".md")
    write_text(latex_single_table(rows, settings["baseline_bleu"], caption), prefix + ".tex")
    alpha = test_settings(args).alpha
    plot_delta_heatmaps(
        rows, prefix + "_delta.png", f"ΔBLEU when one head is masked ({sweep.split}; dots: p < {alpha:g})"
    )
    plot_score_histogram(
        rows, settings["baseline_bleu"], prefix + "_hist.png",
        f"BLEU with one head masked ({sweep.split})", f"{args.bleu} BLEU",
    )


def _print_summary(rows, baseline_bleu: float, alpha: float, what: str) -> None:
    significant = [r for r in rows if r["significant"]]
    worst = min(rows, key=lambda r: r["delta"])
    best = max(rows, key=lambda r: r["delta"])
    print(f"baseline BLEU {baseline_bleu:.2f}; {len(rows)} {what}; {len(significant)} significant at p < {alpha:g}")
    print(f"largest drop  {worst['delta']:+.2f}  {worst['config']} (p = {worst['p_value']:.3g})")
    print(f"largest gain  {best['delta']:+.2f}  {best['config']} (p = {best['p_value']:.3g})")


def check_sweep_arguments(args) -> None:
    """Checks shared by the commands that sweep (``add_sweep_arguments``); fixes fairseq's batching."""
    test_settings(args)
    if args.configs_per_batch <= 0:
        raise StudyError(f"--configs-per-batch must be positive, got {args.configs_per_batch}")
    if args.references and args.bleu != "sacrebleu":
        raise StudyError("--references (raw reference text) is used by --bleu sacrebleu only")
    if not any(a.startswith("--required-batch-size-multiple") for a in args.fairseq_args):
        # fairseq's generation batching leaves out the last (sentences mod 8) sentences of
        # a split when batches must be multiples of 8 (its default): score every sentence
        args.fairseq_args = args.fairseq_args + ["--required-batch-size-multiple", "1"]


def command_ablate(args) -> int:
    from .evaluation import load_task_and_model
    from .masked_multihead_attention import current_head_mask, head_layout

    settings = test_settings(args)
    if args.mode == "cross-domain" and not args.cross_subset:
        raise StudyError("--mode cross-domain needs --cross-subset SPLIT (the out-of-domain test set)")
    if args.select_subset and args.mode != "all-but-one":
        raise StudyError("--select-subset is for --mode all-but-one")
    check_sweep_arguments(args)
    cfg, task, model = load_task_and_model(args.data, args.path, args.fairseq_args, cpu=args.cpu)
    layout = head_layout(model)
    base_mask = current_head_mask(model)  # --head-mask and the checkpoint's recorded mask
    types = _types(args.types)
    heads = None
    if args.heads:
        try:
            heads = parse_head_mask(args.heads, layout)
        except HeadMaskError as error:
            raise StudyError(f"--heads: {error}")
    os.makedirs(args.out_dir, exist_ok=True)
    out = args.out_dir

    if args.mode == "all-but-one":
        configs = [baseline_config()] + all_but_one_configs(layout, types)
    else:
        configs = [baseline_config()] + [
            c for c in single_head_configs(layout, heads) if c.attention_type in types
        ]
    if len(configs) == 1:
        raise StudyError("no configuration to translate (check --types and --heads)")

    sweep = SplitSweep(args, cfg, task, model, args.gen_subset, args.gen_subset, args.references)
    scores = sweep.run(configs, base_mask)
    baseline, rows = compare_sweep(args, sweep, scores, configs)

    if args.mode == "all-but-one":
        write_all_but_one_outputs(args, sweep, baseline, rows, configs, cfg, task, model, base_mask)
    else:
        write_single_outputs(args, sweep, baseline, rows, os.path.join(out, "single"))
        _print_summary(rows, reported_bleu(baseline, args.bleu), settings.alpha, "heads masked one at a time")
        print(f"wrote\t{os.path.join(out, 'single')}.{{tsv,json,md,tex}} single_delta.png single_hist.png")
    if args.mode == "cross-domain":
        cross_task, cross_model = task, model
        name = args.cross_subset
        if args.cross_data:
            _, cross_task, cross_model = load_task_and_model(args.cross_data, args.path, args.fairseq_args, cpu=args.cpu)
            name = f"{os.path.basename(os.path.normpath(args.cross_data))}.{args.cross_subset}"
        cross = SplitSweep(args, cfg, cross_task, cross_model, args.cross_subset, name)
        cross_scores = cross.run(configs, base_mask)
        cross_baseline, cross_rows = compare_sweep(args, cross, cross_scores, configs)
        write_single_outputs(args, cross, cross_baseline, cross_rows, os.path.join(out, f"single.{name}"))
        write_cross_domain_outputs(args, sweep, cross, baseline, cross_baseline, rows, cross_rows)
    return 0


def write_all_but_one_outputs(args, sweep, baseline, rows, configs, cfg, task, model, base_mask) -> None:
    from .plots import plot_delta_heatmaps

    out = args.out_dir
    settings = settings_record(args, sweep, baseline)
    write_result_rows(os.path.join(out, "all_but_one"), rows, settings)
    best = best_per_layer(rows)
    selected = None
    if args.select_subset:
        select = SplitSweep(args, cfg, task, model, args.select_subset, args.select_subset)
        select_scores = select.run(configs, base_mask)
        _, select_rows = compare_sweep(args, select, select_scores, configs)
        by_name = {r["config"]: r for r in rows}
        selected = {}
        for chosen in best_per_layer(select_rows):
            row = dict(by_name[chosen["config"]])
            row["selected_on"] = args.select_subset
            selected[(row["attention_type"], row["layer"])] = row
        settings["select_subset"] = args.select_subset
    best_rows = []
    for row in best:
        entry = {k: row[k] for k in ("attention_type", "layer", "head", "config", "bleu", "delta", "p_value", "significant")}
        if selected is not None:
            chosen = selected[(row["attention_type"], row["layer"])]
            entry.update(
                {
                    "selected_head": chosen["head"],
                    "selected_bleu": chosen["bleu"],
                    "selected_delta": chosen["delta"],
                    "selected_p_value": chosen["p_value"],
                    "selected_significant": chosen["significant"],
                }
            )
        best_rows.append(entry)
    prefix = os.path.join(out, "all_but_one_best")
    write_result_rows(prefix, best_rows, settings)
    caption = table_caption(args, "Best BLEU change per layer when only one head is kept", sweep.split)
    write_text(markdown_best_table(best, caption, selected), prefix + ".md")
    write_text(latex_best_table(best, caption, selected), prefix + ".tex")
    plot_delta_heatmaps(
        rows, os.path.join(out, "all_but_one_delta.png"),
        f"ΔBLEU when only this head of its layer is kept ({sweep.split}; dots: p < {test_settings(args).alpha:g})",
    )
    print(f"baseline BLEU {settings['baseline_bleu']:.2f} on {sweep.split}; best ΔBLEU per layer when one head is kept:")
    for entry in best_rows:
        line = f"  {entry['attention_type']}\tlayer {entry['layer']}\thead {entry['head']}\t{entry['delta']:+.2f}"
        if selected is not None:
            line += f"\tchosen on {args.select_subset}: head {entry['selected_head']} {entry['selected_delta']:+.2f}"
        print(line)
    print(f"wrote\t{prefix}.{{tsv,json,md,tex}} {os.path.join(out, 'all_but_one')}.{{tsv,json}} all_but_one_delta.png")


def write_cross_domain_outputs(args, sweep, cross, baseline, cross_baseline, rows, cross_rows) -> None:
    from .plots import plot_cross_domain

    out = args.out_dir
    by_config = {r["config"]: r for r in cross_rows}
    joined = []
    for row in rows:
        other = by_config[row["config"]]
        joined.append(
            {
                "config": row["config"],
                "attention_type": row["attention_type"],
                "layer": row["layer"],
                "head": row["head"],
                "delta": row["delta"],
                "p_value": row["p_value"],
                "significant": row["significant"],
                "cross_delta": other["delta"],
                "cross_p_value": other["p_value"],
                "cross_significant": other["significant"],
            }
        )
    r, p = pearson([j["delta"] for j in joined], [j["cross_delta"] for j in joined])
    per_type = {}
    for attention_type in ATTENTION_TYPES:
        subset = [j for j in joined if j["attention_type"] == attention_type]
        if subset:
            per_type[attention_type] = pearson([j["delta"] for j in subset], [j["cross_delta"] for j in subset])
    settings = settings_record(args, sweep, baseline)
    settings.update(
        {
            "cross_split": cross.split,
            "cross_baseline_bleu": reported_bleu(cross_baseline, args.bleu),
            "pearson_r": r,
            "pearson_p": p,
            "pearson_per_type": {t: {"r": v[0], "p": v[1]} for t, v in per_type.items()},
        }
    )
    prefix = os.path.join(out, "cross_domain")
    write_result_rows(prefix, joined, settings)
    lines = [
        f"ΔBLEU per masked head on {sweep.split} and {cross.split} ({BLEU_KINDS[args.bleu]}).\n\n",
        "| heads | Pearson r | p-value |\n|---|---:|---:|\n",
        f"| all | {r:.3f} | {p:.3g} |\n",
    ]
    for attention_type, (type_r, type_p) in per_type.items():
        lines.append(f"| {attention_type} | {type_r:.3f} | {type_p:.3g} |\n")
    write_text("".join(lines), prefix + ".md")
    plot_cross_domain(
        joined, prefix + ".png", f"Pearson r = {r:.2f} (p = {p:.2g})",
        f"ΔBLEU on {sweep.split}", f"ΔBLEU on {cross.split}",
    )
    print(f"cross-domain: Pearson r = {r:.3f} (p = {p:.3g}) between ΔBLEU on {sweep.split} and on {cross.split}")
    print(f"wrote\t{prefix}.{{tsv,json,md,png}}")


# ----------------------------------------------------------------------------- significance


def command_significance(args) -> int:
    from .ablation import compare_with_baseline

    settings = test_settings(args)
    references = read_lines(args.reference)
    files = [args.baseline] + list(args.systems)
    texts = [read_lines(path) for path in files]
    for path, lines in zip(files, texts):
        if len(lines) != len(references):
            raise StudyError(f"{path} has {len(lines)} lines but the reference {args.reference} has {len(references)}")
    if not references:
        raise StudyError(f"the reference {args.reference} is empty")
    definition = test_definition(args.bleu, args.test)
    scores = []
    for path, lines in zip(files, texts):
        tokenized = fairseq_bleu_stats(references, lines)
        sacre = sacrebleu_stats(references, lines)
        stats = {"fairseq": tokenized, "sacrebleu": sacre}.get(definition)
        if stats is None:
            stats = compare_mt_stats(references, lines)
        scores.append(
            ConfigScores(
                os.path.basename(path), "", {}, corpus_bleu(tokenized, "fairseq"),
                corpus_bleu(sacre, "sacrebleu"), stats, lines,
            )
        )
    results = compare_with_baseline(
        scores[0], scores[1:], settings, definition, references,
        tokenize="none" if args.bleu == "tokenized" else "13a",
    )
    rows = result_rows(scores[0], scores[1:], results, args.bleu)
    base = reported_bleu(scores[0], args.bleu)
    print(
        f"{BLEU_KINDS[args.bleu]}; {settings.test} test, {settings.samples} resamples "
        f"(sample ratio {settings.sample_ratio:g}), seed {settings.seed}; significant: p < {settings.alpha:g}"
    )
    header = f"{'system':<32} {'BLEU':>7} {'95% CI':>17} {'ΔBLEU':>7} {'p-value':>8}  significant"
    print(header)
    print(f"{files[0][-32:]:<32} {base:>7.2f} {'':>17} {'':>7} {'':>8}  (baseline)")
    for path, row in zip(files[1:], rows):
        interval = "" if row["ci_low"] is None else f"[{row['ci_low']:.2f}, {row['ci_high']:.2f}]"
        print(
            f"{path[-32:]:<32} {row['bleu']:>7.2f} {interval:>17} {row['delta']:>+7.2f} "
            f"{row['p_value']:>8.4f}  {'yes' if row['significant'] else 'no'}"
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


# ----------------------------------------------------------------------------- parsers


def _add_test_arguments(parser) -> None:
    group = parser.add_argument_group("significance test")
    group.add_argument(
        "--bleu", choices=sorted(BLEU_KINDS), default="tokenized",
        help="BLEU to report and test: tokenized (fairseq's bleu scorer on the tokenized "
        "output, the paper's text; default) or sacrebleu (detokenized, 13a; what the "
        "authors' released scripts ran)",
    )
    group.add_argument(
        "--test", choices=TESTS, default="bootstrap",
        help="bootstrap: Koehn's paired bootstrap with full-size resamples (default); "
        "compare-mt: compare-mt's exact procedure (half-size resamples, its BLEU, its "
        "p = 1 - max win fraction); sacrebleu-bs / sacrebleu-ar: sacreBLEU's paired "
        "bootstrap / approximate randomisation",
    )
    group.add_argument("--samples", type=int, default=1000, help="resamples (or AR trials); default 1000")
    group.add_argument("--seed", type=int, default=12345, help="resampling seed (default 12345)")
    group.add_argument(
        "--sample-ratio", type=float,
        help="fraction of the sentences in each resample (default 1.0; 0.5 for --test compare-mt)",
    )
    group.add_argument("--alpha", type=float, default=0.01, help="significance level (default 0.01)")


def add_sweep_arguments(parser) -> None:
    """Options of every command that translates a split under many masks (ablate, prune)."""
    parser.add_argument(
        "--sacrebleu-detokenize", choices=["auto", "moses", "none"], default="auto",
        help="how output becomes detokenized text for sacreBLEU: auto (Moses detokenizer "
        "unless fairseq's --tokenizer already detokenizes; default), moses, none",
    )
    parser.add_argument(
        "--references", metavar="FILE",
        help="raw (detokenized) references of --gen-subset, one per line in corpus order, "
        "for --bleu sacrebleu (default: the data's target side, detokenized)",
    )
    parser.add_argument(
        "--configs-per-batch", type=int, default=4, metavar="K",
        help="translate K masked configurations together, each batch repeated K times "
        "(default 4; memory grows like a K times larger batch; 1: one at a time)",
    )
    _add_test_arguments(parser)
    parser.add_argument("--cpu", action="store_true", help="run on the CPU even if a GPU is present")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def add_parsers(commands) -> None:
    ablate = commands.add_parser(
        "ablate",
        help="ablation sweeps with paired-bootstrap significance (paper section 3)",
        description="Translate a split with fairseq's SequenceGenerator under many head masks, "
        "loading the model once: every head masked alone (--mode single, Table 1), every "
        "head kept alone in its layer (--mode all-but-one, Table 2), or the single-head "
        "sweep on two test sets (--mode cross-domain, Figure 2). Every configuration is "
        "tested against the unmasked model. Results are stored per configuration as they "
        "finish: a rerun continues where it stopped. Any other option is passed to "
        "fairseq-generate's parser (--beam, --lenpen, --remove-bpe, --batch-size, "
        "--max-tokens, --tokenizer, --bpe, ...).",
    )
    ablate.add_argument("data", metavar="DATA", help="fairseq-preprocess output directory")
    ablate.add_argument("--path", required=True, metavar="CKPT", help="fairseq checkpoint")
    ablate.add_argument("--mode", choices=MODES, default="single", help="which study (default: single)")
    ablate.add_argument("--gen-subset", default="test", metavar="SPLIT", help="split to translate (default: test)")
    ablate.add_argument("--out-dir", required=True, metavar="DIR", help="results directory (resumable)")
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

    significance = commands.add_parser(
        "significance",
        help="paired significance test of hypothesis files against a baseline",
        description="Score each SYSTEM and the BASELINE against REF (one sentence per line) "
        "and test each SYSTEM against the BASELINE: BLEU, its 95%% bootstrap interval, "
        "ΔBLEU and p-value.",
    )
    significance.add_argument("reference", metavar="REF", help="reference file")
    significance.add_argument("baseline", metavar="BASELINE", help="baseline hypotheses")
    significance.add_argument("systems", metavar="SYSTEM", nargs="+", help="hypotheses to test")
    _add_test_arguments(significance)
    significance.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    significance.set_defaults(handler=command_significance)
