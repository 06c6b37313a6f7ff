"""Write result files so that an interrupted run never leaves a half-written one."""

import contextlib
import os
import tempfile
from typing import Iterator


@contextlib.contextmanager
def atomic_path(path: str) -> Iterator[str]:
    """A temporary path beside ``path``, renamed onto it only if the block succeeds."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix="-" + os.path.basename(path))
    os.close(handle)
    try:
        yield temporary
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)
