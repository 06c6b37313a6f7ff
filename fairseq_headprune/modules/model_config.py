"""Plugin settings recorded in a model's config, so a saved checkpoint carries them wherever it is loaded.

Plain helpers below the tasks and the engine: the head-masking tasks read
and write these keys when fairseq builds a model, ``shrink`` writes them
into a checkpoint.
"""

from omegaconf import DictConfig, open_dict

# model-config key under which a model built with --head-mask records its mask,
# so that a checkpoint trained with a mask applies it wherever it is loaded
HEAD_MASK_KEY = "headprune_head_mask"
# the same for --ffn-mask: the neurons a model was built (and fine-tuned) with masked, an ffn-mask spec
FFN_MASK_KEY = "headprune_ffn_mask"
# model-config key of the heads a shrunk checkpoint no longer has (a head-mask spec)
PRUNED_HEADS_KEY = "headprune_pruned_heads"


def config_value(model_cfg, key: str):
    """A plugin setting recorded in a model config (DictConfig, dict or old-format Namespace)."""
    if model_cfg is None:
        return None
    if hasattr(model_cfg, "get"):
        return model_cfg.get(key, None)
    return getattr(model_cfg, key, None)


def record_config_value(model_cfg, key: str, value) -> None:
    """Record a plugin setting in a model config, so that the saved checkpoint carries it."""
    if isinstance(model_cfg, DictConfig):
        with open_dict(model_cfg):
            model_cfg[key] = value
    elif isinstance(model_cfg, dict):
        model_cfg[key] = value
    else:
        setattr(model_cfg, key, value)
# and of the FFN neurons it no longer has (an ffn-mask spec)
PRUNED_NEURONS_KEY = "headprune_pruned_neurons"
