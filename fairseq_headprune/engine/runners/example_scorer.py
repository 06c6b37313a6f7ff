"""Score one split of a classifier or a language model under many head masks.

The counterpart of ``translator.SplitTranslator`` for models that are
scored, not searched: RoBERTa-family classifiers (``sentence_prediction``;
each example's predicted label, as fairseq's criterion takes the argmax of
the classification head) and decoder-only language models
(``language_modeling``; each sample's summed loss in base 2 and its token
count, from fairseq's own ``SequenceScorer`` exactly as ``fairseq-eval-lm``
sums them). Batches come from fairseq's own batching of the split; several
masks run in one forward pass, each batch repeated once per mask with the
mask on its rows (``config_batching``): examples do not interact in these
models, so each mask gets what it gets alone.

Each configuration's output is one string per example: the predicted label,
or ``"LOSS TOKENS"``; the study's ``Metric`` turns those into statistics
(accuracy, Matthews correlation, perplexity), against ``references`` (the
gold labels; nothing for a language model).
"""

import hashlib
import json
import math
import os
import time
from dataclasses import dataclass, field
from typing import ClassVar, Dict, List, Optional, Sequence, Tuple

import torch
from fairseq import utils
from fairseq.sequence_scorer import SequenceScorer
from omegaconf import OmegaConf

from fairseq_headprune.constants import CLASSIFIER_FAMILY, LANGUAGE_MODEL_FAMILY
from fairseq_headprune.engine.runners.batches import iterate_samples, load_split, model_device, split_batches
from fairseq_headprune.engine.runners.config_batching import repeat_sample, row_masks
from fairseq_headprune.errors import StudyError
from fairseq_headprune.modules.masked_multihead_attention import head_mask_applied
from fairseq_headprune.study.masks.head_mask import HeadMask, head_mask_to_spec
from fairseq_headprune.study.output.files import file_sha256
from fairseq_headprune.study.output.serialisation import PlainRecord

# version of the stored results; part of every sweep's identity
FORMAT_VERSION = 1
CLASSIFICATION_HEAD = "sentence_classification_head"  # fairseq's sentence_prediction default


@dataclass
class ScoredExamples:
    """One configuration on one split: an output string per example, in example-id order."""

    outputs: List[str]
    seconds: float


@dataclass
class ScoredConfigResult(ScoredExamples, PlainRecord):
    """A finished configuration of a classifier or LM sweep (``example_scorer``) as stored on disk."""

    name: str = ""
    spec: str = ""
    labels: Dict[str, object] = field(default_factory=dict)

    ORDER: ClassVar[Tuple[str, ...]] = ("name", "spec", "labels", "seconds", "outputs")


