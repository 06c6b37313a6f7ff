"""fairseq-headprune: which attention heads does a trained Transformer need?

Pass ``--user-dir fairseq_headprune`` to fairseq's commands to register the
``fairseq-headprune`` task (and its classifier and language-model variants),
the ``headprune_importance`` and ``headprune_gates`` criteria and the masked
multi-head attention.

The public API is in ``__all__``: the plain study logic of ``study`` (masks,
statistics, the papers' methods, settings; no fairseq), the fairseq side of
``engine`` (loading, masks on a model, each command's ``run_*``), and the
errors. Names are imported when first used, so ``import fairseq_headprune``
does not import fairseq.

Layers, each importing only those below it:
``constants``, ``errors``, ``compat/``, ``corpora/`` and ``study/`` (plain study
logic: masks, statistics, methods, output; no fairseq) -> ``modules/``,
``tasks/``, ``criterions/`` (registered fairseq components, registered by
``registry``) -> ``engine/`` (checkpoints, runners, sweeps, methods, pipelines)
-> ``commands/`` and ``cli.py`` (argparse and printing).
"""

import sys

from fairseq_headprune.engine import EXPORTS as _ENGINE_EXPORTS
from fairseq_headprune.lazy_exports import lazy_attributes
from fairseq_headprune.study import EXPORTS as _STUDY_EXPORTS
from fairseq_headprune.version import __version__

_ERRORS = ("HeadPruneError", "HeadMaskError", "CheckpointError", "ResultFileError", "StudyError", "DependencyError",
           "SettingsError")
_EXPORTS = {**_STUDY_EXPORTS, **_ENGINE_EXPORTS, **{name: "fairseq_headprune.errors" for name in _ERRORS}}
__all__ = ["__version__", *sorted(_EXPORTS)]
__getattr__, __dir__ = lazy_attributes(__name__, _EXPORTS)

if "fairseq" in sys.modules:
    # imported by fairseq itself (--user-dir) or after it: register now, so the
    # study modules stay importable without fairseq otherwise
    from fairseq_headprune.commands.fairseq_commands import FAIRSEQ_FLAGS
    from fairseq_headprune.errors import report_plugin_errors_in_one_line
    from fairseq_headprune.registry import register_components

    register_components()
    report_plugin_errors_in_one_line(FAIRSEQ_FLAGS)  # fairseq's commands print tracebacks
