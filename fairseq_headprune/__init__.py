"""fairseq-headprune: which attention heads does a trained Transformer need?

Pass ``--user-dir fairseq_headprune`` to fairseq's commands to register the
``fairseq-headprune`` task (and its classifier and language-model variants),
the ``headprune_importance`` and ``headprune_gates`` criteria and the masked
multi-head attention.

Layers, each importing only those below it:
``constants``, ``errors``, ``compat/``, ``corpora/`` and ``study/`` (plain study
logic: masks, statistics, methods, output; no fairseq) -> ``modules/``,
``tasks/``, ``criterions/`` (registered fairseq components, registered by
``registry``) -> ``engine/`` (checkpoints, runners, sweeps, methods, studies)
-> ``commands/`` and ``cli.py`` (argparse and printing).
"""

import sys

from .version import __version__  # noqa: F401

if "fairseq" in sys.modules:
    # imported by fairseq itself (--user-dir) or after it: register now, so the
    # study modules stay importable without fairseq otherwise
    from .errors import report_plugin_errors_in_one_line
    from .registry import register_components

    register_components()
    report_plugin_errors_in_one_line()  # fairseq's commands print tracebacks
