"""Translate one split under many head masks, with the model loaded once.

``SplitTranslator`` loads nothing itself: it takes the task and model that
``loading.load_generation_model`` built, batches the split exactly as
``fairseq-generate`` does (same ``get_batch_iterator`` arguments, so the same
batches), collates them once, and for every mask runs fairseq's own
``SequenceGenerator`` through ``task.inference_step`` and turns hypotheses and
references into strings with fairseq's own post-processing. Tokenized BLEU
statistics come from fairseq's C scorer on the same token ids
``fairseq-generate`` feeds it, so a configuration's BLEU is the number
``fairseq-generate --head-mask SPEC`` prints. Several masks are translated
together, each batch repeated once per mask (``translate_many``); masks that
agree on the encoder's self-attention share one encoder pass
(``encoder_passes_shared``).
"""

import contextlib
import copy
import hashlib
import json
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from fairseq import utils
from fairseq.dataclass.configs import GenerationConfig
from fairseq.utils import strip_pad
from fairseq_cli.generate import get_symbols_to_strip_from_output
from omegaconf import OmegaConf
from sacremoses import MosesDetokenizer

from fairseq_headprune.constants import FAIRSEQ_GENERATE_MAX_TOKENS
from fairseq_headprune.engine.runners.batches import load_split
from fairseq_headprune.engine.runners.config_batching import (
    encoder_passes_shared,
    repeat_sample,
    row_masks,
    rows_follow_beam_search,
)
from fairseq_headprune.errors import StudyError
from fairseq_headprune.modules.masked_multihead_attention import head_mask_applied
from fairseq_headprune.study.masks.head_mask import HeadMask, head_mask_to_spec
from fairseq_headprune.study.output.files import file_sha256, read_lines
from fairseq_headprune.study.statistics.bleu_stats import fairseq_scorer, fairseq_sentence_stats, sacrebleu_stats
from fairseq_headprune.study.statistics.metrics import SACREBLEU, TOKENIZED_BLEU

logger = logging.getLogger(__name__)

# version of the stored results; part of every sweep's identity
FORMAT_VERSION = 1


@dataclass
class Translation:
    """One configuration on one split; lists follow the translated sentence ids in order."""

    hypotheses: List[str]  # what fairseq's tokenized BLEU scores
    detokenized: List[str]  # what sacreBLEU scores
    fairseq_stats: np.ndarray
    sacrebleu_stats: np.ndarray
    seconds: float

    @property
    def bleu(self) -> float:
        return TOKENIZED_BLEU.score(self.fairseq_stats)

    @property
    def sacrebleu(self) -> float:
        return SACREBLEU.score(self.sacrebleu_stats)


@dataclass
class ConfigResult(Translation):
    """A finished configuration as stored on disk."""

    name: str = ""
    spec: str = ""
    labels: Dict[str, object] = field(default_factory=dict)

    def to_dict(self) -> Dict[str, object]:
        return {
            "name": self.name,
            "spec": self.spec,
            "labels": self.labels,
            "bleu": self.bleu,
            "sacrebleu": self.sacrebleu,
            "seconds": self.seconds,
            "hypotheses": self.hypotheses,
            "detokenized": None if self.detokenized == self.hypotheses else self.detokenized,
            "fairseq_stats": self.fairseq_stats.tolist(),
            "sacrebleu_stats": self.sacrebleu_stats.tolist(),
        }

    @classmethod
    def from_dict(cls, data: Dict[str, object]) -> "ConfigResult":
        """``bleu`` and ``sacrebleu`` are stored for readers; they come back from the statistics."""
        return cls(
            name=data["name"],
            spec=data["spec"],
            labels=data["labels"],
            seconds=data["seconds"],
            hypotheses=data["hypotheses"],
            detokenized=data["detokenized"] if data["detokenized"] is not None else data["hypotheses"],
            fairseq_stats=np.asarray(data["fairseq_stats"], dtype=np.int64),
            sacrebleu_stats=np.asarray(data["sacrebleu_stats"], dtype=np.int64),
        )


