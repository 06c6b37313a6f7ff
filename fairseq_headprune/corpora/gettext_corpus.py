"""A real-language English -> X corpus from the gettext catalogs a system installs.

Every package that speaks German ships ``LC_MESSAGES/*.mo`` files whose
entries are (English message, human translation) pairs: tens of thousands of
short, real sentences with placeholders, product names and imperative UI
text.  They make a second model that speaks a real language for the studies
(the synthetic demo corpus is regular enough that findings on it may not
carry over).  Splits are deterministic: a pair's split follows a hash of its
English side, so the same catalogs give the same corpus on every machine.
"""

import gettext
import glob
import hashlib
import os
import re
from typing import Dict, Iterable, List, Tuple

from fairseq_headprune.corpora.demo_corpus import write_columns
from fairseq_headprune.errors import SettingsError

DEFAULT_LOCALE_DIR = "/usr/share/locale"
# sizes of the held-out splits; the rest is training data
GETTEXT_SPLITS = {"test": 500, "valid": 1500}
MAX_WORDS = 40
MAX_LENGTH_RATIO = 3.0
_CONTEXT_SEPARATOR = "\x04"
# keyboard accelerators: "_File", "&Open" (not "a_b" or "R&D")
_ACCELERATOR = re.compile(r"(?<![\w&])[_&](?=\w)")
_SPACES = re.compile(r"\s+")


def catalog_pairs(path: str) -> Iterable[Tuple[str, str]]:
    """(English, translation) pairs of one compiled catalog (``.mo``); plural entries give the singular."""
    try:
        with open(path, "rb") as stream:
            catalog = gettext.GNUTranslations(stream)._catalog
    except (OSError, UnicodeDecodeError, ValueError):  # unreadable or not UTF-8: skip the package
        return
    for key, translation in catalog.items():
        if isinstance(key, tuple):
            key, plural_form = key
            if plural_form != 0:
                continue
        english = key.split(_CONTEXT_SEPARATOR)[-1]
        if english and translation:
            yield english, translation


def clean_message(message: str) -> str:
    return _SPACES.sub(" ", _ACCELERATOR.sub("", message)).strip()


def usable_pair(english: str, translation: str) -> bool:
    """One-line messages of 1..MAX_WORDS words, translated, of plausible relative length."""
    if english == translation or not english or not translation:
        return False
    if len(english.split()) > MAX_WORDS or len(translation.split()) > MAX_WORDS:
        return False
    ratio = len(english) / len(translation)
    return 1 / MAX_LENGTH_RATIO <= ratio <= MAX_LENGTH_RATIO


def gettext_pairs(locale_dir: str, language: str) -> List[Tuple[str, str]]:
    """Usable pairs of every catalog of ``language``, one translation per English message, in hash order."""
    pattern = os.path.join(locale_dir, language, "LC_MESSAGES", "*.mo")
    paths = sorted(glob.glob(pattern))
    if not paths:
        raise SettingsError(f"no gettext catalogs match {pattern}")
    translations: Dict[str, str] = {}
    for path in paths:  # sorted: the first package to translate a message gives its translation
        for english, translation in catalog_pairs(path):
            if "\n" in english or "\n" in translation:  # help screens and multi-line messages
                continue
            english, translation = clean_message(english), clean_message(translation)
            if english not in translations and usable_pair(english, translation):
                translations[english] = translation
    return sorted(translations.items(), key=lambda pair: hashlib.sha1(pair[0].encode("utf-8")).hexdigest())


def gettext_splits(pairs: List[Tuple[str, str]], sizes: Dict[str, int] = None) -> Dict[str, List[Tuple[str, str]]]:
    """Held-out splits first (in hash order), the rest is ``train``."""
    sizes = dict(GETTEXT_SPLITS if sizes is None else sizes)
    if sum(sizes.values()) >= len(pairs):
        raise SettingsError(f"only {len(pairs)} usable pairs: too few for held-out splits of {sizes}")
    splits, start = {}, 0
    for split, size in sizes.items():
        splits[split] = pairs[start:start + size]
        start += size
    splits["train"] = pairs[start:]
    return splits


def write_gettext_corpus(out_dir: str, language: str = "de", locale_dir: str = DEFAULT_LOCALE_DIR) -> Dict[str, int]:
    """Write ``SPLIT.en`` / ``SPLIT.LANGUAGE`` files; returns pairs per split."""
    os.makedirs(out_dir, exist_ok=True)
    counts = {}
    for split, pairs in gettext_splits(gettext_pairs(locale_dir, language)).items():
        write_columns(out_dir, split, {"en": [en for en, _ in pairs], language: [x for _, x in pairs]})
        counts[split] = len(pairs)
    return counts
