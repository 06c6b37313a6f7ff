"""FFN-neuron mask specs: one mask variable zeta_i per hidden unit of each FFN block.

A neuron's mask multiplies its activation before ``fc2`` (Kwon et al. 2022,
section 3, mask variables for FFN neurons beside the heads'): 1.0 keeps it,
0.0 masks it, which equals zeroing its column of ``fc2``. The grammar is the
head-mask grammar with FFN types and neurons (1-based)::

    TERM := TYPE ":" LAYERS ":" NEURONS,   TYPE := E | enc-ffn | D | dec-ffn | *

e.g. ``E:2:1-200 D:6:keep=1-128``; ``none`` and mask files as for heads.
"""

from typing import Dict, Tuple

import torch

from fairseq_headprune.constants import FFN_TYPE_LETTERS, FFN_TYPES
from fairseq_headprune.study.masks.head_mask import (
    MaskKind,
    count_masked,
    head_mask_to_spec,
    parse_head_mask,
    read_mask_file,
    write_mask_file,
)

NEURONS = MaskKind(
    option="ffn-mask", unit="neuron", structure="FFN", types=FFN_TYPES, letters=FFN_TYPE_LETTERS,
    aliases={"e": "enc-ffn", "enc-ffn": "enc-ffn", "encoder": "enc-ffn",
             "d": "dec-ffn", "dec-ffn": "dec-ffn", "decoder": "dec-ffn"},
    example="E:2:1-200", type_column="ffn_type", block="block",
)

# FFN type -> (number of layers, hidden units per layer)
FfnLayout = Dict[str, Tuple[int, int]]
# FFN type -> float tensor (layers, hidden units), or per sentence (layers, batch, hidden units)
FfnMask = Dict[str, torch.Tensor]


def parse_ffn_mask(spec: str, layout: FfnLayout) -> FfnMask:
    """Spec text (or a mask file) -> neuron masks for a model of ``layout``; ``HeadMaskError`` names what is wrong."""
    return parse_head_mask(spec, layout, NEURONS)


def ffn_mask_to_spec(ffn_mask: FfnMask) -> str:
    """Neuron masks -> canonical spec text; ``parse_ffn_mask`` inverts it."""
    return head_mask_to_spec(ffn_mask, NEURONS)


def read_ffn_mask_file(path: str, layout: FfnLayout) -> FfnMask:
    return read_mask_file(path, layout, NEURONS)


def write_ffn_mask_file(ffn_mask: FfnMask, path: str) -> None:
    write_mask_file(ffn_mask, path, NEURONS)


def count_masked_neurons(ffn_mask: FfnMask) -> int:
    return count_masked(ffn_mask)
