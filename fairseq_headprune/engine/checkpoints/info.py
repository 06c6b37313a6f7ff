"""Read what a fairseq checkpoint says about its model, without building it."""

import os
import pickle
import re
import zipfile
from argparse import Namespace
from typing import Any, Dict, List, Optional, Tuple

import torch

from fairseq_headprune.compat import torch_load  # noqa: F401  (allow-list for torch.load)
from fairseq_headprune.constants import CLASSIFIER_FAMILY, LANGUAGE_MODEL_FAMILY, TRANSLATION_FAMILY, TRANSLATION_TASK
from fairseq_headprune.errors import CheckpointError, HeadMaskError, first_line, library_errors_as
from fairseq_headprune.study.budhraja.finetune_plan import TrainingHistory
from fairseq_headprune.study.masks.ffn_mask import FfnLayout, FfnMask, parse_ffn_mask
from fairseq_headprune.study.masks.head_mask import HeadLayout, HeadMask, parse_head_mask


def load_checkpoint_state(path: str, mmap: bool = False) -> Dict[str, Any]:
    """``torch.load`` a fairseq checkpoint, with one-line errors for bad files; ``mmap``: its tensors mapped from
    the file, not read (to read shapes without the memory of the values), where the file is a zip archive (a
    legacy pickle is read whole)."""
    if not os.path.isfile(path):
        raise CheckpointError(f"checkpoint not found: {path}")
    with library_errors_as(lambda error: CheckpointError(unreadable(path, error))):
        mapped = mmap and zipfile.is_zipfile(path)
        state = torch.load(path, map_location="cpu", mmap=True) if mapped else torch.load(path, map_location="cpu")
    if not isinstance(state, dict) or "model" not in state:
        raise CheckpointError(f"{path} is not a fairseq checkpoint (no 'model' entry)")
    return state


def unreadable(path: str, error: BaseException) -> str:
    """Why ``torch.load`` could not read ``path``, in words: a file cut short, one that is no checkpoint at all
    (neither the zip archive torch.save writes nor a legacy pickle it reads: torch.load's words are then "101" or
    about its weights-only reader), else the library's own words."""
    text = first_line(error)
    if isinstance(error, EOFError) or "central directory" in text or "failed reading zip archive" in text:
        return f"cannot read checkpoint {path}: the file is cut short or damaged (not a whole torch.save archive)"
    if not zipfile.is_zipfile(path):
        return (f"cannot read checkpoint {path}: it is not a PyTorch checkpoint (neither the zip archive torch.save "
                "writes nor a legacy one torch.load reads; --debug shows torch.load's error)")
    return f"cannot read checkpoint {path}: {text}"


def model_config(state: Dict[str, Any]) -> Dict[str, Any]:
    """The model's settings, from new-format ``cfg`` or old-format ``args``."""
    config = None
    if state.get("cfg") is not None:
        config = state["cfg"].get("model")
    if config is None and state.get("args") is not None:
        config = state["args"]
    if isinstance(config, Namespace):
        config = vars(config)
    return dict(config or {})


def model_config_object(state: Dict[str, Any]):
    """The model config object itself (Namespace or dict), to record settings in."""
    if state.get("cfg") is not None and state["cfg"].get("model") is not None:
        return state["cfg"]["model"]
    return state.get("args")


def checkpoint_head_layout(path: str) -> HeadLayout:
    """Layers (counted in the weights) and heads (from the config) per attention type (read lazily)."""
    return state_head_layout(lazy_checkpoint_state(path))


