"""The plain study logic, without fairseq: mask specs, statistics, the papers' methods, settings and outputs.

Everything here works on tensors, numbers and files; ``fairseq_headprune.engine``
runs it on fairseq models. The names below are the public API (imported when
first used).
"""

from ..lazy_exports import lazy_attributes

_MASKS = "fairseq_headprune.study.masks.head_mask"
_FFN = "fairseq_headprune.study.masks.ffn_mask"
_SIGNIFICANCE = "fairseq_headprune.study.statistics.significance"
_SETTINGS = "fairseq_headprune.study.settings"
_METHODS = "fairseq_headprune.study.methods."
EXPORTS = {
    # masks: specs <-> tensors (Michel et al.'s xi), heads and FFN neurons
    **{name: _MASKS for name in ("HeadLayout", "HeadMask", "parse_head_mask", "head_mask_to_spec", "full_mask",
                                 "combine_masks", "count_masked", "masked_heads", "read_mask_file",
                                 "write_mask_file")},
    **{name: _FFN for name in ("FfnMask", "parse_ffn_mask", "ffn_mask_to_spec")},
    # paired significance tests on per-sentence statistics
    **{name: _SIGNIFICANCE for name in ("SignificanceSettings", "PairedResult", "paired_bootstrap",
                                        "sacrebleu_paired_tests", "paired_t_test", "mcnemar_exact")},
    # the settings every study is run with (what the commands build)
    **{name: _SETTINGS for name in ("SweepSettings", "ImportanceSettings", "TuningSettings", "CurveSettings",
                                    "AblationSettings", "DynamicsSettings", "SearchSettings",
                                    "LatencySettings", "ExportSettings")},
    **{name: "fairseq_headprune.study.prune_settings" for name in ("PruneSettings", "FinetuneSettings")},
    # the papers' methods
    **{name: _METHODS + "importance_scores" for name in ("ImportanceResult", "read_importance_file",
                                                         "read_fisher_file", "normalize_per_layer")},
    **{name: _METHODS + "budgets" for name in ("Budget", "parse_layer_budget", "parse_type_budget", "level_budget",
                                               "strategy_budget", "plan_budgets")},
    **{name: _METHODS + "layer_strategies" for name in ("LayerStrategy", "parse_layer_strategy", "strategy_mask",
                                                        "paper_strategies")},
    **{name: _METHODS + "budhraja_configurations" for name in ("paper_budgets", "table1_budgets", "table2_budgets",
                                                               "table3_budgets")},
    **{name: _METHODS + "compensation" for name in ("Compensation", "measure_compensation")},
    **{name: _METHODS + "layer_strategies" for name in ("LayerStrategy", "parse_layer_strategy", "strategy_mask")},
    "paper_budgets": _METHODS + "budhraja_configurations",
    **{name: _METHODS + "compensation" for name in ("Compensation", "measure_compensation")},
    **{name: _METHODS + "mask_search" for name in ("SearchResult", "search_mask")},
    **{name: _METHODS + "least_squares_tuning" for name in ("MaskTuning", "read_tuning", "write_tuning")},
    **{name: _METHODS + "compression" for name in ("CompressSettings", "parse_target")},
}
__all__ = sorted(EXPORTS)
__getattr__, __dir__ = lazy_attributes(__name__, EXPORTS)
