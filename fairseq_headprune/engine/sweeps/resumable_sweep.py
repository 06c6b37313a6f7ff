"""A sweep: every configuration of a study translated (or scored) once, stored as it finishes.

``run_sweep`` stores one JSON file per configuration (written atomically),
next to a manifest that identifies the sweep (checkpoint hash, data, split,
every generation option). A restarted sweep skips configurations whose file
exists; a directory holding another sweep is refused.
"""

import contextlib
import json
import os
from typing import Dict, Optional, Sequence

import torch
from tqdm import tqdm

from fairseq_headprune.engine.runtime.ranks import current_ranks
from fairseq_headprune.engine.search.mask_tuning import tuning_folded
from fairseq_headprune.errors import StudyError
from fairseq_headprune.modules.masked_ffn import ffn_mask_applied
from fairseq_headprune.study.importance.ablation import HeadConfig
from fairseq_headprune.study.masks.head_mask import HeadMask, combine_masks
from fairseq_headprune.study.output.files import (
    first_difference,
    recorded_identity,
    remove_stale_temporaries,
    write_json,
)

MANIFEST = "sweep.json"
CONFIG_DIR = "configs"


def open_sweep_dir(out_dir: str, identity: Dict[str, object], references: Sequence[str]) -> None:
    """Create the sweep directory, or check that it holds this very sweep."""
    manifest = os.path.join(out_dir, MANIFEST)
    if os.path.exists(manifest):
        difference = first_difference(recorded_identity(manifest, "a sweep manifest", "output directory"), identity)
        if difference is not None:
            raise StudyError(
                f"{out_dir} holds the results of a different sweep ({difference}); "
                "use another output directory"
            )
        remove_stale_temporaries(os.path.join(out_dir, CONFIG_DIR))
        return
    if os.path.isdir(out_dir) and os.listdir(out_dir):
        raise StudyError(f"{out_dir} is not empty and holds no sweep; use another output directory")
    os.makedirs(os.path.join(out_dir, CONFIG_DIR), exist_ok=True)
    write_json({"identity": identity, "references": list(references)}, manifest)


def config_path(out_dir: str, name: str) -> str:
    return os.path.join(out_dir, CONFIG_DIR, name + ".json")


def load_config_result(out_dir: str, name: str, result_type):
    path = config_path(out_dir, name)
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as stream:
        return result_type.from_dict(json.load(stream))


def run_sweep(
    runner,
    configs: Sequence[HeadConfig],
    out_dir: str,
    identity: Dict[str, object],
    base_mask: Optional[HeadMask] = None,
    progress: bool = True,
    configs_per_batch: int = 1,
    split_on_memory_error: bool = False,
) -> Dict[str, object]:
    """Every configuration's result, translating (or scoring) only those not stored yet.

    ``runner`` is a ``SplitTranslator`` (results are ``ConfigResult``) or an
    ``example_scorer.SplitScorer`` (``ScoredConfigResult``): its
    ``run_many(masks)`` gives one output per mask.

    Under several ranks (``ranks.py``) rank 0 prepares the directory and
    decides what is left to do; the batches of configurations are then
    dealt out round robin, each rank storing its own, and every rank reads
    the others' results back once all are done.

    ``split_on_memory_error`` (``configs_per_batch`` was chosen for the device): a batch of configurations that
    runs out of the GPU's memory is split in halves and tried again, and so is every later one as large; otherwise
    running out is a one-line error that names the options to lower.
    """


    result_type = runner.result_type  # how the runner's configurations are stored
    ranks = current_ranks()
    names = [c.name for c in configs]
    if len(set(names)) != len(names):
        raise StudyError("two configurations share a name")
    if ranks.is_main:
        open_sweep_dir(out_dir, identity, runner.manifest_references)
    results: Dict[str, object] = {}
    stored = set(ranks.main_value(
        [c.name for c in configs if os.path.exists(config_path(out_dir, c.name))] if ranks.is_main else None
    ))
    todo = [c for c in configs if c.name not in stored]
    # the unmasked baseline runs alone (fairseq's fused attention path, as fairseq-generate);
    # masked configurations run configs_per_batch at a time
    chunks = [[c] for c in todo if c.head_mask is None and base_mask is None and c.ffn_mask is None]
    # a tuned mask changes the output projections' weights: it runs alone, with them folded in
    chunks += [[c] for c in todo if c.tuning is not None and c.ffn_mask is None]
    masked = [c for c in todo if not (c.head_mask is None and base_mask is None) and c.tuning is None
              and c.ffn_mask is None]
    size = max(1, configs_per_batch)
    chunks += [masked[i:i + size] for i in range(0, len(masked), size)]
    # batches carry per-row head masks only: a configuration that masks FFN neurons runs alone, its neuron
    # mask set on the model
    chunks += [[c] for c in todo if c.ffn_mask is not None]
    chunks = ranks.share(chunks)
    # stored configurations count as done; each rank's bar shows its own share of the rest
    bar = tqdm(
        total=len(stored) + sum(len(chunk) for chunk in chunks), initial=len(stored), desc=f"{runner.split}",
        unit="config", disable=not progress, leave=False, dynamic_ncols=True,
    )
    limit = size
    try:
        while chunks:
            chunk = chunks.pop(0)
            if len(chunk) > limit:  # a smaller batch of configurations fitted the device's memory
                chunks[:0] = [chunk[i:i + limit] for i in range(0, len(chunk), limit)]
                continue
            try:
                outputs = _run_chunk(runner, chunk, base_mask)
            except torch.cuda.OutOfMemoryError as error:
                if not split_on_memory_error or len(chunk) == 1:
                    raise StudyError(
                        f"out of GPU memory running {len(chunk)} configuration(s) together: make the configs per "
                        "batch, the batch size or the max tokens smaller",
                        setting=("configs_per_batch", "batch_size", "max_tokens")
                    ) from error
                torch.cuda.empty_cache()
                limit = (len(chunk) + 1) // 2
                tqdm.write(f"device batching: out of GPU memory with {len(chunk)} configurations per batch; "
                           f"continuing with {limit}")
                chunks.insert(0, chunk)
                continue
            for config, output in zip(chunk, outputs):
                result = result_type(name=config.name, spec=config.spec, labels=config.labels, **vars(output))
                write_json(result.to_dict(), config_path(out_dir, config.name))
                results[config.name] = result
                bar.update(1)
    finally:
        bar.close()
    ranks.barrier()  # every rank's results are on disk
    for config in configs:
        if config.name not in results:
            results[config.name] = load_config_result(out_dir, config.name, result_type)
    return {config.name: results[config.name] for config in configs}


def _run_chunk(runner, chunk: Sequence[HeadConfig], base_mask: Optional[HeadMask]):
    """The runner's outputs for configurations run together (a tuned or FFN-masked one alone, its weights set)."""
    tuned, ffn_mask = chunk[0].tuning, chunk[0].ffn_mask
    with contextlib.nullcontext() if tuned is None else tuning_folded(runner.model, tuned), \
            contextlib.nullcontext() if ffn_mask is None else ffn_mask_applied(runner.model, ffn_mask):
        return runner.run_many([combine_masks(base_mask, c.head_mask) for c in chunk])
