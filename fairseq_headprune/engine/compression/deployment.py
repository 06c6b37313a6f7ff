"""Decoding speed in deployment: fairseq and an export engine, unpruned and compressed, on the same batches.

Every system decodes the same sentences in the same batches (fairseq's own
batching of the split at each batch size; an export engine gets each batch's
source tokens), each in a process of its own and passes rotated
(``engine.timing.isolated``). A row per system and batch size: sentences/s
and output tokens/s (median, range and interquartile range over the
repeats), the speed-up against the unpruned model in fairseq and, for a
compressed exported model, against the unpruned one at the same
precision; BLEU on the timed sentences (sacreBLEU on the tokens, as they
come out of the dictionary) and how many outputs equal those of the fairseq
model of the same weights. Both fairseq models compute attention with the
same kernel (``fused_attention_everywhere``), so their ratio is the heads'.

Classifiers and language models are timed in fairseq alone, scoring the
split as the studies do (``runners.example_scorer``): examples/s and input
tokens/s, outputs (labels, losses) compared between the two models.
"""

import copy
import dataclasses
import os
import platform
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import fairseq
import sacrebleu
import torch
from fairseq.dataclass.configs import GenerationConfig

from fairseq_headprune.engine.checkpoints.loading import load_generation_model
from fairseq_headprune.engine.export.engines import export_engine, export_engines
from fairseq_headprune.engine.runners.batches import dictionary_tokens, iterate_samples, split_batches
from fairseq_headprune.engine.runners.example_scorer import SplitScorer
from fairseq_headprune.engine.runners.translator import translate_batches
from fairseq_headprune.engine.search.model_costs import device_description
from fairseq_headprune.engine.timing.isolated import FAIRSEQ, SystemSpec, time_systems
from fairseq_headprune.errors import StudyError
from fairseq_headprune.study.compression.decoding import DecodingOptions, rate_summary
from fairseq_headprune.study.compression.deployment_settings import DeploymentSettings
from fairseq_headprune.study.compression.precision import CandidateTiming
from fairseq_headprune.study.compression.speed import SpeedRow, paired_speedup, paired_speedup_interval
from fairseq_headprune.version import __version__

UNPRUNED, COMPRESSED = "unpruned", "compressed"


def generation_config(options: DecodingOptions):
    """fairseq's generation config for ``options``."""
    return GenerationConfig(beam=options.beam, lenpen=options.lenpen, max_len_a=options.max_len_a,
                            max_len_b=options.max_len_b, min_len=options.min_len)


@dataclass
class DecodingSystem:
    """One engine with one model's weights; ``decode()`` is one pass over the batches: (seconds, outputs)."""

    name: str  # "fairseq compressed", "ct2 unpruned int8"
    engine: str  # FAIRSEQ or an export engine's name
    weights: str  # UNPRUNED or COMPRESSED
    precision: str
    decode: Callable[[], Tuple[float, List[str]]]


@dataclass
class TimedBatches:
    """The first sentences of a split in fairseq's batches of one size, as both engines take them."""

    batch_size: int
    ids: List[int]  # sentence ids in the order outputs come
    samples: List[dict]  # fairseq's collated batches, on the model's device
    sources: List[List[List[str]]]  # per batch, per sentence: the source tokens (an export engine's input)
    references: List[str]  # target tokens, joined by spaces

    def engine_input(self) -> Dict[str, list]:
        """What the export engines' timing workers decode: sentence ids, source tokens, references and each batch's
        source length (fairseq's count, with </s>)."""
        return {"ids": self.ids, "sources": self.sources, "references": self.references,
                "source_lengths": [int(s["net_input"]["src_tokens"].size(1)) for s in self.samples]}


def timed_batches(task, split: str, batch_size: int, sentences: Optional[int], device: torch.device) -> TimedBatches:
    dataset, batches = split_batches(task, split, max_sentences=batch_size, limit=sentences)
    samples = list(iterate_samples(dataset, batches, device))
    ids = [int(i) for sample in samples for i in sample["id"]]
    sources = [[dictionary_tokens(task.source_dictionary, row.tolist()) for row in sample["net_input"]["src_tokens"]]
               for sample in samples]
    references = [" ".join(dictionary_tokens(task.target_dictionary, dataset[i]["target"].tolist())) for i in ids]
    return TimedBatches(batch_size, ids, samples, sources, references)


