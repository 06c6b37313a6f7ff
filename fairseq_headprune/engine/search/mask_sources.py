"""Where a pruning study's masks come from, stored under its output directory and reused on rerun.

``ImportanceStore``: importance (or Fisher scores) per mask, for the
importance, iterative and fisher orders; ``TuningStore``: least-squares mask
tuning per mask (``prune --tune-masks``); the learned gates' masks
(``--gate-masks``); and what finding each order's masks cost.
"""

import hashlib
import json
import os
import time
from typing import Dict, List, Optional, Sequence

from fairseq_headprune.engine.runtime.ranks import current_ranks
from fairseq_headprune.engine.search.mask_tuning import tune_mask, tuning_samples
from fairseq_headprune.errors import HeadPruneError, ResultFileError, StudyError
from fairseq_headprune.modules.masked_ffn import ffn_layout
from fairseq_headprune.study.importance.scores import read_importance_file, write_importance_json
from fairseq_headprune.study.masks.ffn_mask import FfnMask, ffn_mask_to_spec
from fairseq_headprune.study.masks.head_mask import HeadMask, combine_masks, head_mask_to_spec, read_mask_file
from fairseq_headprune.study.output.files import file_sha256, first_difference
from fairseq_headprune.study.pruning.curves import TUNED_SUFFIX, PruneStep, mask_name
from fairseq_headprune.study.pruning.settings import PruneSettings
from fairseq_headprune.study.search.settings import TuningSettings
from fairseq_headprune.study.search.tuning import MaskTuning, read_tuning, write_tuning
from fairseq_headprune.study.settings import ImportanceSettings, SweepSettings

IMPORTANCE_DIR = "importance"
FISHER_DIR = "importance-fisher"
TUNING_DIR = "tuning"
FISHER_ORDERS = {"fisher", "fisher-rearranged"}
class ImportanceStore:
    """Importance per mask under OUT/importance, estimated once and reused on rerun."""

    def __init__(self, family, sweep: SweepSettings, importance: ImportanceSettings, cfg, task, model,
                 base_mask: Optional[HeadMask], directory: str = IMPORTANCE_DIR):
        """``family``: the model's ``families.ModelFamily``, whose estimator is used."""
        self.importance_settings, self.task, self.model, self.base_mask = importance, task, model, base_mask
        self.cfg, self.family = cfg, family
        self.progress = sweep.progress
        self.directory = os.path.join(sweep.out_dir, directory)
        # (seconds, sentences) of every estimate used, in order (stored ones: as recorded when made)
        self.estimates: List[tuple] = []
        self.identity = {
            "checkpoint_sha256": file_sha256(sweep.checkpoint),
            "data": os.path.abspath(sweep.data),
            "subsets": list(importance.subsets),
            "limit_per_subset": importance.limit,
            "max_tokens": importance.max_tokens,
            "granularity": importance.granularity,
            "method": importance.method,
            "loss": importance.loss,
            "label_smoothing": importance.label_smoothing if importance.loss == "label_smoothed" else 0.0,
            "base_mask": head_mask_to_spec(base_mask) if base_mask is not None else "none",
        }
        self._estimator = None

    def importance(self, head_mask: HeadMask, description: str):
        """Raw importance of every head with ``head_mask`` (on top of the model's own mask) set."""
        return self.result(head_mask, description).importance

    def result(self, head_mask: HeadMask, description: str):
        """The whole estimate (scores, Fisher blocks, settings) with ``head_mask`` set; stored and reused."""


        ranks = current_ranks()
        path = os.path.join(self.directory, mask_name(head_mask) + ".json")
        identity = dict(self.identity, pruned=head_mask_to_spec(head_mask))
        if ranks.main_value(os.path.exists(path)):  # all ranks estimate (sharded), or all read
            result = read_importance_file(path)
            stored = dict(result.settings.get("identity", {}))
            stored.setdefault("method", "gradient")  # estimated before Fisher scores existed
            difference = first_difference(stored, identity)
            if difference is not None:
                raise StudyError(
                    f"{path} was estimated with other settings ({difference}); use another output directory"
                )
            self._count(result)
            return result
        if self._estimator is None:
            self._estimator = self.family.importance_estimator(self.cfg, self.task, self.model,
                                                               self.importance_settings)
        start = time.perf_counter()
        result = self._estimator.estimate(
            combine_masks(self.base_mask, head_mask), progress=self.progress, description=description
        )
        result.settings["identity"] = identity
        result.settings["seconds"] = time.perf_counter() - start
        if ranks.is_main:
            os.makedirs(self.directory, exist_ok=True)
            write_importance_json(result, path)
        self._count(result)
        return result

    def _count(self, result) -> None:
        self.estimates.append((float(result.settings.get("seconds", 0.0)),
                               int(result.settings.get("sentences", result.count))))


