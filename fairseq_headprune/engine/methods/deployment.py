"""Decoding speed in deployment: fairseq and CTranslate2, unpruned and compressed, on the same batches.

Every system decodes the same sentences in the same batches (fairseq's own
batching of the split at each batch size; CTranslate2 gets each batch's
source tokens). One pass of each system first (the warm-up, whose outputs
are compared), then the timed repeats, interleaved and each in another
order, so that the machine's drift falls on every system alike. A row per
system and batch size: sentences/s and output tokens/s (median and range
over the repeats), the speed-up against the unpruned model in fairseq and,
for a compressed CTranslate2 model, against the unpruned one at the same
precision; BLEU on the timed sentences (sacreBLEU on the tokens, as they
come out of the dictionary) and how many outputs equal those of the fairseq
model of the same weights.

Classifiers and language models are timed in fairseq alone, scoring the
split as the studies do (``runners.example_scorer``): examples/s and input
tokens/s, outputs (labels, losses) compared between the two models.
"""

import copy
import platform
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from ...study.methods.compression import DeploymentSettings
from ...version import __version__
from ..runners.batches import iterate_samples, split_batches
from ..runners.translator import translate_batches
from .model_costs import device_description
import fairseq
import sacrebleu
from ..export.ctranslate2_spec import import_ctranslate2
from ..runners.example_scorer import SplitScorer
from fairseq.dataclass.configs import GenerationConfig

FAIRSEQ, CTRANSLATE2 = "fairseq", "ctranslate2"
UNPRUNED, COMPRESSED = "unpruned", "compressed"


@dataclass
class DecodingOptions:
    """Beam search as fairseq-generate's options set it, given to both engines."""

    beam: int = 5
    lenpen: float = 1.0
    max_len_a: float = 0.0
    max_len_b: int = 200

    @classmethod
    def of_generation(cls, generation) -> "DecodingOptions":
        """From fairseq's generation config (``--beam``, ``--lenpen``, ``--max-len-a``, ``--max-len-b``)."""
        return cls(int(generation.beam), float(generation.lenpen), float(generation.max_len_a),
                   int(generation.max_len_b))

    def fairseq_config(self):

        return GenerationConfig(beam=self.beam, lenpen=self.lenpen, max_len_a=self.max_len_a, max_len_b=self.max_len_b)

    def max_length(self, source_length: int) -> int:
        """fairseq's length limit for a batch whose sources are ``source_length`` tokens (with </s>)."""
        return int(self.max_len_a * source_length + self.max_len_b)


@dataclass
class DecodingSystem:
    """One engine with one model's weights; ``decode()`` is one pass over the batches: (seconds, outputs)."""

    name: str  # "fairseq compressed", "ct2 unpruned int8"
    engine: str  # FAIRSEQ or CTRANSLATE2
    weights: str  # UNPRUNED or COMPRESSED
    precision: str
    decode: Callable[[], Tuple[float, List[str]]]


@dataclass
class TimedBatches:
    """The first sentences of a split in fairseq's batches of one size, as both engines take them."""

    batch_size: int
    ids: List[int]  # sentence ids in the order outputs come
    samples: List[dict]  # fairseq's collated batches, on the model's device
    sources: List[List[List[str]]]  # per batch, per sentence: the source tokens (CTranslate2's input)
    references: List[str]  # target tokens, joined by spaces


def _tokens(dictionary, ids) -> List[str]:
    return [dictionary[i] for i in ids if i not in (dictionary.pad(), dictionary.eos())]


def timed_batches(task, split: str, batch_size: int, sentences: Optional[int], device: torch.device) -> TimedBatches:
    dataset, batches = split_batches(task, split, max_sentences=batch_size, limit=sentences)
    samples = list(iterate_samples(dataset, batches, device))
    ids = [int(i) for sample in samples for i in sample["id"]]
    sources = [[_tokens(task.source_dictionary, row.tolist()) for row in sample["net_input"]["src_tokens"]]
               for sample in samples]
    references = [" ".join(_tokens(task.target_dictionary, dataset[i]["target"].tolist())) for i in ids]
    return TimedBatches(batch_size, ids, samples, sources, references)


