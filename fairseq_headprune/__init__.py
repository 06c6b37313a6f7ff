"""fairseq-headprune: which attention heads does a trained Transformer need?

Pass ``--user-dir fairseq_headprune`` to fairseq's commands to register the
``fairseq-headprune`` task, the ``headprune_importance`` criterion and the
masked multi-head attention.

Layers, each importing only those below it:
``study/`` (plain study logic: specs, metrics, statistics, orders, tables;
no fairseq) -> ``modules/``, ``tasks/``, ``criterions/`` (registered fairseq
components) -> ``engine/`` (loading, generation, sweeps, the studies on a
model) -> ``commands/`` and ``cli.py`` (argparse and printing).
"""

__version__ = "0.1.0"

import logging
import sys

# fairseq announces at import that an optional speech dependency is missing;
# our own commands keep stderr for what matters.
logging.getLogger("fairseq.tasks.text_to_speech").setLevel(logging.WARNING)

from .engine import checkpoint_compat  # noqa: F401,E402  (torch.load allow-list; torch only)


def register_components() -> None:
    """Register the tasks and criterion with fairseq (importing it), and fix its LM data for numpy 2.

    fairseq auto-imports a user dir's ``tasks/`` and ``models/`` only, and
    only if it has not imported the package already: every entry point that
    builds a fairseq task calls this first.
    """
    from .criterions import headprune_gates, headprune_importance  # noqa: F401
    from .engine.numpy_compat import give_token_block_dataset_compat_long
    from .tasks import fairseq_headprune, headprune_language_modeling, headprune_sentence_prediction  # noqa: F401

    give_token_block_dataset_compat_long()  # transformer_lm data under numpy 2


if "fairseq" in sys.modules:
    # imported by fairseq itself (--user-dir) or after it: register now, so the
    # study modules stay importable without fairseq otherwise
    register_components()