def state_head_layout(state: Dict[str, Any]) -> HeadLayout:
    """``checkpoint_head_layout`` of a checkpoint already loaded."""
    config = model_config(state)
    layer_indices = {"encoder": set(), "decoder": set(), "encoder_attn": set()}
    for key in state["model"]:
        # encoder-decoder and decoder-only: (encoder|decoder).layers.N; RoBERTa: encoder.sentence_encoder.layers.N,
        # decoder.sentence_encoder.layers.N in checkpoints released before fairseq renamed it (roberta.large.mnli)
        match = re.match(r"(encoder|decoder)\.(sentence_encoder\.)?layers\.(\d+)\.(self_attn|encoder_attn)\.", key)
        if match:
            side, sentence_encoder, index, kind = match.groups()
            side = "encoder" if sentence_encoder else side
            layer_indices["encoder_attn" if kind == "encoder_attn" else side].add(int(index))
    layout = {}
    for attention_type, side, heads_key in (
        ("enc-enc", "encoder", "encoder_attention_heads"),
        ("enc-dec", "encoder_attn", "decoder_attention_heads"),
        ("dec-dec", "decoder", "decoder_attention_heads"),
    ):
        if layer_indices[side]:
            if heads_key not in config:
                raise CheckpointError(f"checkpoint config has no {heads_key}")
            layout[attention_type] = (max(layer_indices[side]) + 1, int(config[heads_key]))
    if not layout:
        raise CheckpointError("checkpoint has no Transformer attention layers")
    return layout


# a layer's output projection, (model width, heads x head width): the heads it holds, as loaded
_OUT_PROJECTION = re.compile(r"(encoder|decoder)\.(sentence_encoder\.)?layers\.(\d+)\.(self_attn|encoder_attn)\."
                             r"out_proj\.weight$")


def loaded_head_layout(path: str) -> HeadLayout:
    """The head layout of the model ``path`` loads as (read lazily, without building it): a shrunk checkpoint's
    heads per layer as its weights hold them, what a mask of that model numbers. A type whose layers keep
    different numbers of heads takes no mask: refused as the loaded model refuses it."""
    state = lazy_checkpoint_state(path)
    layout = state_head_layout(state)
    heads = {attention_type: count for attention_type, (_, count) in layout.items()}
    found: Dict[str, Dict[int, int]] = {}
    for key, tensor in state["model"].items():
        match = _OUT_PROJECTION.match(key)
        if match:
            side, sentence_encoder, index, kind = match.groups()
            attention_type = "enc-dec" if kind == "encoder_attn" else (
                "enc-enc" if side == "encoder" or sentence_encoder else "dec-dec")
            width, inner = tensor.shape
            found.setdefault(attention_type, {})[int(index)] = inner // (width // heads[attention_type])
    return {attention_type: (layers, _same(attention_type, found.get(attention_type), count, "head counts"))
            for attention_type, (layers, count) in layout.items()}


def loaded_ffn_layout(path: str) -> FfnLayout:
    """The FFN layout of the model ``path`` loads as: neurons per layer as its weights hold them (``fc1``'s rows);
    a type whose layers differ in width is refused, as the loaded model refuses a mask on it."""
    widths: Dict[str, Dict[int, int]] = {}
    for key, tensor in lazy_checkpoint_state(path)["model"].items():
        match = _FC1.match(key)
        if match:
            side, sentence_encoder, index = match.groups()
            ffn_type = "enc-ffn" if side == "encoder" or sentence_encoder else "dec-ffn"
            widths.setdefault(ffn_type, {})[int(index)] = int(tensor.size(0))
    return {ffn_type: (max(widths[ffn_type]) + 1, _same(ffn_type, widths[ffn_type], None, "widths"))
            for ffn_type in ("enc-ffn", "dec-ffn") if ffn_type in widths}


def _same(unit_type: str, by_layer: Optional[Dict[int, int]], default: Optional[int], what: str) -> int:
    """The one count every layer of ``unit_type`` has (``default`` where none was found)."""
    counts: List[int] = [by_layer[i] for i in sorted(by_layer)] if by_layer else []
    if len(set(counts)) > 1:
        raise HeadMaskError(f"{unit_type} layers have different {what} {counts}")
    return counts[0] if counts else default