class SplitTranslator:
    """fairseq-generate's loop over one split, with the model loaded once."""

    result_type = ConfigResult  # how a sweep stores each configuration

    def __init__(self, cfg, task, model, split: str, detokenize: str = "auto", references: Optional[str] = None,
                 share_encoder: bool = True, sentence_shard: Optional[Tuple[int, int]] = None):
        """``sentence_shard=(rank, ranks)`` keeps the sentences whose id is
        ``rank`` modulo ``ranks`` from every batch: sharding by sentences, which
        ``scripts/benchmarks/benchmark_ablation.py`` measures against the commands'
        sharding by configurations."""


        self.cfg, self.task, self.model, self.split = cfg, task, model, split
        self.share_encoder = share_encoder
        self.sentence_shard = sentence_shard
        scoring = getattr(cfg.scoring, "_name", None)
        if scoring not in (None, "bleu"):
            raise StudyError(
                f"--scoring {scoring}: the sweep always reports fairseq's bleu and sacreBLEU; drop --scoring"
            )
        if cfg.generation.nbest != 1:
            raise StudyError("--nbest must be 1: BLEU scores the best hypothesis")
        load_split(task, split)
        if cfg.common.fp16:
            model.half()
        elif cfg.common.bf16:
            # fairseq-generate ignores --bf16 (it translates in fp32); a sweep honours it
            model.to(torch.bfloat16)
        model.prepare_for_inference_(cfg)
        if cfg.common.seed is not None and not cfg.generation.no_seed_provided:
            np.random.seed(cfg.common.seed)
            utils.set_torch_seed(cfg.common.seed)
        self.generator = task.build_generator(
            [model], cfg.generation, extra_gen_cls_kwargs={"lm_model": None, "lm_weight": cfg.generation.lm_weight}
        )
        self.samples = self._collated_batches()
        # fairseq's batching may leave sentences out (fairseq-generate does the same):
        # results are kept in the order of the sentence ids that were translated
        self.sentence_ids = sorted(i for sample in self.samples for i in sample["id"].tolist())
        self.position = {sentence_id: p for p, sentence_id in enumerate(self.sentence_ids)}
        self.size = len(self.sentence_ids)
        left_out = len(task.dataset(split)) - self.size
        if left_out > 0:
            logger.warning(
                f"fairseq's batching left out {left_out} of {len(task.dataset(split))} sentences of "
                f"{split!r} (--required-batch-size-multiple {cfg.dataset.required_batch_size_multiple}); "
                "scoring the rest, as fairseq-generate does"
            )
        self.tokenizer = task.build_tokenizer(cfg.tokenizer)
        self.bpe = task.build_bpe(cfg.bpe)
        self.detokenizer = self._sacrebleu_detokenizer(detokenize)
        self._read_references(references)
        self._scored_cache: List[Dict[tuple, Tuple[str, List[int]]]] = [{} for _ in range(self.size)]
        self._detokenized: List[Dict[str, str]] = [{} for _ in range(self.size)]
        self._sacrebleu_cache: List[Dict[str, np.ndarray]] = [{} for _ in range(self.size)]

    def _collated_batches(self) -> List[dict]:

        cfg, task = self.cfg, self.task
        max_tokens, batch_size = cfg.dataset.max_tokens, cfg.dataset.batch_size
        if max_tokens is None and batch_size is None:
            max_tokens = FAIRSEQ_GENERATE_MAX_TOKENS
        iterator = task.get_batch_iterator(
            dataset=task.dataset(self.split),
            max_tokens=max_tokens,
            max_sentences=batch_size,
            max_positions=utils.resolve_max_positions(task.max_positions(), self.model.max_positions()),
            ignore_invalid_inputs=cfg.dataset.skip_invalid_size_inputs_valid_test,
            required_batch_size_multiple=cfg.dataset.required_batch_size_multiple,
            seed=cfg.common.seed,
            num_shards=1,
            shard_id=0,
            num_workers=0,
            data_buffer_size=cfg.dataset.data_buffer_size,
        ).next_epoch_itr(shuffle=False)
        use_cuda = next(self.model.parameters()).is_cuda
        samples = [s for s in iterator if "net_input" in s]
        if self.sentence_shard is not None:
            rank, ranks = self.sentence_shard
            dataset = task.dataset(self.split)
            shares = ([i for i in s["id"].tolist() if i % ranks == rank] for s in samples)
            samples = [dataset.collater([dataset[i] for i in share]) for share in shares if share]
        samples = [utils.move_to_cuda(s) if use_cuda else s for s in samples]
        if not samples:
            raise StudyError(f"split {self.split!r} in {self.cfg.task.data} has no sentences")
        if any(s["target"] is None for s in samples):
            raise StudyError(f"split {self.split!r} has no target side to score against")
        return samples

    def _sacrebleu_detokenizer(self, detokenize: str) -> Optional[Callable[[str], str]]:
        """sacreBLEU wants detokenized text: Moses-detokenize unless fairseq's --tokenizer did."""
        if detokenize not in ("auto", "moses", "none"):
            raise StudyError(f"the sacreBLEU detokenizer must be auto, moses or none, got {detokenize!r}",
                             setting="sacrebleu_detokenize")
        if detokenize == "none" or (detokenize == "auto" and self.tokenizer is not None):
            return None

        detokenizer = MosesDetokenizer(lang=self.cfg.task.target_lang or "en")
        return lambda line: detokenizer.detokenize(line.split())

    def _decode(self, text: str) -> str:
        if self.bpe is not None:
            text = self.bpe.decode(text)
        if self.tokenizer is not None:
            text = self.tokenizer.decode(text)
        return text

    def _detokenize(self, text: str) -> str:
        return self.detokenizer(text) if self.detokenizer is not None else text

    def _read_references(self, references: Optional[str]) -> None:

        tgt_dict = self.task.target_dictionary
        # fairseq-generate adds unseen words to the target dictionary when it re-encodes
        # strings for BLEU; a copy keeps the task's dictionary (and the model) unchanged
        self.scoring_dictionary = copy.deepcopy(tgt_dict)
        self.scorer = fairseq_scorer(tgt_dict)
        self.strip = get_symbols_to_strip_from_output(self.generator)
        post_process = self.cfg.common_eval.post_process
        self.reference_text = [None] * self.size
        self.reference_ids = [None] * self.size
        for sample in self.samples:
            for i, sentence_id in enumerate(sample["id"].tolist()):
                position = self.position[sentence_id]
                target = strip_pad(sample["target"][i, :], tgt_dict.pad()).int().cpu()
                text = self._decode(
                    tgt_dict.string(target, post_process, escape_unk=True, extra_symbols_to_ignore=self.strip)
                )
                self.reference_text[position] = text
                self.reference_ids[position] = (
                    self.scoring_dictionary.encode_line(text, add_if_not_exist=True)
                    if post_process is not None else target
                )
        if references is not None:
            lines = read_lines(references, "the references ")
            if len(lines) != len(self.task.dataset(self.split)):
                raise StudyError(
                    f"the references {references} has {len(lines)} lines, split {self.split!r} "
                    f"has {len(self.task.dataset(self.split))} sentences", setting="references"
                )
            self.sacrebleu_references = [lines[i] for i in self.sentence_ids]
            self.references_source = os.path.abspath(references)
        else:
            self.sacrebleu_references = [self._detokenize(t) for t in self.reference_text]
            self.references_source = "data"

    @property
    def manifest_references(self) -> List[str]:
        """What a sweep's manifest records as the references."""
        return self.sacrebleu_references

    def run_many(self, head_masks: Sequence[Optional[HeadMask]]) -> List[Translation]:
        """What ``sweep.run_sweep`` calls: ``translate_many``."""
        return self.translate_many(head_masks)

    def translate(self, head_mask: Optional[HeadMask]) -> Translation:
        return self.translate_many([head_mask])[0]

    def translate_many(self, head_masks: Sequence[Optional[HeadMask]]) -> List[Translation]:
        """Translate the split once per mask.

        One mask runs exactly as ``fairseq-generate --head-mask`` does. Several
        masks run together: each batch is repeated once per mask, every row
        carries its own mask, and the rows' masks follow beam search's
        reordering of the encoder output (``rows_follow_beam_search``). Each
        sentence's search is independent of the others in its batch, so this
        saves the per-step overhead of small batches, and, with
        ``share_encoder``, the encoder passes of masks that differ only on
        the decoder side (``encoder_passes_shared``).
        """

        count = len(head_masks)
        hypotheses = [[None] * self.size for _ in range(count)]
        stats = [[None] * self.size for _ in range(count)]
        start = time.perf_counter()
        with torch.no_grad():
            for sample in self.samples:
                batch = len(sample["id"])
                if count == 1:
                    with head_mask_applied(self.model, head_masks[0]):
                        outputs = self._inference(sample)
                else:
                    sharing = (
                        encoder_passes_shared(self.model, head_masks, batch)
                        if self.share_encoder else contextlib.nullcontext()
                    )
                    with rows_follow_beam_search(self.model, row_masks(head_masks, batch)), sharing:
                        outputs = self._inference(repeat_sample(sample, count))
                for row, output in enumerate(outputs):
                    k, i = divmod(row, batch)
                    position = self.position[int(sample["id"][i])]
                    hypotheses[k][position], stats[k][position] = self._scored(position, output[0])
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        seconds = (time.perf_counter() - start) / count
        return [
            Translation(
                hypotheses=hypotheses[k],
                detokenized=[self._detokenized[p][h] for p, h in enumerate(hypotheses[k])],
                fairseq_stats=np.asarray(stats[k], dtype=np.int64),
                sacrebleu_stats=self._sacrebleu_rows(hypotheses[k]),
                seconds=seconds,
            )
            for k in range(count)
        ]

    def _scored(self, position: int, best) -> Tuple[str, List[int]]:
        """Hypothesis text and tokenized-BLEU statistics, computed once per distinct output.

        Masking one head leaves most sentences' translations unchanged, so a
        sweep meets the same output for the same sentence again and again.
        """
        key = tuple(best["tokens"].tolist())
        cached = self._scored_cache[position].get(key)
        if cached is None:
            text, hypothesis_ids = self._hypothesis(best)
            cached = (text, fairseq_sentence_stats(self.scorer, self.reference_ids[position], hypothesis_ids))
            self._scored_cache[position][key] = cached
            self._detokenized[position].setdefault(text, self._detokenize(text))
        return cached

    def _sacrebleu_rows(self, hypotheses: List[str]) -> np.ndarray:
        missing = [p for p, h in enumerate(hypotheses) if h not in self._sacrebleu_cache[p]]
        if missing:
            rows = sacrebleu_stats(
                [self.sacrebleu_references[p] for p in missing],
                [self._detokenized[p][hypotheses[p]] for p in missing],
            )
            for p, row in zip(missing, rows):
                self._sacrebleu_cache[p][hypotheses[p]] = row
        return np.asarray([self._sacrebleu_cache[p][h] for p, h in enumerate(hypotheses)], dtype=np.int64)

    def _inference(self, sample):
        prefix = None
        if self.cfg.generation.prefix_size > 0:
            prefix = sample["target"][:, : self.cfg.generation.prefix_size]
        return self.task.inference_step(self.generator, [self.model], sample, prefix_tokens=prefix)

    def _hypothesis(self, best):
        """The string fairseq-generate scores and the ids it scores it as."""

        hypothesis_ids, hypothesis_text, _ = utils.post_process_prediction(
            hypo_tokens=best["tokens"].int().cpu(),
            src_str="",
            alignment=best["alignment"],
            align_dict=None,
            # it re-encodes with add_if_not_exist=True after --remove-bpe: never on the
            # task's dictionary, or a generator built later gets the wrong vocabulary size
            tgt_dict=self.scoring_dictionary,
            remove_bpe=self.cfg.common_eval.post_process,
            extra_symbols_to_ignore=self.strip,
        )
        text = self._decode(hypothesis_text)
        if self.cfg.common_eval.post_process is not None:
            hypothesis_ids = self.scoring_dictionary.encode_line(text, add_if_not_exist=True)
        return text, hypothesis_ids

    def identity(self, checkpoint: str, base_mask: Optional[HeadMask]) -> Dict[str, object]:
        """What makes two sweeps comparable: any difference means another sweep."""

        cfg = self.cfg
        return {
            "format": FORMAT_VERSION,
            "checkpoint_sha256": file_sha256(checkpoint),
            "data": os.path.abspath(cfg.task.data),
            "source_lang": cfg.task.source_lang,
            "target_lang": cfg.task.target_lang,
            "split": self.split,
            "sentences": self.size,
            "sentence_ids_sha256": hashlib.sha256(json.dumps(self.sentence_ids).encode()).hexdigest(),
            "base_mask": "none" if base_mask is None else head_mask_to_spec(base_mask),
            "generation": OmegaConf.to_container(cfg.generation, resolve=True),
            "post_process": cfg.common_eval.post_process,
            "tokenizer": OmegaConf.to_container(cfg.tokenizer, resolve=True) if cfg.tokenizer else None,
            "bpe": OmegaConf.to_container(cfg.bpe, resolve=True) if cfg.bpe else None,
            "max_tokens": cfg.dataset.max_tokens,
            "batch_size": cfg.dataset.batch_size,
            "required_batch_size_multiple": cfg.dataset.required_batch_size_multiple,
            "fp16": cfg.common.fp16,
            **({"bf16": True} if cfg.common.bf16 else {}),
            "sacrebleu_detokenizer": "moses" if self.detokenizer is not None else "none",
            "sacrebleu_references": self.references_source,
        }


