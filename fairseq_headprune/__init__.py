"""fairseq-headprune: which attention heads does a trained Transformer need?

Pass ``--user-dir fairseq_headprune`` to fairseq's commands to register the
``fairseq-headprune`` task and its masked multi-head attention.
"""

__version__ = "0.1.0"

import logging

# fairseq announces at import that an optional speech dependency is missing;
# our own commands keep stderr for what matters.
logging.getLogger("fairseq.tasks.text_to_speech").setLevel(logging.WARNING)

from . import checkpoint_compat  # noqa: F401  (torch.load allow-list)
from .tasks import fairseq_headprune  # noqa: F401  (registers the task)
# fairseq auto-imports a user dir's tasks/ and models/ only
from .criterions import headprune_importance  # noqa: F401  (registers the criterion)