class TuningStore:
    """Tuned masks (least squares, ``mask_tuning``) under OUT/tuning, fitted once and reused on rerun.

    Rank 0 fits every mask a sharded study needs before the sweep; the
    other ranks read them (``fit_all``).
    """

    def __init__(self, sweep: SweepSettings, settings: TuningSettings, task, model, base_mask: Optional[HeadMask],
                 loss=None):
        self.settings, self.task, self.model, self.base_mask = settings, task, model, base_mask
        self.loss = loss  # the held-aside guard's loss (None: the target tokens' cross-entropy)
        self.progress = sweep.progress
        self.directory = os.path.join(sweep.out_dir, TUNING_DIR)
        self.identity = {
            "checkpoint_sha256": file_sha256(sweep.checkpoint),
            "data": os.path.abspath(sweep.data),
            "subsets": list(settings.subsets),
            "limit_per_subset": settings.limit,
            "max_tokens": settings.max_tokens,
            "scale_bound": settings.scale_bound,
            "max_condition": settings.max_condition,
            "held_aside": settings.held_aside,
            "tuned_layers": settings.layers,
            "target": "residual",
            "base_mask": head_mask_to_spec(base_mask) if base_mask is not None else "none",
        }
        self._samples = None
        self.seconds: Dict[str, float] = {}  # per mask name, as fitted (or recorded when stored)
        self.sentences = 0

    def _name(self, head_mask: HeadMask, ffn_mask: Optional[FfnMask] = None) -> str:
        """The stored tuning's name: the head mask's, and the neuron mask's digest when it masks a neuron."""
        name = mask_name(head_mask)
        if ffn_mask is not None and _prunes(ffn_mask):
            name += ".ffn-" + hashlib.sha1(ffn_mask_to_spec(ffn_mask).encode()).hexdigest()[:16]
        return name

    def _path(self, head_mask: HeadMask, ffn_mask: Optional[FfnMask] = None) -> str:
        return os.path.join(self.directory, self._name(head_mask, ffn_mask) + ".json")

    def fit_all(self, masks: Sequence) -> None:
        """Fit every mask not stored yet: head masks, or (head mask, FFN mask) pairs."""
        ranks = current_ranks()
        if ranks.is_main:
            pairs = [m if isinstance(m, tuple) else (m, None) for m in masks]
            todo = {self._name(*pair): pair for pair in pairs
                    if not os.path.exists(self._path(*pair)) and _prunes_any(*pair)}
            for index, (head_mask, ffn_mask) in enumerate(todo.values()):
                self._fit(head_mask, f"mask tuning {index + 1}/{len(todo)}", ffn_mask)
        ranks.barrier()

    def _fit(self, head_mask: HeadMask, description: str = "mask tuning", ffn_mask: Optional[FfnMask] = None):
        """Fit ``head_mask`` (on top of the model's own mask) and ``ffn_mask``, and store it."""
        if self._samples is None:
            self._samples = tuning_samples(self.task, self.model, self.settings)
        tuning = tune_mask(self.model, combine_masks(self.base_mask, head_mask), self._samples,
                           self.task.source_dictionary.pad(), self.settings, ffn_mask=ffn_mask, loss=self.loss,
                           progress=self.progress, description=description)
        tuning.head_mask = head_mask
        tuning.settings["identity"] = self.identity
        os.makedirs(self.directory, exist_ok=True)
        write_tuning(tuning, self._path(head_mask, ffn_mask))
        self.seconds[self._name(head_mask, ffn_mask)] = float(tuning.settings["seconds"])
        self.sentences = max(self.sentences, int(tuning.settings["sentences"]))
        return tuning

    def tuning(self, head_mask: HeadMask, ffn_mask: Optional[FfnMask] = None):
        """The stored tuning of ``head_mask`` and ``ffn_mask`` (an empty one for the unpruned model)."""

        if not _prunes_any(head_mask, ffn_mask):
            return MaskTuning(head_mask, {})
        path = self._path(head_mask, ffn_mask)
        if not os.path.exists(path):
            return self._fit(head_mask, ffn_mask=ffn_mask)
        layout = {t: tuple(m.shape) for t, m in head_mask.items()}
        result = read_tuning(path, layout, ffn_layout(self.model))
        difference = first_difference(result.settings.get("identity", {}), self.identity)
        if difference is not None:
            raise StudyError(f"{path} was tuned with other settings ({difference}); use another output directory")
        self.seconds[self._name(head_mask, ffn_mask)] = float(result.settings.get("seconds", 0.0))
        self.sentences = max(self.sentences, int(result.settings.get("sentences", 0)))
        return result


