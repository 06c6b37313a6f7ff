"""The scripts' torchrun launcher (`scripts/demos/torchrun_sweep.py`): a failed rank's one-line error stands alone.

Reference: torchrun itself on the same commands (its exit status, and the traceback it adds after a rank's error).
"""

import shutil
import sys

import pytest

from conftest import BIN_DIR, REPO, run

LAUNCHER = REPO / "scripts" / "demos" / "torchrun_sweep.py"
TWO_RANKS = ["--standalone", "--nproc-per-node", "2"]
ONE_THREAD = {"OMP_NUM_THREADS": "1"}


@pytest.mark.parametrize("program, status", [("true", 0), ("false", 1)])
def test_the_launcher_exits_as_the_ranks_do(program, status):
    launched = run([sys.executable, LAUNCHER, *TWO_RANKS, "--no-python", program], env=ONE_THREAD, check=False)
    assert launched.returncode == status
    assert "Traceback" not in launched.stderr + launched.stdout


def test_a_rank_that_fails_on_bad_input_leaves_its_one_line_error_and_its_exit_status(tmp_path):
    command = [shutil.which("fairseq-headprune", path=str(BIN_DIR)), "prune",
               str(tmp_path / "no-data"), "--path", str(tmp_path / "missing.pt"), "--out-dir", str(tmp_path / "out")]
    torchrun = run([sys.executable, "-m", "torch.distributed.run", *TWO_RANKS, *command], env=ONE_THREAD, check=False)
    launched = run([sys.executable, LAUNCHER, *TWO_RANKS, *command], env=ONE_THREAD, check=False)
    error = "fairseq-headprune prune: error: checkpoint not found"
    assert error in torchrun.stdout + torchrun.stderr and "Traceback" in torchrun.stderr  # what torchrun adds
    assert torchrun.returncode == 1  # and the rank's status lost
    output = launched.stdout + launched.stderr
    assert error in output and "Traceback" not in output and "ChildFailedError" not in output
    assert launched.returncode == 2  # the command's own status for bad input
