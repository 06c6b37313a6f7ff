"""One timed system in a process of its own: ``python -m fairseq_headprune.engine.timing.worker``.

Why a process each: two engines in one process share (and fight over) their
thread pools, and several CTranslate2 translators alive in one process slowed
a batch-1 pass from 1.5 s to 26 s on 2 cores. A worker loads one model in one
engine (fairseq, or an export engine's ``decoder``), then decodes whenever the
parent asks, so that the parent can rotate the systems one pass at a time
(``isolated``). A CTranslate2 worker never imports torch.

The protocol is one JSON object per line. The first line the parent writes
describes the system (``SystemSpec.to_dict``); the worker answers
``{"ready": ...}`` once its model is loaded. Then each request
``{"batch_size": B, "batches": ...}`` is one timed pass over the sentences in
batches of B, answered with ``{"seconds": ..., "outputs": [...]}``; a fairseq
worker also returns, on its first pass at B, the batches it decoded (sentence
ids, source tokens, references), which the parent hands to the export
engines' workers so that every engine decodes the same sentences in the same batches.
An error is answered ``{"error": "one line"}`` and ends the worker.
"""

import contextlib
import json
import os
import sys
import traceback
from typing import Dict, List, Optional

from fairseq_headprune.constants import FAIRSEQ_ATTENTION
from fairseq_headprune.constants import FAIRSEQ_ENGINE as FAIRSEQ
from fairseq_headprune.engine.export.engines import export_engine
from fairseq_headprune.errors import HeadPruneError, raised_by_the_plugin
from fairseq_headprune.study.compression.decoding import DecodingOptions


def _fairseq_translation(spec: Dict[str, object], options: Optional[DecodingOptions], threads: int):
    """fairseq's beam search through the task, as fairseq-generate runs it (by default with the options the
    evaluation's fairseq arguments set, which the worker reports so that the export engines get the same)."""
    import torch

    from fairseq_headprune.engine.checkpoints.loading import load_generation_model
    from fairseq_headprune.engine.compression.deployment import fairseq_translation_system, timed_batches
    from fairseq_headprune.engine.runners.translator import decoder_work_counted

    torch.set_num_threads(threads)
    cfg, task, model = load_generation_model(spec["data"], spec["model"], spec["generation_args"], cpu=spec["cpu"])
    model = _in_precision(model, spec["precision"])
    device = next(model.parameters()).device
    options = options or DecodingOptions.of_generation(cfg.generation)
    systems = {}

    def run(request):
        batch_size = int(request["batch_size"])
        first = batch_size not in systems
        if first:
            batches = timed_batches(task, spec["split"], batch_size, spec["sentences"], device)
            systems[batch_size] = (batches, fairseq_translation_system(spec["name"], "", task, model, batches, options))
        batches, system = systems[batch_size]
        # the untimed warm-up also counts how much decoding the pass does (beam-search steps and rows)
        with _attention_path(spec), decoder_work_counted(model) if first else contextlib.nullcontext() as work:
            seconds, outputs = system.decode()
        reply = {"seconds": seconds, "outputs": outputs}
        if first:
            reply["batches"] = batches.engine_input()
            reply["decoder_work"] = {"steps": work.steps, "rows": work.rows}
        return reply

    return run, {"options": options.to_dict()}


def _fairseq_scoring(spec: Dict[str, object], threads: int):
    """A classifier or language model scoring the split as the studies do (a language model continuing the
    split's sentences instead, given ``continuation``)."""
    import torch

    from fairseq_headprune.engine.compression.deployment import fairseq_scoring_system, lm_continuation_system
    from fairseq_headprune.engine.families import family_named

    torch.set_num_threads(threads)
    family = family_named(spec["family"])
    cfg, task, model = family.load(spec["data"], spec["model"], spec["generation_args"], cpu=spec["cpu"])
    model = _in_precision(model, spec["precision"])
    systems = {}

    def build(batch_size):
        if spec.get("continuation"):
            return lm_continuation_system(spec["name"], task, model, spec["split"], batch_size, spec["sentences"],
                                          **spec["continuation"])
        return fairseq_scoring_system(spec["name"], "", family.name, cfg, task, model, spec["split"], batch_size,
                                      spec["sentences"])

    def run(request):
        batch_size = int(request["batch_size"])
        first = batch_size not in systems
        if first:
            systems[batch_size] = build(batch_size)
        system, _, tokens = systems[batch_size]
        with _attention_path(spec):
            seconds, outputs = system.decode()
        reply = {"seconds": seconds, "outputs": [_plain(o) for o in outputs]}
        if first:
            reply["input_tokens"] = tokens
        return reply

    return run, {}


def _attention_path(spec: Dict[str, object]):
    """The attention kernel the system's layers run (``SystemSpec.attention``)."""
    from fairseq_headprune.modules.masked_multihead_attention import fused_attention_everywhere, unfused_attention

    return unfused_attention() if spec.get("attention") == FAIRSEQ_ATTENTION else fused_attention_everywhere()


def _in_precision(model, precision: str):
    import torch

    if precision in ("float16", "half"):
        return model.half()
    if precision == "bfloat16":
        return model.to(torch.bfloat16)
    return model


def _plain(value):
    """An output as JSON holds it (a label, a loss)."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value.item() if hasattr(value, "item") else value


def _build(spec: Dict[str, object]):
    options = DecodingOptions.from_dict(spec["options"]) if spec.get("options") else None
    threads = int(spec["threads"])
    if spec["engine"] != FAIRSEQ:
        return export_engine(spec["engine"]).decoder(spec, options or DecodingOptions(), threads), {}
    if spec["family"] == "translation":
        return _fairseq_translation(spec, options, threads)
    return _fairseq_scoring(spec, threads)


def serve(requests, replies) -> None:
    """Load the system the first request describes, then answer each timing request (see the module)."""

    def send(message: Dict[str, object]) -> None:
        replies.write(json.dumps(message) + "\n")
        replies.flush()

    line = requests.readline()
    try:
        run, described = _build(json.loads(line))
        send({"ready": True, "pid": os.getpid(), "torch_imported": "torch" in sys.modules,
              "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"), **described})
        for line in requests:
            request = json.loads(line)
            if request.get("quit"):
                return
            send(run(request))
    except Exception as error:  # noqa: BLE001  (sent to the parent, which reports it: one line, or a bug's traceback)
        send({"error": f"{type(error).__name__}: {' '.join(str(error).split())}",
              "bug": raised_by_the_plugin(error) and not isinstance(error, HeadPruneError),
              "traceback": traceback.format_exc()})


def main(argv: Optional[List[str]] = None) -> None:
    # the protocol gets the original stdout; whatever the libraries print goes to stderr
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    serve(sys.stdin, replies)


if __name__ == "__main__":
    main()
