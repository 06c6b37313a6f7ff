"""The export-engine seam (``engine.export.base``): a second engine, a fake one in ``support/sleep_engine.py``, is
exported to by the ``export`` command and timed by the deployment's own code, with nothing of CTranslate2's touched.

The sleep engine's model records how many heads and FFN neurons it keeps; the reference here is the count taken
from the masks given on the command line (the tiny model: 2 + 2 layers, 8 heads, 128 FFN neurons per layer)."""

import json
import os
import sys

import pytest

from conftest import REPO, run

TESTS = os.path.dirname(os.path.abspath(__file__))
ENGINE_ENV = {"HEADPRUNE_EXPORT_ENGINES": "support.sleep_engine:SLEEP",
              "PYTHONPATH": os.pathsep.join(filter(None, (TESTS, str(REPO), os.environ.get("PYTHONPATH"))))}
# half of every layer's heads and FFN neurons
HALF_HEADS = "E:1:1-4 E:2:1-4 A:1:1-4 A:2:1-4 D:1:1-4 D:2:1-4"
HALF_FFN = "E:1:1-64 E:2:1-64 D:1:1-64 D:2:1-64"


@pytest.fixture(scope="module")
def sleep_exports(tiny_model, tmp_path_factory):
    work = tmp_path_factory.mktemp("sleep-engine")
    common = ["fairseq-headprune", "export", tiny_model["data"], "--path", tiny_model["checkpoint"], "--cpu",
              "--format", "sleep"]
    env = {**ENGINE_ENV, "HEADPRUNE_TEST_FORK": "0"}  # a fresh interpreter, which finds the engine on PYTHONPATH
    unpruned = run([*common, "--out-dir", work / "unpruned"], env=env)
    half = run([*common, "--head-mask", HALF_HEADS, "--ffn-mask", HALF_FFN, "--out-dir", work / "half"], env=env)
    return {"work": work, "stdout": {"unpruned": unpruned.stdout, "half": half.stdout}}


def _model(directory):
    from support.sleep_engine import MODEL_FILE

    with open(os.path.join(directory, MODEL_FILE), encoding="utf-8") as stream:
        return json.load(stream)


def test_the_export_command_writes_the_engine_named_by_format(sleep_exports):
    total = 6 * 8 + 4 * 128  # heads of three attention types, FFN neurons of four layers
    assert _model(sleep_exports["work"] / "unpruned") == {"kept_units": total, "total_units": total,
                                                          "quantization": "float32"}
    assert _model(sleep_exports["work"] / "half")["kept_units"] == total // 2
    assert not list(sleep_exports["work"].glob("*/model.bin"))  # nothing of CTranslate2's written


def test_the_deployment_times_the_engine_in_its_own_processes(tiny_model, sleep_exports, monkeypatch):
    """``measure_speed`` with the sleep engine: its systems named by its prefix, decoded in workers of its
    environment (the engine asserts it), and the half model timed about twice as fast, as its sleep is half."""
    for name, value in ENGINE_ENV.items():
        monkeypatch.setenv(name, value)
    monkeypatch.syspath_prepend(TESTS)
    import torch

    from fairseq_headprune.engine.compression.deployment import measure_speed
    from fairseq_headprune.study.compression.deployment_settings import DeploymentSettings

    work = sleep_exports["work"]
    exported = {("unpruned", "float32"): str(work / "unpruned"), ("compressed", "float32"): str(work / "half")}
    settings = DeploymentSettings(batch_sizes=[4], sentences=16, repeats=2, threads=1)
    rows, _, _ = measure_speed("translation", {"unpruned": str(tiny_model["checkpoint"])}, exported,
                               str(tiny_model["data"]), "test", ["--beam", "5", "--lenpen", "1"], settings,
                               torch.device("cpu"), export_format="sleep")
    by_system = {row.system: row for row in rows}
    assert {"sleep unpruned float32", "sleep compressed float32", "fairseq unpruned"} <= set(by_system)
    half = by_system["sleep compressed float32"]
    assert half.engine == "sleep" and half.sentences == 16
    # 0.16 s against 0.08 s of sleep per pass: the ratio is the engine's, not the machine's
    assert 1.6 < half.speedup_like_for_like < 2.4


def test_an_unknown_engine_is_one_line(tiny_model, tmp_path):
    result = run(["fairseq-headprune", "export", tiny_model["data"], "--path", tiny_model["checkpoint"], "--cpu",
                  "--format", "onnx", "--out-dir", tmp_path / "out"], check=False)
    assert result.returncode == 2 and "invalid choice: 'onnx'" in result.stderr
    broken = run([sys.executable, "-m", "fairseq_headprune.cli", "export", "--help"], check=False,
                 env={**ENGINE_ENV, "HEADPRUNE_EXPORT_ENGINES": "support.no_such_module:ENGINE"})
    assert broken.returncode == 2 and "Traceback" not in broken.stderr
    assert broken.stderr.strip().endswith("cannot be imported: No module named 'support.no_such_module'")
    assert not (tmp_path / "out").exists()
