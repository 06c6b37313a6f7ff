"""The real-language corpus read from gettext catalogs: compiled .mo files written here, read back by
Python's gettext."""

import struct

import pytest

from fairseq_headprune.corpora.gettext_corpus import gettext_pairs, gettext_splits, write_gettext_corpus
from fairseq_headprune.errors import SettingsError


def write_mo(path, entries):
    """A GNU .mo catalog (little-endian, no hash table) of ``entries``: {msgid: msgstr} as bytes-able strings."""
    keys = sorted(entries)
    ids = [k.encode("utf-8") for k in keys]
    strs = [entries[k].encode("utf-8") for k in keys]
    count = len(keys)
    header_size = 7 * 4
    originals_offset = header_size
    translations_offset = originals_offset + 8 * count
    data_offset = translations_offset + 8 * count
    tables, data = [b"", b""], b""
    for which, items in enumerate((ids, strs)):
        for item in items:
            tables[which] += struct.pack("<II", len(item), data_offset + len(data))
            data += item + b"\0"
    header = struct.pack("<7I", 0x950412DE, 0, count, originals_offset, translations_offset, 0, data_offset)
    path.write_bytes(header + tables[0] + tables[1] + data)


@pytest.fixture
def locale_dir(tmp_path):
    catalogs = tmp_path / "de" / "LC_MESSAGES"
    catalogs.mkdir(parents=True)
    header = "Content-Type: text/plain; charset=UTF-8\nPlural-Forms: nplurals=2; plural=(n != 1);\n"
    write_mo(catalogs / "a.mo", {
        "": header,
        "_Open the file": "Datei _öffnen",
        "menu\x04Quit": "Beenden",
        "one file\x00%d files": "eine Datei\x00%d Dateien",
        "first line\nsecond line": "erste Zeile\nzweite Zeile",
        "same": "same",
        "shared message": "geteilte Nachricht (a)",
    })
    write_mo(catalogs / "b.mo", {"": header, "shared message": "geteilte Nachricht (b)", "R&D budget": "F&E-Budget"})
    return tmp_path


def test_catalog_entries_become_clean_one_line_pairs(locale_dir):
    pairs = dict(gettext_pairs(str(locale_dir), "de"))
    assert pairs == {
        "Open the file": "Datei öffnen",  # keyboard accelerators removed
        "Quit": "Beenden",  # the context prefix dropped
        "one file": "eine Datei",  # plural entries give the singular
        "shared message": "geteilte Nachricht (a)",  # the first catalog (sorted by name) translates it
        "R&D budget": "F&E-Budget",  # an & inside a word is no accelerator
    }  # multi-line and untranslated messages are left out


def test_splits_are_disjoint_deterministic_and_sized(locale_dir):
    pairs = gettext_pairs(str(locale_dir), "de")
    assert pairs == gettext_pairs(str(locale_dir), "de")
    splits = gettext_splits(pairs, {"test": 1, "valid": 2})
    assert [len(splits[s]) for s in ("test", "valid", "train")] == [1, 2, 2]
    assert sorted(p for split in splits.values() for p in split) == sorted(pairs)
    with pytest.raises(SettingsError, match="too few"):
        gettext_splits(pairs, {"test": 3, "valid": 2})


def test_a_language_without_catalogs_is_one_clear_error(tmp_path):
    with pytest.raises(SettingsError, match="no gettext catalogs match"):
        write_gettext_corpus(str(tmp_path / "out"), "xx", str(tmp_path))
