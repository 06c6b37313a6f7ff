"""Write result files so that an interrupted run never leaves a half-written one."""

import contextlib
import json
import os
import tempfile
from typing import Iterator, Optional, TextIO


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
    handle, temporary = tempfile.mkstemp(dir=directory, prefix=f"{TEMPORARY_PREFIX}{os.path.basename(path)}.", suffix=".part")
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


def write_text(text: str, path: str) -> None:
    with atomic_text_file(path) as stream:
        stream.write(text)