def fairseq_translation_system(name: str, weights: str, task, model, batches: TimedBatches,
                               options: DecodingOptions) -> DecodingSystem:
    """fairseq's ``SequenceGenerator`` through the task, as fairseq-generate runs it."""
    generation = generation_config(options)

    def decode():
        seconds, hypotheses = translate_batches(task, model, batches.samples, options.beam, generation)
        return seconds, [" ".join(dictionary_tokens(task.target_dictionary, h)) for h in hypotheses]

    return DecodingSystem(name, FAIRSEQ, weights, str(next(model.parameters()).dtype).replace("torch.", ""), decode)


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

    def decode():  # the model as loaded: its own masks (a --head-mask) kept
        scored = scorer.score_as_loaded()
        return scored.seconds, [scored.outputs[p] for p in positions]

    precision = str(next(model.parameters()).dtype).replace("torch.", "")
    return DecodingSystem(name, FAIRSEQ, weights, precision, decode), len(ids), tokens


def _counterpart(systems: Sequence[DecodingSystem], engine: str, weights: str, precision: Optional[str] = None,
                 vocabulary_mapped: bool = False):
    for system in systems:
        if (system.engine == engine and system.weights == weights and precision in (None, system.precision)
                and bool(getattr(system, "use_vmap", False)) == vocabulary_mapped):
            return system
    return None


def speed_rows(systems: Sequence[DecodingSystem], seconds: Dict[str, List[float]], outputs: Dict[str, List[str]],
               batch_size: int, references: Optional[Sequence[str]] = None,
               input_tokens: Optional[int] = None) -> List[SpeedRow]:
    """One row per system: rates, speed-ups, BLEU (with ``references``) and outputs equal to its counterpart's.

    Tokens are the outputs' tokens and </s> (translation), or ``input_tokens`` (scored models).
    The counterpart of an exported model is the fairseq model of the same weights; that of the
    compressed fairseq model, the unpruned one. The compressed model's speed-up is stated like for like
    (``speedup_like_for_like``: against the unpruned model in the same engine, compute type and vocabulary-map
    setting; the beam is the run's) and, for an exported model, against the stock conversion separately
    (``speedup_vs_stock_conversion``: the unpruned model converted as it is, the same compute type, no map); every
    speed-up is ``paired_speedup`` of the two systems' passes.
    """

    reference = _counterpart(systems, FAIRSEQ, UNPRUNED)
    rows = []
    for system in systems:
        median = statistics.median(seconds[system.name])
        count = len(outputs[system.name])
        tokens = input_tokens if input_tokens is not None else sum(len(o.split()) + 1 for o in outputs[system.name])
        mapped = bool(getattr(system, "use_vmap", False))
        exported = system.engine != FAIRSEQ
        if exported:
            same_as = _counterpart(systems, FAIRSEQ, system.weights)
        else:
            same_as = reference if system.weights == COMPRESSED else None
        same = None if same_as is None else sum(a == b for a, b in zip(outputs[system.name], outputs[same_as.name]))
        compressed = system.weights == COMPRESSED
        like = (_counterpart(systems, system.engine, UNPRUNED, system.precision, vocabulary_mapped=mapped)
                if compressed else None)
        stock = _counterpart(systems, system.engine, UNPRUNED, system.precision) if compressed and exported else None

        def against(other) -> Optional[float]:
            return None if other is None else paired_speedup(seconds[other.name], seconds[system.name])

        def interval(other) -> Optional[List[float]]:
            return None if other is None else paired_speedup_interval(seconds[other.name], seconds[system.name])

        rates = rate_summary(count, seconds[system.name])
        rows.append(SpeedRow(
            batch_size=batch_size, system=system.name, engine=system.engine, weights=system.weights,
            precision=system.precision, seconds=list(seconds[system.name]), sentences=count,
            sentences_per_second=rates["median"], sentences_per_second_min=rates["min"],
            sentences_per_second_max=rates["max"], sentences_per_second_iqr=rates["iqr"],
            tokens_per_second=tokens / median, speedup_vs_fairseq_unpruned=against(reference),
            speedup_like_for_like=against(like), speedup_vs_stock_conversion=against(stock),
            speedup_like_for_like_interval=interval(like),
            bleu=(None if references is None else
                  sacrebleu.corpus_bleu(outputs[system.name], [list(references)], tokenize="none", force=True).score),
            same_hypotheses_as=None if same_as is None else same_as.name, same_hypotheses=same,
            vocabulary_mapped=mapped,
        ))
    return rows


