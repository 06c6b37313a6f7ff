"""CTranslate2 as an export engine (``export.base.ExportEngine``): the only module the rest of the plugin reaches it by.

CTranslate2 (OpenNMT) runs an exported Transformer whole, with one head count
per encoder and one per decoder (the decoder's cross-attention shares it),
so a pruned model's uneven layers are padded with zero heads (``spec``); a
translation model may carry a vocabulary map (``vmap.txt``) that restricts
each batch's output to its sources' candidate tokens.
"""

import os
import re
from typing import Dict, List, Optional, Sequence

from fairseq_headprune.engine.export.base import Decode, ExportEngine, StackHeads
from fairseq_headprune.engine.export.ctranslate2.library import import_ctranslate2

# what CTranslate2 logs at load with CT2_VERBOSE=1 that says which kernels it runs
_KERNEL_LINES = re.compile(r"(CPU: |Selected ISA|backend:|Use Intel MKL|CPU ISA)")


class CTranslate2Engine(ExportEngine):
    name = "ctranslate2"
    title = "CTranslate2"
    system_prefix = "ct2"
    vocabulary_map_file = "vmap.txt"
    worker_environment = {"CT2_VERBOSE": "1"}  # it then logs its CPU, ISA and GEMM backends at load
    tied_attention_types = (("dec-dec", "enc-dec"),)

    def version(self) -> Optional[str]:
        try:
            import ctranslate2
        except ImportError:
            return None
        return ctranslate2.__version__

    def compute_types(self, device: str) -> List[str]:
        return sorted(import_ctranslate2().get_supported_compute_types(device))

    def sees_cuda(self) -> bool:
        return import_ctranslate2().get_cuda_device_count() > 0

    def write(self, family, cfg, task, model, quantization: str, directory: str,
              vocabulary_map: Optional[str] = None) -> Dict[str, StackHeads]:
        """Through CTranslate2's own spec objects (``spec``), the vocabulary map registered as the model's vmap.txt;
        the weights converted to ``quantization`` as CTranslate2's converters do (``ModelSpec.optimize``)."""
        import torch

        from fairseq_headprune.engine.export.ctranslate2.spec import model_spec

        with torch.no_grad():
            spec, heads = model_spec(family.name, cfg, task, model)
        if vocabulary_map is not None:
            spec.register_vocabulary_mapping(vocabulary_map)
        spec.validate()
        spec.optimize(quantization=quantization)
        os.makedirs(directory, exist_ok=True)
        spec.save(directory)
        return heads

    def decoder(self, system: Dict[str, object], options, threads: int) -> Decode:
        from fairseq_headprune.engine.export.ctranslate2.decoding import ctranslate2_decoder

        return ctranslate2_decoder(system, options, threads)

    def kernel_lines(self, log_lines: Sequence[str]) -> List[str]:
        return [line.split("]", 3)[-1].strip() for line in log_lines if _KERNEL_LINES.search(line)]


CTRANSLATE2 = CTranslate2Engine()
