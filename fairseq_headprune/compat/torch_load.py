"""Let torch >= 2.6 load fairseq checkpoints without turning weights_only off.

Since torch 2.6, ``torch.load`` refuses every global that is not on its
allow-list, and fairseq calls it with the default.  Old-format checkpoints
(the released WMT models among them) keep their configuration in an
``argparse.Namespace``; checkpoints written by fairseq-train add a few more
plain types, and with ``--eval-bleu`` its meters, saved in every checkpoint,
hold numpy arrays of numbers (the BLEU counts). We allow exactly those, and
nothing else, so a checkpoint that pickles arbitrary objects (a numpy array of
objects among them) is still refused.
"""

import argparse

import numpy
import torch

# numpy's own rebuilding of an array of numbers: the function, the array and dtype types, the numeric dtypes
_NUMPY_CORE = getattr(numpy, "_core", None) or numpy.core
_NUMERIC_DTYPES = [getattr(getattr(numpy, "dtypes", None), name, None) for name in (
    "BoolDType", "Int8DType", "Int16DType", "Int32DType", "Int64DType", "UInt8DType", "UInt16DType", "UInt32DType",
    "UInt64DType", "Float16DType", "Float32DType", "Float64DType")]
NUMPY_ARRAY_GLOBALS = [_NUMPY_CORE.multiarray._reconstruct, numpy.ndarray, numpy.dtype,
                       *[dtype for dtype in _NUMERIC_DTYPES if dtype is not None]]

# Found by loading fairseq checkpoints with weights_only=True: old-format ones
# store ``args`` as a Namespace, and fairseq-train stores ``cfg.model`` as one
# for every architecture registered with register_model_architecture; with
# --eval-bleu (compress --target speedup fine-tunes so) its meters hold numpy arrays.
FAIRSEQ_CHECKPOINT_GLOBALS = [
    argparse.Namespace,
    *NUMPY_ARRAY_GLOBALS,
]


def allow_fairseq_checkpoint_globals() -> None:
    add_safe_globals = getattr(torch.serialization, "add_safe_globals", None)
    if add_safe_globals is not None:  # torch < 2.4 loads everything anyway
        add_safe_globals(FAIRSEQ_CHECKPOINT_GLOBALS)


allow_fairseq_checkpoint_globals()
