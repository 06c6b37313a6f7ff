"""Register the plugin's components with fairseq: the one place that does.

fairseq auto-imports a user dir's ``tasks/`` and ``models/`` only, and only
if it has not imported the package already; a criterion registers only when
imported. Every entry point that builds a fairseq task (the engine's
loaders, ``fairseq-headprune train/generate/...``, and the package itself
when fairseq imports it as ``--user-dir``) calls ``register_components``.
"""

import logging

from fairseq_headprune.errors import DependencyError

_registered = False


def register_components() -> None:
    """Register the tasks and criteria (importing fairseq), and make fairseq's data and checkpoints load.

    Also: torch >= 2.6's ``torch.load`` allow-list for fairseq checkpoints,
    fairseq's LM data under numpy 2, and one-line errors of the plugin's
    own exceptions inside fairseq's commands. Idempotent.
    """
    global _registered
    if _registered:
        return
    # fairseq announces at import that an optional speech dependency is missing
    logging.getLogger("fairseq.tasks.text_to_speech").setLevel(logging.WARNING)
    check_fairseq()
    from fairseq_headprune.compat import torch_load  # noqa: F401  (the allow-list, applied on import)
    from fairseq_headprune.compat.numpy2 import give_token_block_dataset_compat_long
    from fairseq_headprune.criterions import headprune_gates, headprune_importance, headprune_word_distillation  # noqa: F401
    from fairseq_headprune.tasks import fairseq_headprune, headprune_language_modeling, headprune_sentence_prediction  # noqa: F401

    give_token_block_dataset_compat_long()  # transformer_lm data under numpy 2
    _registered = True


MINIMUM_FAIRSEQ = (0, 12)


def check_fairseq() -> None:
    """fairseq is the user's to install (a fork with custom architectures is fine): say so clearly if it is missing."""
    try:
        import fairseq
    except ImportError as error:
        raise DependencyError(
            "fairseq is not installed: install your own, or pip install 'fairseq-headprune[fairseq]' "
            f"(ve-fairseq on Python >= 3.11) ({error})"
        ) from error
    version = tuple(int(part) for part in fairseq.__version__.split(".")[:2] if part.isdigit())
    if version < MINIMUM_FAIRSEQ:
        raise DependencyError(f"fairseq {fairseq.__version__} is too old: the plugin needs fairseq >= 0.12")