def _prunes(mask) -> bool:
    return any(bool((m == 0).any()) for m in mask.values())


def _prunes_any(head_mask: HeadMask, ffn_mask: Optional[FfnMask] = None) -> bool:
    return _prunes(head_mask) or (ffn_mask is not None and _prunes(ffn_mask))


def method_costs(settings: PruneSettings, store: Optional[ImportanceStore], fisher_store: Optional[ImportanceStore],
                 tuning_store: Optional[TuningStore], steps: Sequence[PruneStep]) -> Dict[str, Dict[str, object]]:
    """What each order's masks cost to find: seconds and sentences of the estimates and fits it needed.

    Estimates read back from OUT count the seconds they took when made.
    """
    costs: Dict[str, Dict[str, object]] = {}
    for order in settings.orders:
        if order in ("importance", "iterative") and store is not None and store.estimates:
            used = store.estimates[:1] if order == "importance" else store.estimates
            costs[order] = {"seconds": sum(s for s, _ in used), "sentences": used[0][1], "estimates": len(used)}
        elif order in FISHER_ORDERS and fisher_store is not None and fisher_store.estimates:
            seconds, sentences = fisher_store.estimates[0]
            costs[order] = {"seconds": seconds, "sentences": sentences, "estimates": 1}
        elif order == "gates":
            costs[order] = _gate_costs(settings.gate_masks)
        else:
            costs[order] = {"seconds": 0.0, "sentences": 0, "estimates": 0}
    if tuning_store is not None:
        for order in settings.tune_orders:
            names = {tuning_store._name(s.head_mask, getattr(s, "ffn_mask", None)) for s in steps
                     if s.order == order and _prunes_any(s.head_mask, getattr(s, "ffn_mask", None))}
            base = costs[order]
            costs[order + TUNED_SUFFIX] = {
                "seconds": base["seconds"] + sum(tuning_store.seconds.get(n, 0.0) for n in names),
                "sentences": base["sentences"], "estimates": base["estimates"],
                "tuning_sentences": tuning_store.sentences, "tuned_masks": len(names),
            }
    return costs


def read_gate_mask(path: str, layout) -> HeadMask:

    try:
        return read_mask_file(path, layout)
    except HeadPruneError as error:
        raise ResultFileError(f"the gate masks: {error}", setting="gate_masks") from error


def _gate_costs(paths: Sequence[str]) -> Dict[str, object]:
    """Training time and sentences seen of the gates, from each mask's cost.json (scripts/train/train_gates.sh)."""
    seconds, sentences, found = 0.0, 0, 0
    for path in paths:
        cost_file = os.path.join(os.path.dirname(os.path.abspath(path)), "cost.json")
        if os.path.exists(cost_file):
            with open(cost_file, encoding="utf-8") as stream:
                cost = json.load(stream)
            seconds += float(cost.get("seconds", 0.0))
            sentences = max(sentences, int(cost.get("sentences", 0)))
            found += 1
    return {"seconds": seconds, "sentences": sentences, "estimates": 0, "trainings": found}
