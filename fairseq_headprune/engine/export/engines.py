"""The export engines, by name: the dispatch list every export, timing and latency table is chosen from.

The shipped engine is CTranslate2 (``export/ctranslate2/``). Another engine is
a subclass of ``base.ExportEngine`` in a folder of its own, added to
``_SHIPPED``; an engine from outside the package (a test's fake) is named in
the environment variable ``HEADPRUNE_EXPORT_ENGINES`` as ``module:attribute``
entries, comma-separated, so that the timing workers, each a process of its
own, find it too.
"""

import importlib
import os
from typing import Dict

from fairseq_headprune.engine.export.base import ExportEngine
from fairseq_headprune.engine.export.ctranslate2.engine import CTRANSLATE2
from fairseq_headprune.errors import SettingsError

EXTRA_ENGINES_VARIABLE = "HEADPRUNE_EXPORT_ENGINES"
_SHIPPED = (CTRANSLATE2,)


def export_engines() -> Dict[str, ExportEngine]:
    """Every engine, by name: the shipped ones, then those ``HEADPRUNE_EXPORT_ENGINES`` names."""
    engines = {engine.name: engine for engine in _SHIPPED}
    for entry in filter(None, (part.strip() for part in os.environ.get(EXTRA_ENGINES_VARIABLE, "").split(","))):
        module, _, attribute = entry.partition(":")
        try:
            engine = getattr(importlib.import_module(module), attribute)
        except (ImportError, AttributeError) as error:
            raise SettingsError(f"{EXTRA_ENGINES_VARIABLE} names {entry}, which cannot be imported: {error}") from error
        if not isinstance(engine, ExportEngine):
            raise SettingsError(f"{EXTRA_ENGINES_VARIABLE} names {entry}, which is not an export engine")
        engines[engine.name] = engine
    return engines


def export_engine(name: str) -> ExportEngine:
    """The engine called ``name`` (an export format, or a timed system's engine)."""
    engines = export_engines()
    if name not in engines:
        raise SettingsError(f"the export {name}: no such engine (expected {', '.join(engines)})", setting="export")
    return engines[name]


def exported(engine_name: str) -> bool:
    """Whether a timed system's engine is an export engine (not fairseq itself)."""
    return engine_name in export_engines()
