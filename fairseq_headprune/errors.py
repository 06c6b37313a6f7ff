"""Every error the plugin reports to a user, in one place.

Each is input the plugin cannot work with. Components and the engine raise
them; only the command line turns them into one line
(``fairseq-headprune COMMAND: error: ...``, exit status 2; inside fairseq's
own commands ``fairseq-headprune: error: ...``, exit status 1), never a
traceback, unless ``FAIRSEQ_HEADPRUNE_DEBUG=1`` (or ``fairseq-headprune
--debug``) asks for it. They derive from ``ValueError`` so plain-Python
callers can catch them the usual way.

An error about a setting says which (``setting``: the settings field, named
as the commands' options store it, ``"head_mask"``, ``"budget"``,
``"finetune_updates"``) and speaks of it in plain words (``SETTING_WORDS``:
"the head mask", "the budget"): below the commands nothing knows which flag,
if any, a value came from (``compress`` sets a head mask no user passed).
The command that reports the error words it with its user's flag where it
took the setting from one (``worded``; each command's settings and flags:
``cli.command_flags``), and leaves the plain words where it did not.
"""

import contextlib
import os
import re
import sys
from typing import Callable, Dict, Iterator, Mapping, Optional, Sequence, Tuple, Union

# a setting's plain words in messages, where they are not "the" and its name ("the budget", "the head mask")
SETTING_WORDS: Dict[str, str] = {
    "bleu": "the BLEU",
    "sacrebleu_detokenize": "the sacreBLEU detokenizer",
    "ffn_mask": "the FFN mask",
    "importance": "the importance file",
    "ablation": "the ablation file",
    "fisher": "the Fisher file",
    "drop_encoder_layers": "the encoder layers to drop",
    "drop_decoder_layers": "the decoder layers to drop",
    "drop_layers": "the layers to drop",
    "tuning": "the tuning file",
    "latency_table": "the latency table",
    "out": "the output file",
    "out_dir": "the output directory",
}

# set (to anything but 0) to see the traceback of an error the commands would report in one line
DEBUG_VARIABLE = "FAIRSEQ_HEADPRUNE_DEBUG"


def setting_words(setting: str) -> str:
    """How a message below the commands speaks of ``setting``: ``SETTING_WORDS``, else "the" and its name."""
    return SETTING_WORDS.get(setting) or "the " + setting.replace("_", " ")


class HeadPruneError(ValueError):
    """Base class: input the plugin cannot work with.

    ``setting``: the setting the message is about (a settings field's name), or several, the first the one to
    correct; the message speaks of each in its plain words (``setting_words``).
    """

    def __init__(self, message: str = "", setting: Union[str, Sequence[str], None] = None):
        super().__init__(message)
        self.settings: Tuple[str, ...] = (setting,) if isinstance(setting, str) else tuple(setting or ())

    @property
    def setting(self) -> Optional[str]:
        return self.settings[0] if self.settings else None

    def __reduce__(self):  # pickled whole (a timed system's process reports its errors)
        return type(self), (str(self), self.settings)

    def worded(self, flags: Mapping[str, str]) -> str:
        """The message as a command prints it: each setting's plain words replaced by the flag ``flags`` maps it
        to (setting -> flag) wherever they stand, the longest words first; a setting without a flag keeps its
        words. A mapped setting whose words the message does not hold is named before it (``--flag: message``)."""
        message = str(self)
        named = []
        for setting in sorted(self.settings, key=lambda s: -len(setting_words(s))):
            flag = flags.get(setting)
            if not flag:
                continue
            words = setting_words(setting)
            # whole words only ("the export" is not in "the exported model"), the first letter either case
            pattern = rf"(?<![\w-])[{words[:1]}{words[:1].upper()}]{re.escape(words[1:])}(?![\w-])"
            message, count = re.subn(pattern, lambda _: flag, message)
            if not count:
                named.append(flag)
        return f"{', '.join(named)}: {message}" if named else message


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
    """A setting's value out of range; the message names the setting (``the draws must be positive``, worded
    ``--draws must be positive`` by a command that took it from ``--draws``)."""


def debugging() -> bool:
    """Whether errors should come with their traceback (``FAIRSEQ_HEADPRUNE_DEBUG``)."""
    return os.environ.get(DEBUG_VARIABLE, "") not in ("", "0")


def report_plugin_errors_in_one_line(flags: Mapping[str, str]) -> None:
    """Inside fairseq's own commands (``fairseq-train --user-dir ...``), the plugin's errors as one line.

    There the command line is fairseq's, which prints tracebacks; this hook
    is the one place that turns an uncaught ``HeadPruneError`` into
    ``fairseq-headprune: error: MESSAGE`` (exit status 1), worded with
    ``flags``, the settings fairseq's parser takes as options (the tasks'
    ``--head-mask``). Installed once, by the package when fairseq imports it;
    other exceptions keep their traceback.
    """
    previous = sys.excepthook
    if getattr(previous, "reports_plugin_errors", False):
        return

    def hook(kind, value, traceback):
        if issubclass(kind, HeadPruneError) and not debugging():
            print(f"fairseq-headprune: error: {value.worded(flags)}", file=sys.stderr)
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