def checkpoint_masks(path: str, head_spec: Optional[str], ffn_spec: Optional[str]
                     ) -> Tuple[Optional[HeadMask], Optional[FfnMask]]:
    """The masks a record's specs name (a stage's ``SearchRecord.spec`` and ``ffn_spec``), of the model ``path``
    holds (its layouts read lazily); a spec that is None stays None."""
    if head_spec is None and ffn_spec is None:
        return None, None
    state = lazy_checkpoint_state(path)
    return (None if head_spec is None else parse_head_mask(head_spec, state_head_layout(state)),
            None if ffn_spec is None else parse_ffn_mask(ffn_spec, state_ffn_layout(state)))


def checkpoint_weights(path: str) -> Dict[str, Any]:
    """The state dict of a checkpoint file, memory-mapped where torch can (shapes without reading every weight)."""
    return lazy_checkpoint_state(path)["model"]


def same_weights(first: str, second: str) -> bool:
    """Whether two checkpoint files (or files of tensors) hold the same tensors bit for bit, their recorded paths
    and options aside: a resumed run's or another version's outputs checked against a reference's."""
    left, right = (torch.load(path, map_location="cpu", weights_only=False) for path in (first, second))
    left, right = (data.get("model", data) if isinstance(data, dict) else data for data in (left, right))
    if not isinstance(left, dict) or not isinstance(right, dict):
        return torch.is_tensor(left) and torch.is_tensor(right) and torch.equal(left, right)
    return left.keys() == right.keys() and all(
        torch.equal(left[key], right[key]) if torch.is_tensor(left[key]) and torch.is_tensor(right[key])
        else left[key] == right[key] for key in left)


def lazy_checkpoint_state(path: str) -> Dict[str, Any]:
    """A checkpoint's state, memory-mapped where torch can (``_read_lazily``), checked as
    ``load_checkpoint_state`` checks it."""
    state = _read_lazily(path)
    if not isinstance(state, dict) or not isinstance(state.get("model"), dict):
        raise CheckpointError(f"{path} is not a fairseq checkpoint (no 'model' entry)")
    return state


def _read_lazily(path: str):
    """``torch.load`` memory-mapped where torch can, whole otherwise (old, non-zip files)."""
    try:
        return torch.load(path, map_location="cpu", mmap=True)
    except (RuntimeError, OSError, EOFError, pickle.UnpicklingError):  # not a zip file: the full read reports it
        return load_checkpoint_state(path)


# the tasks of classifier and language-model checkpoints (fairseq's and the plugin's head-masking ones)
CLASSIFIER_TASKS = ("sentence_prediction", "headprune_sentence_prediction")
LANGUAGE_MODEL_TASKS = ("language_modeling", "headprune_language_modeling")


def classification_head_override(path: str) -> Dict[str, str]:
    """``{"classification_head_name": NAME}`` where a classifier's configured head is not in its weights but one is.

    fairseq's sentence_prediction task builds the head its config names
    (``sentence_classification_head`` unless ``--classification-head-name``)
    and drops the checkpoint's others; a released classifier such as
    ``roberta.large.mnli`` stores its one head as ``mnli``. Loading it as
    stock fairseq-validate would with ``--model-overrides
    "{'classification_head_name': 'mnli'}"`` keeps it. Empty when nothing is
    to override; several heads, none of them configured, is one clear error.
    """
    return state_classification_head_override(_read_lazily(path), path)


def state_classification_head_override(state: Dict[str, Any], path: str) -> Dict[str, str]:
    """``classification_head_override`` of a checkpoint already loaded (``path`` names it in the error)."""
    heads = sorted({key.split(".")[1] for key in state["model"] if key.startswith("classification_heads.")})
    configured = saved_option(state, "task", "classification_head_name") or "sentence_classification_head"
    if not heads or configured in heads:
        return {}
    if len(heads) > 1:
        raise CheckpointError(f"{path} has classification heads {', '.join(heads)} and its config names none of them")
    return {"classification_head_name": heads[0]}


