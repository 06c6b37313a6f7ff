"""The tests' ``fairseq-headprune`` commands, each in a process of its own without seconds of imports.

Started once per test process (``conftest.run``): it imports the command line, torch and fairseq (about 7 s on a
CPU core, what every ``fairseq-headprune`` process spends before it starts), then reads one request per line on
stdin, ``{"argv": [...], "env": {...}, "cwd": DIR, "stdout": FILE, "stderr": FILE}``, forks a child that runs the
command as the console script does (``sys.exit(main())``) with that environment, directory and output files, and
answers ``{"status": N}`` (minus the signal's number where one ended the child, as ``subprocess`` does). The child
is a process of its own, as a command run from a shell: nothing it sets stays for the next. Nothing runs torch here
before a fork, so no thread pool is copied into a child.
"""

import json
import os
import sys

import fairseq  # noqa: F401  (its tasks, models and criteria: most of the seconds)
import torch  # noqa: F401

from fairseq_headprune.cli import main


def _run_child(request) -> int:
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    for descriptor, path, flags in ((0, os.devnull, os.O_RDONLY),
                                    (1, request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                                    (2, request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)):
        opened = os.open(path, flags)
        os.dup2(opened, descriptor)
        os.close(opened)
    sys.argv = ["fairseq-headprune", *request["argv"]]
    try:
        status = main(request["argv"])
    except SystemExit as exit:
        status = exit.code
    except BaseException:  # noqa: BLE001  (what the interpreter prints for an uncaught exception, and its status)
        sys.excepthook(*sys.exc_info())
        status = 1
    if status is None:
        status = 0
    elif not isinstance(status, int):
        print(status, file=sys.stderr)
        status = 1
    return status


def serve() -> None:
    for line in sys.stdin:
        request = json.loads(line)
        child = os.fork()
        if child == 0:
            status = 1
            try:
                status = _run_child(request)
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(status)
        _, wait_status = os.waitpid(child, 0)
        status = os.waitstatus_to_exitcode(wait_status)
        sys.stdout.write(json.dumps({"status": status}) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    serve()
