"""fairseq's language-modeling data under numpy 2, changed in one place only.

``fairseq.data.token_block_dataset`` (``--sample-break-mode eos``, which
``transformer_lm`` training and ``fairseq-eval-lm`` use) allocates an array
with ``dtype=np.compat.long``; numpy 2 removed ``np.compat``. Rather than
patch numpy for everyone, that one fairseq module gets a numpy whose
``compat.long`` is ``numpy.int64`` (what ``np.compat.long``, Python's
``int``, meant on 64-bit Linux); every other name is numpy's own.
Nothing changes under numpy 1.
"""

import types

import numpy


class _NumpyWithCompatLong(types.ModuleType):
    """numpy, plus ``compat.long``."""

    compat = types.SimpleNamespace(long=numpy.int64)

    def __getattr__(self, name):
        return getattr(numpy, name)


def give_token_block_dataset_compat_long() -> None:
    if hasattr(numpy, "compat"):
        return  # numpy 1: fairseq works as it is
    from fairseq.data import token_block_dataset

    if not isinstance(token_block_dataset.np, _NumpyWithCompatLong):
        token_block_dataset.np = _NumpyWithCompatLong("numpy")
