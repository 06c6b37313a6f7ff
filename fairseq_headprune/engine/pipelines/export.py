"""The ``export`` command's work: a checkpoint, with its masks, tuning and removals, as an export engine's model.

The model is loaded as the studies load it (the plugin's task, its recorded
masks applied, a shrunk checkpoint rebuilt to its shapes), the settings'
head and FFN masks added to its own, a tuning's scales folded in, and written by the engine the settings name
(``engine.export.engines``; CTranslate2's pads heads per stack and leaves masked neurons out). The directory is
written whole or not at all.
"""

import contextlib
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import torch

from fairseq_headprune.constants import TRANSLATION_FAMILY
from fairseq_headprune.engine.export.base import ExportEngine
from fairseq_headprune.engine.export.engines import export_engine
from fairseq_headprune.engine.export.vocabulary_map import vocabulary_map_for
from fairseq_headprune.engine.families import family_of_checkpoint
from fairseq_headprune.engine.search.mask_tuning import tuning_folded
from fairseq_headprune.errors import SettingsError
from fairseq_headprune.modules.masked_ffn import current_ffn_mask, ffn_layout, set_ffn_mask
from fairseq_headprune.modules.masked_multihead_attention import current_head_mask, head_layout, set_head_mask
from fairseq_headprune.study.compression.deployment_settings import ExportSettings
from fairseq_headprune.study.masks.ffn_mask import NEURONS
from fairseq_headprune.study.masks.head_mask import HEADS, check_mask_layout, combine_masks, count_masked
from fairseq_headprune.study.search.tuning import read_tuning


@dataclass
class ExportOutcome:
    """What ``run_export`` wrote."""

    out_dir: str
    quantization: str
    num_heads: Dict[str, int] = field(default_factory=dict)  # per stack: the head count the engine gets
    padded: Dict[str, int] = field(default_factory=dict)  # per stack: zero heads added to even the layers out
    headless: List[str] = field(default_factory=list)  # stacks keeping no head (one zero head per layer)
    kept: Dict[str, List[int]] = field(default_factory=dict)  # per attention type: heads kept in each layer
    vocabulary_map: Optional[Dict[str, object]] = None  # the vmap.txt exported: its settings and valid coverage


def check_out_dir(out_dir: str) -> None:
    """An existing non-empty directory (or a file) is never written into."""
    if os.path.isfile(out_dir) or (os.path.isdir(out_dir) and os.listdir(out_dir)):
        raise SettingsError(f"the output directory {out_dir} exists and is not empty; nothing was written",
                            setting="out_dir")


def _cuda_for(engine: ExportEngine) -> bool:
    """Whether both torch and the installed engine see a CUDA device."""
    return torch.cuda.is_available() and engine.sees_cuda()


def engine_device(engine: ExportEngine, cpu: bool) -> str:
    """Where the installed engine runs the exported model: cuda when a GPU is there and not ``cpu``."""
    return "cuda" if not cpu and _cuda_for(engine) else "cpu"


def deploy_device(device: str, engine: Optional[ExportEngine]) -> str:
    """The device a deployment is timed on (``DeploymentSettings.device``), checked where a run starts (run_compress,
    run_speedup): cuda needs a GPU that torch sees, and the export engine too (None: no export)."""
    if device == "cuda" and engine is None and not torch.cuda.is_available():
        raise SettingsError("the deploy device cuda: torch sees no CUDA device here", setting="deploy_device")
    if device == "cuda" and engine is not None and not _cuda_for(engine):
        raise SettingsError(f"the deploy device cuda: torch or the installed {engine.title} sees no CUDA device here",
                            setting="deploy_device")
    return device


