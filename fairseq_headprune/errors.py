"""Every error the plugin reports to a user, in one place.

Each is input the plugin cannot work with, reported by the commands as one
line (``fairseq-headprune COMMAND: error: ...``) with exit status 2, never as
a traceback. They derive from ``ValueError`` so plain-Python callers can
catch them the usual way.
"""


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


class SettingsError(HeadPruneError):
    """An option value out of range; the message names the option (``--draws must be positive``)."""


def exit_with_error(message: str) -> None:
    """End a fairseq command (fairseq-train, -generate, ...) with one line on stderr and exit status 1.

    Inside fairseq's own commands there is no handler of ours to print an
    error, and fairseq prints tracebacks; ``SystemExit`` with a message is
    the one way to say it in one line.
    """
    raise SystemExit(f"fairseq-headprune: error: {message}")
