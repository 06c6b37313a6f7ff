"""fairseq state: loading checkpoints, masking built models, running the studies on them.

Importing a name from here imports fairseq. The names below are the public
API (imported when first used); each ``run_*`` is what a command runs, given
the settings of ``fairseq_headprune.study``.
"""

from fairseq_headprune.lazy_exports import lazy_attributes

_LOADING = "fairseq_headprune.engine.checkpoints.loading"
_ATTENTION = "fairseq_headprune.modules.masked_multihead_attention"
_FFN = "fairseq_headprune.modules.masked_ffn"
_PIPELINES = "fairseq_headprune.engine.pipelines."
EXPORTS = {
    "register_components": "fairseq_headprune.registry",
    **{name: _LOADING for name in ("load_generation_model", "load_evaluation_model", "load_with_saved_task")},
    **{name: "fairseq_headprune.engine.families" for name in ("ModelFamily", "family_named", "family_of_checkpoint")},
    # masks on a built model
    **{name: _ATTENTION for name in ("head_layout", "set_head_mask", "current_head_mask", "head_mask_applied")},
    **{name: _FFN for name in ("ffn_layout", "set_ffn_mask", "current_ffn_mask", "ffn_mask_applied")},
    # checkpoints
    **{name: "fairseq_headprune.engine.checkpoints.shrink" for name in ("shrink_checkpoint", "shrink_layouts")},
    "tune_mask": "fairseq_headprune.engine.search.mask_tuning",
    # each command's work
    "run_importance": _PIPELINES + "importance",
    "run_ablation": _PIPELINES + "ablate",
    "run_prune": _PIPELINES + "prune",
    "checkpoint_compensation": _PIPELINES + "compensation",
    "run_dynamics": _PIPELINES + "dynamics",
    **{name: _PIPELINES + "search" for name in ("run_search", "run_latency")},
    "run_export": _PIPELINES + "export",
    "run_compress": _PIPELINES + "compress",
}
__all__ = sorted(EXPORTS)
__getattr__, __dir__ = lazy_attributes(__name__, EXPORTS)