def translate_batches(task, model, batches, beam: int = 5, generation=None):
    """Seconds and best hypotheses (token ids) of fairseq's beam search over ``batches``.

    ``generation``: fairseq's generation config (default: fairseq's defaults with ``beam``).
    """

    generator = task.build_generator([model], generation or GenerationConfig(beam=beam))
    hypotheses = []
    start = time.perf_counter()
    with torch.no_grad():
        for batch in batches:
            for sentence in task.inference_step(generator, [model], batch):
                hypotheses.append(sentence[0]["tokens"].tolist())
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - start, hypotheses


@dataclass
class DecoderWork:
    """How much decoding a pass did: the decoder's calls (beam-search steps, summed over batches) and the
    hypotheses they extended (each call's rows: sentences still unfinished times the beam).

    Two models translating the same sentences do the same work only when these agree: a model whose
    predictions changed (heads masked without fine-tuning) can keep its beams alive longer, and its pass
    then takes longer whatever each step costs.
    """

    steps: int = 0
    rows: int = 0


@contextlib.contextmanager
def decoder_work_counted(model):
    """Count the decoder's calls and rows in the block.

    fairseq's beam search calls ``decoder.forward`` itself, which skips the decoder's hooks, and the token
    embeddings may be the encoder's too; every call runs the decoder's first layer (a module, called as one) on
    time x rows x channels, so a forward pre-hook there sees each step and only those.
    """
    work = DecoderWork()

    def count(_layer, inputs):
        work.steps += 1
        work.rows += int(inputs[0].size(1))

    handle = model.decoder.layers[0].register_forward_pre_hook(count)
    try:
        yield work
    finally:
        handle.remove()
