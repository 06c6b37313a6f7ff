"""Where a command writes, checked before it works, and one run per output directory at a time.

Every command names its outputs by the same settings (``OUTPUT_DIRECTORIES``, ``OUTPUT_FILES``), so one
check covers all of them before any model is loaded: a directory that is a file, lies under a file, or
cannot be written; a file whose directory is missing or cannot be written, or that is a directory; a file
that exists (replaced only with ``--overwrite``) or that the command also reads. A run
that writes a directory holds an advisory lock on it (``fcntl.flock`` on a lock file keyed by the
directory's real path, in the temporary directory, so the user's directory gains no file): a second run
into it ends at once, naming the first run's process (the shares of a ``--config-shard`` fine-tune, which
write one directory together, each hold their own); the system releases the lock when that process ends,
however it ends, so a killed run leaves no obstacle.
"""

import argparse
import contextlib
import fcntl
import hashlib
import os
import tempfile
from typing import Callable, Dict, Iterator, Optional

from fairseq_headprune.errors import SettingsError

# settings (argparse destinations) that name a directory a command writes, and a file it writes
OUTPUT_DIRECTORIES = ("out_dir",)
OUTPUT_FILES = ("out", "report", "json", "plot")

LOCK_FOLDER = "fairseq-headprune-locks"


def _nearest_existing(path: str) -> str:
    """``path`` itself if it exists, else its nearest ancestor that does."""
    current = os.path.abspath(path)
    while not os.path.lexists(current):
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    return current


def directory_problem(path: str) -> Optional[str]:
    """Why ``path`` cannot be the directory a command writes (None: it can)."""
    if os.path.isdir(path):
        return None if os.access(path, os.W_OK | os.X_OK) else f"{path} is not writable"
    if os.path.lexists(path):
        return f"{path} is a file, not a directory"
    existing = _nearest_existing(path)
    if not os.path.isdir(existing):
        return f"{path} lies under {existing}, which is a file"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{path} cannot be made: {existing} is not writable"
    return None


def file_problem(path: str) -> Optional[str]:
    """Why ``path`` cannot be a file a command writes (None: it can)."""
    if os.path.isdir(path):
        return f"{path} is a directory, not a file"
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        existing = _nearest_existing(folder)
        if not os.path.isdir(existing):
            return f"{path} lies under {existing}, which is a file"
        return f"the directory of {path} does not exist ({folder})"
    if os.path.exists(path) and not os.access(path, os.W_OK):
        return f"{path} is not writable"
    if not os.path.exists(path) and not os.access(folder, os.W_OK | os.X_OK):
        return f"{path} cannot be written: {folder} is not writable"
    return None


def _flag(flags: Dict[str, str], setting: str) -> str:
    """How the command's user gave ``setting``: its flag, or a positional argument's name."""
    return flags.get(setting, setting.upper())


def add_overwrite_option(parser: argparse.ArgumentParser) -> None:
    """``--overwrite`` for a command that writes single files (``OUTPUT_FILES``): without it an existing file
    is refused, never replaced."""
    if any(action.dest in OUTPUT_FILES for action in parser._actions):
        parser.add_argument("--overwrite", action="store_true",
                            help="replace output files that exist (without it such a file is refused, unchanged)")


def _inputs(args: argparse.Namespace, outputs) -> Iterator[tuple]:
    """(setting, path) of every existing file the command's other settings name: what it reads."""
    for setting, value in vars(args).items():
        if setting in outputs:
            continue
        for path in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(path, str) and path and os.path.isfile(path):
                yield setting, path


def check_output_paths(args: argparse.Namespace, flags: Dict[str, str]) -> None:
    """Refuse, before any work, an output the command could not write, a file output that exists (unless
    ``--overwrite``), and one that is also an input (``SettingsError`` naming the flag)."""
    for settings, problem_of in ((OUTPUT_DIRECTORIES, directory_problem), (OUTPUT_FILES, file_problem)):
        for setting in settings:
            path = getattr(args, setting, None)
            if not isinstance(path, str) or not path:
                continue
            problem = problem_of(path)
            if problem is not None:
                raise SettingsError(f"{_flag(flags, setting)}: {problem}; nothing was written")
    for setting in OUTPUT_FILES:
        path = getattr(args, setting, None)
        if not isinstance(path, str) or not path or not os.path.isfile(path):
            continue
        for source, read in _inputs(args, OUTPUT_FILES + OUTPUT_DIRECTORIES):
            if os.path.samefile(read, path):
                raise SettingsError(f"{_flag(flags, setting)}: {path} is also what {_flag(flags, source)} reads; "
                                    "give another path; nothing was written")
        if not getattr(args, "overwrite", False):
            raise SettingsError(f"{_flag(flags, setting)}: {path} exists; give --overwrite to replace it, or "
                                "another path; nothing was written")


def _lock_path(directory: str, share: Optional[str]) -> str:
    """The lock file of ``directory`` (and of one ``--config-shard`` share of it: the shares of a sharded
    fine-tune write one directory at once, each its own configurations)."""
    key = hashlib.sha256((os.path.realpath(directory) + "\0" + (share or "")).encode()).hexdigest()[:24]
    folder = os.path.join(tempfile.gettempdir(), LOCK_FOLDER)
    os.makedirs(folder, exist_ok=True)
    return os.path.join(folder, key + ".lock")


@contextlib.contextmanager
def _held(path: str, exclusive: bool, holder: str, refusal: Callable[[str], str]) -> Iterator[None]:
    """Hold ``path``'s lock (exclusive, or shared with other holders of a shared one) for the block, its
    holder named in the file while exclusive; refuse one held otherwise (``refusal`` of its holder's name)."""
    with open(path, "a+") as stream:
        try:
            fcntl.flock(stream.fileno(), (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
        except BlockingIOError:
            stream.seek(0)
            named = stream.read().strip() or "the shares of a sharded run"
            raise SettingsError(refusal(named)) from None
        if exclusive:
            stream.seek(0)
            stream.truncate()
            stream.write(holder)
            stream.flush()
        try:
            yield
        finally:
            if exclusive:
                stream.seek(0)
                stream.truncate()
            fcntl.flock(stream.fileno(), fcntl.LOCK_UN)


@contextlib.contextmanager
def output_directory_locked(args: argparse.Namespace, flags: Dict[str, str], command: str) -> Iterator[None]:
    """Hold the lock of the command's output directory (if it writes one) for the block; refuse one another run
    holds (``SettingsError`` naming its process). A ``--config-shard I/K`` share (I/K other than 1/1) shares
    the directory's lock with the other shares and holds its own share's alone."""
    setting = next((s for s in OUTPUT_DIRECTORIES if isinstance(getattr(args, s, None), str)), None)
    if setting is None:
        yield
        return
    directory = getattr(args, setting)
    share = getattr(args, "config_shard", None)
    share = None if share in (None, "1/1") else share
    holder = f"fairseq-headprune {command}, process {os.getpid()}"
    def refusal(other: str) -> str:
        return (f"{_flag(flags, setting)}: {directory} is in use by another run ({other}); wait for it to end or "
                "give another directory")

    with contextlib.ExitStack() as held:
        held.enter_context(_held(_lock_path(directory, None), share is None, holder, refusal))
        if share is not None:
            held.enter_context(_held(_lock_path(directory, share), True, holder, refusal))
        yield
