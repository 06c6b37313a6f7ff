"""One split of a classifier's or language model's data swept under many masks, and tested.

The counterpart of ``split_sweep.SplitSweep`` for the models an
``example_scorer.SplitScorer`` scores: every configuration's outputs are
stored under ``OUT/sweeps/NAME`` (resumable and sharded by ``sweep.run_sweep``
as translation sweeps are), turned into the statistics of the study's metric
(accuracy, Matthews correlation, perplexity) and compared with the baseline
by the chosen paired test. The methods the ablation writers call are the
same as ``SplitSweep``'s.
"""

import os
from typing import Dict, List, Sequence, Tuple

from fairseq_headprune.engine.runners.example_scorer import SplitScorer
from fairseq_headprune.engine.sweeps.resumable_sweep import run_sweep
from fairseq_headprune.engine.sweeps.translation_sweep import SWEEPS_DIR, TEST_COLUMNS, check_out_dir
from fairseq_headprune.study.importance.ablation import (
    BASELINE,
    ConfigScores,
    HeadConfig,
    compare_with_baseline,
    metric_result_rows,
)
from fairseq_headprune.study.masks.head_mask import HeadMask
from fairseq_headprune.study.settings import SweepSettings


class ScoredSplitSweep:
    """One split of one data directory, scored into ``out_dir/sweeps/NAME``."""

    def __init__(self, settings: SweepSettings, cfg, task, model, split: str, name: str):
        self.settings, self.split, self.name = settings, split, name
        self.scorer = SplitScorer(settings.family, cfg, task, model, split)
        self.directory = os.path.join(settings.out_dir, SWEEPS_DIR, name)

    @property
    def metric(self):
        return self.settings.metric

    def run(self, configs: Sequence[HeadConfig], base_mask: HeadMask) -> Dict[str, ConfigScores]:
        identity = self.scorer.identity(self.settings.checkpoint, base_mask)
        check_out_dir(self.settings.out_dir, identity)
        results = run_sweep(
            self.scorer, configs, self.directory, identity, base_mask,
            progress=self.settings.progress, configs_per_batch=self.settings.batch_configs,
        )
        test_metric = self.settings.test_metric
        return {
            name: ConfigScores(result.name, result.spec, result.labels, None, None,
                               test_metric.example_statistics(self.scorer.references, result.outputs),
                               result.outputs)
            for name, result in results.items()
        }

    def compare(self, scores: Dict[str, ConfigScores], configs: Sequence[HeadConfig]
                ) -> Tuple[ConfigScores, List[Dict[str, object]]]:
        """The baseline's scores, and one result row per other configuration with its test."""
        baseline = scores[BASELINE]
        systems = [scores[c.name] for c in configs if c.name != BASELINE]
        results = compare_with_baseline(baseline, systems, self.settings.test, self.settings.test_metric)
        return baseline, metric_result_rows(baseline, systems, results, self.metric)

    def result_columns(self, row: Dict[str, object]) -> Dict[str, object]:
        """A compared configuration's row as a pruning step reports it: the metric's column (and an LM's loss)."""
        column = self.metric.column
        keys = ("config", "spec", column, "delta") + (("loss",) if "loss" in row else ()) + TEST_COLUMNS
        return {key: row[key] for key in keys}

    def baseline_score(self, baseline: ConfigScores) -> float:
        return self.metric.score(baseline.stats)

    def settings_record(self, baseline: ConfigScores) -> Dict[str, object]:
        """What is written beside every result table of this sweep."""
        return {
            "family": self.settings.family,
            "metric": self.metric.name,
            "metric_description": self.metric.description,
            f"baseline_{self.metric.column}": self.baseline_score(baseline),
            "examples": len(baseline.stats),
            "test": self.settings.test.to_dict(),
            "split": self.split,
            "sweep_dir": os.path.abspath(self.directory),
            "checkpoint": os.path.abspath(self.settings.checkpoint),
        }
