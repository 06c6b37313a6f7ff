"""How many configurations and sentences one batch takes on a GPU: a rule from numbers to a choice.

On the CPU the studies keep their defaults (4 configurations per batch, fairseq's
own batching of the split; importance 64 sentences a batch), measured there
(``scripts/benchmarks/benchmark_batching.py``, docs/benchmarks.md). On a GPU a
batch that size leaves the device idle: a 145-configuration sweep of a 6+6-layer
model took 122.6 s on an H100 with 4 configurations of 64 sentences a batch, 54.0 s
with 32 of 256 (issue 64).
So on a GPU the engine measures the free memory at start and the model's shape and
hands the numbers to this rule, which plans ``MEMORY_SHARE`` of the free memory
for the rows of one batch, up to ceilings beyond which nothing was measured. What
the user gives (``--configs-per-batch``, ``--batch-size``, ``--max-tokens``) is
never changed; only what is left open is chosen, around it.

The memory a row holds is a plain estimate, not a measurement: in beam search
every decoder layer's cached keys and values (of the output so far and of the
source), the encoder's output and the output layer's scores over the vocabulary
(in the model's type, then three float32 copies: log-probabilities, scores added,
top-k's input); for importance, the activations a backward pass keeps. The
lengths are the split's longest sentences, so the batch holding them fits too.
"""

import math
from dataclasses import dataclass
from typing import Optional

from fairseq_headprune.constants import DEFAULT_CONFIGS_PER_BATCH

MEMORY_SHARE = 0.9  # of the free memory, planned for one batch's rows (a worst case: every row lives to the end)
SWEEP_ROW_CEILING = 32 * 256 * 5  # beam rows of one batch: issue 64's largest point on an H100, beyond it unmeasured
BATCH_CEILING = 256  # sentences per batch, at most
CONFIGS_CEILING = 64  # configurations per batch, at most: a batch is what a killed sweep loses, and a shard's unit
IMPORTANCE_BATCH_CEILING = 512  # sentences per importance batch, at most
FLOAT32_SCORE_COPIES = 3  # float32 copies of the scores over the vocabulary in one beam-search step
GIB = 1024 ** 3
MIB = 1024 ** 2


@dataclass(frozen=True)
class ModelShape:
    """What the rule needs of a model: its layers, widths and vocabulary, and the bytes of one activation."""

    encoder_layers: int
    decoder_layers: int
    embed_dim: int  # the widest layer's
    ffn_dim: int  # the widest FFN's
    heads: int  # per layer, at most
    vocabulary: int  # the output layer's width (the target dictionary)
    value_bytes: int  # 4 in float32, 2 in float16 or bfloat16
    parameters: int = 0  # stated, not used

    def describe(self) -> str:
        return (f"{self.encoder_layers}+{self.decoder_layers} layers, d {self.embed_dim}, FFN {self.ffn_dim}, "
                f"{self.vocabulary:,} words, {8 * self.value_bytes}-bit")


@dataclass(frozen=True)
class SplitShape:
    """What the rule needs of the data: how many sentences, and the longest (in tokens, </s> included)."""

    sentences: int
    longest_source: int
    longest_target: int


def sweep_bytes_per_sentence(model: ModelShape, split: SplitShape, beam: int) -> int:
    """Device memory one sentence of one configuration holds in beam search (an estimate, in bytes)."""
    width, value = model.embed_dim, model.value_bytes
    source, target = split.longest_source, split.longest_target
    cached = model.decoder_layers * 2 * width * (source + target)  # keys and values: self- and cross-attention
    per_row = value * (cached + source * width) + (value + 4 * FLOAT32_SCORE_COPIES) * model.vocabulary
    encoder_pass = value * source * (4 * width + model.ffn_dim)  # once per sentence and configuration
    return beam * per_row + encoder_pass


def importance_bytes_per_sentence(model: ModelShape, split: SplitShape) -> int:
    """Device memory one sentence holds in importance's forward and backward pass (an estimate, in bytes).

    Every layer keeps its activations for the head masks' gradients: about 12 (encoder) and 18 (decoder)
    vectors of the model's width and two of the FFN's per position, and the attention probabilities.
    """
    width, ffn, heads = model.embed_dim, model.ffn_dim, model.heads
    source, target = split.longest_source, split.longest_target
    encoder = model.encoder_layers * source * (12 * width + 2 * ffn + 2 * heads * source)
    decoder = model.decoder_layers * target * (18 * width + 2 * ffn + 2 * heads * (target + source))
    scores = target * model.vocabulary * (model.value_bytes + 8)  # logits; float32 log-probabilities, their gradient
    return model.value_bytes * (encoder + decoder) + scores


def balanced(limit: int, total: int) -> int:
    """The smallest size that needs no more batches for ``total`` items than ``limit`` does (even batches)."""
    limit = max(1, min(limit, total))
    return math.ceil(total / math.ceil(total / limit))