def fairseq_translation_system(name: str, weights: str, task, model, batches: TimedBatches,
                               options: DecodingOptions) -> DecodingSystem:
    """fairseq's ``SequenceGenerator`` through the task, as fairseq-generate runs it."""
    generation = options.fairseq_config()

    def decode():
        seconds, hypotheses = translate_batches(task, model, batches.samples, options.beam, generation)
        return seconds, [" ".join(_tokens(task.target_dictionary, h)) for h in hypotheses]

    return DecodingSystem(name, FAIRSEQ, weights, str(next(model.parameters()).dtype).replace("torch.", ""), decode)


def ctranslate2_translation_system(name: str, weights: str, precision: str, translator, batches: TimedBatches,
                                   options: DecodingOptions) -> DecodingSystem:
    """A ``ctranslate2.Translator`` on each batch's source tokens, with fairseq's beam, penalty and length limit."""

    def decode():
        hypotheses = []
        start = time.perf_counter()
        for sources, sample in zip(batches.sources, batches.samples):
            limit = options.max_length(int(sample["net_input"]["src_tokens"].size(1)))
            results = translator.translate_batch(sources, beam_size=options.beam, length_penalty=options.lenpen,
                                                 max_batch_size=len(sources), max_decoding_length=max(limit, 1))
            hypotheses += [" ".join(result.hypotheses[0]) for result in results]
        return time.perf_counter() - start, hypotheses

    return DecodingSystem(name, CTRANSLATE2, weights, precision, decode)


def load_ctranslate2_model(model_dir: str, device: torch.device, threads: int, generator: bool = False):
    """A ``ctranslate2.Translator`` (a ``Generator`` for a language model) at the weights' own type, on the
    GPU when ``device`` is one and CTranslate2 sees it."""

    ctranslate2 = import_ctranslate2()
    on_gpu = device.type == "cuda" and ctranslate2.get_cuda_device_count() > 0
    engine = ctranslate2.Generator if generator else ctranslate2.Translator
    return engine(model_dir, device="cuda" if on_gpu else "cpu", intra_threads=threads, inter_threads=1)


def fairseq_scoring_system(name: str, weights: str, family: str, cfg, task, model, split: str, batch_size: int,
                           sentences: Optional[int]) -> Tuple[DecodingSystem, int, int]:
    """A classifier or LM scoring the first examples of ``split`` at ``batch_size`` (``example_scorer``).

    Returns the system, the examples it scores and their input tokens.
    """

    cfg = copy.deepcopy(cfg)
    cfg.dataset.batch_size, cfg.dataset.max_tokens = batch_size, None
    scorer = SplitScorer(family, cfg, task, model, split)
    kept, examples = [], 0
    for sample in scorer.samples:  # whole batches, up to the first ``sentences`` examples
        if sentences is not None and examples >= sentences:
            break
        kept.append(sample)
        examples += len(sample["id"])
    scorer.samples = kept
    ids = [int(i) for sample in kept for i in sample["id"]]
    positions = [scorer.position[i] for i in ids]
    tokens = int(sum(int(sample["ntokens"]) for sample in kept))

    def decode():
        scored = scorer.score(None)
        return scored.seconds, [scored.outputs[p] for p in positions]

    precision = str(next(model.parameters()).dtype).replace("torch.", "")
    return DecodingSystem(name, FAIRSEQ, weights, precision, decode), len(ids), tokens


def time_interleaved(systems: Sequence[DecodingSystem], repeats: int
                     ) -> Tuple[Dict[str, List[float]], Dict[str, List[str]]]:
    """Seconds of every repeat and the outputs of each system: a warm-up pass, then rotating orders."""
    outputs = {system.name: system.decode()[1] for system in systems}  # warm-up, and the outputs compared
    seconds: Dict[str, List[float]] = {system.name: [] for system in systems}
    for repeat in range(repeats):
        shift = repeat % len(systems)
        for system in list(systems[shift:]) + list(systems[:shift]):
            seconds[system.name].append(system.decode()[0])
    return seconds, outputs


def _counterpart(systems: Sequence[DecodingSystem], engine: str, weights: str, precision: Optional[str] = None):
    for system in systems:
        if system.engine == engine and system.weights == weights and precision in (None, system.precision):
            return system
    return None


