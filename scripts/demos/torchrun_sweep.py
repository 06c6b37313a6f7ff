#!/usr/bin/env python3
"""torchrun for the scripts' sweeps (``demo_common.sh``), its arguments unchanged.

A rank that fails has printed its own one-line error (``fairseq-headprune ...: error: ...``); torchrun then raises
its ``ChildFailedError``, whose traceback and failure summary say nothing more. This launcher leaves them out and
exits with the failed rank's exit status (128 + the signal for a rank a signal ended), as the command run alone
would; everything else is torchrun's own.
"""

import sys

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.run import main as torchrun


def launch(arguments) -> int:
    try:
        torchrun(arguments)
    except ChildFailedError as failure:
        _, first = failure.get_first_failure()
        if first.exitcode < 0:  # ended by signal -exitcode
            return 128 - first.exitcode
        return first.exitcode or 1
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] in ("-h", "--help"):
        print(__doc__.strip() + "\n\nusage: torchrun_sweep.py TORCHRUN-ARGUMENTS... (see torchrun --help)")
        sys.exit(0)
    sys.exit(launch(sys.argv[1:]))
