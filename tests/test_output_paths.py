"""Outputs checked before the work, one run per output directory, and a clean stop on Ctrl-C or SIGTERM.

Each bad output is tried on the tiny model through the real command: it must end in one line naming the
option, with exit status 2, no traceback, and leave every file that existed before as it was.
"""

import os
import signal
import subprocess
import sys
import time
from argparse import Namespace

import pytest

from conftest import BIN_DIR, REPO, run, run_in_process


def one_line_refusal(result, flag):
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().count("\n") == 0, result.stderr
    assert flag in result.stderr and "nothing was written" in result.stderr, result.stderr


@pytest.fixture
def a_file(tmp_path):
    path = tmp_path / "results.txt"
    path.write_text("earlier results\n")
    return path


def bad_outputs(tiny_model, tmp_path, a_file):
    """(command, the flag refused) for each kind of output path no command can write."""
    checkpoint, data = str(tiny_model["checkpoint"]), str(tiny_model["data"])
    missing = tmp_path / "missing" / "deeper"
    return [
        (["mask", "E:1:1", "--path", checkpoint, "--out", a_file / "mask.json"], "--out"),
        (["shrink", "--path", checkpoint, "--head-mask", "E:1:1", "--out", missing / "pruned.pt"], "--out"),
        (["shrink", "--path", checkpoint, "--head-mask", "E:1:1", "--out", tmp_path / "pruned.pt",
          "--report", a_file / "report.tsv"], "--report"),
        (["shrink", "--path", checkpoint, "--head-mask", "E:1:1", "--out", tmp_path], "--out"),
        (["importance", data, "--path", checkpoint, "--out-dir", a_file], "--out-dir"),
        (["importance", data, "--path", checkpoint, "--out-dir", a_file / "below"], "--out-dir"),
        (["ablate", data, "--path", checkpoint, "--mode", "single", "--out-dir", a_file], "--out-dir"),
        (["export", data, "--path", checkpoint, "--out-dir", a_file / "ct2"], "--out-dir"),
        (["compress", data, "--path", checkpoint, "--target", "speedup=2x", "--out-dir", a_file], "--out-dir"),
        (["significance", a_file, a_file, a_file, "--json", missing / "p.json"], "--json"),
        (["latency", data, "--path", checkpoint, "--out", missing / "table.json"], "--out"),
        (["corpus", a_file], "OUT_DIR"),
    ]


def test_every_unwritable_output_is_refused_before_any_work(tiny_model, tmp_path, a_file, capsys):
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    for command, flag in bad_outputs(tiny_model, tmp_path, a_file):
        result = run_in_process(command, capsys)
        one_line_refusal(result, flag)
        assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before, command
    assert not (tmp_path / "pruned.pt").exists()  # shrink --report refused before the checkpoint was written


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_a_read_only_output_directory_is_refused(tiny_model, tmp_path):
    locked = tmp_path / "read-only"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        result = run(["fairseq-headprune", "importance", tiny_model["data"], "--path", tiny_model["checkpoint"],
                      "--out-dir", locked / "importance"], check=False)
    finally:
        locked.chmod(0o755)
    one_line_refusal(result, "--out-dir")


def test_a_second_run_into_a_directory_in_use_is_refused_naming_the_first(tiny_model, tmp_path):
    from fairseq_headprune.commands.outputs import output_directory_locked

    out = tmp_path / "importance"
    command = ["fairseq-headprune", "importance", tiny_model["data"], "--path", tiny_model["checkpoint"],
               "--out-dir", out, "--no-progress"]
    with output_directory_locked(Namespace(out_dir=str(out)), {"out_dir": "--out-dir"}, "importance"):
        refused = run(command, check=False)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert f"is in use by another run (fairseq-headprune importance, process {os.getpid()})" in refused.stderr
    assert not out.exists()
    run(command)  # the lock released: the run goes through
    assert (out / "importance.json").is_file()


