"""Timing systems each in a process of its own, one pass at a time, in rotation (what every speed figure rests on).

Measured on 2 CPU cores: two engines or several CTranslate2 translators in one
process distort each other's times (a batch-1 pass took 26 s instead of 1.5 s),
and the machine's speed drifts 2x within minutes. So each system (one model in
one engine) lives in its own worker process (``worker``), all with the same
thread count and OpenMP's own wait policy (``OMP_WAIT_POLICY=PASSIVE``, which
would keep an idle worker's threads from spinning, made fairseq's batch-1 beam
search 2.5x slower: each of its many small parallel regions then wakes sleeping
threads), and the parent asks one worker at a time for a pass, so that only one
is busy:
first an untimed warm-up of every system (its outputs are the ones compared),
then ``repeats`` rounds, each starting one system later than the last, so that
over the rounds every system runs in every position and drift falls on all
alike. Only ratios between systems of one call mean anything.
"""

import json
import os
import platform
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from fairseq_headprune.constants import FAIRSEQ_ENGINE as FAIRSEQ
from fairseq_headprune.constants import FUSED_ATTENTION
from fairseq_headprune.engine.export.engines import export_engine, export_engines
from fairseq_headprune.errors import StudyError
from fairseq_headprune.study.compression.decoding import DecodingOptions
from fairseq_headprune.study.output.serialisation import PlainRecord

_ISA_FLAGS = ("avx", "avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_int8", "amx_bf16")


@dataclass
class SystemSpec(PlainRecord):
    """One system to time: a model (a checkpoint, or an exported directory) in one engine."""

    name: str  # "fairseq compressed", "ct2 unpruned float32"
    engine: str  # FAIRSEQ or an export engine's name (``engine.export.engines``)
    weights: str  # "unpruned" or "compressed"
    precision: str
    model: str  # the checkpoint (fairseq) or the exported directory (an export engine)
    family: str = "translation"
    data: Optional[str] = None  # fairseq's data directory (fairseq systems)
    split: str = "test"
    sentences: Optional[int] = None  # the split's first N sentences (None: all)
    generation_args: Sequence[str] = ()  # fairseq options, as the evaluation took them
    cpu: bool = True
    device: str = "cpu"
    options: Optional[Dict[str, object]] = None  # DecodingOptions (None: the fairseq model's own)
    threads: int = 1
    use_vmap: bool = False  # an export engine: restrict the output to the model's vocabulary map
    # fairseq: FUSED (torch's scaled_dot_product_attention in every layer, masked or not, so that models differ in
    # their heads only) or FAIRSEQ_ATTENTION (fairseq's own unfused path, the reference the fused one is timed against)
    attention: str = FUSED_ATTENTION
    # fairseq language model: time continuing each sentence's first "prompt" tokens by "generate" tokens (greedy, or
    # sampled from the "sampling_topk" likeliest, seeded by "seed") instead of scoring it
    # (deployment.lm_continuation_system)
    continuation: Optional[Dict[str, object]] = None



@dataclass
class TimedPasses:
    """What the systems did at one batch size: each system's seconds per timed pass and its outputs."""

    batch_size: int
    seconds: Dict[str, List[float]]
    outputs: Dict[str, List[object]]
    ids: List[int] = field(default_factory=list)  # sentence ids, in the order the outputs come
    references: Optional[List[str]] = None  # translation: target tokens joined by spaces
    input_tokens: Optional[int] = None  # scored models: the examples' input tokens
    rounds: List[List[str]] = field(default_factory=list)  # the order the systems ran in, round by round
    # fairseq translation: each system's decoding in its untimed pass, {"steps": decoder calls, "rows": the
    # hypotheses those calls extended} (``runners.translator.DecoderWork``): equal work only where these agree
    decoder_work: Dict[str, Dict[str, int]] = field(default_factory=dict)

    def paired_ratios(self, numerator: str, denominator: str) -> List[float]:
        """``numerator``'s seconds over ``denominator``'s, round by round: each ratio from two passes of one
        round, minutes apart at most, so the machine's drift between rounds cancels."""
        return [a / b for a, b in zip(self.seconds[numerator], self.seconds[denominator])]


