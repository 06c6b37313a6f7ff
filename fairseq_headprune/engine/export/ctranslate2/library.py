"""The ``ctranslate2`` package, imported where it is needed (it is an optional dependency)."""

from fairseq_headprune.errors import DependencyError


def import_ctranslate2():
    """``ctranslate2``, or one clear line saying how to get it."""
    try:
        import ctranslate2
    except ImportError as error:
        raise DependencyError(
            "exporting to CTranslate2 needs the ctranslate2 package: pip install 'fairseq-headprune[ctranslate2]'"
        ) from error
    return ctranslate2