def speed_rows(systems: Sequence[DecodingSystem], seconds: Dict[str, List[float]], outputs: Dict[str, List[str]],
               batch_size: int, references: Optional[Sequence[str]] = None,
               input_tokens: Optional[int] = None) -> List[Dict[str, object]]:
    """One row per system: rates, speed-ups, BLEU (with ``references``) and outputs equal to its counterpart's.

    Tokens are the outputs' tokens and </s> (translation), or ``input_tokens`` (scored models).
    The counterpart of a CTranslate2 model is the fairseq model of the same weights; that of the
    compressed fairseq model, the unpruned one.
    """

    reference = _counterpart(systems, FAIRSEQ, UNPRUNED)
    base = statistics.median(seconds[reference.name]) if reference is not None else None
    rows = []
    for system in systems:
        median = statistics.median(seconds[system.name])
        count = len(outputs[system.name])
        tokens = input_tokens if input_tokens is not None else sum(len(o.split()) + 1 for o in outputs[system.name])
        if system.engine == CTRANSLATE2:
            same_as = _counterpart(systems, FAIRSEQ, system.weights)
        else:
            same_as = reference if system.weights == COMPRESSED else None
        same = None if same_as is None else sum(a == b for a, b in zip(outputs[system.name], outputs[same_as.name]))
        ct2_unpruned = (_counterpart(systems, CTRANSLATE2, UNPRUNED, system.precision)
                        if system.engine == CTRANSLATE2 and system.weights == COMPRESSED else None)
        rates = [count / s for s in seconds[system.name]]
        rows.append({
            "batch_size": batch_size,
            "system": system.name,
            "engine": system.engine,
            "weights": system.weights,
            "precision": system.precision,
            "seconds": seconds[system.name],
            "sentences": count,
            "sentences_per_second": count / median,
            "sentences_per_second_min": min(rates),
            "sentences_per_second_max": max(rates),
            "tokens_per_second": tokens / median,
            "speedup_vs_fairseq_unpruned": None if base is None else base / median,
            "speedup_vs_ct2_unpruned_same_precision": (
                None if ct2_unpruned is None else statistics.median(seconds[ct2_unpruned.name]) / median),
            "bleu": (None if references is None else
                     sacrebleu.corpus_bleu(outputs[system.name], [list(references)], tokenize="none", force=True).score),
            "same_hypotheses_as": None if same_as is None else same_as.name,
            "same_hypotheses": same,
        })
    return rows


def measure_translation_speed(models: Dict[str, Tuple[object, object]], exported: Dict[Tuple[str, str], str],
                              split: str, settings: DeploymentSettings, options: DecodingOptions,
                              device: torch.device, progress: Optional[Callable[[str], None]] = None
                              ) -> List[Dict[str, object]]:
    """Rows of every batch size: the fairseq ``models`` (weights -> (task, model)) and the CTranslate2 directories
    ``exported`` ((weights, precision) -> path), in that order, on the first task's batches."""
    threads = settings.threads or torch.get_num_threads()
    translators = {key: load_ctranslate2_model(path, device, threads) for key, path in exported.items()}
    first_task = next(iter(models.values()))[0]
    rows = []
    for batch_size in settings.batch_sizes:
        batches = timed_batches(first_task, split, batch_size, settings.sentences, device)
        systems = [fairseq_translation_system(f"fairseq {weights}", weights, task, model, batches, options)
                   for weights, (task, model) in models.items()]
        systems += [ctranslate2_translation_system(f"ct2 {weights} {precision}", weights, precision, translator,
                                                   batches, options)
                    for (weights, precision), translator in translators.items()]
        if progress is not None:
            progress(f"batch size {batch_size}: {len(batches.ids)} sentences, {len(systems)} systems")
        seconds, outputs = time_interleaved(systems, settings.repeats)
        rows += speed_rows(systems, seconds, outputs, batch_size, batches.references)
    return rows


def deployment_environment(device: torch.device, threads: Optional[int] = None) -> Dict[str, object]:
    """Where and with what the speeds were measured: device, threads and versions."""

    try:
        import ctranslate2

        ctranslate2_version = ctranslate2.__version__
    except ImportError:
        ctranslate2_version = None
    return {
        "device": device_description(device),
        "threads": threads or torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "fairseq": fairseq.__version__,
        "ctranslate2": ctranslate2_version,
        "fairseq_headprune": __version__,
    }
