"""The plain study logic, without fairseq: mask specs, statistics, the papers' methods, settings and outputs.

Everything here works on tensors, numbers and files; ``fairseq_headprune.engine``
runs it on fairseq models. The names below are the public API (imported when
first used).
"""

from fairseq_headprune.lazy_exports import lazy_attributes

_MASKS = "fairseq_headprune.study.masks.head_mask"
_FFN = "fairseq_headprune.study.masks.ffn_mask"
_SIGNIFICANCE = "fairseq_headprune.study.statistics.significance"
_STUDY = "fairseq_headprune.study."
EXPORTS = {
    # masks: specs <-> tensors (Michel et al.'s xi), heads and FFN neurons
    **{name: _MASKS for name in ("HeadLayout", "HeadMask", "parse_head_mask", "head_mask_to_spec", "full_mask",
                                 "combine_masks", "count_masked", "masked_heads", "read_mask_file",
                                 "write_mask_file")},
    **{name: _FFN for name in ("FfnMask", "parse_ffn_mask", "ffn_mask_to_spec")},
    **{name: "fairseq_headprune.study.masks.layer_drop" for name in ("LayerDrop", "parse_layer_drop")},
    # paired significance tests on per-sentence statistics
    **{name: _SIGNIFICANCE for name in ("SignificanceSettings", "PairedResult", "paired_bootstrap",
                                        "sacrebleu_paired_tests", "paired_t_test", "mcnemar_exact")},
    # the settings every study is run with (what the commands build), each beside its concept
    **{name: _STUDY + "settings" for name in ("SweepSettings", "ImportanceSettings")},
    "AblationSettings": _STUDY + "importance.settings",
    **{name: _STUDY + "pruning.settings" for name in ("CurveSettings", "DynamicsSettings", "PruneSettings")},
    "FinetuneSettings": _STUDY + "finetune.settings",
    **{name: _STUDY + "search.settings" for name in ("TuningSettings", "SearchSettings", "LatencySettings")},
    "CompressSettings": _STUDY + "compression.settings",
    **{name: _STUDY + "compression.target" for name in ("CompressTarget", "parse_target")},
    "ExportSettings": _STUDY + "compression.deployment_settings",
    # Michel et al.: importance
    **{name: _STUDY + "importance.scores" for name in ("ImportanceResult", "read_importance_file",
                                                        "read_fisher_file", "normalize_per_layer")},
    # Budhraja et al.: budgets, layer strategies, their tables, compensation, fine-tuned records
    **{name: _STUDY + "budhraja.budgets" for name in ("Budget", "parse_layer_budget", "parse_type_budget",
                                                       "level_budget", "strategy_budget", "plan_budgets")},
    **{name: _STUDY + "budhraja.layer_strategies" for name in ("LayerStrategy", "parse_layer_strategy",
                                                                "strategy_mask", "paper_strategies")},
    **{name: _STUDY + "budhraja.configurations" for name in ("paper_budgets", "table1_budgets", "table2_budgets",
                                                              "table3_budgets")},
    **{name: _STUDY + "budhraja.compensation" for name in ("Compensation", "measure_compensation")},
    **{name: _STUDY + "budhraja.records" for name in ("FinetuneRecord", "CurvePoint")},
    # Kwon et al.: search and tuning
    **{name: _STUDY + "search.mask_search" for name in ("SearchResult", "search_mask")},
    **{name: _STUDY + "search.tuning" for name in ("MaskTuning", "read_tuning", "write_tuning")},
}
__all__ = sorted(EXPORTS)
__getattr__, __dir__ = lazy_attributes(__name__, EXPORTS)
