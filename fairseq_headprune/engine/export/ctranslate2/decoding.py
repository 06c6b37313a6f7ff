"""A CTranslate2 model decoding in a timing worker's process (``engine.timing.worker``); torch is never imported.

A ``ctranslate2.Translator`` (a ``Generator`` for a language model) decodes
the sentences the parent hands it, batch by batch, with fairseq's beam,
length penalty and length limits (``DecodingOptions``), so that it does the
same work as the fairseq model it is timed against.
"""

import time
from typing import Dict, List

from fairseq_headprune.engine.export.base import Decode
from fairseq_headprune.engine.export.ctranslate2.library import import_ctranslate2
from fairseq_headprune.errors import CheckpointError
from fairseq_headprune.study.compression.decoding import DecodingOptions


def ctranslate2_decoder(system: Dict[str, object], options: DecodingOptions, threads: int) -> Decode:
    """Load ``system``'s directory (its precision is the compute type: a float32 directory is quantized as it
    loads) and return its timed pass over the given batches."""
    ctranslate2 = import_ctranslate2()
    device = "cuda" if system["device"] == "cuda" and ctranslate2.get_cuda_device_count() > 0 else "cpu"
    generator = system["family"] == "language_model"
    try:
        engine = (ctranslate2.Generator if generator else ctranslate2.Translator)(
            system["model"], device=device, compute_type=system["precision"], intra_threads=threads, inter_threads=1)
    except (RuntimeError, ValueError) as error:
        # the engine's C++ errors have no Python frame of their own, so they would read as the plugin's bug:
        # a directory it cannot load is input, reported in one line
        raise CheckpointError(f"CTranslate2 cannot load {system['model']}: {error}") from error
    # fairseq's --min-len 1 (its default) is CTranslate2's default too; a longer minimum is passed on
    lengths = {"min_decoding_length": options.min_len} if options.min_len > 1 else {}
    batches: Dict[int, Dict[str, List]] = {}

    def decode(sources, source_length):
        limit = max(options.max_length(source_length), 1)
        if generator:
            results = engine.generate_batch(sources, max_length=limit, beam_size=options.beam,
                                            length_penalty=options.lenpen, include_prompt_in_result=False,
                                            max_batch_size=len(sources),
                                            **({"min_length": options.min_len} if lengths else {}))
            return [" ".join(result.sequences[0]) for result in results]
        results = engine.translate_batch(sources, beam_size=options.beam, length_penalty=options.lenpen,
                                         max_batch_size=len(sources), max_decoding_length=limit,
                                         use_vmap=bool(system.get("use_vmap")), **lengths)
        return [" ".join(result.hypotheses[0]) for result in results]

    def run(request):
        batch_size = int(request["batch_size"])
        if request.get("batches") is not None:
            batches[batch_size] = request["batches"]
        if batch_size not in batches:
            raise RuntimeError(f"no sentences were given at batch size {batch_size}")
        given = batches[batch_size]
        hypotheses = []
        start = time.perf_counter()
        for sources, length in zip(given["sources"], given["source_lengths"]):
            hypotheses += decode(sources, length)
        return {"seconds": time.perf_counter() - start, "outputs": hypotheses}

    return run