def checkpoint_family(path: str) -> str:
    """The family of model a checkpoint holds (``constants.MODEL_FAMILIES``), from the task it was trained with.

    An unreadable file, or a task no study takes, is a ``CheckpointError``.
    """
    if not os.path.isfile(path):
        raise CheckpointError(f"checkpoint not found: {path}")
    state = _read_lazily(path)
    if not isinstance(state, dict):
        raise CheckpointError(f"{path} is not a fairseq checkpoint")
    return task_family(saved_task_name(state), path)


def task_family(task, path: str = "the checkpoint") -> str:
    """The family of model a saved ``--task`` trains; a task of none of them is a ``CheckpointError``."""
    if task in CLASSIFIER_TASKS:
        return CLASSIFIER_FAMILY
    if task in LANGUAGE_MODEL_TASKS:
        return LANGUAGE_MODEL_FAMILY
    if task is not None and ("translation" in task or task == TRANSLATION_TASK):
        return TRANSLATION_FAMILY
    said = "does not say which task trained it" if task is None else f"is a {task} checkpoint"
    raise CheckpointError(
        f"{path} {said}; the studies take translation, sentence_prediction and language_modeling checkpoints"
    )


_FC1 = re.compile(r"(encoder|decoder)\.(sentence_encoder\.)?layers\.(\d+)\.fc1\.weight$")


def state_ffn_layout(state: Dict[str, Any]) -> Dict[str, tuple]:
    """Layers and hidden units per FFN type, counted in the weights (every layer of a type as wide)."""
    widths: Dict[str, Dict[int, int]] = {"enc-ffn": {}, "dec-ffn": {}}
    for key, tensor in state["model"].items():
        match = _FC1.match(key)
        if match:
            side, sentence_encoder, index = match.groups()
            ffn_type = "enc-ffn" if side == "encoder" or sentence_encoder else "dec-ffn"
            widths[ffn_type][int(index)] = int(tensor.size(0))
    layout = {}
    for ffn_type, by_layer in widths.items():
        if by_layer:
            if len(set(by_layer.values())) != 1:
                raise CheckpointError(f"{ffn_type} layers have different widths {sorted(set(by_layer.values()))}: "
                                      "the checkpoint already has neurons removed")
            layout[ffn_type] = (max(by_layer) + 1, next(iter(by_layer.values())))
    return layout


def saved_task_name(state: Dict[str, Any]):
    """The task a checkpoint was trained with (``--task``), or None if it does not say."""
    return saved_option(state, "task", "_name", legacy_name="task")


def saved_option(state: Dict[str, Any], group: str, name: str, legacy_name: Optional[str] = None):
    """An option as the checkpoint saved it: new-format ``cfg`` (``name`` in its ``group``) or old-format ``args``
    (``legacy_name`` there where fairseq's flag is named otherwise); None: not saved."""
    if state.get("cfg") is not None and state["cfg"].get(group) is not None:
        return state["cfg"][group].get(name)
    return getattr(state.get("args"), legacy_name or name, None)


def training_history(path: str) -> TrainingHistory:
    """How the checkpoint was trained (``TrainingHistory``), from fairseq's optimizer history and extra state."""
    state = load_checkpoint_state(path)
    updates = int(((state.get("optimizer_history") or [{}])[-1]).get("num_updates", 0))
    extra = state.get("extra_state") or {}
    iterator = extra.get("train_iterator") or {}
    epochs = int(iterator["epoch"]) - 1 if iterator.get("epoch") and not iterator.get("iterations_in_epoch") else None
    seconds = extra.get("previous_training_time")
    rates, seed = saved_option(state, "optimization", "lr"), saved_option(state, "common", "seed")
    peak_lr = rates if rates is None or isinstance(rates, (int, float)) else list(rates)[0]  # fairseq: a list
    world = saved_option(state, "distributed_training", "distributed_world_size")
    return TrainingHistory(updates, epochs or None, float(seconds) if seconds else None,
                           None if peak_lr is None else float(peak_lr), None if seed is None else int(seed),
                           int(world) if world and int(world) > 0 else 1)

