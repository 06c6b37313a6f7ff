"""Result files: written so that an interrupted run never leaves a half-written one; text read with one-line errors."""

import contextlib
import csv
import functools
import hashlib
import json
import math
import os
import tempfile
from typing import Dict, Iterator, List, Optional, Sequence, TextIO

from fairseq_headprune.errors import ResultFileError, StudyError, setting_words

TEMPORARY_PREFIX = ".tmp-"


def remove_stale_temporaries(directory: str) -> None:
    """Temporaries a killed run left behind (it could not rename or delete them)."""
    if os.path.isdir(directory):
        for name in os.listdir(directory):
            if name.startswith(TEMPORARY_PREFIX) and name.endswith(".part"):
                os.unlink(os.path.join(directory, name))


@contextlib.contextmanager
def atomic_path(path: str) -> Iterator[str]:
    """A temporary path beside ``path``, renamed onto it only if the block succeeds."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    # ".tmp-NAME.XXXX.part": never matches the pattern of finished files (e.g. *.json)
    handle, temporary = tempfile.mkstemp(dir=directory, prefix=f"{TEMPORARY_PREFIX}{os.path.basename(path)}.",
                                         suffix=".part")
    os.close(handle)
    try:
        yield temporary
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)


@contextlib.contextmanager
def atomic_text_file(path: str) -> Iterator[TextIO]:
    """A UTF-8 text stream whose file appears at ``path`` only when the block succeeds."""
    with atomic_path(path) as temporary, open(temporary, "w", encoding="utf-8", newline="") as stream:
        yield stream


def write_json(data, path: str, indent: Optional[int] = None) -> None:
    with atomic_text_file(path) as stream:
        json.dump(data, stream, indent=indent, default=float)
        if indent is not None:
            stream.write("\n")


def read_json_of_format(path: str, file_format: str, setting: str, description: str) -> Dict[str, object]:
    """A JSON file that says it is ``file_format``, given as ``setting`` (``tuning``, ``latency_table``); one-line
    errors, naming the setting, otherwise."""
    words = setting_words(setting)
    if not os.path.isfile(path):
        raise ResultFileError(f"{words} {path} is not found", setting=setting)
    try:
        with open(path, encoding="utf-8") as stream:
            payload = json.load(stream)
    except (OSError, ValueError) as error:
        raise ResultFileError(f"{words} {path} is not {description} ({error})", setting=setting) from error
    if not isinstance(payload, dict) or payload.get("format") != file_format:
        raise ResultFileError(f"{words} {path} is not {description} (no format {file_format!r})", setting=setting)
    return payload


def write_text(text: str, path: str) -> None:
    with atomic_text_file(path) as stream:
        stream.write(text)


def read_lines(path: str, what: str = "") -> List[str]:
    """The lines of a UTF-8 text file, without their newlines; ``what`` names it in errors."""
    try:
        with open(path, encoding="utf-8") as stream:
            return [line.rstrip("\n") for line in stream]
    except OSError as error:
        raise StudyError(f"cannot read {what}{path}: {error.strerror}") from error
    except UnicodeDecodeError:
        raise StudyError(f"{what}{path} is not UTF-8 text") from None


def file_sha256(path: str) -> str:
    """SHA-256 of a file, computed once per file version (a checkpoint may be a gigabyte)."""
    status = os.stat(path)
    return _file_sha256(os.path.abspath(path), status.st_size, status.st_mtime_ns)


@functools.lru_cache(maxsize=None)
def _file_sha256(path: str, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def recorded_identity(path: str, description: str, option: str) -> Dict[str, object]:
    """The ``identity`` a study directory's record file holds (the settings its results depend on)."""
    try:
        with open(path, encoding="utf-8") as stream:
            return json.load(stream)["identity"]
    except (OSError, ValueError, KeyError) as error:
        raise StudyError(f"{path} is not {description} ({error}); use another {option}") from error


def first_difference(old: Dict[str, object], new: Dict[str, object]) -> Optional[str]:
    """The first setting in which two identities differ, as text (None: the same)."""
    for key in sorted(set(old) | set(new)):
        if old.get(key) != new.get(key):
            if isinstance(old.get(key), dict) and isinstance(new.get(key), dict):
                inner = first_difference(old[key], new[key])
                return f"{key}.{inner}"
            return f"{key}: {old.get(key)!r} there, {new.get(key)!r} now"
    return None


def write_rows_tsv(rows: Sequence[Dict[str, object]], path: str) -> None:
    """Rows of one result table as TSV, columns from the first row (written atomically)."""
    if not rows:
        raise ValueError("no rows to write")
    columns = list(rows[0])
    with atomic_text_file(path) as stream:
        writer = csv.writer(stream, delimiter="\t", lineterminator="\n")
        writer.writerow(columns)
        for row in rows:
            writer.writerow([_tsv_value(row[c]) for c in columns])


def _tsv_value(value) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}" if not math.isnan(value) else "nan"
    return str(value)
