"""One split swept under many masks, scored and tested against the unmasked model.

What ``ablate``, ``prune`` and ``dynamics`` share: a ``SplitSweep`` stores
every configuration's translation under ``OUT/sweeps/NAME`` (resumable,
``sweep.run_sweep``), turns stored results into the scores the chosen
metric and test need, and compares every configuration with the baseline on
one shared set of resamples. Settings come in as ``SweepSettings``.
"""

import glob
import json
import os
from typing import Dict, List, Optional, Sequence, Tuple

from fairseq_headprune.engine.runners.translator import ConfigResult, SplitTranslator
from fairseq_headprune.engine.sweeps.resumable_sweep import run_sweep
from fairseq_headprune.errors import StudyError
from fairseq_headprune.study.importance.ablation import (
    BASELINE,
    ConfigScores,
    HeadConfig,
    compare_with_baseline,
    reported_bleu,
    result_rows,
)
from fairseq_headprune.study.masks.head_mask import HeadMask
from fairseq_headprune.study.output.files import first_difference, write_json, write_rows_tsv
from fairseq_headprune.study.settings import SweepSettings

SWEEPS_DIR = "sweeps"
# a pruning step's columns: BLEU as reported, both BLEUs, and the test against the unpruned model
RESULT_COLUMNS = ("config", "spec", "bleu", "delta", "bleu_tokenized", "bleu_sacrebleu", "p_value", "significant",
                  "ci_low", "ci_high")
TEST_COLUMNS = ("p_value", "significant", "ci_low", "ci_high")
# identity keys that may differ between the sweeps of one output directory
PER_SPLIT_KEYS = ("split", "sentences", "sentence_ids_sha256", "data", "sacrebleu_references")


class SplitSweep:
    """One split of one data directory, swept into ``out_dir/sweeps/NAME``."""

    def __init__(self, settings: SweepSettings, cfg, task, model, split: str, name: str,
                 references: Optional[str] = None):
        self.settings, self.split, self.name = settings, split, name
        self.translator = SplitTranslator(
            cfg, task, model, split, detokenize=settings.detokenize, references=references,
            share_encoder=settings.share_encoder,
        )
        self.directory = os.path.join(settings.out_dir, SWEEPS_DIR, name)

    def run(self, configs: Sequence[HeadConfig], base_mask: Optional[HeadMask]) -> Dict[str, ConfigScores]:
        identity = self.translator.identity(self.settings.checkpoint, base_mask)
        check_out_dir(self.settings.out_dir, identity)
        results = run_sweep(
            self.translator, configs, self.directory, identity, base_mask,
            progress=self.settings.progress, configs_per_batch=self.settings.batch_configs,
            split_on_memory_error=self.settings.configs_per_batch_chosen,
        )
        return {name: self._scores(result) for name, result in results.items()}

    def _scores(self, result: ConfigResult) -> ConfigScores:
        tokenized = self.settings.bleu == "tokenized"
        texts = result.hypotheses if tokenized else result.detokenized
        test_metric = self.settings.test_metric
        if test_metric.name == "tokenized":
            stats = result.fairseq_stats  # from fairseq's scorer on the token ids, as fairseq-generate
        elif test_metric.name == "sacrebleu":
            stats = result.sacrebleu_stats
        else:
            stats = test_metric.example_statistics(self.references, texts)
        return ConfigScores(result.name, result.spec, result.labels, result.bleu, result.sacrebleu, stats, texts)

    @property
    def references(self) -> List[str]:
        if self.settings.bleu == "tokenized":
            return self.translator.reference_text
        return self.translator.sacrebleu_references

    def compare(self, scores: Dict[str, ConfigScores], configs: Sequence[HeadConfig]
                ) -> Tuple[ConfigScores, List[Dict[str, object]]]:
        """The baseline's scores, and one result row per other configuration with its test."""
        baseline = scores[BASELINE]
        systems = [scores[c.name] for c in configs if c.name != BASELINE]
        results = compare_with_baseline(
            baseline, systems, self.settings.test, self.settings.test_metric, self.references,
            tokenize="none" if self.settings.bleu == "tokenized" else "13a",
        )
        return baseline, result_rows(baseline, systems, results, self.settings.bleu)

    def result_columns(self, row: Dict[str, object]) -> Dict[str, object]:
        """A compared configuration's row as a pruning step reports it."""
        return {key: row[key] for key in RESULT_COLUMNS}

    @property
    def metric(self):
        """The BLEU reported."""
        return self.settings.metric

    def baseline_score(self, baseline: ConfigScores) -> float:
        return reported_bleu(baseline, self.settings.bleu)

    def settings_record(self, baseline: ConfigScores) -> Dict[str, object]:
        """What is written beside every result table of this sweep."""
        return {
            "bleu": self.settings.bleu,
            "bleu_description": self.settings.metric.description,
            "baseline_bleu": reported_bleu(baseline, self.settings.bleu),
            "baseline_bleu_tokenized": baseline.bleu,
            "baseline_sacrebleu": baseline.sacrebleu,
            "test": self.settings.test.to_dict(),
            "split": self.split,
            "sweep_dir": os.path.abspath(self.directory),
            "checkpoint": os.path.abspath(self.settings.checkpoint),
        }


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


def write_result_rows(prefix: str, rows, settings: Dict[str, object]) -> None:
    """PREFIX.tsv and PREFIX.json (rows with the settings that made them)."""
    write_rows_tsv(rows, prefix + ".tsv")
    write_json({"settings": settings, "rows": rows}, prefix + ".json", indent=1)


def table_caption(settings: SweepSettings, what: str, split: str) -> str:
    test = settings.test
    return (
        f"{what} on {split}, {settings.metric.description}; "
        f"marked: p < {test.alpha:g} ({test.test}, {test.samples} resamples, seed {test.seed})."
    )