def measure_speed(family: str, checkpoints: Dict[str, str], exported: Dict[Tuple[str, str], str], data: str,
                  split: str, generation_args: Sequence[str], settings: DeploymentSettings, device: torch.device,
                  precision: str = "float32", options: Optional[DecodingOptions] = None,
                  progress: Optional[Callable[[str], None]] = None, vocabulary_mapped: Sequence[str] = (),
                  run_beam_options: Optional[DecodingOptions] = None, export_format: Optional[str] = None
                  ) -> Tuple[List[SpeedRow], Optional[DecodingOptions], Dict[str, object]]:
    """Rows of every batch size, the decoding options and the machine: the fairseq ``checkpoints`` (weights ->
    path) and the directories ``exported`` ((weights, precision) -> path) of the engine ``export_format``
    (``engine.export.engines``), each system in its own
    process (``engine.timing.isolated``). ``options`` None: the checkpoint's own, as ``generation_args`` set them.
    The exported models of ``vocabulary_mapped`` weights are timed again with their vocabulary map.
    ``run_beam_options`` (``options`` at another beam than the run's): the unpruned systems are timed in the same
    rotation at the run's beam too, and each compressed row gets ``speedup_vs_run_beam`` against its unpruned
    counterpart there, a ratio from one run (the machine drifts between runs)."""
    threads = settings.threads or torch.get_num_threads()
    on_gpu = device.type == "cuda"
    common = dict(family=family, data=data, split=split, sentences=settings.sentences, threads=threads,
                  generation_args=list(generation_args), cpu=not on_gpu, device=device.type,
                  options=None if options is None else options.to_dict())
    specs = [SystemSpec(f"fairseq {weights}", FAIRSEQ, weights, precision, path, **common)
             for weights, path in checkpoints.items()]
    if exported:
        engine = export_engine(export_format)
        prefix, mapped_file = engine.system_prefix, engine.vocabulary_map_file
        specs += [SystemSpec(f"{prefix} {weights} {quantization}", engine.name, weights, quantization, path, **common)
                  for (weights, quantization), path in exported.items()]
        specs += [SystemSpec(f"{prefix} {weights} {quantization} vmap", engine.name, weights, quantization, path,
                             use_vmap=True, **common)
                  for (weights, quantization), path in exported.items()
                  if weights in vocabulary_mapped and mapped_file and os.path.isfile(os.path.join(path, mapped_file))]
    at_run_beam = {} if run_beam_options is None else {
        spec.name: dataclasses.replace(spec, name=f"{spec.name} at the run's beam", options=run_beam_options.to_dict())
        for spec in specs if spec.weights == UNPRUNED}
    run = time_systems([*specs, *at_run_beam.values()], settings.batch_sizes, settings.repeats, progress)
    rows = []
    for passes in run.passes:
        batch_rows = speed_rows(specs, passes.seconds, passes.outputs, passes.batch_size, passes.references,
                                passes.input_tokens)
        for row in batch_rows if at_run_beam else ():
            reference = at_run_beam.get(row.system.replace(COMPRESSED, UNPRUNED))
            if row.compressed and reference is not None:  # the unpruned counterpart's passes, in this run
                row.run_beam_seconds = passes.seconds[reference.name]
                row.speedup_vs_run_beam = paired_speedup(row.run_beam_seconds, row.seconds)
                row.speedup_vs_run_beam_interval = paired_speedup_interval(row.run_beam_seconds, row.seconds)
        rows += batch_rows
    return rows, run.options, run.environment


def engine_inputs(task, split: str, batch_sizes: Sequence[int], sentences: Optional[int],
                  device: torch.device) -> Dict[int, Dict[str, list]]:
    """What a fairseq timing worker hands the export engines' workers at each batch size (sentence ids, source
    tokens, references, each batch's source length), made here: for timings with exported systems alone."""
    return {batch_size: timed_batches(task, split, batch_size, sentences, device).engine_input()
            for batch_size in batch_sizes}