def check_quantization(quantization: Optional[str], cpu: bool, engine: ExportEngine,
                       device: Optional[str] = None) -> str:
    """The weight type, checked against what the installed engine computes on ``device`` (default: where it runs
    the exported model, ``engine_device``)."""
    device = device or engine_device(engine, cpu)
    supported = engine.compute_types(device)
    quantization = quantization or "float32"
    if quantization not in supported:
        raise SettingsError(f"the quantization {quantization}: {engine.title} {engine.version()} computes "
                            f"{', '.join(supported)} on {device}", setting="quantization")
    return quantization


def _add_masks(model, settings: ExportSettings) -> None:
    """The settings' head and FFN masks, on top of the masks the model loaded with (its checkpoint's records)."""
    for mask, layout_of, current, set_mask, kind in (
            (settings.head_mask, head_layout, current_head_mask, set_head_mask, HEADS),
            (settings.ffn_mask, ffn_layout, current_ffn_mask, set_ffn_mask, NEURONS)):
        if mask is not None:
            check_mask_layout(mask, layout_of(model), kind)
            combined = combine_masks(current(model), mask)
            if count_masked(combined):
                set_mask(model, combined)


def run_export(settings: ExportSettings) -> ExportOutcome:
    check_out_dir(settings.out_dir)
    engine = export_engine(settings.format)
    quantization = check_quantization(settings.quantization, settings.cpu, engine)
    family = family_of_checkpoint(settings.checkpoint)
    cfg, task, model = family.load(settings.data, settings.checkpoint, list(settings.fairseq_args), cpu=True)
    _add_masks(model, settings)
    folded = contextlib.nullcontext()
    if settings.tuning_file is not None:
        tuning = read_tuning(settings.tuning_file, head_layout(model), ffn_layout(model))
        set_head_mask(model, combine_masks(current_head_mask(model), tuning.head_mask))
        if tuning.ffn_mask is not None:
            set_ffn_mask(model, combine_masks(current_ffn_mask(model), tuning.ffn_mask))
        folded = tuning_folded(model, tuning)
    if settings.vocabulary_map:
        if family.name != TRANSLATION_FAMILY:
            raise SettingsError("the vocabulary map restricts a translation model's output to its source's "
                                f"candidates; {settings.checkpoint} is a {family.name.replace('_', ' ')}",
                                setting="vocabulary_map")
        if engine.vocabulary_map_file is None:
            raise SettingsError(f"the vocabulary map: {engine.title} models carry none", setting="vocabulary_map")
    parent = os.path.dirname(os.path.abspath(settings.out_dir))
    os.makedirs(parent, exist_ok=True)
    temporary = tempfile.mkdtemp(prefix=".tmp-export-", dir=parent)
    vocabulary_map = None
    try:
        with folded:
            if settings.vocabulary_map:
                vmap_path = os.path.join(parent, f".vmap-{os.path.basename(temporary)}.txt")
                try:
                    vocabulary_map = vocabulary_map_for(task, settings.vocabulary_map_candidates,
                                                        settings.vocabulary_map_common, vmap_path)
                    heads = engine.write(family, cfg, task, model, quantization, temporary, vmap_path)
                finally:
                    if os.path.exists(vmap_path):
                        os.remove(vmap_path)
                vocabulary_map["file"] = engine.vocabulary_map_file
            else:
                heads = engine.write(family, cfg, task, model, quantization, temporary)
        if os.path.isdir(settings.out_dir):
            os.rmdir(settings.out_dir)  # empty (checked above)
        os.replace(temporary, settings.out_dir)
    finally:
        shutil.rmtree(temporary, ignore_errors=True)
    kept: Dict[str, List[int]] = {}
    for stack in heads.values():
        for (attention_type, layer), count in sorted(stack.kept.items()):
            kept.setdefault(attention_type, []).append(count)
    return ExportOutcome(settings.out_dir, quantization,
                         num_heads={side: stack.num_heads for side, stack in heads.items() if stack.kept},
                         padded={side: stack.padded for side, stack in heads.items() if stack.kept}, kept=kept,
                         headless=[side for side, stack in heads.items() if stack.kept and stack.headless],
                         vocabulary_map=vocabulary_map)
