"""The public names of a package, imported from their modules when first used (PEP 562).

The package faces (``fairseq_headprune``, ``.study``, ``.engine``) list their
public API in ``__all__`` without importing it, so that importing the plugin
does not import fairseq (its plain study logic works without it) and fairseq's
``--user-dir`` import stays light.
"""

import importlib
from typing import Callable, Dict, List, Tuple


def lazy_attributes(package: str, exports: Dict[str, str]) -> Tuple[Callable[[str], object], Callable[[], List[str]]]:
    """``__getattr__`` and ``__dir__`` of ``package`` for ``exports``: public name -> module (absolute)."""
    namespace = importlib.import_module(package).__dict__

    def getattr_(name: str):
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(exports[name]), name)
        namespace[name] = value  # resolved once
        return value

    def dir_() -> List[str]:
        return sorted(set(namespace) | set(exports))

    return getattr_, dir_
