"""Write result files so that an interrupted run never leaves a half-written one."""

import contextlib
import os
import tempfile
from typing import Iterator


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
