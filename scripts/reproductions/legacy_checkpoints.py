"""Write checkpoints in the old fairseq formats of the released models the papers study.

The released ``wmt14.en-fr.joined-dict.transformer`` model predates fairseq's
hydra configs: its configuration is an ``argparse.Namespace`` under ``args``,
each attention module stores one packed ``in_proj_weight``, and encoder
layers name their norms ``layer_norms.0/1``. The stand-in bundles
(``make_standin_bundle.sh``, ``make_standin_roberta_bundle.sh``) convert a small
trained model into that format, and the tests check that the plugin loads
it exactly as fairseq upgrades the real one.

    python scripts/reproductions/legacy_checkpoints.py {translation|roberta} CHECKPOINT OUT
"""

import re
import sys
from argparse import Namespace
from typing import Any, Dict

import torch

from fairseq_headprune.engine.checkpoints.info import load_checkpoint_state, model_config

# Settings that 0.6-era fairseq-train wrote into args beside the model's own.
_LEGACY_TRAINING_ARGS = dict(
    task="translation",
    criterion="label_smoothed_cross_entropy",
    label_smoothing=0.1,
    optimizer="adam",
    adam_betas="(0.9, 0.98)",
    lr=[0.0005],
    lr_scheduler="inverse_sqrt",
    warmup_updates=4000,
    max_tokens=3584,
    left_pad_source="True",
    left_pad_target="False",
    raw_text=False,
    fp16=True,
)


def _legacy_model_state(model_state: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """Pack q/k/v into in_proj_*, rename encoder norms, drop newer keys."""
    legacy = {}
    packed = {}
    for key, tensor in model_state.items():
        match = re.match(r"(.*\.(?:self_attn|encoder_attn))\.([qkv])_proj\.(weight|bias)$", key)
        if match:
            prefix, projection, kind = match.groups()
            packed.setdefault((prefix, kind), {})[projection] = tensor
            continue
        if key == "decoder.output_projection.weight":
            continue  # shared with the embeddings; old checkpoints did not store it
        key = re.sub(r"^(encoder\.layers\.\d+)\.self_attn_layer_norm\.", r"\1.layer_norms.0.", key)
        key = re.sub(r"^(encoder\.layers\.\d+)\.final_layer_norm\.", r"\1.layer_norms.1.", key)
        legacy[key] = tensor
    for (prefix, kind), parts in packed.items():
        legacy[f"{prefix}.in_proj_{kind}"] = torch.cat([parts["q"], parts["k"], parts["v"]], dim=0)
    return legacy


def write_legacy_checkpoint(source_path: str, out_path: str, **extra_args: Any) -> None:
    """Save the model of a fairseq-train checkpoint in the released model's format."""
    state = load_checkpoint_state(source_path)
    namespace_fields = dict(_LEGACY_TRAINING_ARGS)
    namespace_fields.update(model_config(state))
    task_config = state["cfg"]["task"] if state.get("cfg") else {}
    for name in ("source_lang", "target_lang", "max_source_positions", "max_target_positions"):
        if name in task_config:
            namespace_fields[name] = task_config[name]
    namespace_fields.update(extra_args)
    torch.save(_legacy_checkpoint(namespace_fields, _legacy_model_state(state["model"]),
                                  "LabelSmoothedCrossEntropyCriterion"), out_path)


def _legacy_checkpoint(namespace_fields: Dict[str, Any], model_state: Dict[str, torch.Tensor], criterion: str):
    """The old format's top level: args as a Namespace, the weights, an optimizer history without state."""
    return {
        "args": Namespace(**namespace_fields),
        "model": model_state,
        "optimizer_history": [
            {
                "criterion_name": criterion,
                "optimizer_name": "FairseqAdam",
                "lr_scheduler_state": {"best": None},
                "num_updates": 0,
            }
        ],
        "extra_state": {"epoch": 1, "batch_offset": 0, "val_loss": None},
        "last_optimizer_state": None,
    }


def _legacy_roberta_state(model_state: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """RoBERTa's encoder under ``decoder`` and ``emb_layer_norm``, as released (fairseq renames both on load)."""
    legacy = {}
    for key, tensor in model_state.items():
        key = re.sub(r"^encoder\.", "decoder.", key)
        legacy[key.replace(".layernorm_embedding.", ".emb_layer_norm.")] = tensor
    return legacy


def write_legacy_roberta_checkpoint(source_path: str, out_path: str) -> None:
    """Save a fine-tuned RoBERTa classifier in the format of the released ``roberta.large.mnli``.

    An ``argparse.Namespace`` under ``args`` (the model's and the
    sentence_prediction task's settings, without ``classification_head_name``:
    the released model names its head ``mnli`` while its config names none),
    the encoder's keys under ``decoder.``.
    """
    state = load_checkpoint_state(source_path)
    namespace_fields = dict(task="sentence_prediction", criterion="sentence_prediction", optimizer="adam",
                            lr=[1e-05], lr_scheduler="polynomial_decay", fp16=True)
    namespace_fields.update(model_config(state))
    task_config = state["cfg"]["task"] if state.get("cfg") else {}
    for name in ("num_classes", "init_token", "separator_token", "max_positions", "regression_target"):
        if name in task_config:
            namespace_fields[name] = task_config[name]
    namespace_fields.pop("classification_head_name", None)
    namespace_fields.pop("_name", None)
    torch.save(_legacy_checkpoint(namespace_fields, _legacy_roberta_state(state["model"]),
                                  "SentencePredictionCriterion"), out_path)


if __name__ == "__main__":
    writers = {"translation": write_legacy_checkpoint, "roberta": write_legacy_roberta_checkpoint}
    if len(sys.argv) != 4 or sys.argv[1] not in writers:
        sys.exit("usage: legacy_checkpoints.py {translation|roberta} CHECKPOINT OUT")
    writers[sys.argv[1]](sys.argv[2], sys.argv[3])