def test_the_shares_of_a_sharded_fine_tune_hold_one_directory_together(tmp_path):
    """``prune --config-shard I/K`` runs write one directory at once: each share holds its own lock, and a
    second process of the same share is refused."""
    from fairseq_headprune.commands.outputs import output_directory_locked
    from fairseq_headprune.errors import SettingsError

    def share(text):
        return Namespace(out_dir=str(tmp_path), config_shard=text)

    with output_directory_locked(share("1/2"), {}, "prune"):
        with output_directory_locked(share("2/2"), {}, "prune"):
            with pytest.raises(SettingsError, match="in use by another run"):
                with output_directory_locked(share("2/2"), {}, "prune"):
                    pass
        with pytest.raises(SettingsError, match="in use by another run"):
            with output_directory_locked(share("1/1"), {}, "prune"):  # the whole run beside a share of it
                pass


def test_a_killed_runs_lock_is_no_obstacle(tiny_model, tmp_path):
    out = tmp_path / "importance"
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time; from argparse import Namespace; "
         "from fairseq_headprune.commands.outputs import output_directory_locked\n"
         f"with output_directory_locked(Namespace(out_dir={str(out)!r}), {{}}, 'importance'):\n"
         "    print('locked', flush=True); time.sleep(600)"],
        stdout=subprocess.PIPE, text=True, cwd=REPO)
    assert holder.stdout.readline().strip() == "locked"
    holder.kill()
    holder.wait()
    run(["fairseq-headprune", "importance", tiny_model["data"], "--path", tiny_model["checkpoint"],
         "--out-dir", out, "--no-progress"])
    assert (out / "importance.json").is_file()


@pytest.mark.parametrize("stop, status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_stopped_run_ends_in_one_line(tiny_model, tmp_path, stop, status):
    """Ctrl-C (SIGINT) or SIGTERM while the command works: one line saying how to resume, no traceback."""
    from fairseq_headprune.commands.outputs import _lock_path

    out = tmp_path / "importance"
    environment = {**os.environ, "PATH": f"{BIN_DIR}{os.pathsep}{os.environ.get('PATH', '')}"}
    process = subprocess.Popen(["fairseq-headprune", "importance", str(tiny_model["data"]), "--path",
                                str(tiny_model["checkpoint"]), "--out-dir", str(out), "--no-progress"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=environment,
                               # SIGINT at its default: a suite launched in the background by a shell passes it on
                               # ignored, and Python then raises no KeyboardInterrupt
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    lock = _lock_path(str(out), None)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and process.poll() is None:  # the run has begun once it holds its lock
        if os.path.exists(lock) and f"process {process.pid}" in open(lock).read():
            break
        time.sleep(0.05)
    assert process.poll() is None, "the run ended before it could be stopped"
    process.send_signal(stop)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == status, stderr
    assert "Traceback" not in stderr
    last = stderr.strip().splitlines()[-1]
    assert last == "fairseq-headprune importance: stopped; run the same command again to resume"


DROPPED_STOP = """
import os, signal, sys, time, weakref
from fairseq_headprune.commands.stop_signals import stops_raised

class Thing:
    pass

def callback(_ref):  # Python drops an exception raised here ("Exception ignored in: ...")
    os.kill(os.getpid(), signal.{signal})
    for _ in range(100000):
        pass

began = time.monotonic()
try:
    with stops_raised():
        thing = Thing()
        ref = weakref.ref(thing, callback)
        del thing
        print("went on", flush=True)
        time.sleep({sleep})
    print("not stopped")
except BaseException as stop:
    print(type(stop).__name__, f"{{time.monotonic() - began:.1f}}")
"""


@pytest.mark.parametrize("stop, name", [("SIGINT", "KeyboardInterrupt"), ("SIGTERM", "Terminated")])
@pytest.mark.parametrize("sleep", [5, 0])
def test_a_stop_python_drops_is_raised_again(stop, name, sleep):
    """A signal that lands in a weakref callback (an import's module lock, a tensor freed) is not lost: raised
    again within a second while the command works, or when it would end; Python's "Exception ignored" is silent."""
    result = subprocess.run([sys.executable, "-c", DROPPED_STOP.format(signal=stop, sleep=sleep)],
                            capture_output=True, text=True, timeout=60,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    went_on, stopped = result.stdout.split("\n")[:2]
    assert went_on == "went on"  # Python dropped it where it landed
    assert stopped.split()[0] == name and float(stopped.split()[1]) < 1.5, result.stdout
    assert result.stderr == ""