@dataclass
class TimingRun:
    """Every batch size's passes, the decoding options all engines used, and where they ran."""

    passes: List[TimedPasses]
    options: Optional[DecodingOptions]
    environment: Dict[str, object]
    processes: Dict[str, Dict[str, object]]  # system -> its process: pid, whether torch was imported, OpenMP's policy


class _Worker:
    """A worker process serving one system (``worker``), its errors named after the system."""

    def __init__(self, spec: SystemSpec, log_dir: str):
        self.spec = spec
        env = dict(os.environ)
        threads = str(spec.threads)
        env.update(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads)
        if spec.engine != FAIRSEQ:
            env.update(export_engine(spec.engine).worker_environment)
        self.log_path = os.path.join(log_dir, re.sub(r"[^A-Za-z0-9]+", "-", spec.name) + ".log")
        self.log = open(self.log_path, "w")
        self.process = subprocess.Popen([sys.executable, "-m", "fairseq_headprune.engine.timing.worker"],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, env=env,
                                        text=True)
        try:
            self.ready = self.ask(spec.to_dict())
        except BaseException:
            self.close()
            raise

    def ask(self, message: Dict[str, object]) -> Dict[str, object]:
        try:
            self.process.stdin.write(json.dumps(message) + "\n")
            self.process.stdin.flush()
            line = self.process.stdout.readline()
        except BrokenPipeError:
            line = ""
        if not line:
            raise StudyError(f"timing {self.spec.name}: its process ended ({self._last_log_line()})")
        reply = json.loads(line)
        if "error" in reply:
            if reply.get("bug"):  # the plugin's own failure: its traceback, not one line
                raise RuntimeError(f"timing {self.spec.name} failed in the plugin:\n{reply['traceback']}")
            raise StudyError(f"timing {self.spec.name}: {reply['error']}")
        return reply

    def kernel_lines(self) -> List[str]:
        """An export engine's own account of the kernels it runs (CTranslate2's CPU, ISA and GEMM backends, logged
        at load)."""
        self.log.flush()
        with open(self.log_path, errors="replace") as stream:
            return export_engine(self.spec.engine).kernel_lines(list(stream))

    def _last_log_line(self) -> str:
        self.log.flush()
        with open(self.log_path, errors="replace") as stream:
            lines = [line.strip() for line in stream if line.strip()]
        return lines[-1] if lines else "nothing logged"

    def close(self) -> None:
        if self.process.poll() is None:
            try:
                self.process.stdin.write(json.dumps({"quit": True}) + "\n")
                self.process.stdin.flush()
                self.process.wait(timeout=30)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                self.process.kill()
                self.process.wait()
        self.log.close()