@dataclass(frozen=True)
class SweepBatching:
    """What a sweep translates together: configurations per batch and sentences per batch, and why."""

    configs_per_batch: int
    batch_size: Optional[int]  # sentences per batch; None: fairseq's own batching (--max-tokens, or its default)
    configs_chosen: bool = False  # chosen by the rule for the device (not given, not the CPU default)
    batch_chosen: bool = False
    free_bytes: Optional[int] = None  # None: the CPU
    bytes_per_sentence: int = 0  # per sentence and configuration (the estimate)
    beam: int = 0
    split: Optional[SplitShape] = None
    model: Optional[ModelShape] = None

    @property
    def chosen(self) -> bool:
        return self.configs_chosen or self.batch_chosen

    def describe(self, device: str) -> str:
        """The one console line that states the choice (when anything was chosen)."""
        configs = f"{self.configs_per_batch} configurations per batch" + ("" if self.configs_chosen else " (given)")
        if self.batch_size is None:
            sentences = "fairseq's batching of the split (given)"
        else:
            sentences = f"{self.batch_size} sentences per batch" + ("" if self.batch_chosen else " (given)")
        return (f"device batching: {configs}, {sentences}; chosen for {device} with "
                f"{self.free_bytes / GIB:.1f} GiB free, the model ({self.model.describe()}, beam {self.beam}) and "
                f"the split ({self.split.sentences} sentences, up to {self.split.longest_source}/"
                f"{self.split.longest_target} tokens): about {self.bytes_per_sentence / MIB:.2f} MiB a sentence per "
                f"configuration, {MEMORY_SHARE:.0%} of the free memory planned "
                f"(--configs-per-batch and --batch-size choose otherwise)")


def choose_sweep_batching(free_bytes: Optional[int], model: ModelShape, split: SplitShape, beam: int,
                          configurations: int, configs_per_batch: Optional[int] = None,
                          batch_size: Optional[int] = None, max_tokens: Optional[int] = None,
                          ranks: int = 1) -> SweepBatching:
    """The batching of a sweep of ``configurations`` masked configurations over ``split``.

    ``free_bytes`` None is the CPU: what is given, else 4 configurations per batch and fairseq's batching.
    ``configs_per_batch``, ``batch_size`` and ``max_tokens`` are what the user gave (None: left open); a
    sweep dealt over ``ranks`` processes chooses configurations per batch from each one's share.
    """
    if free_bytes is None:
        return SweepBatching(configs_per_batch or DEFAULT_CONFIGS_PER_BATCH, batch_size)
    per_sentence = sweep_bytes_per_sentence(model, split, beam)
    capacity = int(MEMORY_SHARE * free_bytes) // per_sentence  # sentence-configurations in one batch
    capacity = max(1, min(capacity, SWEEP_ROW_CEILING // max(1, beam)))
    batch_chosen = batch_size is None and max_tokens is None
    if batch_chosen:
        rows = capacity // (configs_per_batch or 1)
        batch_size = balanced(min(BATCH_CEILING, rows), split.sentences)
        sentences = batch_size
    elif batch_size is not None:
        sentences = min(batch_size, split.sentences)
    else:  # fairseq fills batches up to max_tokens tokens, the longest sentence's length counted for each
        sentences = max(1, min(split.sentences, max_tokens // max(split.longest_source, split.longest_target)))
    configs_chosen = configs_per_batch is None
    if configs_chosen:
        share = math.ceil(max(1, configurations) / max(1, ranks))
        configs_per_batch = balanced(min(CONFIGS_CEILING, capacity // sentences), share)
    return SweepBatching(configs_per_batch, batch_size, configs_chosen, batch_chosen, free_bytes, per_sentence,
                         beam, split, model)


@dataclass(frozen=True)
class ImportanceBatching:
    """Sentences per importance batch, and why."""

    batch_size: Optional[int]  # None: the estimator's default (64 sentences unless --importance-max-tokens)
    chosen: bool = False
    free_bytes: Optional[int] = None
    bytes_per_sentence: int = 0
    split: Optional[SplitShape] = None
    model: Optional[ModelShape] = None

    def describe(self, device: str) -> str:
        return (f"device batching: {self.batch_size} sentences per importance batch; chosen for {device} with "
                f"{self.free_bytes / GIB:.1f} GiB free, the model ({self.model.describe()}) and the data "
                f"({self.split.sentences} sentences, up to {self.split.longest_source}/{self.split.longest_target} "
                f"tokens): about {self.bytes_per_sentence / MIB:.2f} MiB a sentence, {MEMORY_SHARE:.0%} of the free "
                f"memory planned (--importance-batch-size and --importance-max-tokens choose otherwise)")


def choose_importance_batch(free_bytes: Optional[int], model: ModelShape, split: SplitShape,
                            batch_size: Optional[int] = None, max_tokens: Optional[int] = None,
                            per_batch: bool = False) -> ImportanceBatching:
    """Sentences per batch of an importance estimate on ``split`` (its largest subset, after any limit).

    Left as given on the CPU, when a size is given, and at batch granularity (``per_batch``), where the batch is
    the unit the scores average over, so its size changes what they mean.
    """
    if free_bytes is None or batch_size is not None or max_tokens is not None or per_batch:
        return ImportanceBatching(batch_size)
    per_sentence = importance_bytes_per_sentence(model, split)
    capacity = max(1, int(MEMORY_SHARE * free_bytes) // per_sentence)
    chosen = balanced(min(capacity, IMPORTANCE_BATCH_CEILING), split.sentences)
    return ImportanceBatching(chosen, True, free_bytes, per_sentence, split, model)