class SplitScorer:
    """One split of a classifier's or LM's data, scored under many masks with the model loaded once."""

    result_type = ScoredConfigResult  # how a sweep stores each configuration

    def __init__(self, family: str, cfg, task, model, split: str):

        if family not in (CLASSIFIER_FAMILY, LANGUAGE_MODEL_FAMILY):
            raise StudyError(f"no example scorer for {family} models")
        self.family, self.cfg, self.task, self.model, self.split = family, cfg, task, model, split
        load_split(task, split)
        if family == CLASSIFIER_FAMILY and getattr(task.cfg, "regression_target", False):
            raise StudyError("a regression classifier (--regression-target) has no accuracy; the studies need labels")
        if cfg.common.fp16:
            model.half()
        elif cfg.common.bf16:
            model.to(torch.bfloat16)
        self.samples = self._collated_batches()
        self.example_ids = sorted(i for sample in self.samples for i in sample["id"].tolist())
        self.position = {example_id: p for p, example_id in enumerate(self.example_ids)}
        self.size = len(self.example_ids)
        if family == CLASSIFIER_FAMILY:
            self.references = self._gold_labels()
        else:

            self.scorer = SequenceScorer(task.target_dictionary, cfg.eval_lm.softmax_batch)
            self.references = [""] * self.size
            self.continuations = self._continuation_ids(cfg.common_eval.post_process)

    # ------------------------------------------------------------------ batches

    def _collated_batches(self) -> List[dict]:


        device = model_device(self.model)
        if self.family == LANGUAGE_MODEL_FAMILY:
            # fairseq-eval-lm's own batching (context window included)
            iterator = self.task.eval_lm_dataloader(
                dataset=self.task.dataset(self.split),
                max_tokens=self.cfg.dataset.max_tokens or 36000,
                batch_size=self.cfg.dataset.batch_size,
                max_positions=utils.resolve_max_positions(self.model.max_positions()),
                num_shards=1, shard_id=0, num_workers=0,
                data_buffer_size=self.cfg.dataset.data_buffer_size,
                context_window=self.cfg.eval_lm.context_window,
            )
            samples = [s for s in iterator if "net_input" in s]
            samples = [utils.move_to_cuda(s, device=device) if device.type == "cuda" else s for s in samples]
        else:
            dataset, batches = split_batches(
                self.task, self.split, self.cfg.dataset.max_tokens, self.cfg.dataset.batch_size or 32
            )
            samples = list(iterate_samples(dataset, batches, device))
        if not samples:
            raise StudyError(f"split {self.split!r} in {self.task.cfg.data} has no examples")
        return samples

    def _gold_labels(self) -> List[str]:
        """Each example's label as the label dictionary spells it (fairseq's target + nspecial)."""
        labels = self.task.label_dictionary
        gold = [None] * self.size
        for sample in self.samples:
            for example_id, target in zip(sample["id"].tolist(), sample["target"].view(-1).tolist()):
                gold[self.position[example_id]] = labels[target + labels.nspecial]
        return gold

    # ------------------------------------------------------------------ scoring

    def score(self, head_mask: Optional[HeadMask]) -> ScoredExamples:
        return self.score_many([head_mask])[0]

    def score_as_loaded(self) -> ScoredExamples:
        """Every example with the model as it is, its own masks kept (a ``--head-mask`` it was loaded with, or none
        on a shrunk model, whose layers keep different head counts): what a timed system runs."""
        outputs: List[Optional[str]] = [None] * self.size
        start = time.perf_counter()
        with torch.no_grad():
            for sample in self.samples:
                for i, output in enumerate(self._score_rows(sample)):
                    outputs[self.position[int(sample["id"][i])]] = output
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return ScoredExamples(outputs=outputs, seconds=time.perf_counter() - start)

    def run_many(self, head_masks: Sequence[Optional[HeadMask]]) -> List[ScoredExamples]:
        """What ``sweep.run_sweep`` calls: ``score_many``."""
        return self.score_many(head_masks)

    def score_many(self, head_masks: Sequence[Optional[HeadMask]]) -> List[ScoredExamples]:
        """Every example under every mask: one mask alone, or each batch repeated once per mask."""

        count = len(head_masks)
        outputs = [[None] * self.size for _ in range(count)]
        # masks that mask nothing take the unmasked path, as the baseline: the same numbers, not
        # numbers equal within float error that a paired test would read as a difference
        plain = [k for k, m in enumerate(head_masks) if m is None or all(bool((t == 1).all()) for t in m.values())]
        masked = [k for k in range(count) if k not in plain]
        start = time.perf_counter()
        with torch.no_grad():
            for sample in self.samples:
                batch = len(sample["id"])
                rows = {}
                if plain:
                    with head_mask_applied(self.model, None):
                        unmasked = self._score_rows(sample)
                    rows.update({k: unmasked for k in plain})
                if len(masked) == 1:
                    with head_mask_applied(self.model, head_masks[masked[0]]):
                        rows[masked[0]] = self._score_rows(sample)
                elif masked:
                    device = next(self.model.parameters()).device
                    together = row_masks([head_masks[k] for k in masked], batch)
                    with head_mask_applied(self.model, {t: m.to(device) for t, m in together.items()}):
                        scored = self._score_rows(repeat_sample(sample, len(masked)))
                    rows.update({k: scored[j * batch:(j + 1) * batch] for j, k in enumerate(masked)})
                for k, k_rows in rows.items():
                    for i, output in enumerate(k_rows):
                        outputs[k][self.position[int(sample["id"][i])]] = output
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        seconds = (time.perf_counter() - start) / count
        return [ScoredExamples(outputs=outputs[k], seconds=seconds) for k in range(count)]

    def _score_rows(self, sample) -> List[str]:
        if self.family == CLASSIFIER_FAMILY:
            return self._predicted_labels(sample)
        return self._sentence_losses(sample)

    def _predicted_labels(self, sample) -> List[str]:
        """The argmax of the classification head, as fairseq's sentence_prediction criterion takes it."""
        head = getattr(self.task.cfg, "classification_head_name", None) or CLASSIFICATION_HEAD
        logits, _ = self.model(**sample["net_input"], features_only=True, classification_head_name=head)
        labels = self.task.label_dictionary
        return [labels[p + labels.nspecial] for p in logits.argmax(dim=1).tolist()]

    def _sentence_losses(self, sample) -> List[str]:
        """Each sample's summed loss in base 2 and token count, as fairseq-eval-lm sums them.

        ``fairseq_cli.eval_lm.eval_lm``: positional log-probabilities from
        ``SequenceScorer``, the BOS position dropped with --add-bos-token,
        subword continuations folded into the word's last piece with
        --post-process subword_nmt, infinite scores skipped.
        """
        continuation = self.continuations
        rows = []
        for hypotheses in self.scorer.generate([self.model], sample):
            tokens, scores = hypotheses[0]["tokens"], hypotheses[0]["positional_scores"].float()
            if getattr(self.task.cfg, "add_bos_token", False):
                tokens, scores = tokens[1:], scores[1:]
            skipped = 0
            if continuation is not None:
                scores = scores.clone()
                for i in range(len(tokens) - 1):
                    if tokens[i].item() in continuation:
                        skipped += 1
                        scores[i + 1] += scores[i]
                        scores[i] = 0
            scores = scores[torch.isfinite(scores)]
            loss = -float(scores.double().sum()) / math.log(2)
            rows.append(f"{loss!r} {scores.numel() - skipped}")
        return rows

    def _continuation_ids(self, post_process: Optional[str]):
        """Subword pieces continued by the next (``--post-process subword_nmt``), or None without it."""
        if post_process is None:
            return None
        if post_process not in ("subword_nmt", "@@ "):
            raise StudyError(f"--post-process {post_process}: fairseq-eval-lm implements subword_nmt only")
        dictionary = self.task.source_dictionary
        return {i for i in range(len(dictionary)) if dictionary[i].endswith("@@")}

    # ------------------------------------------------------------------ identity

    @property
    def manifest_references(self) -> List[str]:
        return self.references

    def identity(self, checkpoint: str, base_mask: Optional[HeadMask]) -> Dict[str, object]:
        """What makes two sweeps comparable: any difference means another sweep."""

        cfg = self.cfg
        identity = {
            "format": FORMAT_VERSION,
            "family": self.family,
            "checkpoint_sha256": file_sha256(checkpoint),
            "data": os.path.abspath(cfg.task.data),
            "split": self.split,
            "sentences": self.size,
            "sentence_ids_sha256": hashlib.sha256(json.dumps(self.example_ids).encode()).hexdigest(),
            "base_mask": "none" if base_mask is None else head_mask_to_spec(base_mask),
            "max_tokens": cfg.dataset.max_tokens,
            "batch_size": cfg.dataset.batch_size,
            "fp16": cfg.common.fp16,
            **({"bf16": True} if cfg.common.bf16 else {}),
        }
        if self.family == LANGUAGE_MODEL_FAMILY:
            identity.update({
                "eval_lm": OmegaConf.to_container(cfg.eval_lm, resolve=True),
                "tokens_per_sample": cfg.task.tokens_per_sample,
                "sample_break_mode": str(cfg.task.sample_break_mode),
                "add_bos_token": bool(getattr(cfg.task, "add_bos_token", False)),
                "post_process": cfg.common_eval.post_process,
            })
        return identity