def time_compute_types(export_format: str, model_dir: str, compute_types: Sequence[str], data: str, checkpoint: str,
                       split: str, generation_args: Sequence[str], settings: DeploymentSettings, device: torch.device,
                       progress: Optional[Callable[[str], None]] = None) -> List[CandidateTiming]:
    """The translation model ``model_dir`` exported by ``export_format`` in float32, loaded at each compute type,
    each in its own process, on the split's first sentences at every batch size, with ``checkpoint``'s decoding
    options: its median seconds and its BLEU on the timed sentences (sacreBLEU on the tokens, as in ``speed_rows``)."""
    cfg, task, _ = load_generation_model(data, checkpoint, generation_args, cpu=True)
    options = DecodingOptions.of_generation(cfg.generation)
    inputs = engine_inputs(task, split, settings.batch_sizes, settings.sentences, torch.device("cpu"))
    threads = settings.threads or torch.get_num_threads()
    engine = export_engine(export_format)
    specs = [SystemSpec(f"{engine.system_prefix} compressed {compute_type}", engine.name, COMPRESSED, compute_type,
                        model_dir,
                        split=split, threads=threads, device=device.type, options=options.to_dict())
             for compute_type in compute_types]
    run = time_systems(specs, settings.batch_sizes, settings.repeats, progress, sentences=inputs)
    timings = []
    for spec in specs:
        seconds, rates, bleu = {}, {}, []
        for passes in run.passes:
            row = speed_rows([DecodingSystem(spec.name, spec.engine, COMPRESSED, spec.precision, None)],
                             passes.seconds, passes.outputs, passes.batch_size, passes.references)[0]
            seconds[passes.batch_size] = statistics.median(passes.seconds[spec.name])
            rates[passes.batch_size] = row.sentences_per_second
            bleu.append(row.bleu)
        # every batch size decodes the same sentences; beam search may still differ by batch (padding), so the mean
        timings.append(CandidateTiming(spec.precision, seconds, rates, sum(bleu) / len(bleu)))
    return timings


def deployment_environment(device: torch.device, threads: Optional[int] = None) -> Dict[str, object]:
    """Where and with what the speeds were measured: device, threads and versions (of every export engine: None
    where it is not installed)."""
    return {
        "device": device_description(device),
        "threads": threads or torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "fairseq": fairseq.__version__,
        **{engine.name: engine.version() for engine in export_engines().values()},
        "fairseq_headprune": __version__,
    }


def lm_continuation_system(name: str, task, model, split: str, batch_size: int, sentences: Optional[int],
                           prompt: int, generate: int, sampling_topk: Optional[int], seed: int):
    """A language model continuing the first ``sentences`` sentences of ``split`` longer than ``prompt`` tokens:
    each cut to its first ``prompt`` tokens and continued by ``generate`` with fairseq's SequenceGenerator and the
    incremental state (what fairseq-interactive runs for an LM), greedy or sampled from the ``sampling_topk``
    likeliest tokens with the same seed for every model. Returns, as ``fairseq_scoring_system`` does,
    the system (its outputs: every prompt and continuation's token ids, joined by spaces), the sentences, and no
    count of input tokens (None: a benchmark counts the tokens generated from the outputs)."""
    from fairseq import utils
    from fairseq.dataclass.configs import GenerationConfig

    task.load_dataset(split)
    dataset = task.dataset(split)
    long_enough = [i for i in range(len(dataset)) if dataset.sizes[i] > prompt][:sentences]
    if not long_enough:
        raise StudyError(f"no sentence of {split} is longer than the prompt ({prompt} tokens)")
    device = next(model.parameters()).device
    prompts = []
    for start in range(0, len(long_enough), batch_size):
        sample = dataset.collater([dataset[i] for i in long_enough[start:start + batch_size]])
        sample = utils.move_to_cuda(sample) if device.type == "cuda" else sample
        lengths = torch.full_like(sample["net_input"]["src_lengths"], prompt)
        prompts.append(dict(sample, net_input={"src_tokens": sample["net_input"]["src_tokens"][:, :prompt],
                                               "src_lengths": lengths}))
    length = prompt + generate
    generator = task.build_generator([model], GenerationConfig(
        beam=1, max_len_a=0, max_len_b=length, min_len=length, sampling=sampling_topk is not None,
        sampling_topk=sampling_topk or -1))

    def decode():
        torch.manual_seed(seed)
        start = time.perf_counter()
        with torch.no_grad():
            continued = [h[0]["tokens"].tolist() for sample in prompts
                         for h in task.inference_step(generator, [model], sample)]
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start, [" ".join(map(str, tokens)) for tokens in continued]

    system = DecodingSystem(name, FAIRSEQ, "", str(next(model.parameters()).dtype).replace("torch.", ""), decode)
    return system, len(long_enough), None