def time_systems(specs: Sequence[SystemSpec], batch_sizes: Sequence[int], repeats: int,
                 progress: Optional[Callable[[str], None]] = None,
                 sentences: Optional[Dict[int, Dict[str, list]]] = None) -> TimingRun:
    """Time every system at every batch size (see the module). The fairseq systems come first: the first of
    them decides the batches, the decoding options and the references every other system gets. Without a
    fairseq system, ``sentences`` gives the export engines' input at each batch size (``sources``: per batch, per
    sentence, its tokens; ``source_lengths``: per batch, its length in fairseq's count, with </s>)."""
    if repeats < 1:
        raise StudyError(f"timing needs at least one timed repeat, got {repeats}")
    specs = sorted(specs, key=lambda s: s.engine != FAIRSEQ)
    if not specs or (specs[0].engine != FAIRSEQ and sentences is None):
        raise StudyError("timing needs a fairseq system (it reads the sentences and their batches) or the sentences")
    with tempfile.TemporaryDirectory(prefix="headprune-timing-") as log_dir:
        workers: List[_Worker] = []
        try:
            options = None
            for spec in specs:
                if spec.engine != FAIRSEQ and spec.options is None:
                    spec = SystemSpec(**{**spec.to_dict(), "options": options.to_dict()})
                worker = _Worker(spec, log_dir)
                workers.append(worker)
                if spec.engine == FAIRSEQ and worker.ready.get("options") is not None:
                    # the run's options are the first fairseq system's; another may differ only where it was
                    # given its own (a beam timed against the run's beam in the same rotation)
                    theirs = DecodingOptions.from_dict(worker.ready["options"])
                    if options is None:
                        options = theirs
                    elif theirs != options and spec.options is None:
                        raise StudyError(f"timing: {spec.name} decodes with {theirs}, {specs[0].name} with {options}")
                if progress is not None:
                    progress(f"loaded {spec.name} (process {worker.ready['pid']})")
            passes = [_time_batch_size(workers, batch_size, repeats, progress, (sentences or {}).get(batch_size))
                      for batch_size in batch_sizes]
            environment = machine_description(specs[0].threads)
            exported = [w for w in workers if w.spec.engine != FAIRSEQ]
            if exported:
                environment[f"{exported[0].spec.engine}_kernels"] = exported[0].kernel_lines()
            for name in export_engines():  # an engine's workers never import torch: checked on every run
                environment[f"torch_in_{name}_processes"] = any(
                    w.ready["torch_imported"] for w in exported if w.spec.engine == name)
            processes = {w.spec.name: {key: w.ready[key] for key in ("pid", "torch_imported", "omp_wait_policy")}
                         for w in workers}
            return TimingRun(passes, options, environment, processes)
        finally:
            for worker in workers:
                worker.close()


def _time_batch_size(workers: List[_Worker], batch_size: int, repeats: int,
                     progress: Optional[Callable[[str], None]], batches: Optional[Dict[str, list]]) -> TimedPasses:
    names = [w.spec.name for w in workers]
    passes = TimedPasses(batch_size, {name: [] for name in names}, {})
    if batches is not None:  # given by the caller: its sentence ids and references
        passes.ids, passes.references = list(batches.get("ids", [])), batches.get("references")
    for worker in workers:  # the warm-up: untimed, and the outputs compared
        reply = worker.ask({"batch_size": batch_size,
                            "batches": batches if worker.spec.engine != FAIRSEQ else None})
        passes.outputs[worker.spec.name] = reply["outputs"]
        if "batches" in reply:
            if batches is None:
                batches = reply["batches"]
                passes.ids, passes.references = batches["ids"], batches["references"]
            elif reply["batches"]["ids"] != batches["ids"]:
                raise StudyError(f"timing: {worker.spec.name} batched other sentences than {names[0]}")
        if "input_tokens" in reply:
            passes.input_tokens = reply["input_tokens"]
        if "decoder_work" in reply:
            passes.decoder_work[worker.spec.name] = reply["decoder_work"]
    if progress is not None:
        count = len(next(iter(passes.outputs.values())))
        progress(f"batch size {batch_size}: {count} examples, {len(workers)} systems, {repeats} rounds")
    for round_index in range(repeats):
        shift = round_index % len(workers)
        passes.rounds.append([w.spec.name for w in workers[shift:] + workers[:shift]])
        for worker in workers[shift:] + workers[:shift]:
            passes.seconds[worker.spec.name].append(float(worker.ask({"batch_size": batch_size})["seconds"]))
    return passes


def cpu_model_and_flags() -> Tuple[str, set]:
    """The CPU's model name and feature flags from /proc/cpuinfo (the platform's processor name elsewhere)."""
    model, flags = None, set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as stream:
            for line in stream:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and model is None:
                    model = value.strip()
                elif key.strip() == "flags" and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    return model or platform.processor() or "unknown", flags


def machine_description(threads: int) -> Dict[str, object]:
    """The CPU model and the vector instructions it offers (what decides which kernels the engines pick)."""
    model, flags = cpu_model_and_flags()
    return {"cpu": model, "isa": [flag for flag in _ISA_FLAGS if flag in flags], "threads": threads,
            "isolation": "each system in its own process, one busy at a time, rotated passes"}
