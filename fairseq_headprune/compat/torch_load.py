"""Let torch >= 2.6 load fairseq checkpoints without turning weights_only off.

Since torch 2.6, ``torch.load`` refuses every global that is not on its
allow-list, and fairseq calls it with the default.  Old-format checkpoints
(the released WMT models among them) keep their configuration in an
``argparse.Namespace``; checkpoints written by fairseq-train add a few more
plain types.  We allow exactly those, and nothing else, so a checkpoint that
pickles arbitrary objects is still refused.
"""

import argparse

import torch

# Found by loading fairseq checkpoints with weights_only=True: old-format ones
# store ``args`` as a Namespace, and fairseq-train stores ``cfg.model`` as one
# for every architecture registered with register_model_architecture.
FAIRSEQ_CHECKPOINT_GLOBALS = [
    argparse.Namespace,
]


def allow_fairseq_checkpoint_globals() -> None:
    add_safe_globals = getattr(torch.serialization, "add_safe_globals", None)
    if add_safe_globals is not None:  # torch < 2.4 loads everything anyway
        add_safe_globals(FAIRSEQ_CHECKPOINT_GLOBALS)


allow_fairseq_checkpoint_globals()
