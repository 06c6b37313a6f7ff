"""scripts/reproductions/run_budhraja_long.sh on the tiny models: its plan of the paper's grid (nothing run), the
BERT side run for real with 2 updates per configuration, and the pair the paper sets side by side tested against
each other.

References: the grid's configurations counted from the paper's tables at the tiny models' depth (Table 1: 7 levels
and one head per layer; Table 2: 5 levels kept and pruned; Table 3: 4 levels of 3; Tables 5 and 6 at 2 layers:
top:1, bottom:1, top+bottom:2, with middle:2, even and odd the same masks); the direct test against Koehn's paired
bootstrap recomputed here from the two configurations' per-example statistics in their record.json.
"""

import json
import os

import numpy as np
import pytest
from test_sentence_prediction import classifier  # noqa: F401  (the tiny classifier fixture)

from conftest import REPO, run

SCRIPT = REPO / "scripts" / "reproductions" / "run_budhraja_long.sh"


@pytest.fixture
def demo_dirs(tiny_model, classifier, tmp_path):  # noqa: F811
    """The tiny models laid out as the demo models are (DIR/data/bin, DIR/checkpoints)."""
    demo, bert = tmp_path / "demo", tmp_path / "bert"
    (demo / "data").mkdir(parents=True)
    (bert / "data" / "bin").mkdir(parents=True)
    os.symlink(tiny_model["data"], demo / "data" / "bin")
    os.symlink(tiny_model["checkpoint"].parent, demo / "checkpoints")
    os.symlink(classifier["data"], bert / "data" / "bin" / "nli")
    os.symlink(classifier["checkpoint"].parent, bert / "checkpoints")
    return {"DEMO_DIR": str(demo), "BERT_DEMO_DIR": str(bert), "RANKS": "1", "THREADS": "1", "DRAWS": "1",
            "UPDATES": "2", "CURVE": "1", "BERT_UPDATES": "2", "BERT_CURVE": "1"}


def test_the_long_study_plans_the_papers_grid_and_tests_each_pair_against_the_other(demo_dirs, tmp_path):
    out = tmp_path / "long"
    plan = run(["bash", SCRIPT, out], env=dict(demo_dirs, PLAN_ONLY="1")).stdout
    assert not out.exists()  # the plan runs nothing and writes nothing
    assert "34 configurations, 0 finished" in plan  # the control, 8 + 10 + 12 budgets, 3 curve steps
    assert "Table 1 (8, 0 finished): 50%, 60%, 75%, 25%, 35%, 55%, 81%, one head per layer" in plan
    assert "Table 2 (10, 0 finished)" in plan and "Table 3 (12, 0 finished)" in plan
    assert "the curves' steps (3, 0 finished): all importance 50%, all importance 60%, all importance 75%" in plan
    assert "5 configurations, 0 finished" in plan and "Tables 5, 6 (3, 0 finished): top:1, bottom:1, top+bottom:2" \
        in plan

    console = run(["bash", SCRIPT, out], env=dict(demo_dirs, SIDES="bert")).stdout
    assert "no preference between pruning top and bottom layers (Budhraja et al. Table 5)" in console
    assert "the pairs the paper sets side by side, tested against each other" in console
    finetune = out / "bert" / "pruning" / "finetune"
    records = {r["label"]: r for r in json.loads((finetune / "results.json").read_text())}
    test = records["top:1"]["paired"]["bottom:1"]
    assert test["delta"] == pytest.approx(records["top:1"]["score_after"] - records["bottom:1"]["score_after"])

    from fairseq_headprune.study.statistics.metrics import ACCURACY
    from fairseq_headprune.study.statistics.significance import (
        SignificanceSettings,
        paired_bootstrap,
        resample_counts,
    )

    stats = {label: np.asarray(json.loads((finetune / records[label]["name"] / "record.json").read_text())["stats"])
             for label in ("top:1", "bottom:1")}
    settings = SignificanceSettings(**records["top:1"]["significance"])
    metric = ACCURACY.for_test(settings.test)  # the classifier's metric
    expected = paired_bootstrap(stats["bottom:1"], stats["top:1"], resample_counts(len(stats["top:1"]), settings),
                                metric, settings)
    assert (test["p_value"], test["low"], test["high"]) == pytest.approx(
        (expected.p_value, expected.delta_low, expected.delta_high))
    assert f"  top:1 minus bottom:1: {test['delta']:+.2f} [{test['low']:+.2f}, {test['high']:+.2f}]" in console
    report = (out / "bert" / "report.md").read_text()
    assert "| `top:1` minus `bottom:1` |" in report
    assert "95% interval: the paired test of the two configurations against each other" in report

    again = run(["bash", SCRIPT, out], env=dict(demo_dirs, SIDES="bert", PLAN_ONLY="1")).stdout
    assert "5 configurations, 5 finished" in again and "none left" in again
