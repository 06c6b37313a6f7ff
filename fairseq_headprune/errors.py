"""Every error the plugin reports to a user, in one place.

Each is input the plugin cannot work with. Components and the engine raise
them; only the command line turns them into one line
(``fairseq-headprune COMMAND: error: ...``, exit status 2; inside fairseq's
own commands ``fairseq-headprune: error: ...``, exit status 1), never a
traceback, unless ``FAIRSEQ_HEADPRUNE_DEBUG=1`` (or ``fairseq-headprune
--debug``) asks for it. They derive from ``ValueError`` so plain-Python
callers can catch them the usual way.
"""

import contextlib
import os
import sys
from typing import Callable, Iterator

# set (to anything but 0) to see the traceback of an error the commands would report in one line
DEBUG_VARIABLE = "FAIRSEQ_HEADPRUNE_DEBUG"


class HeadPruneError(ValueError):
    """Base class: input the plugin cannot work with."""


class HeadMaskError(HeadPruneError):
    """A head-mask spec or mask that is malformed or does not fit the model."""


class CheckpointError(HeadPruneError):
    """A checkpoint that is missing, unreadable or not a fairseq Transformer."""


class ResultFileError(HeadPruneError):
    """A result file given as input (importance, ablation, mask) that is missing or of another kind."""


class StudyError(HeadPruneError):
    """Data, model or results a study cannot run on (missing split, another sweep's directory ...)."""


class DependencyError(HeadPruneError):
    """A package the plugin needs (fairseq, or an optional engine) is missing or too old."""


class SettingsError(HeadPruneError):
    """An option value out of range; the message names the option (``--draws must be positive``)."""


def debugging() -> bool:
    """Whether errors should come with their traceback (``FAIRSEQ_HEADPRUNE_DEBUG``)."""
    return os.environ.get(DEBUG_VARIABLE, "") not in ("", "0")


def report_plugin_errors_in_one_line() -> None:
    """Inside fairseq's own commands (``fairseq-train --user-dir ...``), the plugin's errors as one line.

    There the command line is fairseq's, which prints tracebacks; this hook
    is the one place that turns an uncaught ``HeadPruneError`` into
    ``fairseq-headprune: error: MESSAGE`` (exit status 1). Installed once, by
    the package when fairseq imports it; other exceptions keep their traceback.
    """
    previous = sys.excepthook
    if getattr(previous, "reports_plugin_errors", False):
        return

    def hook(kind, value, traceback):
        if issubclass(kind, HeadPruneError) and not debugging():
            print(f"fairseq-headprune: error: {value}", file=sys.stderr)
        else:
            previous(kind, value, traceback)

    hook.reports_plugin_errors = True
    sys.excepthook = hook


def first_line(error: BaseException) -> str:
    """The first line of a library's error message (its type's name if it has none), to quote in ours."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def raised_by_the_plugin(error: BaseException) -> bool:
    """Whether ``error`` was raised in the plugin's own code (its traceback's innermost frame): a bug to show with
    its traceback, not input to report in one line."""
    frame = error.__traceback__
    while frame is not None and frame.tb_next is not None:
        frame = frame.tb_next
    return frame is not None and os.path.abspath(frame.tb_frame.f_code.co_filename).startswith(_PACKAGE_DIR)


@contextlib.contextmanager
def library_errors_as(report: Callable[[BaseException], HeadPruneError]) -> Iterator[None]:
    """The errors fairseq or torch raise in the call inside (fairseq raises bare ``Exception`` for bad input) as
    the plugin's one-line error ``report(error)``, the cause chained (its traceback shown under
    ``FAIRSEQ_HEADPRUNE_DEBUG``); the plugin's own errors, and its bugs, pass through unchanged."""
    try:
        yield
    except HeadPruneError:
        raise
    except Exception as error:
        if raised_by_the_plugin(error):
            raise
        raise report(error) from error
